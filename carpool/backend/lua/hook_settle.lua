-- hook_settle.lua: record how one try of one webhook event went, and what comes next.
--
-- KEYS[1]  outbox       {p.s}:outbox (hook_take.lua leased the event)
-- KEYS[2]  state        {p.s}:hook:<id>  the job's delivery states, event -> JSON, and
--                       "<event>:body" -> the body of a retried event
-- KEYS[3]  dead         {p.s}:hook-dead  dead-lettered deliveries, newest first, capped
-- KEYS[4]  record       {p.s}:job:<id>  the job's record (its TTL bounds the state's)
-- ARGV[1]  member       the event, as the outbox holds it
-- ARGV[2]  event        its name (the state hash's field)
-- ARGV[3]  outcome      "delivered" | "retry" | "dead"
-- ARGV[4]  delay_ms     with "retry": the event is due again this long from now
-- ARGV[5]  state_json   the event's delivery state after this try (JSON)
-- ARGV[6]  state_ttl_s  while retrying, the state hash lives this long after its change
-- ARGV[7]  dead_cap     the dead list's cap
-- ARGV[8]  dead_entry   with "dead": what the dead list keeps of it (JSON)
-- ARGV[9]  leased_ms    the event's score when this dispatcher took it: its lease
-- ARGV[10] body         with "retry": the body this try sent, kept for every later try
--                       (the first kept wins), so a retry after the record expired still
--                       carries the result
--
-- Only the lease's holder settles: the event still in the outbox with the score it was
-- leased at. A try that outlived its lease (another dispatcher took the event, and may
-- have delivered it) changes nothing, so a late "retry" never overwrites a later
-- "delivered". "delivered" and "dead" take the event out of the outbox and drop its
-- body; the state then lives as long as the job's record, which shows it (a record
-- without a TTL yet: state_ttl_s; a record gone: the state goes too), or as long as it
-- already would while another event of the job still retries. "retry" moves its due
-- time. Returns 1 when this call settled the event, 0 when it no longer held it.
redis.replicate_commands()
local score = redis.call("ZSCORE", KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[9]) then return 0 end
local body_field = ARGV[2] .. ":body"
redis.call("HSET", KEYS[2], ARGV[2], ARGV[5])
if ARGV[3] == "retry" then
  local t = redis.call("TIME")
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call("ZADD", KEYS[1], "XX", now_ms + tonumber(ARGV[4]), ARGV[1])
  if ARGV[10] ~= "" then redis.call("HSETNX", KEYS[2], body_field, ARGV[10]) end
  redis.call("EXPIRE", KEYS[2], tonumber(ARGV[6]))
  return 1
end
redis.call("ZREM", KEYS[1], ARGV[1])
redis.call("HDEL", KEYS[2], body_field)
local ttl_ms = redis.call("PTTL", KEYS[4])
if ttl_ms == -1 then ttl_ms = tonumber(ARGV[6]) * 1000 end
for _, f in ipairs(redis.call("HKEYS", KEYS[2])) do
  if string.find(f, ":body", 1, true) then  -- another event still retries: keep its body
    ttl_ms = math.max(ttl_ms, redis.call("PTTL", KEYS[2]))
    break
  end
end
if ttl_ms > 0 then redis.call("PEXPIRE", KEYS[2], ttl_ms) else redis.call("DEL", KEYS[2]) end
if ARGV[3] == "dead" then
  redis.call("LPUSH", KEYS[3], ARGV[8])
  redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[7]) - 1)
end
return 1
