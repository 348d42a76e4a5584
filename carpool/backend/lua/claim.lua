-- claim.lua: take up to N of one bin's most urgent jobs and lease them to one worker.
--
-- KEYS[1]  bin zset  {p.s}:q:<model>:<bin>  (lowest score = most urgent first)
-- KEYS[2]  leases    {p.s}:leases  zset lease token -> lease deadline (ms)
-- ARGV[1]  max_n     ARGV[2] lease_ms   ARGV[3] lease token (unique per claim)
-- ARGV[4]  job key prefix "{p.s}:job:"     ARGV[5] worker name
-- ARGV[6]  done channel                  ARGV[7] result_ttl_s
-- ARGV[8]  most ids to take off the bin in this call, live or not (>= max_n): a
--          backlog of expired jobs is cleared a bounded slice at a time
-- ARGV[9]  queued_ttl_s: a job admitted longer ago ends "expired" here (a queued
--          record has no TTL: admit.lua)
-- KEYS[3]  the model's byte-budget hash {p.s}:bytes:<model> (admit.lua): each input
--          taken off the bin leaves its count, and its API key's
--          ({p.s}:bytes:<model>:<owner>, same slot)
-- KEYS[4]  the claim hash {p.s}:claim:<token>: the ids it leases, each with its attempt
--          count as of this claim, its time ("t") and worker ("w"); renew, release, reap
--          and complete act on it, once per claim rather than once per job
--
-- Returns {now_ms, expired, id_1, record_1, id_2, record_2, ...}, most urgent first: each
-- record whole, as MGET read it (carpool/backend/records.py's `claimed` takes the attempt
-- count, the admission fields and the input out of it in the worker; cutting them out
-- here would cost Redis a string each). Ids whose record is gone are dropped; jobs whose deadline has passed,
-- or queued longer than ARGV[9], end "expired" here, are never computed, and their
-- places go to the next jobs: `expired` counts them, so the worker that decided it
-- counts each expiry once (carpool_jobs_expired_total). Per slice taken off the bin: one
-- MGET of the records, inputs included (carpool/backend/records.py); per claim: one HSET of the claim
-- hash and one ZADD of its token into the leases zset.
--
-- A claimed job's record is not written: it still says "queued", and the claim hash
-- holding it (out of its bin) is what makes it running. Readers tell the two apart by
-- its bin (carpool/backend/queue.py); its attempt count lives in the claim hash until the
-- claim ends (complete.lua, release.lua, reap.lua write it back when it changed).
--#include record
--#include claim_batch
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now_ms, 0}
local max_n = tonumber(ARGV[1])
out[2] = claim_batch({bin = KEYS[1], leases = KEYS[2], bytes = KEYS[3], claim = KEYS[4],
  max_n = max_n, lease_ms = tonumber(ARGV[2]), token = ARGV[3], job_prefix = ARGV[4],
  worker = ARGV[5], done_channel = ARGV[6], result_ttl_s = ARGV[7],
  budget = tonumber(ARGV[8]), queued_ttl_s = tonumber(ARGV[9]), now_ms = now_ms,
  -- once: a number argument is formatted per call
  now_s = string.format("%d", now_ms)}, out)
return out
