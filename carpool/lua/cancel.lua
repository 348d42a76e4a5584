-- cancel.lua: cancel a queued job, or delete a finished one.
--
-- KEYS[1]  job hash {p.s}:job:<id>
-- ARGV[1]  id   ARGV[2] bin key prefix "{p.s}:q:" (the bin zset is <prefix><model>:<bin>,
--          read from the record; same slot)   ARGV[3] done channel   ARGV[4] result_ttl_s
--
-- Returns "cancelled" | "deleted" | "running" (not cancellable) | "missing".
redis.replicate_commands()

local job = redis.call("HMGET", KEYS[1], "status", "model", "bin")
local status = job[1]
if not status then
  return "missing"
end
if status == "queued" then
  redis.call("ZREM", ARGV[2] .. job[2] .. ":" .. job[3], ARGV[1])
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
return "deleted"
