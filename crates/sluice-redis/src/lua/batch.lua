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
