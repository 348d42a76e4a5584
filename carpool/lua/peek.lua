-- peek.lua: the state of several bins in one round trip, read-only.
--
-- KEYS[1..n]    bin zsets {p.s}:q:<model>:<bin> of one model (one shard: carpool/keys.py)
-- KEYS[n+1..2n] their stats hashes {p.s}:stats:<model>:<bin> (the "admitted" counter)
-- ARGV[1]       job key prefix "{p.s}:job:" (jobs are read from it; same slot)
-- ARGV[1+i]     bin i's max_batch: a bin holding fewer has every job looked at (its next
--               batch takes them all); a full bin leaves at once anyway, so only its
--               head (the most urgent job) is: a peek costs O(max_batch) at most
--
-- Returns {now_ms, then per bin: depth, oldest_admit_ms, earliest_deadline_ms, admitted}.
-- oldest and earliest are over the jobs looked at; oldest is -1 for an empty bin and
-- now_ms for a job whose record has expired; earliest is 0 when none has a deadline.
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now_ms}
local n = #KEYS / 2
for i = 1, n do
  local depth = redis.call("ZCARD", KEYS[i])
  local oldest, earliest = -1, 0
  if depth > 0 then
    local look = tonumber(ARGV[1 + i])
    if depth >= look then look = 1 end
    local ids = redis.call("ZRANGE", KEYS[i], 0, look - 1)
    for _, id in ipairs(ids) do
      local job = redis.call("HMGET", ARGV[1] .. id, "t_admit", "deadline")
      local admitted = tonumber(job[1]) or now_ms
      if oldest < 0 or admitted < oldest then oldest = admitted end
      local deadline = tonumber(job[2]) or 0
      if deadline > 0 and (earliest == 0 or deadline < earliest) then earliest = deadline end
    end
  end
  out[#out + 1] = depth
  out[#out + 1] = oldest
  out[#out + 1] = earliest
  out[#out + 1] = tonumber(redis.call("HGET", KEYS[n + i], "admitted")) or 0
end
return out
