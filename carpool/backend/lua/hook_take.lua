-- hook_take.lua: lease up to N due webhook events of one shard's outbox to a dispatcher.
--
-- KEYS[1]  outbox        {p.s}:outbox zset of events (outbox.lua), scored by due time (ms)
-- ARGV[1]  max_n         most events taken
-- ARGV[2]  lease_ms      how long a taken event is this dispatcher's: its score moves to
--                        now + lease_ms, so no other dispatcher takes it meanwhile; one
--                        that dies with it leaves it due again after the lease
-- ARGV[3]  state_prefix  "{p.s}:hook:" (same slot): each job's delivery states
--
-- Returns {now_ms, next_due_ms (-1: the outbox is empty), member_1, state_1, body_1, ...}:
-- each event taken with its delivery state so far (JSON, "" before its first try) and
-- the body its first settled try sent (field "<event>:body", "" before: the dispatcher
-- reads the job's record then), and when the earliest event still waiting is due, so a
-- dispatcher waits that long at most. Each taken event's score, now_ms + lease_ms, is
-- its lease: hook_settle.lua writes only for the holder of that lease.
--
-- Keys built here, not in KEYS: each taken event's delivery states, state_prefix .. id
-- (which events are due is data read here), in KEYS[1]'s hash tag
-- (carpool/backend/keys.py). Members are lib/wire.lua's outbox events.
--#include lib/wire.lua
redis.replicate_commands()
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now_ms, "LIMIT", 0, tonumber(ARGV[1]))
local out = {now_ms, -1}
if #due > 0 then
  local leased = {}
  for i, member in ipairs(due) do
    leased[2 * i - 1] = now_ms + tonumber(ARGV[2])
    leased[2 * i] = member
    local id, event = wire_event_decode(member)
    out[#out + 1] = member
    out[#out + 1] = (id and redis.call("HGET", ARGV[3] .. id, event)) or ""
    out[#out + 1] = (id and redis.call("HGET", ARGV[3] .. id, event .. ":body")) or ""
  end
  redis.call("ZADD", KEYS[1], "XX", unpack(leased))
end
local head = redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")
if #head > 0 then out[2] = math.floor(tonumber(head[2])) end
return out
