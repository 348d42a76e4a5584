-- pinned.lua: how many of one model's jobs are queued and running, read at one instant:
-- a retiring version has drained once both are 0 (carpool/backend/rollouts.py). Read-only.
--
-- KEYS[1]     leases        {p.s}:leases zset of the model's shard: its claims' tokens
-- KEYS[2..]   bins          the model's bin zsets {p.s}:q:<model>:<bin> (same slot)
-- ARGV[1]     claim_prefix  "{p.s}:claim:" (a claim hash is <prefix><token>; same slot)
--
-- Returns {queued, running}: the bins' jobs, and the jobs the shard's claims hold (a
-- claim hash holds its ids and the fields "t" and "w"). A job taken back from a lost
-- lease is in one of the two at every instant, so neither count misses it. Another
-- model whose shard tag is the same (1 in 2^24) adds its running jobs: a drain then
-- waits for them too, never ends early.
--
-- Keys built here, not in KEYS: the claim hashes, claim_prefix .. token, in KEYS[1]'s
-- hash tag (carpool/backend/keys.py).
local queued = 0
for i = 2, #KEYS do queued = queued + redis.call("ZCARD", KEYS[i]) end
local running = 0
for _, token in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
  running = running + math.max(0, redis.call("HLEN", ARGV[1] .. token) - 2)
end
return {queued, running}
