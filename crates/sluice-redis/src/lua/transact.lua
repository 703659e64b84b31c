-- Decides a batch of transactions atomically, mirroring sluice-core's
-- algorithm.rs operation for operation so that the floating-point results
-- agree bit for bit. Each transaction is all-or-nothing on its own; they are
-- decided in order, each seeing what the ones before it committed.
--
-- A state is struct.pack('<dd', tokens, ts) with ts in time units of
-- ARGV[1] nanoseconds. Its TTL is the time until the bucket is full again;
-- a full bucket is deleted, since a missing key means full.
--
-- KEYS: every distinct key of the batch.
-- ARGV: unit_ns, now ('' = Redis TIME, in microseconds), min_ttl_ms, limits,
-- ops, extras, where the last three are packed little-endian records:
--   limit: kind (B: 1 token bucket, 2 fixed window), p1, p2, p3, p4 (d)
--     token bucket: tokens per period, period in ns, burst, how far a reservation may go (see Algorithm::reservable)
--     fixed window: rate, period in units, capacity, how far a reservation may go (see Algorithm::reservable)
--   op: ctl (B), key a (I4, index into KEYS), limit (I4, index into the
--     limits), cost (d)
--     ctl: 1 consume, 2 reserve, 4 first op of its transaction, 8 last op,
--     16 the op has extras (else key b is key a and origin is 0)
--   extra, one per op with ctl bit 16, in op order: key b (I4, the second
--     candidate key of a sharded limit), origin in units (d, fixed window)
-- Returns {now, replies}: replies is a string holding, per transaction, one
-- byte (1 allowed, 0 denied), then per op one byte (bit 0: which of its two
-- keys it used; bit 1: a state follows) and the state it saw, '<dd'.
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

-- Every state, read at once: tok[k] is false for a missing key, and raw[k]
-- is the value as read, while no transaction has changed it.
local nkeys = #keys
local tok, tsv, wlim, raw = sized(nkeys), sized(nkeys), sized(nkeys), sized(nkeys)
do
  local i = 1
  while i <= nkeys do
    local j = i + CHUNK - 1
    if j > nkeys then j = nkeys end
    local vals = call('MGET', unpack(keys, i, j))
    for k = i, j do
      local v = vals[k - i + 1]
      if v then
        tok[k], tsv[k] = unpack_s('<dd', v)
        if #v == 16 then raw[k] = v end
      else
        tok[k] = false
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

-- The state of a key at now under limit l: refilled (token bucket) or rolled
-- over (fixed window). `tokens` false: no state. The loop below repeats the
-- token bucket's case inline for its common lone op.
local function advance(l, tokens, ts, origin)
  if kind[l] == 1 then
    if not tokens then return p3[l], now end
    local e = now - ts
    if e < 0 then e = 0 end
    local t = tokens + e * unit * p1[l] / p2[l]
    if t > p3[l] then t = p3[l] end
    if now > ts then ts = now end
    return t, ts
  end
  local period = p2[l]
  if not tokens then
    return p3[l], origin + idiv(now - origin, period) * period
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

local PICK = {[0] = '\0', [1] = '\1'}
local SAW = {[0] = '\2', [1] = '\3'}
-- A lone op's verdict byte and its own byte, which follow each other.
local YES_SAW, NO_SAW, YES_NONE, NO_NONE = '\1\2', '\0\2', '\1\0', '\0\0'
local out, nout = {}, 0
-- Per transaction: where its verdict byte is, whether it still holds, and
-- (several ops only) its pending writes, which its own later ops see.
local head, ok
local ptok, pts, plim, porder, npend
local nx = 0
for i = 0, nops - 1 do
  local f = i * 4
  local ctl, a, l, cost = ops[f + 1], ops[f + 2], ops[f + 3], ops[f + 4]
  if ctl >= 12 and ctl < 16 and kind[l] == 1 then
    -- A transaction of one op on one token-bucket key, nearly every call:
    -- the general case below, with what cannot happen here left out.
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
        ptok = nil
      else
        ptok, pts, plim, porder, npend = {}, {}, {}, {}, 0
      end
    end

    local k, pick = a, 0
    local st, sts, seen
    if ptok and ptok[a] then st, sts = ptok[a], pts[a] else st, sts, seen = tok[a], tsv[a], raw[a] end
    local avail, ts = advance(l, st, sts, origin)
    if b ~= a then
      local sb, sbts, seenb
      if ptok and ptok[b] then sb, sbts = ptok[b], pts[b] else sb, sbts, seenb = tok[b], tsv[b], raw[b] end
      local availb, tsb = advance(l, sb, sbts, origin)
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

    if last then
      if not ok then
        out[head] = '\0'
      elseif ptok and ctl % 2 == 1 then
        for j = 1, npend do
          local pk = porder[j]
          commit(pk, ptok[pk], pts[pk], plim[pk])
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

-- The writes: each key once, with the TTL until it is full again.
local dels, ndels = {}, 0
for k = 1, nkeys do
  local l = wlim[k]
  if l then
    local t = tok[k]
    if t then
      local ts = tsv[k]
      local missing = p3[l] - t
      local span
      if kind[l] == 1 then
        span = missing * p2[l] / p1[l]
      else
        local w = missing / p1[l]
        local c = w - w % 1
        if c < w then c = c + 1 end
        span = c * p2[l] * unit
      end
      -- At least a millisecond more than the time to full (rounded up).
      local x = ((ts - now) * unit + span) / 1000000
      local ms = x - x % 1 + 2
      if ms < min_ttl then ms = min_ttl end
      call('SET', keys[k], pack_s('<dd', t, ts), 'PX', ttl_texts[ms] or ttl_text(ms))
    else
      ndels = ndels + 1
      dels[ndels] = keys[k]
      if ndels == CHUNK then
        call('DEL', unpack(dels, 1, ndels))
        ndels = 0
      end
    end
  end
end
if ndels > 0 then call('DEL', unpack(dels, 1, ndels)) end

return {now, table.concat(out)}
