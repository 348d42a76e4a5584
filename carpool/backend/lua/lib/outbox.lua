-- outbox.lua: not a script of its own. Scripts that change a job's state include it
-- (carpool/backend/connection.py: a line "--#include lib/outbox.lua") to record the
-- webhook event of that change in the same call, so a crash between the change and
-- the delivery loses nothing (docs/webhooks.md). Its formats are lib/wire.lua's.
--
-- A job asks for webhooks with its record's last header field, "hook" (lib/record.lua's
-- record_hook reads it; lib/wire.lua's wire_hook_decode splits it). The shard's outbox
-- {p.s}:outbox is a zset of events scored by when each is due (ms), one member per
-- (job, event), due at once when added; the dispatcher leases and settles them
-- (hook_take.lua, hook_settle.lua). Its wake list {p.s}:hook-wake gets one token per
-- call that added any. Both are KEYS of every script that includes this.
--
-- outbox_add(outbox, id, letter, hook, owner, now_s) -> 1 when the hook asks for the
--   event with this letter (and it was added), else 0
-- outbox_wake(wake, added) -> pushes one token when added > 0 (capped list)
--#include lib/wire.lua
local HOOK_WAKE_CAP = 16

local function outbox_add(outbox, id, letter, hook, owner, now_s)
  local letters, url = wire_hook_decode(hook)
  if not letters or not string.find(letters, letter, 1, true) then return 0 end
  redis.call("ZADD", outbox, now_s, wire_event_encode(id, WIRE_EVENTS[letter], now_s, owner,
    url))
  return 1
end

local function outbox_wake(wake, added)
  if added > 0 then
    redis.call("RPUSH", wake, "1")
    redis.call("LTRIM", wake, -HOOK_WAKE_CAP, -1)
  end
end
