-- peek.lua: the state of several bins in one round trip; and, when the worker asks,
-- the batch it would claim next, claimed in the same call.
--
-- KEYS[1..n]    bin zsets {p.s}:q:<model>:<bin> of one model (one shard: carpool/backend/keys.py)
-- KEYS[n+1..2n] their stats hashes {p.s}:stats:<model>:<bin> (the "admitted" counter)
-- KEYS[2n+1..2n+3] with a request to claim ahead only: the leases zset, the model's
--               byte-budget hash and the claim hash of the request's token (claim.lua)
-- ARGV[1]       job key prefix "{p.s}:job:" (jobs are read from it; same slot)
-- ARGV[2]       a request to claim ahead (claim_batch.lua's claim_ahead), "" for none:
--               a worker that serves these bins alone, woken, claims its next batch
--               here when it is a full one, without a second round trip
-- ARGV[2+i]     bin i's max_batch (peek_bins.lua says how it bounds the jobs looked at)
--
-- Returns {now_ms, then per bin: depth, oldest_admit_ms, earliest_deadline_ms, admitted}
-- (peek_bins.lua), the states before any claim; with a request, then what claim_ahead
-- appends. Read-only without a request. complete.lua answers the same after a batch,
-- so a worker serving one model needs no peek of its own between batches.
--#include record
--#include peek_bins
--#include claim_batch
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #ARGV - 2
local bins, stats = {}, {}
for i = 1, n do
  bins[i], stats[i] = KEYS[i], KEYS[n + i]
end
local scans = {unpack(ARGV, 3, n + 2)}
local out = peek_bins(bins, stats, scans, ARGV[1], now_ms, {now_ms})
if ARGV[2] ~= "" then
  redis.replicate_commands()  -- Redis 6.2: writes after TIME
  claim_ahead(ARGV[2], {KEYS[2 * n + 1], KEYS[2 * n + 2], KEYS[2 * n + 3]}, bins, scans, 2,
    ARGV[1], now_ms, string.format("%d", now_ms), out)
end
return out
