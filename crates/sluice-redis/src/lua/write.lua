-- Redis formats a number argument with snprintf's %.17g, which costs a third
-- as much as the SET itself, so a TTL goes as text instead, made once per
-- distinct value in a call (the keys of a limit tend to share a few).
-- Redis refuses a TTL it cannot add to its clock, so one past 10^15 ms
-- (31,700 years) is cut to that.
local ttl_texts = {}
local function ttl_text(ms)
  local text = string.format('%d', ms < 1e15 and ms or 1e15)
  ttl_texts[ms] = text
  return text
end

-- The PX of a state that has counted nothing from `at` (in units) on: at
-- least a millisecond more than the time until then (rounded up).
local function px(at)
  local x = (at - now) * unit / 1000000
  local ms = x - x % 1 + 2
  if ms < min_ttl then ms = min_ttl end
  return ttl_texts[ms] or ttl_text(ms)
end

-- The writes: each key once, with the TTL until it is full (or has counted
-- nothing) again.
local dels, ndels = {}, 0
for k = 1, nkeys do
  local l = wlim[k]
  local sliding = l and kind[l] >= 3 and kind[l] <= 5
  if sliding then
    local value, head, empty_at
    if kind[l] == 3 then
      if wgot[k] then
        value = pack_s('<ddd', wcur[k], wws[k], wprev[k])
        empty_at = wempty[k]
      end
    elseif kind[l] == 5 then
      local e = rare.lsent[k]
      local n = count(e, 24, LEASE_HEAD)
      if n > 0 then
        value, head = e, '\5\6' .. pack_s('<d', rare.lsheld[k])
        empty_at = rare.lease(e, n) + p2[l]
      end
    else
      local e = lent[k]
      local n = count(e, 16, LOG_HEAD)
      if n > 0 then
        value, head = e, pack_s('<dB', lused[k], linex[k])
        empty_at = entry(e, n) + p2[l]
      end
    end
    if value then
      -- A log's or leases' string as the call left it, and its head over
      -- the first bytes: Redis copies the one, and the other is a few.
      call('SET', keys[k], value, 'PX', px(empty_at))
      if head then call('SETRANGE', keys[k], 0, head) end
    else
      ndels = ndels + 1
      dels[ndels] = keys[k]
    end
  elseif l then
    local t = tok[k]
    if t then
      local ts = tsv[k]
      -- A token bucket's time to full (algorithm.rs full_at's first case)
      -- is here and not in full_after: the common write, and a Lua call
      -- costs about as much as its body.
      local span
      if kind[l] == 1 then
        span = (p3[l] - t) * p2[l] / p1[l]
      else
        span = full_after(l, t, ts)
      end
      -- At least a millisecond more than the time to full (rounded up).
      local x = ((ts - now) * unit + span) / 1000000
      local ms = x - x % 1 + 2
      if ms < min_ttl then ms = min_ttl end
      call('SET', keys[k], pack_s('<dd', t, ts), 'PX', ttl_texts[ms] or ttl_text(ms))
    else
      ndels = ndels + 1
      dels[ndels] = keys[k]
    end
  end
  if ndels == CHUNK then
    call('DEL', unpack(dels, 1, ndels))
    ndels = 0
  end
end
if ndels > 0 then call('DEL', unpack(dels, 1, ndels)) end

return {now, table.concat(out)}
