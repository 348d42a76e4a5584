-- budget.lua: not a script of its own. Scripts that queue inputs or take them off a bin
-- include it (carpool/backend/connection.py: a line "--#include lib/budget.lua"): the
-- byte budget (carpool/admission/budget.py), the queued input bytes of a model, and of
-- each API key, in the field "queued" of {p.s}:bytes:<model> and
-- {p.s}:bytes:<model>:<owner> (same slot).
--
-- budget_fit(budgets, input_bytes, n) -> the first jobs of n that fit, and nil or the
--   {scope, held_bytes, budget_bytes} of the first that did not; budgets: {key, budget,
--   scope} each, input_bytes[i]: job i's
-- budget_count(budgets, input_bytes, n) adds the first n jobs' bytes to every budget
-- budget_free(freed) takes bytes off: freed maps a budget key to the bytes leaving it;
--   a hash goes with its last queued byte (at 0, or below: a requeued job, by reap or
--   release, was counted once)
local function budget_fit(budgets, input_bytes, n)
  if #budgets == 0 then return n, nil end
  local held = {}
  for k, b in ipairs(budgets) do held[k] = tonumber(redis.call("HGET", b[1], "queued")) or 0 end
  local sum = 0
  for i = 1, n do
    for k, b in ipairs(budgets) do
      if held[k] + sum + input_bytes[i] > b[2] then
        return i - 1, {b[3], held[k] + sum, b[2]}
      end
    end
    sum = sum + input_bytes[i]
  end
  return n, nil
end

local function budget_count(budgets, input_bytes, n)
  if #budgets == 0 then return end
  local sum = 0
  for i = 1, n do sum = sum + input_bytes[i] end
  for _, b in ipairs(budgets) do redis.call("HINCRBY", b[1], "queued", sum) end
end

local function budget_free(freed)
  for key, n in pairs(freed) do
    local queued = tonumber(redis.call("HGET", key, "queued"))
    if queued and queued > n then
      redis.call("HINCRBY", key, "queued", -n)
    elseif queued then
      redis.call("DEL", key)
    end
  end
end
