-- peek_bins.lua: not a script of its own. Scripts that answer with bin states (peek.lua,
-- complete.lua) include it (carpool/backend/connection.py: a line
-- "--#include lib/peek_bins.lua").
--
-- peek_bins(bin_keys, stats_keys, scans, job_prefix, now_ms, out) appends to `out`, per
-- bin: depth, oldest_admit_ms, earliest_deadline_ms, admitted. `scans[i]` is bin i's
-- max_batch: a bin holding fewer has every job looked at (its next batch takes them
-- all); a full bin leaves at once anyway, so only its head (the most urgent job) is:
-- a peek costs O(max_batch) at most. oldest and earliest are over the jobs looked at;
-- oldest is -1 for an empty bin and now_ms for a job whose record is gone; earliest is
-- 0 when none has a deadline. Read-only. Needs record.lua included before it.
local HEAD_PEEK_BYTES = 64  -- status, attempts, t_admit and deadline fit: ~40 bytes

local function peek_bins(bin_keys, stats_keys, scans, job_prefix, now_ms, out)
  for i = 1, #bin_keys do
    local depth = redis.call("ZCARD", bin_keys[i])
    local oldest, earliest = -1, 0
    if depth > 0 then
      local look = tonumber(scans[i])
      if depth >= look then look = 1 end
      -- The head of each record (carpool/backend/records.py: t_admit and deadline are its third
      -- and fourth fields), never its input.
      for _, id in ipairs(redis.call("ZRANGE", bin_keys[i], 0, look - 1)) do
        local t_admit, deadline_s = record_times(
          redis.call("GETRANGE", job_prefix .. id, 0, HEAD_PEEK_BYTES - 1))
        local admitted = tonumber(t_admit) or now_ms
        if oldest < 0 or admitted < oldest then oldest = admitted end
        local deadline = tonumber(deadline_s) or 0
        if deadline > 0 and (earliest == 0 or deadline < earliest) then earliest = deadline end
      end
    end
    out[#out + 1] = depth
    out[#out + 1] = oldest
    out[#out + 1] = earliest
    out[#out + 1] = tonumber(redis.call("HGET", stats_keys[i], "admitted")) or 0
  end
  return out
end
