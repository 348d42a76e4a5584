-- claim.lua: take up to N of one bin's most urgent jobs and lease them to one worker.
--
-- KEYS[1]  bin           {p.s}:q:<model>:<bin> zset (lowest score = most urgent first)
-- KEYS[2]  leases        {p.s}:leases zset lease token -> lease deadline (ms)
-- KEYS[3]  bytes         the model's byte-budget hash {p.s}:bytes:<model> (admit.lua): each
--                        input taken off the bin leaves its count, and its API key's
--                        ({p.s}:bytes:<model>:<owner>, same slot)
-- KEYS[4]  claim         the claim hash {p.s}:claim:<token>: the ids it leases, each with
--                        its attempt count as of this claim, its time ("t") and worker
--                        ("w"); renew, release, reap and complete act on it, once per
--                        claim rather than once per job
-- KEYS[5]  outbox        {p.s}:outbox (lib/outbox.lua): the webhook events of this call,
--                        "running" for each job claimed and "expired" for each one
--                        ended, of the jobs that asked for them
-- KEYS[6]  hook_wake     {p.s}:hook-wake, the dispatcher's wake list
-- ARGV[1]  max_n         most live jobs leased
-- ARGV[2]  lease_ms
-- ARGV[3]  token         the lease token (unique per claim)
-- ARGV[4]  job_prefix    "{p.s}:job:"
-- ARGV[5]  worker        the worker's name
-- ARGV[6]  done_channel
-- ARGV[7]  result_ttl_s
-- ARGV[8]  scan_budget   most ids taken off the bin in this call, live or not (>= max_n):
--                        a backlog of expired jobs is cleared a bounded slice at a time
-- ARGV[9]  queued_ttl_s  a job admitted longer ago ends "expired" here (a queued record
--                        has no TTL: admit.lua)
-- ARGV[10] claimed_channel  pub/sub: "<now_ms> <id> <attempts> <id> <attempts> ..." of
--                        the jobs leased, one message per claim (web/results/followers.py: the
--                        event streams' `running`)
-- ARGV[11] cost_a_ms     the bin's fitted batch time a + b·n (claim to results written;
-- ARGV[12] cost_b_ms     0 and 0: unknown): a job whose deadline comes before its batch
--                        would end (n: the bin's jobs, the dead ones taken off, at most
--                        max_n) would end late, and ends "expired" instead
--
-- Keys built here, not in KEYS: which jobs a claim takes is known only once the bin is
-- read, so their records are job_prefix .. id, and an owner's byte budget is
-- KEYS[3] .. ":" .. owner (the owner read from the record); both in KEYS[1]'s hash tag
-- (carpool/backend/keys.py), so the script stays on one slot.
--
-- Returns {now_ms, expired, id_1, record_1, id_2, record_2, ...}, most urgent first: each
-- record whole, as MGET read it (carpool/backend/records.py's `claimed` takes the attempt
-- count, the admission fields and the input out of it in the worker; cutting them out
-- here would cost Redis a string each). Ids whose record is gone are dropped; jobs whose
-- deadline has passed or comes before its batch would end, or queued longer than
-- queued_ttl_s, end "expired" here, are never computed, and their places go to the next
-- jobs: `expired` counts them, so the worker that decided it counts each expiry once
-- (carpool_jobs_expired_total). Per slice taken off the bin: one MGET of the records,
-- inputs included; per claim: one HSET of the claim hash and one ZADD of its token into
-- the leases zset.
--
-- A claimed job's record is not written: it still says "queued", and the claim hash
-- holding it (out of its bin) is what makes it running. Readers tell the two apart by
-- its bin (carpool/backend/queue.py); its attempt count lives in the claim hash until the
-- claim ends (complete.lua, release.lua, reap.lua write it back when it changed).
--#include lib/record.lua
--#include lib/budget.lua
--#include lib/outbox.lua
redis.replicate_commands()

local bin, leases, bytes, claim = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local max_n, lease_ms, token = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local job_prefix, worker, done_channel, result_ttl_s = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local budget, queued_ttl_s = tonumber(ARGV[8]), tonumber(ARGV[9])
local cost_a, cost_b = tonumber(ARGV[11]) or 0, tonumber(ARGV[12]) or 0
-- The batch a job ends in: the bin's jobs less those found dead so far, at most max_n.
local depth = (cost_a > 0 or cost_b > 0) and redis.call("ZCARD", bin) or 0
local dead = 0
local function batch_ms()
  return cost_a + cost_b * math.max(1, math.min(max_n, depth - dead))
end

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format("%d", now_ms)  -- once: a number argument is formatted per call
local out = {now_ms, 0}
local expired, live = 0, 0
local held = {"t", now_s, "w", worker}  -- the claim hash's fields
local stale_ms = now_ms - queued_ttl_s * 1000  -- admitted then or before: too old
local outbox, hooked = KEYS[5], 0  -- webhook events added (outbox.lua)

-- >>> byte budget (carpool/admission/budget.py): sum the bytes leaving per budget hash
local freed = {}  -- hash key -> bytes
local function unbudget_job(input_bytes, owner)
  freed[bytes] = (freed[bytes] or 0) + input_bytes
  if owner ~= "" then
    local key = bytes .. ":" .. owner
    freed[key] = (freed[key] or 0) + input_bytes
  end
end
-- <<< byte budget

while live < max_n and budget > 0 do
  -- ZPOPMIN's reply would carry each score, formatted as a float ("%.17g") per job.
  local popped = redis.call("ZRANGE", bin, 0, math.min(max_n - live, budget) - 1)
  if #popped == 0 then break end
  redis.call("ZREMRANGEBYRANK", bin, 0, #popped - 1)  -- the first write: never OOM
  budget = budget - #popped
  local asked = {}
  for i = 1, #popped do asked[i] = job_prefix .. popped[i] end
  local got = redis.call("MGET", unpack(asked))
  for i = 1, #popped do
    local id, rec = popped[i], got[i]
    local attempts_s, t_admit, deadline_s, owner, nl = nil, nil, nil, nil, nil
    if rec then
      attempts_s, t_admit, deadline_s, owner, nl = record_queued(rec)
    end
    if attempts_s then  -- a record there, still queued
      unbudget_job(#rec - nl, owner)
      local deadline = deadline_s ~= "" and tonumber(deadline_s) or 0
      local why, takes_ms = nil, deadline > 0 and batch_ms() or 0
      if deadline > 0 and now_ms >= deadline then
        why = "deadline passed while queued"
      elseif now_ms + takes_ms > deadline and deadline > 0 then
        -- Computed, it would end late (nobody waits for it) and delay the jobs behind it.
        why = "cannot finish by its deadline: " .. (deadline - now_ms)
          .. " ms left, its batch takes about " .. string.format("%.0f", takes_ms) .. " ms"
      elseif (tonumber(t_admit) or now_ms) <= stale_ms then
        why = "queued longer than CARPOOL_QUEUED_TTL_S (" .. queued_ttl_s .. " s)"
      end
      if why then
        redis.call("SET", asked[i],
          ended_record("expired", attempts_s, record_admission(rec, attempts_s, nl), "",
            now_s, "", "", why), "EX", result_ttl_s)
        redis.call("PUBLISH", done_channel, id)
        expired, dead = expired + 1, dead + 1
        hooked = hooked + outbox_add(outbox, id, "x", record_hook_of_head(rec, nl), owner, now_s)
      else
        local attempts = 1  -- "": never claimed before
        if attempts_s ~= "" then attempts = tonumber(attempts_s) + 1 end
        -- Nothing is written to the record (a write per job is most of a claim's
        -- cost): the worker, the claim time and the attempt count are the claim's.
        held[#held + 1] = id
        held[#held + 1] = string.format("%d", attempts)
        out[#out + 1] = id
        out[#out + 1] = rec
        live = live + 1
        hooked = hooked + outbox_add(outbox, id, "r", record_hook_of_head(rec, nl), owner, now_s)
      end
    else
      dead = dead + 1  -- gone, or no longer queued: not in the batch either
    end
  end
end
if live > 0 then
  redis.call("HSET", claim, unpack(held))
  redis.call("ZADD", leases, now_ms + lease_ms, token)
  redis.call("PUBLISH", ARGV[10], now_s .. " " .. table.concat(held, " ", 5))
end
budget_free(freed)  -- a hash goes with its last queued byte
outbox_wake(KEYS[6], hooked)
out[2] = expired
return out
