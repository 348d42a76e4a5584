-- read.lua: job records as GET /result reads them, never an input.
--
-- KEYS[1..n]  job records {p.s}:job:<id> of one shard (carpool/records.py)
--
-- Returns per key: its record, a queued one cut at the end of its head (its input,
-- which may be a large image, stays in Redis); false (nil) when there is none. Each
-- record's first READ_BYTES are read first: a queued record's head and most ended
-- records fit, so an input is never copied whole; a longer ended record is then read
-- whole. A key that is not a string (a record of an older layout) reads as none.
local READ_BYTES = 4096
local out = {}
for i, key in ipairs(KEYS) do
  local part = redis.pcall("GETRANGE", key, 0, READ_BYTES - 1)
  if type(part) ~= "string" or part == "" then
    out[i] = false
  elseif string.byte(part, 1) == 113 then  -- "q": queued, its head alone
    out[i] = string.sub(part, 1, (string.find(part, "\n", 1, true) or 0) - 1)
  elseif #part < READ_BYTES then
    out[i] = part
  else
    out[i] = redis.call("GET", key)
  end
end
return out
