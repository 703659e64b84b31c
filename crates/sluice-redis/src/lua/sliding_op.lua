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
