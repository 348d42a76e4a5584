-- gpu_claim.lua: give one worker one free GPU, under a lease.
--
-- KEYS[1..n]  gpus    GPU leases {p}:gpu:<uuid_i>, strings: the holder's name, expiring
--                      with the lease; one key per candidate GPU, in the order to try them
-- ARGV[1]  holder      the worker's node name (unique per worker, stable across a
--                      restart of the same container)
-- ARGV[2]  lease_ms
--
-- Returns {i, 0} when the GPU of KEYS[i] is now this holder's, or {0, wait_ms}
-- when every GPU is held, wait_ms being the least time left on any lease (when
-- the next one could come free unless renewed).
-- A GPU this holder already holds comes first: a worker restarted in the same
-- container takes its own GPU back at once instead of waiting out its lease.
local lease_ms = tonumber(ARGV[2])
for i = 1, #KEYS do
  if redis.call("GET", KEYS[i]) == ARGV[1] then
    redis.call("PEXPIRE", KEYS[i], lease_ms)
    return {i, 0}
  end
end
local wait_ms = lease_ms
for i = 1, #KEYS do
  if redis.call("SET", KEYS[i], ARGV[1], "NX", "PX", lease_ms) then
    return {i, 0}
  end
  local left = redis.call("PTTL", KEYS[i])
  if left >= 0 and left < wait_ms then
    wait_ms = left
  end
end
return {0, wait_ms}
