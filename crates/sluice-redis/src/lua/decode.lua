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
