-- renew.lua: push back the lease deadline of the jobs one claim still holds.
--
-- KEYS[1]  leases  {p.s}:leases  zset id -> lease deadline (ms)
-- ARGV[1]  lease token of the claim   ARGV[2] lease_ms   ARGV[3] job key prefix "{p.s}:job:"
-- ARGV[4..] the claim's job ids
--
-- Returns {now_ms, held_1, held_2, ...}: 1 renewed, 0 no longer this claim's (reaped,
-- finished, or expired), in the order of the ids. Touches only the leases zset.
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease_until = now_ms + tonumber(ARGV[2])
local out = {now_ms}
for i = 4, #ARGV do
  local id = ARGV[i]
  local job = redis.call("HMGET", ARGV[3] .. id, "status", "lease")
  if job[1] == "running" and job[2] == ARGV[1] then
    -- ZREM before ZADD: Redis refuses a script for being out of memory only at its
    -- first write, and only if that write may grow memory (ZADD may, ZREM cannot).
    -- So a renewal still goes through when Redis is full (noeviction).
    redis.call("ZREM", KEYS[1], id)
    redis.call("ZADD", KEYS[1], lease_until, id)
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
return out
