-- Decides a batch of transactions atomically, mirroring sluice-core's
-- algorithm.rs operation for operation so that the floating-point results
-- agree bit for bit. Each transaction is all-or-nothing on its own; they are
-- decided in order, each seeing what the ones before it committed.
--
-- A function that restates one of sluice-core (a twin) says so in a line
-- `-- twin of <file> <function>` above it, and mirror.txt, beside this
-- file, records both sides' digests: sluice-redis's tests/lua_mirror.rs
-- fails when one changes without the other.
--
-- Times are in units of ARGV[1] nanoseconds. A state, by its length:
--   16 bytes, token bucket and fixed window: '<dd' tokens, ts. Its TTL is
--     the time until the bucket is full again; a full bucket is deleted,
--     since a missing key means full.
--   24 bytes, sliding window: '<ddd' cur, ws, prev (sluice_core::sliding's
--     WindowState). Deleted once it counts nothing.
--   9 + 16n bytes, sliding log: '<dB' used, inexact (0 or 1), then n
--     entries '<dd' t, cost, oldest first (sluice_core::sliding::Log).
--     Deleted once empty.
--   10 + 24n bytes, concurrency: '\5\6', '<d' the slots held, then n
--     leases '<ddd' taken at, slots, id, oldest first
--     (sluice_core::concurrency::Leases). Even, where a log's length is
--     odd. Deleted once empty. (Earlier versions wrote '\5\5' and the
--     leases without the sum; such a key is read, and written back in
--     this form.)
-- The TTL of a sliding state is the time until it has counted nothing. A
-- state of another length than its limit's kind keeps (the limit changed
-- kind) comes back as the fullest state of the new kind that counts
-- nothing by the end of its TTL (see ghost_end).
--
-- KEYS: every distinct key of the batch.
-- ARGV: unit_ns, now ('' = Redis TIME, in microseconds), min_ttl_ms, limits,
-- ops, extras, calendars, where the last four are packed little-endian
-- records:
--   limit: kind (B), p1, p2, p3, p4 (d)
--     1 token bucket: tokens per period, period in ns, burst, how far a reservation may go (see Algorithm::reservable)
--     2 fixed window: rate, period in units, capacity, how far a reservation may go (see Algorithm::reservable)
--     3 sliding window: rate, period in units, 0, 0
--     4 sliding log: rate, period in units, the most entries a log keeps, 0
--     5 concurrency: max slots, lease in units, 0, 0
--     6 calendar window: rate, the windows of its deepest debt, capacity,
--       how far a reservation may go; its boundaries come in calendars
--   op: ctl (B), key a (I4, index into KEYS), limit (I4, index into the
--     limits), cost (d)
--     ctl: 1 consume, 2 reserve, 4 first op of its transaction, 8 last op,
--     16 the op has extras (else key b is key a and origin is 0), 32 a
--     forced charge of cost, 64 a refund of cost, 96 a forced charge
--     unless the key is in debt already (see settle_op), 128 a
--     release of the lease whose id is in origin (see release_op)
--   extra, one per op with ctl bit 16, in op order: key b (I4, the second
--     candidate key of a sharded limit), origin in units (d, fixed and
--     sliding window), or the lease id (d, below 2^53, concurrency)
--   calendars, one per calendar window limit, in limit order: a count n
--     (d), then n window boundaries in units (d), ascending: every boundary
--     that can matter to a call at the client's time (see
--     sluice-redis's script.rs, `boundaries`), since the script has no tz
--     database to find them with
-- Returns {now, replies}: replies is a string holding, per transaction, one
-- byte (1 allowed, 0 denied), then per op one byte (bit 0: which of its two
-- keys it used; bit 1: a state follows; bit 2: a log's newest entry is
-- set; bit 3: a release found its lease) and what it saw:
--   token bucket, fixed window: the state, '<dd';
--   sliding window: the state, '<ddd';
--   sliding log and concurrency (always): '<dddd' at, used, newest,
--     frees_at, the fields of sluice_core::sliding::LogReading, which the
--     ops' decisions are computed from.
-- A settling op (ctl 32 or 64) is always admitted and committed at once,
-- and replies with what its key holds after it, in the same forms.
--
-- Speed matters here, since Redis runs it on its one thread. Every key is
-- read with one MGET and every key written is written once, at the end,
-- with its TTL in the same SET. Beyond those, the cost is in calls into C,
-- in new strings, in growing tables and in Lua's own instructions, so the
-- ops are decoded with one struct call per chunk, tables are created at
-- their final size, a lone op on a token bucket takes a short path, a state
-- read and not yet changed is returned as the very string MGET gave, and
-- TTLs are passed as text (see ttl_text).

local unpack_s, pack_s = struct.unpack, struct.pack
local call = redis.call
local floor = math.floor
local rep = string.rep
local keys = KEYS

-- Values per struct or unpack call: well within Lua's C stack (8000 slots).
local CHUNK = 3000

local NONE = {}
-- A table whose array part already has n slots, so that filling 1..n never
-- rehashes it (a table constructor sizes itself to what it is given).
local function sized(n)
  if n <= CHUNK then return {unpack(NONE, 1, n)} end
  return {}
end

local unit = tonumber(ARGV[1])
local now
if ARGV[2] == '' then
  local t = call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local min_ttl = tonumber(ARGV[3])

-- The limits, as parallel arrays.
local kind, p1, p2, p3, p4 = {}, {}, {}, {}, {}
do
  local blob, pos, n = ARGV[4], 1, 0
  local len = #blob
  while pos <= len do
    n = n + 1
    kind[n], p1[n], p2[n], p3[n], p4[n], pos = unpack_s('<Bdddd', blob, pos)
  end
end

-- Each calendar window limit's boundaries, bnd[l].
local bnd = {}
do
  local blob, pos = ARGV[7] or '', 1
  for l = 1, #kind do
    if kind[l] == 6 then
      local n
      n, pos = unpack_s('<d', blob, pos)
      local b = {}
      for i = 1, n do b[i], pos = unpack_s('<d', blob, pos) end
      bnd[l] = b
    end
  end
end

-- The index in b of the last boundary at or before t (0 if none).
local function last_at(b, t)
  local lo, hi = 0, #b
  while lo < hi do
    local mid = floor((lo + hi + 1) / 2)
    if b[mid] <= t then lo = mid else hi = mid - 1 end
  end
  return lo
end

-- Every state, read at once: tok[k] is false for a missing key (or one
-- that is not a two-number state), and raw[k] is the value as read, while
-- no transaction has changed it. A sliding state stays in blob[k] until an
-- op on it decodes it.
local nkeys = #keys
local tok, tsv, wlim, raw = sized(nkeys), sized(nkeys), sized(nkeys), sized(nkeys)
local blob = {}
do
  local i = 1
  while i <= nkeys do
    local j = i + CHUNK - 1
    if j > nkeys then j = nkeys end
    local vals = call('MGET', unpack(keys, i, j))
    for k = i, j do
      local v = vals[k - i + 1]
      if v and #v == 16 then
        tok[k], tsv[k] = unpack_s('<dd', v)
        raw[k] = v
      else
        tok[k] = false
        if v then blob[k] = v end
      end
    end
    i = j + 1
  end
end

-- Decodes a blob of `size`-byte records of `fields` fields each into one
-- flat array, with one struct call per chunk of records.
local function records(blob, fmt, fields, size)
  local all, n = {}, 0
  local per = floor(CHUNK / fields)
  local total = #blob / size
  local pos = 1
  while n < total do
    local m = total - n
    if m > per then m = per end
    local part = {unpack_s('<' .. rep(fmt, m), blob, pos)}
    pos = part[m * fields + 1]
    if n == 0 then
      all = part
    else
      local base = n * fields
      for i = 1, m * fields do all[base + i] = part[i] end
    end
    n = n + m
  end
  return all, n
end

-- Every op at once, four fields each; most ops have no extras, and each
-- field decoded and read back costs Redis's one thread time.
local ops, nops = records(ARGV[5], 'BI4I4d', 4, 17)
local extras = records(ARGV[6], 'I4d', 2, 12)

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

-- When the state t at ts of a limit l key is full again, for its TTL: as
-- nanoseconds after ts, since a bucket's is no whole number of units. A
-- full state is deleted, so t is below the capacity.
-- twin of algorithm.rs full_at
local function full_after(l, t, ts)
  local missing = p3[l] - t
  if kind[l] == 1 then return missing * p2[l] / p1[l] end
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
-- for no state, true for the state in wcur, wws, wprev.
local wgot, wcur, wws, wprev = {}, {}, {}, {}
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

local function window_commit(k, l, ws, cur, prev)
  local got = window_empty_at(l, ws, cur, prev) > now
  wgot[k] = got
  if got then wcur[k], wws[k], wprev[k] = cur, ws, prev end
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

-- Settling and concurrency: see use_rare, below.
local use_rare

-- An op on a sliding limit: picks the fuller of its keys, decides, keeps
-- or commits what it admits, and appends what it saw to the reply.
-- Returns whether it was admitted.
-- twin of sliding.rs window_evaluate, LogReading::decide
local function sliding_op(ctl, a, b, l, cost, origin, single)
  local rate = p1[l]
  local pick, k = 0, a
  if kind[l] == 3 then
    local has, cur, ws, prev, rws, rcur, rprev, w = window_state(a, l, origin)
    if b ~= a then
      local hb, cb, wsb, pb, rwsb, rcb, rpb, wb = window_state(b, l, origin)
      if rate - (wb + rcb) > rate - (w + rcur) then
        pick, k = 1, b
        has, cur, ws, prev, rws, rcur, rprev, w = hb, cb, wsb, pb, rwsb, rcb, rpb, wb
      end
    end
    local allowed = w + rcur + cost <= rate
    if allowed then
      if single then
        if ctl % 2 == 1 then window_commit(k, l, rws, rcur + cost, rprev) end
      else
        if not pwin[k] then pworder[#pworder + 1] = k end
        pwin[k] = {rws, rcur + cost, rprev, l}
      end
    end
    nout = nout + 1
    if has then
      out[nout] = pack_s('<Bddd', pick + 2, cur, ws, prev)
    else
      out[nout] = PICK[pick]
    end
    return allowed
  end
  local read = log_read
  if kind[l] == 5 then read = use_rare().lease_read end
  local pa = plog and plog[a] or 0
  local at, used, newest, frees = read(a, l, pa, cost)
  if b ~= a then
    local pb = plog and plog[b] or 0
    local atb, ub, nb, fb = read(b, l, pb, cost)
    local ta, tb = rate - used, rate - ub
    if plog and plog[a] then ta = ta - pa end
    if plog and plog[b] then tb = tb - pb end
    if tb > ta then pick, k, pa, at, used, newest, frees = 1, b, pb, atb, ub, nb, fb end
  end
  local with = used
  if pa > 0 then with = used + pa end
  local allowed = with + cost <= rate
  if allowed then
    if single then
      if ctl % 2 == 1 then
        if kind[l] == 5 then
          use_rare().lease_acquire(k, l, cost, origin)
        else
          log_commit(k, l, cost)
        end
      end
    else
      plog[k] = pa + cost
      nplist = nplist + 1
      plist[nplist] = {k, l, cost, origin}
    end
  end
  nout = nout + 1
  out[nout] = pack_s('<Bdddd', pick + (newest and 6 or 2), at, used, newest or 0, frees)
  return allowed
end

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

local nx = 0
for i = 0, nops - 1 do
  local f = i * 4
  local ctl, a, l, cost = ops[f + 1], ops[f + 2], ops[f + 3], ops[f + 4]
  if ctl >= 12 and ctl < 16 and kind[l] == 1 then
    -- A transaction of one op on one token-bucket key, nearly every call:
    -- the general case below, with what cannot happen here left out.
    if not tok[a] and blob[a] then flat_ghost(a, l, 0) end
    local st, sts = tok[a], tsv[a]
    local avail, ts
    if st then
      local e = now - sts
      if e < 0 then e = 0 end
      avail = st + e * unit * p1[l] / p2[l]
      if avail > p3[l] then avail = p3[l] end
      if now > sts then ts = now else ts = sts end
    else
      avail, ts = p3[l], now
    end
    local yes = avail >= cost
    if not yes and ctl >= 14 then
      local mr = p4[l]
      yes = cost - avail <= mr
    end
    local seen = raw[a]
    if seen then
      out[nout + 1] = yes and YES_SAW or NO_SAW
      nout = nout + 2
      out[nout] = seen
    elseif st then
      out[nout + 1] = yes and '\1' or '\0'
      nout = nout + 2
      out[nout] = pack_s('<Bdd', 2, st, sts)
    else
      nout = nout + 1
      out[nout] = yes and YES_NONE or NO_NONE
    end
    if yes and ctl % 2 == 1 then
      -- commit(), inline: a call costs as much as its body.
      local t = avail - cost
      if t >= p3[l] then tok[a] = false else tok[a], tsv[a] = t, ts end
      wlim[a] = l
      raw[a] = false
    end
  else
    local b, origin = a, 0
    local release = ctl >= 128
    if release then ctl = ctl - 128 end
    local settle = 0
    if ctl >= 32 then
      settle = ctl - ctl % 32
      ctl = ctl % 32
    end
    if ctl >= 16 then
      nx = nx + 2
      b, origin = extras[nx - 1], extras[nx]
      ctl = ctl - 16
    end
    local first = ctl % 8 >= 4
    local last = ctl >= 8
    if first then
      nout = nout + 1
      head = nout
      out[nout] = '\1'
      ok = true
      if last then
        ptok, pwin, plog = nil, nil, nil
      else
        ptok, pts, plim, porder, npend = {}, {}, {}, {}, 0
        pwin, pworder, plog, plist, nplist = {}, {}, {}, {}, 0
      end
    end

    if release then
      use_rare().release_op(a, l, origin)
    elseif settle > 0 then
      use_rare().settle_op(a, l, cost, origin, settle)
    elseif kind[l] >= 3 and kind[l] <= 5 then
      if not sliding_op(ctl, a, b, l, cost, origin, ptok == nil) then ok = false end
    else
      local k, pick = a, 0
      local st, sts, seen = flat_read(a, l, origin)
      local avail, ts = refill(l, st, sts, origin)
      if b ~= a then
        local sb, sbts, seenb = flat_read(b, l, origin)
        local availb, tsb = refill(l, sb, sbts, origin)
        if availb > avail then
          k, pick, st, sts, avail, ts, seen = b, 1, sb, sbts, availb, tsb, seenb
        end
      end

      local allowed = avail >= cost
      if not allowed and ctl % 4 >= 2 then
        local mr = p4[l]
        allowed = cost - avail <= mr
      end
      if allowed then
        if not ptok then
          if ctl % 2 == 1 then commit(k, avail - cost, ts, l) end
        else
          if not ptok[k] then
            npend = npend + 1
            porder[npend] = k
          end
          ptok[k], pts[k], plim[k] = avail - cost, ts, l
        end
      else
        ok = false
      end

      nout = nout + 1
      if seen then
        out[nout] = SAW[pick]
        nout = nout + 1
        out[nout] = seen
      elseif st then
        out[nout] = pack_s('<Bdd', pick + 2, st, sts)
      else
        out[nout] = PICK[pick]
      end
    end

    if last then
      if not ok then
        out[head] = '\0'
      elseif ptok and ctl % 2 == 1 then
        for j = 1, npend do
          local pk = porder[j]
          commit(pk, ptok[pk], pts[pk], plim[pk])
        end
        for j = 1, #pworder do
          local pk = pworder[j]
          local w = pwin[pk]
          window_commit(pk, w[4], w[1], w[2], w[3])
        end
        for j = 1, nplist do
          local c = plist[j]
          if kind[c[2]] == 5 then
            use_rare().lease_acquire(c[1], c[2], c[3], c[4])
          else
            log_commit(c[1], c[2], c[3])
          end
        end
      end
    end
  end
end

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
        empty_at = window_empty_at(l, wws[k], wcur[k], wprev[k])
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
      local span = full_after(l, t, ts)
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
