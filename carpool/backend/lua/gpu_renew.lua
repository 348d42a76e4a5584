-- gpu_renew.lua: extend a worker's lease on its GPU.
--
-- KEYS[1]  gpu       the GPU lease {p}:gpu:<uuid>
-- ARGV[1]  holder
-- ARGV[2]  lease_ms
--
-- Returns "renewed" (still this holder's), "retaken" (the lease had lapsed and
-- nobody took the GPU: it is this holder's again), or the name of the worker
-- that holds it now (the lease lapsed and another worker claimed it).
local holder = redis.call("GET", KEYS[1])
if holder == ARGV[1] then
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[2]))
  return "renewed"
end
if not holder then
  redis.call("SET", KEYS[1], ARGV[1], "PX", tonumber(ARGV[2]))
  return "retaken"
end
return holder
