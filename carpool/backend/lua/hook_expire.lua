-- hook_expire.lua: dead-letter the webhook events of one outbox that are overdue past
-- their max age, a bounded number per call. An event due that long ago was taken by no
-- dispatcher (its model left the catalogue, or no dispatcher ran): by the delivery rule
-- (docs/webhooks.md) it is dead anyway, and without this it would stay forever.
--
-- KEYS[1]  outbox        {p.s}:outbox zset of events (outbox.lua), scored by due time (ms)
-- KEYS[2]  dead          {p.s}:hook-dead  dead-lettered deliveries, newest first, capped
-- ARGV[1]  max_age_ms    events due before Redis's now minus this are expired
-- ARGV[2]  max_n         most events expired by this call
-- ARGV[3]  dead_cap      the dead list's cap
--
-- Returns the number of events expired. Members are lib/wire.lua's outbox events.
--#include lib/wire.lua
redis.replicate_commands()
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", "(" .. (now_ms - tonumber(ARGV[1])),
  "LIMIT", 0, tonumber(ARGV[2]))
for _, member in ipairs(stale) do
  local id, event, t_ms, _owner, url = wire_event_decode(member)
  redis.call("ZREM", KEYS[1], member)
  redis.call("LPUSH", KEYS[2], cjson.encode({id = id or member, event = event or "",
    url = url or "", state = "dead", attempts = 0, last_status = cjson.null,
    last_error = "no dispatcher took it within CARPOOL_WEBHOOK_MAX_AGE_S",
    t_event_ms = tonumber(t_ms) or 0}))
end
if #stale > 0 then redis.call("LTRIM", KEYS[2], 0, tonumber(ARGV[3]) - 1) end
return #stale
