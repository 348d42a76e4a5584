-- coming.lua: say how many workers are starting for a model and when they will serve
-- (`carpool up`'s autoscaler, carpool/backend/coming.py), so that admission counts
-- them from then on (lib/pace.lua, model_coming) instead of refusing a surge for
-- capacity that arrives in seconds.
--
-- KEYS[1]  model_stats  {p.s}:mstats:<model> hash: coming_n, coming_at (Redis ms)
-- ARGV[1]  starting     how many workers are starting
-- ARGV[2]  ready_in_ms  they serve this long from now (their cold start, less what passed)
--
-- Returns now_ms (Redis time). Writing 0 workers leaves the last entry: once they serve,
-- it fades over the drain rate's tau as the pace learns them, then admit.lua ignores it.
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local starting = tonumber(ARGV[1])
if starting > 0 then
  redis.call("HSET", KEYS[1], "coming_n", starting,
    "coming_at", now_ms + math.max(0, tonumber(ARGV[2])))
end
return now_ms
