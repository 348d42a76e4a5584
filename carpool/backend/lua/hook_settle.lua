-- hook_settle.lua: record how one try of one webhook event went, and what comes next.
--
-- KEYS[1]  outbox       {p.s}:outbox (hook_take.lua leased the event)
-- KEYS[2]  state        {p.s}:hook:<id>  the job's delivery states, event -> JSON
-- KEYS[3]  dead         {p.s}:hook-dead  dead-lettered deliveries, newest first, capped
-- ARGV[1]  member       the event, as the outbox holds it
-- ARGV[2]  event        its name (the state hash's field)
-- ARGV[3]  outcome      "delivered" | "retry" | "dead"
-- ARGV[4]  delay_ms     with "retry": the event is due again this long from now
-- ARGV[5]  state_json   the event's delivery state after this try (JSON)
-- ARGV[6]  state_ttl_s  the state hash lives this long after its last change
-- ARGV[7]  dead_cap     the dead list's cap
-- ARGV[8]  dead_entry   with "dead": what the dead list keeps of it (JSON)
--
-- "delivered" and "dead" take the event out of the outbox; "retry" moves its due time
-- (XX: an event another dispatcher settled meanwhile, after this one's lease lapsed,
-- is not put back). The state is written either way. Returns 1 when the event was
-- still in the outbox, 0 when another dispatcher had settled it.
redis.replicate_commands()
local held = redis.call("ZSCORE", KEYS[1], ARGV[1]) and 1 or 0
if ARGV[3] == "retry" then
  local t = redis.call("TIME")
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call("ZADD", KEYS[1], "XX", now_ms + tonumber(ARGV[4]), ARGV[1])
else
  redis.call("ZREM", KEYS[1], ARGV[1])
end
redis.call("HSET", KEYS[2], ARGV[2], ARGV[5])
redis.call("EXPIRE", KEYS[2], tonumber(ARGV[6]))
if ARGV[3] == "dead" and held == 1 then
  redis.call("LPUSH", KEYS[3], ARGV[8])
  redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[7]) - 1)
end
return held
