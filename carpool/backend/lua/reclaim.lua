-- reclaim.lua: a worker starting under a name ends, at once, the leases its dead
-- predecessor of that name held, so the reaper takes their jobs back now instead of
-- when the leases run out (Sidekiq's super_fetch does the same for a restarted
-- process). The name is held by the process now starting: whoever held it is gone.
--
-- KEYS[1]  leases  {p.s}:leases  zset lease token -> lease deadline (ms)
-- ARGV[1]  token_prefix  "<worker name>:": every claim token a worker makes starts so
--
-- Each matching claim's lease deadline becomes 0 (expired), nothing else: reap.lua
-- then takes its jobs back as for any dead worker (their attempt counted: they were
-- in a batch whose worker died). The zset holds one entry per live claim, a few per
-- worker, so reading it whole is cheap.
--
-- Returns the number of claims whose lease it ended.
local n = 0
local prefix = ARGV[1]
for _, token in ipairs(redis.call("ZRANGE", KEYS[1], 0, -1)) do
  if string.sub(token, 1, #prefix) == prefix then
    redis.call("ZADD", KEYS[1], "XX", 0, token)
    n = n + 1
  end
end
return n
