-- floor(a / b) for integers held exactly in doubles.
local function idiv(a, b)
  local q = floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- The start of the window containing t, for windows at origin + k period.
-- twin of algorithm.rs window_start
local function window_start(t, origin, period)
  return origin + idiv(t - origin, period) * period
end

-- The state of a key at now under limit l: refilled (token bucket) or rolled
-- over (fixed window). `tokens` false: no state. The loop below repeats the
-- token bucket's case inline for its common lone op. One function for the
-- four of algorithm.rs: a call costs Redis's thread as much as its body.
-- twin of algorithm.rs tb_refill, fw_roll, calendar_roll, refill
local function refill(l, tokens, ts, origin)
  if kind[l] == 1 then
    if not tokens then return p3[l], now end
    local e = now - ts
    if e < 0 then e = 0 end
    local t = tokens + e * unit * p1[l] / p2[l]
    if t > p3[l] then t = p3[l] end
    if now > ts then ts = now end
    return t, ts
  end
  if kind[l] == 6 then
    -- algorithm.rs's calendar_roll: rate for each boundary passed since
    -- the window of ts, ts moved to the last one. A state older than the
    -- first boundary has passed more than the script was given, which are
    -- always enough to fill it.
    local b = bnd[l]
    local j = last_at(b, now)
    if not tokens then return p3[l], b[j] or now end
    local windows = j - last_at(b, ts)
    if ts < (b[1] or ts) then windows = j + 1 end
    if windows <= 0 then return tokens, ts end
    local t = tokens + p1[l] * windows
    if t > p3[l] then t = p3[l] end
    return t, b[j]
  end
  local period = p2[l]
  if not tokens then
    return p3[l], window_start(now, origin, period)
  end
  local e = now - ts
  if e < 0 then e = 0 end
  local windows = idiv(e, period)
  local t = tokens + p1[l] * windows
  if t > p3[l] then t = p3[l] end
  return t, ts + windows * period
end

-- Committed writes: the final state of each key, written once below.
local function commit(k, t, ts, l)
  if t >= p3[l] then
    -- Full: deleted, so later transactions see no state, as after a DEL.
    tok[k] = false
  else
    tok[k], tsv[k] = t, ts
  end
  wlim[k] = l
  raw[k] = false
end

-- When the state t at ts of a limit l window key is full again, for its
-- TTL: as nanoseconds after ts. A full state is deleted, so t is below the
-- capacity. A token bucket's case is inline in the writes.
-- twin of algorithm.rs full_at
local function full_after(l, t, ts)
  local missing = p3[l] - t
  local w = missing / p1[l]
  local c = w - w % 1
  if c < w then c = c + 1 end
  if kind[l] == 6 then
    -- The boundary that many windows after ts. The script is given every
    -- boundary a key can wait for; past them, a year a window keeps it
    -- long enough.
    local b = bnd[l]
    local at = b[last_at(b, ts) + c]
    if at then return (at - ts) * unit end
    return c * 31622400000000000
  end
  return c * p2[l] * unit
end

-- A key whose state is of another kind than its limit now keeps (the limit
-- changed kind) comes back as the fullest state of the new kind that has
-- counted nothing by the time the old one would have (its TTL), as the
-- memory store brings back a key it forgot: a change of kind never grants
-- a burst. The time, in units, until which the old state counts:
local function ghost_end(k)
  local ms = call('PTTL', keys[k])
  if ms <= 0 then return nil end
  local u = ms * 1000000 / unit
  local c = u - u % 1
  if c < u then c = c + 1 end
  return now + c
end

-- The token bucket or fixed window ghost of key k, into tok and tsv:
-- emptiest_full_by with ghost_end for its full_at, and least_tokens inline.
-- twin of algorithm.rs emptiest_full_by, least_tokens
local function flat_ghost(k, l, origin)
  blob[k] = nil
  local e = ghost_end(k)
  if not e then return end
  local span = e - now
  if kind[l] == 6 then
    -- algorithm.rs's least_tokens: a window's rate short for each boundary
    -- until the ghost ends (one at least), never deeper than the deepest
    -- debt.
    local b = bnd[l]
    local j = last_at(b, now)
    local n = last_at(b, e) - j
    if n < 1 then n = 1 end
    local t = p3[l] - p1[l] * n
    local deepest = p1[l] * p2[l]
    if t < -deepest then t = -deepest end
    tok[k], tsv[k] = t, b[j] or now
  elseif kind[l] == 1 then
    -- One nanosecond more, as sluice-core's least_tokens rounds.
    tok[k], tsv[k] = p3[l] - (span * unit + 1) * p1[l] / p2[l], now
  else
    local w = span / p2[l]
    local b = w - w % 1
    if b < w then b = b + 1 end
    tok[k] = p3[l] - p1[l] * b
    tsv[k] = window_start(now, origin, p2[l])
  end
  raw[k] = false
end

local PICK = {[0] = '\0', [1] = '\1'}
local SAW = {[0] = '\2', [1] = '\3'}
-- A lone op's verdict byte and its own byte, which follow each other.
local YES_SAW, NO_SAW, YES_NONE, NO_NONE = '\1\2', '\0\2', '\1\0', '\0\0'
local out, nout = {}, 0
