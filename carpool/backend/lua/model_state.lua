-- model_state.lua: load or unload one model in the repository (Triton's repository API;
-- carpool/backend/repository.py). Each change is a new generation, which the workers
-- that may serve the model act on between batches; admit.lua refuses an unloaded model.
--
-- KEYS[1]  model_stats  {p.s}:mstats:<model> hash: unloaded ("1" while unloaded), gen
--                       (the generation, +1 per change), config (the load's override)
-- ARGV[1]  action       "load" | "unload"
-- ARGV[2]  config       load: the override, a catalogue entry as canonical JSON ("": none)
-- ARGV[3]  expect       load: the generation the caller saw settled, every live worker
--                       done with it (-1: it saw one in progress). A load of the entry in
--                       force starts a new generation only from that one, else joins the
--                       one started since: two loads at once load once.
--
-- Returns {generation, changed}: changed is 1 when this call started a generation.
local st = redis.call("HMGET", KEYS[1], "unloaded", "gen", "config")
local gen = tonumber(st[2]) or 0
if ARGV[1] == "unload" then
  if st[1] then return {gen, 0} end
  redis.call("HDEL", KEYS[1], "config")  -- cannot grow memory: works on a full Redis
  redis.call("HSET", KEYS[1], "unloaded", "1", "gen", gen + 1)
  return {gen + 1, 1}
end
if not st[1] and (st[3] or "") == ARGV[2] and gen ~= tonumber(ARGV[3]) then
  return {gen, 0}
end
redis.call("HDEL", KEYS[1], "unloaded")
if ARGV[2] == "" then
  redis.call("HDEL", KEYS[1], "config")
  redis.call("HSET", KEYS[1], "gen", gen + 1)
else
  redis.call("HSET", KEYS[1], "gen", gen + 1, "config", ARGV[2])
end
return {gen + 1, 1}
