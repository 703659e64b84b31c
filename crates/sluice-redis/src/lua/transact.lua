-- Decides a batch of transactions atomically, mirroring sluice-core's
-- algorithm.rs operation for operation so that the floating-point results
-- agree bit for bit. Each transaction is all-or-nothing on its own.
--
-- A state is struct.pack('<dd', tokens, ts) with ts in time units of
-- ARGV[1] nanoseconds. Its TTL is the time until the bucket is full again;
-- a full bucket is deleted, since a missing key means full.
--
-- ARGV: unit_ns, now ('' = Redis TIME, in microseconds), transactions,
-- min_ttl_ms, then per transaction: flags (1 consume, 2 reserve), ops;
-- then per op: key a, key b (indices into KEYS), kind (1 token bucket,
-- 2 fixed window), p1, p2, p3, p4, p5, cost.
--   token bucket: tokens per period, period in ns, burst, max_reserved (-1: none), 0
--   fixed window: rate, period in units, capacity, max_reserved (-1: none), origin in units
-- Returns {now, {allowed, pick_1, state_1, pick_2, state_2, ...}, ...}: the
-- state each op saw (false: none) and which of its two keys it used (0 or 1).

local unit = tonumber(ARGV[1])
local now
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  now = tonumber(ARGV[2])
end
local min_ttl = tonumber(ARGV[4])

local function elapsed_units(from)
  local e = now - from
  if e < 0 then return 0 end
  return e
end

-- floor(a / b) for non-negative integers held exactly in doubles.
local function idiv(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end

-- The state at now: refilled (token bucket) or rolled over (fixed window).
local function advance(op, s)
  if op.kind == 1 then
    if not s then return op.p3, now end
    local tokens = math.min(s[1] + (elapsed_units(s[2]) * unit) * op.p1 / op.p2, op.p3)
    return tokens, math.max(s[2], now)
  end
  local period = op.p2
  if not s then
    local origin = op.p5
    return op.p3, origin + idiv(now - origin, period) * period
  end
  local windows = idiv(elapsed_units(s[2]), period)
  return math.min(s[1] + op.p1 * windows, op.p3), s[2] + windows * period
end

local function may_reserve(reserve, deficit, max_reserved)
  return reserve and (max_reserved < 0 or deficit <= max_reserved)
end

local function ttl_ms(op, tokens, ts)
  local missing = op.p3 - tokens
  local span
  if op.kind == 1 then
    span = missing * op.p2 / op.p1
  else
    span = math.ceil(missing / op.p1) * op.p2 * unit
  end
  local ms = math.ceil(((ts - now) * unit + span) / 1000000) + 1
  if ms < min_ttl then ms = min_ttl end
  return ms
end

local out = {now}
local i = 5
for t = 1, tonumber(ARGV[3]) do
  local flags = tonumber(ARGV[i])
  local n = tonumber(ARGV[i + 1])
  i = i + 2
  local consume = flags % 2 == 1
  local reserve = flags >= 2
  local pending = {}
  local order = {}
  local reply = {1}
  local ok = true
  local function read(k)
    local p = pending[k]
    if p then return p end
    local v = redis.call('GET', KEYS[k])
    if not v then return false end
    local tokens, ts = struct.unpack('<dd', v)
    return {tokens, ts}
  end
  for _ = 1, n do
    local op = {
      a = tonumber(ARGV[i]), b = tonumber(ARGV[i + 1]), kind = tonumber(ARGV[i + 2]),
      p1 = tonumber(ARGV[i + 3]), p2 = tonumber(ARGV[i + 4]), p3 = tonumber(ARGV[i + 5]),
      p4 = tonumber(ARGV[i + 6]), p5 = tonumber(ARGV[i + 7]), cost = tonumber(ARGV[i + 8]),
    }
    i = i + 9
    local k, pick = op.a, 0
    local s = read(op.a)
    if op.b ~= op.a then
      local sb = read(op.b)
      local ta = advance(op, s)
      local tb = advance(op, sb)
      if tb > ta then k, pick, s = op.b, 1, sb end
    end
    local available, ts = advance(op, s)
    local deficit = op.cost - available
    local allowed = available >= op.cost or may_reserve(reserve, deficit, op.p4)
    if allowed then
      if not pending[k] then order[#order + 1] = k end
      pending[k] = {available - op.cost, ts, op}
    else
      ok = false
    end
    reply[#reply + 1] = pick
    if s then
      reply[#reply + 1] = struct.pack('<dd', s[1], s[2])
    else
      reply[#reply + 1] = false
    end
  end
  if ok and consume then
    for _, k in ipairs(order) do
      local p = pending[k]
      if p[1] >= p[3].p3 then
        redis.call('DEL', KEYS[k])
      else
        redis.call('SET', KEYS[k], struct.pack('<dd', p[1], p[2]), 'PX', ttl_ms(p[3], p[1], p[2]))
      end
    end
  end
  if not ok then reply[1] = 0 end
  out[#out + 1] = reply
end
return out
