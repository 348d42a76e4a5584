-- claim.lua: take up to N of one bin's most urgent jobs and lease them to one worker.
--
-- KEYS[1]  bin zset  {p.s}:q:<model>:<bin>  (lowest score = most urgent first)
-- KEYS[2]  leases    {p.s}:leases  zset lease token -> lease deadline (ms)
-- ARGV[1]  max_n     ARGV[2] lease_ms   ARGV[3] lease token (unique per claim)
-- ARGV[4]  job key prefix "{p.s}:job:"     ARGV[5] worker name
-- ARGV[6]  done channel                  ARGV[7] result_ttl_s
-- ARGV[8]  most ids to take off the bin in this call, live or not (>= max_n): a
--          backlog of expired jobs is cleared a bounded slice at a time
-- KEYS[3]  the model's byte-budget hash {p.s}:bytes:<model> (admit.lua): each input
--          taken off the bin leaves its admission bucket, and its API key's
--          ({p.s}:bytes:<model>:<owner>, same slot)
-- KEYS[4]  the claim hash {p.s}:claim:<token>: the ids it leases ("1" each), its time
--          ("t") and worker ("w"); renew, release, reap and complete act on it, once per
--          claim rather than once per job
--
-- Returns {now_ms, expired, id_1, input_1, admit_ms_1, attempts_1, owner_1, id_2, ...}, most
-- urgent first. Ids whose record has expired are dropped; jobs whose deadline has
-- passed end "expired" here, are never computed, and their places go to the next
-- jobs: `expired` counts them, so the worker that decided it counts each expiry once
-- (carpool_jobs_expired_total). Per job: one HMGET and one HSET; per claim: one HSET
-- of the claim hash and one ZADD of its token into the leases zset.
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {now_ms, 0}
local max_n, budget = tonumber(ARGV[1]), tonumber(ARGV[8])
local now_s = string.format("%d", now_ms)  -- once: a number argument is formatted per call
local lease_until = now_ms + tonumber(ARGV[2])
local live = 0
local held = {"t", now_s, "w", ARGV[5]}  -- the claim hash's fields

-- >>> byte budget (carpool/budget.py): sum the bytes leaving per hash and bucket
local budget_w, budget_freed, buckets = {}, {}, {}
local function unbudget(key, t_admit, n)
  local w = budget_w[key]
  if w == nil then
    w = tonumber(redis.call("HGET", key, "w")) or false
    budget_w[key] = w
    buckets[key] = {}
  end
  if w then
    local bucket = buckets[key][t_admit]  -- a call's jobs mostly share an admission time
    if not bucket then
      bucket = string.format("%d", math.floor(tonumber(t_admit) / w))
      buckets[key][t_admit] = bucket
    end
    local per = budget_freed[key] or {}
    budget_freed[key] = per
    per[bucket] = (per[bucket] or 0) + n
  end
end
local function unbudget_job(job)  -- job: HMGET's status, input, t_admit, ..., owner
  unbudget(KEYS[3], job[3], #job[2])
  if job[6] and job[6] ~= "" then unbudget(KEYS[3] .. ":" .. job[6], job[3], #job[2]) end
end
-- <<< byte budget

while live < max_n and budget > 0 do
  local popped = redis.call("ZPOPMIN", KEYS[1], math.min(max_n - live, budget))
  if #popped == 0 then break end
  budget = budget - #popped / 2
  for i = 1, #popped, 2 do
    local id = popped[i]
    local key = ARGV[4] .. id
    local job = redis.call("HMGET", key, "status", "input", "t_admit", "attempts", "deadline",
      "owner")
    if job[1] == "queued" then
      unbudget_job(job)
      local deadline = tonumber(job[5]) or 0
      if deadline > 0 and now_ms >= deadline then
        redis.call("HSET", key, "status", "expired", "t_done", now_s,
          "error", "deadline passed while queued")
        redis.call("HDEL", key, "input")
        redis.call("EXPIRE", key, ARGV[7])
        redis.call("PUBLISH", ARGV[6], id)
        out[2] = out[2] + 1
      else
        local attempts, attempts_s = 1, "1"
        if job[4] then
          attempts = (tonumber(job[4]) or 0) + 1
          attempts_s = string.format("%d", attempts)
        end
        redis.call("HSET", key, "status", "running", "lease", ARGV[3], "worker", ARGV[5],
          "t_claim", now_s, "attempts", attempts_s)
        held[#held + 1] = id
        held[#held + 1] = "1"
        out[#out + 1] = id
        out[#out + 1] = job[2]
        out[#out + 1] = job[3]
        out[#out + 1] = attempts
        out[#out + 1] = job[6] or ""
        live = live + 1
      end
    end
  end
end
if live > 0 then
  redis.call("HSET", KEYS[4], unpack(held))
  redis.call("ZADD", KEYS[2], lease_until, ARGV[3])
end
for key, per in pairs(budget_freed) do  -- byte budget: never revive a dropped bucket
  for bucket, n in pairs(per) do
    if redis.call("HEXISTS", key, bucket) == 1 and redis.call("HINCRBY", key, bucket, -n) < 0 then
      redis.call("HSET", key, bucket, 0)  -- a requeued job (reap, release) was counted once
    end
  end
end
return out
