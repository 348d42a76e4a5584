-- admit.lua: admit one or more jobs into one bin, or refuse them, atomically.
--
-- One call admits a whole submission (POST /submit: one job; POST /submit/batch: the
-- jobs of one bin), so what does not depend on the job (the clock, the depth, the
-- counter, the wake check) is paid once per call, not once per job.
--
-- KEYS[1]  bin zset      {p.s}:q:<model>:<bin>   ids scored by urgency (µs), most urgent first
-- KEYS[2]  wake list     {p.s}:wake:<model>      a token wakes one blocked worker
-- KEYS[3]  idempotency   {p.s}:idem:<model>:<k>  read/written only when ARGV[7] == "1"
-- KEYS[4]  stats hash    {p.s}:stats:<model>:<bin>  admitted += jobs admitted; drain rate read
--                        when full
-- ARGV[1]  job key prefix "{p.s}:job:" (job hashes are <prefix><id>, created here; same slot)
-- ARGV[2]  model         ARGV[3] bin          ARGV[4] max_depth    ARGV[5] max_batch
-- ARGV[6]  ttl_s of a queued record
-- ARGV[7]  "1" if an idempotency key was given (then exactly one job)
-- ARGV[8]  wake list cap
-- ARGV[9]  drain-rate time constant, ms (carpool/retry_after.py)
-- ARGV[10] deadline, ms after admission (0: none)   ARGV[11] priority
-- ARGV[12] sort offset, ms: score = admission (µs) + offset * 1000 (carpool/urgency.py)
-- ARGV[13] owner digest ("" when no API key)        ARGV[14] input digest ("" if no key)
-- ARGV[15..] per job, 2 values: id, input (JSON)
--
-- Returns {"ok", admitted, depth_after, admit_ms} when every job was admitted;
--         {"full", admitted, depth, drained_ewma, age_ms} when the bin reached max_depth
--         after the first `admitted` jobs (those are queued; the rest are refused): the
--         bin's drain counter decayed to now and the time since its first drain (-1:
--         never drained), for Retry-After;
--         {"dup", first_id} | {"conflict", first_id} for a repeated idempotency key.
-- Admission time is Redis's own clock, so the hosts' clocks never matter. Fields that
-- hold their default (no deadline, priority 0, no owner, no digest, 0 attempts) are not
-- written: every reader treats a missing one as its default.
redis.replicate_commands()  -- needed on Redis 6.2 before writes that follow TIME

if ARGV[7] == "1" then
  local prior = redis.call("GET", KEYS[3])
  if prior then
    local sep = string.find(prior, " ", 1, true)
    local first_id = string.sub(prior, 1, sep - 1)
    if string.sub(prior, sep + 1) == ARGV[14] then
      return {"dup", first_id}
    end
    return {"conflict", first_id}
  end
end

local FIRST_JOB = 15
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local depth = redis.call("ZCARD", KEYS[1])
local n = math.min((#ARGV - FIRST_JOB + 1) / 2, tonumber(ARGV[4]) - depth)

local function full(admitted, depth_now)
  local st = redis.call("HMGET", KEYS[4], "rate_c", "rate_t", "rate_t0")
  if not st[3] then
    return {"full", admitted, depth_now, "0", -1}
  end
  local c = tonumber(st[1]) * math.exp(-(now_ms - tonumber(st[2])) / tonumber(ARGV[9]))
  return {"full", admitted, depth_now, string.format("%.6f", c), now_ms - tonumber(st[3])}
end
if n <= 0 then
  return full(0, depth)
end

-- Jobs of one call get consecutive scores, so they keep their order in the bin.
local base_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[12]) * 1000
local head = nil
if depth > 0 then
  head = tonumber(redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")[2])
end
local fields = {"model", ARGV[2], "bin", ARGV[3], "status", "queued", "t_admit", now_ms,
                "input", "", "score", ""}
if tonumber(ARGV[10]) > 0 then
  fields[#fields + 1] = "deadline"
  fields[#fields + 1] = now_ms + tonumber(ARGV[10])
end
if ARGV[11] ~= "0" then
  fields[#fields + 1] = "priority"
  fields[#fields + 1] = ARGV[11]
end
if ARGV[13] ~= "" then
  fields[#fields + 1] = "owner"
  fields[#fields + 1] = ARGV[13]
end
if ARGV[14] ~= "" then
  fields[#fields + 1] = "digest"
  fields[#fields + 1] = ARGV[14]
end

local members = {}
for i = 0, n - 1 do
  local id = ARGV[FIRST_JOB + 2 * i]
  local score = string.format("%.0f", base_us + i)
  fields[10] = ARGV[FIRST_JOB + 2 * i + 1]
  fields[12] = score
  redis.call("HSET", ARGV[1] .. id, unpack(fields))
  redis.call("EXPIRE", ARGV[1] .. id, ARGV[6])
  members[#members + 1] = score
  members[#members + 1] = id
end
redis.call("ZADD", KEYS[1], unpack(members))
redis.call("HINCRBY", KEYS[4], "admitted", n)
if ARGV[7] == "1" then
  redis.call("SET", KEYS[3], ARGV[FIRST_JOB] .. " " .. ARGV[14], "EX", ARGV[6])
end

-- Wake a worker only when its plan changes: the bin got its first jobs (a new
-- deadline), a new most urgent job (it overtook the head: an earlier deadline or a
-- higher priority), or just filled a batch. Other arrivals need no wake-up.
local after = depth + n
local max_batch = tonumber(ARGV[5])
if head == nil or (depth < max_batch and after >= max_batch) or base_us < head then
  redis.call("RPUSH", KEYS[2], ARGV[3])
  redis.call("LTRIM", KEYS[2], -tonumber(ARGV[8]), -1)
end
if FIRST_JOB + 2 * n <= #ARGV then
  return full(n, after)
end
return {"ok", n, after, now_ms}
