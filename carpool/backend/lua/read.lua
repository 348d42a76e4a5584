-- read.lua: job records as GET /result reads them, never an input.
--
-- KEYS[1..n]  jobs        job records {p.s}:job:<id> of one shard (carpool/backend/records.py)
-- ARGV[1]     bin_prefix  "{p.s}:q:" (a bin is <prefix><model>:<bin>; same slot)
-- ARGV[2]     job_prefix  "{p.s}:job:" (a key is <prefix><id>)
--
-- Returns per key: its record; a queued one cut at the end of its head (its input,
-- which may be a large image, stays in Redis) and followed by its place in its bin
-- (ZRANK, 0 = next; "<head>\n<rank>"), and saying "running" when its job is
-- no longer in its bin (a claim holds it: claim.lua writes no record); false (nil)
-- when there is none. Record and bin are read in one script, so a job claimed and
-- finished meanwhile cannot read as running. Each record's first READ_BYTES are read
-- first: a queued record's head and most ended records fit, so an input is never
-- copied whole; a longer ended record is then read whole. A key that is not a string
-- (a record of an older layout) reads as none.
--
-- Keys built here, not in KEYS: a queued job's bin, named by its record, in KEYS[1]'s
-- hash tag (carpool/backend/keys.py).
--#include lib/record.lua
local READ_BYTES = 4096
local out = {}
for i, key in ipairs(KEYS) do
  local part = redis.pcall("GETRANGE", key, 0, READ_BYTES - 1)
  if type(part) ~= "string" or part == "" then
    out[i] = false
  elseif string.byte(part, 1) == 113 then  -- "q": queued, its head alone
    local head = string.sub(part, 1, (string.find(part, "\n", 1, true) or 0) - 1)
    local _, _, admission = record_head(head)
    local _, model, bin = record_place(admission)
    local id = string.sub(key, #ARGV[2] + 1)
    local rank = bin and redis.call("ZRANK", ARGV[1] .. model .. ":" .. bin, id)
    if bin and not rank then
      head = "running" .. string.sub(head, 7)
    elseif rank then
      head = head .. "\n" .. rank
    end
    out[i] = head
  elseif #part < READ_BYTES then
    out[i] = part
  else
    out[i] = redis.call("GET", key)
  end
end
return out
