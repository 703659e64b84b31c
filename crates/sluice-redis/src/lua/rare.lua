-- Per transaction: where its verdict byte is, whether it still holds, and
-- (several ops only) its pending writes, which its own later ops see.
local head, ok
local ptok, pts, plim, porder, npend

-- What key x holds for op limit l: its transaction's pending state, or
-- the committed one (brought back first if it was of another kind), with
-- the value as read when that is still the state.
local function flat_read(x, l, origin)
  if ptok and ptok[x] then return ptok[x], pts[x], nil end
  if not tok[x] and blob[x] then flat_ghost(x, l, origin) end
  return tok[x], tsv[x], raw[x]
end
-- Settling and concurrency, made on the first op that needs them: most
-- calls of the script need neither, and each function it defines costs
-- every call.
local rare
use_rare = function()
  if rare then return rare end
  -- Log::settle's refund: takes cost back from the newest entries first,
  -- after dropping the entries that have left, and sums what is left afresh.
  -- twin of sliding.rs Log::settle, Log::expire
  local function log_refund(k, l, cost)
    local e = log_of(k, l)
    local at = read_at(e, 16, LOG_HEAD)
    local gone = expired(e, at - p2[l], 16, LOG_HEAD)
    if gone > 0 then e = drop_front(e, gone, 16) end
    local cut, tail, left = count(e, 16, LOG_HEAD), '', cost
    while left > 0 and cut > 0 do
      local t, c = entry(e, cut)
      if c <= left then
        left = left - c
      else
        tail = pack_s('<dd', t, c - left)
        left = 0
      end
      cut = cut - 1
    end
    e = string.sub(e, 1, LOG_HEAD + cut * 16) .. tail
    local n = count(e, 16, LOG_HEAD)
    local sum, exact = sum_span(e, 1, n, 'dd', 2, 16, LOG_HEAD, 0, 1)
    lent[k], lused[k] = e, sum
    if exact then linex[k] = 0 else linex[k] = 1 end
    wlim[k] = l
  end

  -- Concurrency: lsent[k] is nil before the key is decoded, else its
  -- leases (24 bytes each) after a head, and lsheld[k] the slots they hold
  -- (Leases::held), kept beside them so that no call adds up every lease.
  local lsent, lsheld = {}, {}
  -- Key k's leases, decoded once. A key of another kind comes back as
  -- Leases::emptiest makes it: every slot, under a lease no id releases.
  -- twin of concurrency.rs Leases::emptiest
  local function leases_of(k, l)
    local e = lsent[k]
    if e == nil then
      local v = blob[k]
      local held = 0
      local b1, b2 = string.byte(v or '', 1, 2)
      if b1 == 5 and b2 == 6 and #v >= 34 and (#v - 10) % 24 == 0 then
        held = unpack_s('<d', v, 3)
        e = v
      elseif b1 == 5 and b2 == 5 and #v >= 26 and (#v - 2) % 24 == 0 then
        -- Written before the sum was kept: summed once, then kept, with
        -- the head this version writes.
        e = rep('\0', LEASE_HEAD - 2) .. v
        held = sum_span(e, 1, count(e, 24, LEASE_HEAD), 'ddd', 3, 24, LEASE_HEAD, 0, 1)
      else
        e = rep('\0', LEASE_HEAD)
        local ends = (v or tok[k]) and ghost_end(k)
        if ends then
          local t = ends - p2[l]
          if t > now then t = now end
          e, held = e .. pack_s('<ddd', t, p1[l], 0), p1[l]
        end
      end
      lsent[k], lsheld[k] = e, held
    end
    return e, lsheld[k]
  end

  -- Lease i: taken at, slots, id.
  local function lease(e, i)
    return unpack_s('<ddd', e, LEASE_HEAD + i * 24 - 23)
  end

  -- The slots of the leases after the first `gone`, from whichever side
  -- has fewer to add up.
  -- twin of concurrency.rs Leases::held_after
  local function held_after(e, held, gone)
    if gone == 0 then return held end
    local n = count(e, 24, LEASE_HEAD)
    if gone <= n - gone then
      return held - (sum_span(e, 1, gone, 'ddd', 3, 24, LEASE_HEAD, 0, 1))
    end
    return (sum_span(e, gone + 1, n, 'ddd', 3, 24, LEASE_HEAD, 0, 1))
  end

  -- The reading of key k for a call of cost after pending, as at, used,
  -- newest (false if none), frees_at.
  -- twin of concurrency.rs Leases::read
  local function lease_read(k, l, pending, cost)
    local e, held = leases_of(k, l)
    local at = read_at(e, 24, LEASE_HEAD)
    local n = count(e, 24, LEASE_HEAD)
    local live = expired(e, at - p2[l], 24, LEASE_HEAD)
    local used = held_after(e, held, live)
    local newest = false
    if live < n then newest = time_of(e, n, 24, LEASE_HEAD) end
    local left = used + pending
    local need, keep = left + cost - p1[l], p1[l] - cost - pending
    local frees = at
    if need <= 0 or keep < 0 then
      frees = at
    elseif keep + 1 < need then
      frees = walk_back(e, live + 1, n, 'ddd', 3, 24, LEASE_HEAD, keep) or at
    else
      frees = walk(e, live + 1, n, 'ddd', 3, 24, LEASE_HEAD, left, cost, p1[l]) or at
    end
    return at, used, newest, frees
  end

  -- Drops key k's expired leases, as at the start of Leases::acquire and
  -- Leases::release, read at the time Leases::at gives.
  -- twin of concurrency.rs Leases::expire
  local function lease_expire(k, l)
    local e, held = leases_of(k, l)
    local at = read_at(e, 24, LEASE_HEAD)
    local gone = expired(e, at - p2[l], 24, LEASE_HEAD)
    if gone > 0 then
      held = held_after(e, held, gone)
      e = drop_front(e, gone, 24)
    end
    wlim[k] = l
    return e, held, at
  end
  -- Takes cost slots under lease id.
  -- twin of concurrency.rs Leases::acquire
  local function lease_acquire(k, l, cost, id)
    local e, held, at = lease_expire(k, l)
    if cost > 0 then
      e = e .. pack_s('<ddd', at, cost, id)
      held = held + cost
    end
    lsent[k], lsheld[k] = e, held
  end
  -- Gives back lease id; returns whether it was still held.
  -- twin of concurrency.rs Leases::release
  local function lease_release(k, l, id)
    local e, held = lease_expire(k, l)
    -- The id's bytes, found by a search in C; a match inside another
    -- field of a lease, or in the head, is skipped. Ids are whole numbers
    -- below 2^53, so equal ids are equal bytes.
    local needle, from = pack_s('<d', id), LEASE_HEAD + 1
    while true do
      local pos = string.find(e, needle, from, true)
      if not pos then break end
      if (pos - LEASE_HEAD) % 24 == 17 then
        local i = (pos - LEASE_HEAD + 7) / 24
        local _, slots = lease(e, i)
        local at = LEASE_HEAD + i * 24
        lsent[k] = string.sub(e, 1, at - 24) .. string.sub(e, at + 1)
        lsheld[k] = held - slots
        return true
      end
      from = pos + 1
    end
    lsent[k], lsheld[k] = e, held
    return false
  end

  -- A settling op on key k: a refund of cost (never above the capacity) or a
  -- forced charge (without a floor), as sluice_core's algorithm::settle,
  -- sliding::window_settle and Log::settle make them. Committed at once: a
  -- settlement is never refused, and a transaction of them names each key
  -- once. Appends what the key holds after it to the reply.
  -- twin of algorithm.rs settle; sliding.rs window_settle, Log::settle
  local function settle_op(k, l, cost, origin, how)
    local refund, once = how == 64, how == 96
    nout = nout + 1
    if kind[l] == 3 then
      local _, _, _, _, ws, cur, prev, w = window_state(k, l, origin)
      if refund then
        local back = cost
        if back > cur then back = cur end
        cur = cur - back
        prev = prev - (cost - back)
        if prev < 0 then prev = 0 end
      elseif not (once and w + cur > p1[l]) then
        cur = cur + cost
      end
      window_commit(k, l, ws, cur, prev)
      out[nout] = pack_s('<Bddd', 2, cur, ws, prev)
    elseif kind[l] == 4 then
      if refund then
        log_refund(k, l, cost)
      else
        local _, used = log_read(k, l, 0, 0)
        if not (once and p1[l] - used < 0) then log_commit(k, l, cost) end
      end
      local at, used, newest, frees = log_read(k, l, 0, 0)
      out[nout] = pack_s('<Bdddd', newest and 6 or 2, at, used, newest or 0, frees)
    else
      local st, sts = flat_read(k, l, origin)
      local avail, ts = refill(l, st, sts, origin)
      local t
      if refund then
        t = avail + cost
        if t > p3[l] then t = p3[l] end
      elseif once and avail < 0 then
        t = avail
      else
        -- No deeper than a year of refill: Algorithm::deepest_debt, with
        -- the same operations in the same order. A year in nanoseconds is
        -- a multiple of 4, so a double holds it exactly.
        local deepest
        if kind[l] == 1 then
          deepest = 31536000000000000 * p1[l] / p2[l]
        elseif kind[l] == 6 then
          deepest = p1[l] * p2[l]
        else
          deepest = p1[l] * idiv(31536000000000000 / unit, p2[l])
        end
        if deepest > 9007199254740992 then deepest = 9007199254740992 end
        t = avail - cost
        if t < -deepest then t = -deepest end
      end
      commit(k, t, ts, l)
      out[nout] = pack_s('<Bdd', 2, t, ts)
    end
  end

  -- A release of lease id on key k (a concurrency limit): committed at once,
  -- it appends whether the lease was held and what the key holds after it.
  local function release_op(k, l, id)
    local held = lease_release(k, l, id)
    local at, used, newest, frees = lease_read(k, l, 0, 0)
    local tag = 2
    if newest then tag = tag + 4 end
    if held then tag = tag + 8 end
    nout = nout + 1
    out[nout] = pack_s('<Bdddd', tag, at, used, newest or 0, frees)
  end

  rare = {
    lsent = lsent,
    lsheld = lsheld,
    lease = lease,
    lease_read = lease_read,
    lease_acquire = lease_acquire,
    settle_op = settle_op,
    release_op = release_op,
  }
  return rare
end
