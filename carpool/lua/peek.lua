-- peek.lua: the state of several bins in one round trip, read-only.
--
-- KEYS[i]  bin list {p}:q:<model>:<bin>
-- ARGV[1]  job key prefix "{p}:job:" (head jobs are read from it; same slot)
--
-- Returns {now_ms, depth_1, oldest_admit_ms_1, depth_2, ...};
-- oldest is -1 for an empty bin, and now_ms when the head's record has expired.
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now_ms}
for i = 1, #KEYS do
  local depth = redis.call("LLEN", KEYS[i])
  local oldest = -1
  if depth > 0 then
    local head = redis.call("LINDEX", KEYS[i], 0)
    oldest = tonumber(redis.call("HGET", ARGV[1] .. head, "t_admit")) or now_ms
  end
  out[#out + 1] = depth
  out[#out + 1] = oldest
end
return out
