-- ---- The sliding algorithms, as sluice_core::sliding decides them ----

-- The window state at now: rolled on by whole periods, or new on the
-- key's alignment.
-- twin of sliding.rs roll
local function roll(l, has, cur, ws, prev, origin)
  local p = p2[l]
  if not has then return window_start(now, origin, p), 0, 0 end
  local e = now - ws
  if e < 0 then e = 0 end
  local k = idiv(e, p)
  if k == 0 then return ws, cur, prev end
  if k == 1 then return ws + p, 0, cur end
  return ws + k * p, 0, 0
end

-- The previous window's count, weighted by its share still in the period
-- that ends at now (in nanoseconds, as sluice-core divides).
-- twin of sliding.rs weighted
local function weighted(l, ws, prev)
  local p = p2[l]
  local e = now - ws
  if e < 0 then e = 0 end
  if e > p then e = p end
  return prev * ((p - e) * unit) / (p * unit)
end

-- When a window state has counted nothing any more, and may go.
-- twin of sliding.rs window_empty_at
local function window_empty_at(l, ws, cur, prev)
  local n = 0
  if cur > 0 then n = 2 elseif prev > 0 then n = 1 end
  return ws + n * p2[l]
end

-- Sliding window states: wgot[k] is nil before the key is decoded, false
-- for no state, true for the state in wcur, wws, wprev; wempty[k] is when
-- a committed state has counted nothing any more, for its TTL.
local wgot, wcur, wws, wprev, wempty = {}, {}, {}, {}, {}
-- Key k's window state, decoded once. A key of another kind comes back as
-- window_emptiest makes it: the whole rate counted in the window two
-- periods before the first boundary at or after the end.
-- twin of sliding.rs window_emptiest
local function window_of(k, l, origin)
  local got = wgot[k]
  if got == nil then
    local v = blob[k]
    got = v ~= nil and #v == 24
    if got then
      wcur[k], wws[k], wprev[k] = unpack_s('<ddd', v)
    elseif v or tok[k] then
      local e = ghost_end(k)
      if e then
        local p = p2[l]
        local boundary = window_start(e - 1, origin, p) + p
        got = true
        wcur[k], wws[k], wprev[k] = p1[l], boundary - 2 * p, 0
      end
    end
    wgot[k] = got
  end
  if got then return true, wcur[k], wws[k], wprev[k] end
  return false
end

-- The empty instant is kept for the write: a Lua call costs about as many
-- of Redis's instructions as this body (scripts/redis-instructions).
local function window_commit(k, l, ws, cur, prev)
  local empty_at = window_empty_at(l, ws, cur, prev)
  local got = empty_at > now
  wgot[k] = got
  if got then wcur[k], wws[k], wprev[k], wempty[k] = cur, ws, prev, empty_at end
  wlim[k] = l
end

-- Pending sliding writes of the transaction being decided (several ops
-- only): window states by key (and the keys in the order first written),
-- logged costs by key (their sum) and in op order (each one committed as
-- it came, as the memory store commits them).
local pwin, pworder, plog, plist, nplist

-- The window state op key k sees: its transaction's pending one, or the
-- committed one.
local function window_seen(k, l, origin)
  if pwin and pwin[k] then
    local w = pwin[k]
    return true, w[2], w[1], w[3]
  end
  return window_of(k, l, origin)
end

-- Key x's window under op limit l: as seen, rolled on to now, and the
-- previous window's count weighted at now.
-- twin of sliding.rs window_evaluate, window_settle
local function window_state(x, l, origin)
  local has, cur, ws, prev = window_seen(x, l, origin)
  local rws, rcur, rprev = roll(l, has, cur, ws, prev, origin)
  return has, cur, ws, prev, rws, rcur, rprev, weighted(l, rws, rprev)
end
