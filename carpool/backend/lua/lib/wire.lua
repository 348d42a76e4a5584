-- wire.lua: not a script of its own. The Lua side of the webhook formats that cross
-- Python <-> Lua; carpool/core/wire.py is the Python side, and tests/redis/test_wire.py
-- round-trips each both ways. Scripts include it (carpool/backend/connection.py: a line
-- "--#include lib/wire.lua"). The job record's own layout is lib/record.lua's.
--
-- The hook field, a record's last header field (wire.py's HookField): the events'
-- letters (r running, d done, f failed, x expired, c cancelled), a space, the URL
-- (checked: no space, tab or newline); "" when the job asked for none.
-- An outbox event (wire.py's OutboxEvent), the member of a {p.s}:outbox zset:
-- "<subject id>\t<event>\t<t_ms>\t<owner>\t<url>".
-- complete.lua's hooks (wire.py's CompletionHook): one line per job that asked for its
-- outcome's event, "<k>\t<event letter>\t<owner>\t<hook field>", "\n" between.
-- complete.lua's usage (wire.py's UsageLine): one line per owner of the batch,
-- "<owner>\t<jobs>\t<device_us>\t<queue_ms>\t<k> <device_us> <queue_ms> ...".
--
-- WIRE_EVENTS: an event's name by its letter
-- wire_hook_decode(hook) -> letters, url; nil for "" (or a field without a URL)
-- wire_event_encode(id, event, t_ms, owner, url) -> an outbox member
-- wire_event_decode(member) -> id, event, t_ms, owner, url; nil for a malformed one
-- wire_completion_hooks(text) -> an iterator of k (a number), letter, owner, hook
-- wire_usage_lines(text) -> an iterator of owner, jobs, device_us, queue_ms (numbers),
--   each (the jobs' "k device_us queue_ms" triples, a string: wire_usage_each reads it)
-- wire_usage_each(each) -> an iterator of k, device_us, queue_ms (numbers)
local WIRE_EVENTS = {r = "running", d = "done", f = "failed", x = "expired", c = "cancelled"}

local function wire_hook_decode(hook)
  if hook == "" then return nil end
  return string.match(hook, "^(%a+) (.+)$")
end

local function wire_event_encode(id, event, t_ms, owner, url)
  return id .. "\t" .. event .. "\t" .. t_ms .. "\t" .. owner .. "\t" .. url
end

local function wire_event_decode(member)
  return string.match(member, "^([^\t]+)\t([^\t]+)\t(%d+)\t([^\t]*)\t(.*)$")
end

local function wire_completion_hooks(text)
  local lines = string.gmatch(text, "(%d+)\t(%a)\t([^\t\n]*)\t([^\n]*)")
  return function()
    local k, letter, owner, hook = lines()
    if k then return tonumber(k), letter, owner, hook end
  end
end

local function wire_usage_lines(text)
  local lines = string.gmatch(text, "([^\t\n]*)\t(%d+)\t(%d+)\t(%d+)\t([^\n]*)")
  return function()
    local owner, jobs, device_us, queue_ms, each = lines()
    if owner then return owner, tonumber(jobs), tonumber(device_us), tonumber(queue_ms), each end
  end
end

local function wire_usage_each(each)
  local triples = string.gmatch(each, "(%d+) (%d+) (%d+)")
  return function()
    local k, device_us, queue_ms = triples()
    if k then return tonumber(k), tonumber(device_us), tonumber(queue_ms) end
  end
end
