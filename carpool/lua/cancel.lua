-- cancel.lua: cancel a queued job, or delete a finished one.
--
-- KEYS[1]  job hash {p.s}:job:<id>
-- ARGV[1]  id   ARGV[2] bin key prefix "{p.s}:q:" (the bin zset is <prefix><model>:<bin>,
--          read from the record; same slot)   ARGV[3] done channel   ARGV[4] result_ttl_s
-- ARGV[5]  byte-budget key prefix "{p.s}:bytes:" (same slot): a cancelled input leaves
--          its model's (and its API key's) budget, as in claim.lua
-- ARGV[6]  results channel: a deleted job's id is published there ("del <id>"), so no
--          web process answers from a result it was pushed (carpool/pushed.py)
--
-- Either way the job's idempotency key ("idem", when it still names this job) is
-- deleted: a retry with that key queues a new job instead of finding this one.
--
-- Returns "cancelled" | "deleted" | "running" (not cancellable) | "missing".
redis.replicate_commands()

local job = redis.call("HMGET", KEYS[1], "status", "model", "bin", "idem", "owner")
local status = job[1]
if not status then
  return "missing"
end
-- A claimed job's record still says "queued" (claim.lua writes none): it is running
-- when it is no longer in its bin. ZREM first: it is the check and the cancel's first
-- write at once (never refused for memory, so a full Redis still cancels).
local bin_key = ARGV[2] .. job[2] .. ":" .. job[3]
if status == "queued" and redis.call("ZREM", bin_key, ARGV[1]) == 0 then
  status = "running"
end
if status ~= "running" and job[4] then
  local prior = redis.call("GET", job[4])
  if prior and string.sub(prior, 1, #ARGV[1] + 1) == ARGV[1] .. " " then
    redis.call("DEL", job[4])
  end
end
if status == "queued" then
  -- >>> byte budget (carpool/budget.py): the input leaves the count, as in claim.lua
  local n = redis.call("HSTRLEN", KEYS[1], "input")
  local keys = {ARGV[5] .. job[2]}
  if job[5] and job[5] ~= "" then keys[2] = keys[1] .. ":" .. job[5] end
  for _, key in ipairs(keys) do
    local queued = tonumber(redis.call("HGET", key, "queued"))
    if queued and queued > n then
      redis.call("HINCRBY", key, "queued", -n)
    elseif queued then  -- its last queued byte: the hash goes
      redis.call("DEL", key)
    end
  end
  -- <<< byte budget
  local t = redis.call("TIME")
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call("HSET", KEYS[1], "status", "cancelled", "t_done", now_ms,
    "error", "cancelled by the client")
  redis.call("HDEL", KEYS[1], "input")
  redis.call("EXPIRE", KEYS[1], ARGV[4])
  redis.call("PUBLISH", ARGV[3], ARGV[1])
  return "cancelled"
end
if status == "running" then
  return "running"
end
redis.call("DEL", KEYS[1])
redis.call("PUBLISH", ARGV[6], "del " .. ARGV[1])
return "deleted"
