-- heartbeat.lua: say which models one worker serves, which it refused (and why) and
-- which it is still loading, until a deadline; or withdraw the worker. Lapsed entries
-- (dead workers) are dropped.
--
-- KEYS[1]  workers  {p}:workers  hash worker -> "<until_ms> <JSON>"
-- ARGV[1]  worker   the worker's name
-- ARGV[2]  ttl_ms   the entry holds until now + ttl_ms; 0 withdraws the worker's entry
-- ARGV[3]  doc      JSON {"served": [model, ...], "refused": {model: reason},
--                   "loading": [model, ...]} (unread here)
--
-- Returns now_ms (Redis time). The hash holds one field per live worker, plus those
-- lapsed since the last heartbeat of any worker: readers skip entries whose until_ms
-- has passed, on Redis's clock, so hosts' clocks never matter.
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local entries = redis.call("HGETALL", KEYS[1])
for i = 1, #entries, 2 do
  local until_ms = tonumber(string.match(entries[i + 1], "^%d+")) or 0
  if until_ms < now_ms then
    redis.call("HDEL", KEYS[1], entries[i])
  end
end
local ttl_ms = tonumber(ARGV[2])
if ttl_ms > 0 then
  redis.call("HSET", KEYS[1], ARGV[1], tostring(now_ms + ttl_ms) .. " " .. ARGV[3])
else
  redis.call("HDEL", KEYS[1], ARGV[1])
end
return now_ms
