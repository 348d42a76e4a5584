-- outbox.lua: not a script of its own. Scripts that change a job's state include it
-- (carpool/backend/connection.py: a line "--#include lib/outbox.lua") to record the
-- webhook event of that change in the same call, so a crash between the change and
-- the delivery loses nothing (docs/webhooks.md).
--
-- A job asks for webhooks with its record's last header field, "hook": the events'
-- letters (carpool/core/webhooks.py: r running, d done, f failed, x expired,
-- c cancelled), a space, the URL. Empty for almost every job: the byte before the
-- head's end is then the tab before it, so a job without one costs one byte compare.
--
-- The shard's outbox {p.s}:outbox is a zset of events scored by when each is due (ms):
-- "<id>\t<event>\t<t_ms>\t<owner>\t<url>", one member per (job, event), due at once
-- when added; the dispatcher leases and settles them (hook_take.lua, hook_settle.lua).
-- Its wake list {p.s}:hook-wake gets one token per call that added any.
--
-- hook_of_head(rec, stop) -> the hook field of a record whose head ends before `stop`
--   (its newline), "" when none
-- hook_of_admission(admission) -> the same, from the admission fields (record.lua)
-- outbox_add(outbox, id, letter, hook, owner, now_s) -> 1 when the hook asks for the
--   event with this letter (and it was added), else 0
-- outbox_wake(wake, added) -> pushes one token when added > 0 (capped list)
local HOOK_EVENTS = {r = "running", d = "done", f = "failed", x = "expired", c = "cancelled"}
local HOOK_WAKE_CAP = 16

local function hook_of_head(rec, stop)
  if stop < 2 or string.byte(rec, stop - 1) == 9 then return "" end
  return string.match(string.sub(rec, 1, stop - 1), "\t([^\t]*)$") or ""
end

local function hook_of_admission(admission)
  if #admission == 0 or string.byte(admission, -1) == 9 then return "" end
  return string.match(admission, "\t([^\t]*)$") or ""
end

local function outbox_add(outbox, id, letter, hook, owner, now_s)
  if hook == "" then return 0 end
  local letters, url = string.match(hook, "^(%a+) (.+)$")
  if not letters or not string.find(letters, letter, 1, true) then return 0 end
  redis.call("ZADD", outbox, now_s, id .. "\t" .. HOOK_EVENTS[letter] .. "\t" .. now_s ..
    "\t" .. owner .. "\t" .. url)
  return 1
end

local function outbox_wake(wake, added)
  if added > 0 then
    redis.call("RPUSH", wake, "1")
    redis.call("LTRIM", wake, -HOOK_WAKE_CAP, -1)
  end
end
