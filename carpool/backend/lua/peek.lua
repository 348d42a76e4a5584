-- peek.lua: the state of several bins of one model in one round trip. Read-only.
--
-- KEYS[1..n]    bins        bin zsets {p.s}:q:<model>:<bin> of one model (one shard:
--                           carpool/backend/keys.py)
-- KEYS[n+1..2n] stats       their stats hashes {p.s}:stats:<model>:<bin> (the "admitted"
--                           counter)
-- ARGV[1]       job_prefix  "{p.s}:job:" (jobs are read from it; same slot)
-- ARGV[2..]     scans       bin i's max_batch at ARGV[1+i] (peek_bins.lua says how it
--                           bounds the jobs looked at)
--
-- Returns {now_ms, then per bin: depth, oldest_admit_ms, earliest_deadline_ms, admitted}
-- (peek_bins.lua). complete.lua answers the same after a batch, so a worker serving one
-- model needs no peek of its own between batches.
--
-- Keys built here, not in KEYS: the records of the jobs looked at (job_prefix .. id, ids
-- read from the bins), in KEYS[1]'s hash tag (carpool/backend/keys.py).
--#include lib/record.lua
--#include lib/peek_bins.lua
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS / 2
local bins, stats = {}, {}
for i = 1, n do
  bins[i], stats[i] = KEYS[i], KEYS[n + i]
end
return peek_bins(bins, stats, {unpack(ARGV, 2, n + 1)}, ARGV[1], now_ms, {now_ms})
