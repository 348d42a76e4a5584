-- renew.lua: push back the lease deadline of one claim, for all the jobs it still holds.
--
-- KEYS[1]  leases    {p.s}:leases  zset lease token -> lease deadline (ms)
-- KEYS[2]  claim     {p.s}:claim:<token> (claim.lua)
-- ARGV[1]  token     lease token of the claim
-- ARGV[2]  lease_ms
-- ARGV[3..] ids      the claim's job ids
--
-- Returns {now_ms, held_1, held_2, ...}: 1 renewed, 0 no longer this claim's (reaped,
-- finished, or handed back), in the order of the ids. One lease per claim: the cost
-- does not grow with the batch.
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now_ms}
if #ARGV < 3 then return out end
local held = {}
if redis.call("ZSCORE", KEYS[1], ARGV[1]) then  -- else reaped, or its jobs all ended
  held = redis.call("HMGET", KEYS[2], unpack(ARGV, 3))
  -- ZREM before ZADD: Redis refuses a script for being out of memory only at its first
  -- write, and only if that write may grow memory (ZADD may, ZREM cannot). So a
  -- renewal still goes through when Redis is full (noeviction).
  redis.call("ZREM", KEYS[1], ARGV[1])
  redis.call("ZADD", KEYS[1], now_ms + tonumber(ARGV[2]), ARGV[1])
end
for i = 3, #ARGV do
  if held[i - 2] then out[#out + 1] = 1 else out[#out + 1] = 0 end
end
return out
