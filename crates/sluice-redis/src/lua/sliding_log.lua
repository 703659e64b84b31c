-- a + b, and whether that is exact (the TwoSum error term is 0).
-- twin of sliding.rs add_exact
local function add_exact(a, b)
  local s = a + b
  local bb = s - a
  local err = (a - (s - bb)) + (b - bb)
  return s, err == 0
end

-- A log's and a key's leases are kept as Redis holds them, head and all:
-- a script pays for every byte of a string it makes (most of it in Lua's
-- collector), so a call on a fat key makes as few as it can. The head's
-- numbers live in tables beside the string while a call runs; a string
-- made without a head here starts with as many bytes of anything, and the
-- write puts the head back over them (SETRANGE). Record i of a string with
-- a head of `base` bytes starts at byte base + (i - 1) * size + 1.
local LOG_HEAD, LEASE_HEAD = 9, 10

-- Sliding logs: lent[k] is nil before the key is decoded, else its entries
-- (16 bytes each) after a head, with lused[k] and linex[k] the head's.
local lent, lused, linex = {}, {}, {}
-- Key k's log, decoded once. A key of another kind comes back as
-- Log::emptiest makes it: the whole rate, logged a period before the end
-- (or now, if that is earlier).
-- twin of sliding.rs Log::emptiest
local function log_of(k, l)
  local e = lent[k]
  if e == nil then
    local v = blob[k]
    if v and #v >= 25 and (#v - 9) % 16 == 0 then
      lused[k], linex[k] = unpack_s('<dB', v)
      e = v
    else
      lused[k], linex[k] = 0, 0
      e = pack_s('<dB', 0, 0)
      local ends = (v or tok[k]) and ghost_end(k)
      if ends then
        local t = ends - p2[l]
        if t > now then t = now end
        e, lused[k] = e .. pack_s('<dd', t, p1[l]), p1[l]
      end
    end
    lent[k] = e
  end
  return e, lused[k], linex[k]
end

-- How many records of `size` bytes e holds after its head.
local function count(e, size, base)
  return (#e - base) / size
end

-- The time of entry i, and its cost.
local function entry(e, i)
  return unpack_s('<dd', e, LOG_HEAD + i * 16 - 15)
end

-- The time of record i of a log's (size 16) or a key's leases (size 24):
-- its first double.
local function time_of(e, i, size, base)
  return (unpack_s('<d', e, base + i * size - size + 1))
end

-- e without its first `gone` records, made in one string: the bytes before
-- the first record kept stand in for the head (gone * size >= base).
local function drop_front(e, gone, size)
  return string.sub(e, gone * size + 1)
end

-- Formats of m records, made once per call: '<' and fmt m times.
local formats = {}
local function format_of(fmt, m)
  local by = formats[fmt]
  if not by then by = {}; formats[fmt] = by end
  local f = by[m]
  if not f then f = '<' .. rep(fmt, m); by[m] = f end
  return f
end

-- The most records decoded by one call into C: a walk or a sum over a fat
-- key costs a call into C per this many records, not one per record.
local SPAN = 256

-- Records i..i+m-1 of e, each of fmt (`size` bytes), as one flat array.
local function span(e, i, m, fmt, size, base)
  return {unpack_s(format_of(fmt, m), e, base + i * size - size + 1)}
end

-- The sum of the second fields (a log's costs, a key's slots) of records
-- i..j of e, oldest first from `from` (or subtracted from it, with sign
-- -1), and whether every step was exact.
-- twin of sliding.rs fold
local function sum_span(e, i, j, fmt, fields, size, base, from, sign)
  local sum, exact = from, true
  while i <= j do
    local m = j - i + 1
    if m > SPAN then m = SPAN end
    local r = span(e, i, m, fmt, size, base)
    for x = 2, m * fields, fields do
      local d, ok = add_exact(sum, sign * r[x])
      sum, exact = d, exact and ok
    end
    i = i + m
  end
  return sum, exact
end

-- The time records are read at: never before the newest one.
-- twin of sliding.rs Log::at; concurrency.rs Leases::at
local function read_at(e, size, base)
  local n = count(e, size, base)
  if n > 0 then
    local t = time_of(e, n, size, base)
    if t > now then return t end
  end
  return now
end

-- How many records, oldest first, are at or before cutoff.
-- twin of sliding.rs Log::expired; concurrency.rs Leases::expired
local function expired(e, cutoff, size, base)
  local lo, hi = 0, count(e, size, base)
  while lo < hi do
    local mid = floor((lo + hi) / 2)
    if time_of(e, mid + 1, size, base) <= cutoff then lo = mid + 1 else hi = mid end
  end
  return lo
end

-- The sum of the costs of the entries after the first `live`, and whether
-- it is exact.
-- twin of sliding.rs Log::sum_from
local function sum_from(e, used, inexact, live)
  if live == 0 then return used, inexact == 0 end
  local n = count(e, 16, LOG_HEAD)
  if inexact == 0 and live <= n - live then
    local u, exact = sum_span(e, 1, live, 'dd', 2, 16, LOG_HEAD, used, -1)
    if exact then return u, true end
  end
  return sum_span(e, live + 1, n, 'dd', 2, 16, LOG_HEAD, 0, 1)
end

-- The first record from i on (oldest first) at which `left`, less the
-- second fields of the records up to it, leaves room for cost under max:
-- its time, or false if none does, and what is left after every record
-- walked. The walk decodes more at each step, since most end at once.
-- twin of sliding.rs Log::frees_at; concurrency.rs Leases::read
local function walk(e, i, n, fmt, fields, size, base, left, cost, max)
  local m = 4
  while i <= n do
    if m > n - i + 1 then m = n - i + 1 end
    local r = span(e, i, m, fmt, size, base)
    for x = 1, m * fields, fields do
      left = left - r[x + 1]
      if left + cost <= max then return r[x], left end
    end
    i = i + m
    if m < SPAN then m = m * 2 end
  end
  return false, left
end

-- The first record from n down to i (newest first) whose second field,
-- with those of the records after it, comes to more than keep: its time,
-- or false if none does (Leases::read's walk from the newest end).
-- twin of concurrency.rs Leases::read
local function walk_back(e, i, n, fmt, fields, size, base, keep)
  local m, newer = 4, 0
  while n >= i do
    if m > n - i + 1 then m = n - i + 1 end
    local r = span(e, n - m + 1, m, fmt, size, base)
    for x = (m - 1) * fields + 1, 1, -fields do
      newer = newer + r[x + 1]
      if newer > keep then return r[x] end
    end
    n = n - m
    if m < SPAN then m = m * 2 end
  end
  return false
end

-- The reading of key k's log for a call of cost after pending, as at,
-- used, newest (false if none), frees_at, whose walk past the entries to
-- the pending cost is here.
-- twin of sliding.rs Log::read, Log::frees_at
local function log_read(k, l, pending, cost)
  local e, used, inexact = log_of(k, l)
  local at = read_at(e, 16, LOG_HEAD)
  local n = count(e, 16, LOG_HEAD)
  local live = expired(e, at - p2[l], 16, LOG_HEAD)
  local u = sum_from(e, used, inexact, live)
  local with = u
  if pending > 0 then with = u + pending end
  local newest = false
  if live < n then newest = entry(e, n) end
  local frees = at
  if not (with + cost <= p1[l]) then
    local found, left = walk(e, live + 1, n, 'dd', 2, 16, LOG_HEAD, with, cost, p1[l])
    if not found and pending > 0 then
      left = left - pending
      if left + cost <= p1[l] then found = at end
    end
    if found then frees = found end
  end
  return at, u, newest, frees
end

-- Logs cost at now (at the newest entry's time if later), after dropping
-- the entries that have left (Log::expire, here).
-- twin of sliding.rs Log::commit, Log::expire
local function log_commit(k, l, cost)
  local e, used, inexact = log_of(k, l)
  local at = read_at(e, 16, LOG_HEAD)
  local gone = expired(e, at - p2[l], 16, LOG_HEAD)
  if gone > 0 then
    local u, exact = sum_from(e, used, inexact, gone)
    e, used = drop_front(e, gone, 16), u
    if exact then inexact = 0 else inexact = 1 end
  end
  if cost > 0 then
    local n = count(e, 16, LOG_HEAD)
    local merged, fine = false, true
    if n > 0 then
      local t, c = entry(e, n)
      if t == at or n >= p3[l] then
        local d
        d, fine = add_exact(c, cost)
        e = string.sub(e, 1, #e - 16) .. pack_s('<dd', at, d)
        merged = true
      end
    end
    if not merged then e = e .. pack_s('<dd', at, cost) end
    local u, ok = add_exact(used, cost)
    used = u
    if not (fine and ok) then inexact = 1 end
  end
  lent[k], lused[k], linex[k] = e, used, inexact
  wlim[k] = l
end
