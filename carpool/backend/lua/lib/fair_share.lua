-- fair_share.lua: not a script of its own. admit.lua's reading of the owners' state for
-- fair share (docs/admission.md, "Fair share between tenants"); read-only.
--
-- The tenants hash ({p.s}:tenants:<model>:<bin>) holds, per owner, "decayed admissions,
-- as of ms, weight, virtual clock (us)", read once per call (all jobs of a call have one
-- owner) and written back once by admit.lua.
--
-- fair_owner_state(tenants_key, owner, weight, all, now_ms, now_us, tau_ms) ->
--   mine (the owner's decayed admissions), clock_us (its virtual clock; 0: none),
--   sum_c, sum_w (the active owners' admissions and weights, the owner's counted),
--   forgotten (owners idle for ~5 tau: admit.lua drops them, so the hash stays small).
-- With `all` false only the owner's own field is read (the share cannot be judged:
-- the bin is not near its bound), and sum_c, sum_w count it alone.

local function fair_owner_state(tenants_key, owner, weight, all, now_ms, now_us, tau_ms)
  local mine, clock_us, sum_c, sum_w, forgotten = 0, 0, 0, 0, {}
  local fields, found = {}, false
  if all then
    fields = redis.call("HGETALL", tenants_key)
  else
    local prev = redis.call("HGET", tenants_key, owner)
    if prev then fields = {owner, prev} end
  end
  for i = 1, #fields, 2 do
    local c, ct, wt, v = string.match(fields[i + 1], "(%S+) (%S+) (%S+) ?(%S*)")
    c, v = tonumber(c) * math.exp(-(now_ms - tonumber(ct)) / tau_ms), tonumber(v) or 0
    if fields[i] == owner then
      mine, clock_us, found = c, v, true
    elseif c < 0.01 and v < now_us then
      forgotten[#forgotten + 1] = fields[i]
    end
    if c >= 0.5 or fields[i] == owner then  -- active: one admission within ~0.7 tau
      sum_c, sum_w = sum_c + c, sum_w + tonumber(wt)
    end
  end
  if not found then sum_w = sum_w + weight end
  return mine, clock_us, sum_c, sum_w, forgotten
end
