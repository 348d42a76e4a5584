-- gpu_release.lua: hand a GPU back and wake one worker waiting for a GPU.
--
-- KEYS[1]  gpu        the GPU lease {p}:gpu:<uuid>
-- KEYS[2]  free       the free list {p}:gpu-free: a token wakes one waiting worker (capped)
-- ARGV[1]  holder
-- ARGV[2]  uuid       the token pushed
-- ARGV[3]  free_cap   the free list's cap
--
-- Returns 1 when released, 0 when the GPU was not this holder's (its lease had
-- lapsed): a late release never frees a GPU that another worker now holds.
if redis.call("GET", KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call("DEL", KEYS[1])
redis.call("RPUSH", KEYS[2], ARGV[2])
redis.call("LTRIM", KEYS[2], -tonumber(ARGV[3]), -1)
return 1
