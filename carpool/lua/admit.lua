-- admit.lua: admit one job into its bin, or refuse it, atomically.
--
-- KEYS[1]  bin zset      {p}:q:<model>:<bin>   ids scored by urgency (µs), most urgent first
-- KEYS[2]  job hash      {p}:job:<id>          created here
-- KEYS[3]  wake list     {p}:wake:<model>      a token wakes one blocked worker
-- KEYS[4]  idempotency   {p}:idem:<model>:<k>  read/written only when ARGV[10] == "1"
-- KEYS[5]  stats hash    {p}:stats:<model>:<bin>  admitted += 1; drain rate read when full
-- KEYS[6]  tenants hash  {p}:tenants:<model>:<bin> owner -> "count at weight clock", when owned
-- ARGV[1]  id            ARGV[2] model        ARGV[3] bin
-- ARGV[4]  input (JSON)  ARGV[5] max_depth    ARGV[6] max_batch
-- ARGV[7]  ttl_s of a queued record           ARGV[8] deadline, ms after admission (0: none)
-- ARGV[9]  priority      ARGV[10] "1" if an idempotency key was given
-- ARGV[11] input digest  ARGV[12] owner digest ("" when no API key)
-- ARGV[13] wake list cap
-- ARGV[14] sort offset, ms: score = admission (µs) + offset * 1000 (carpool/urgency.py)
-- ARGV[15] drain-rate time constant, ms (carpool/retry_after.py)
-- ARGV[16] max_queue_ms: the longest predicted wait of a job without a deadline (0: none)
-- ARGV[17] drain-rate minimum age, ms  ARGV[18] a drain rate older than this is unknown, ms
-- ARGV[19] the owner's fair-share weight  ARGV[20] "near the bound" as a fraction of it
-- ARGV[21] the most an owner's virtual clock may lead now, ms (fair queueing)
--
-- Returns {"ok", id, depth_after, admit_ms} | {"dup", first_id} | {"conflict", first_id} |
--         {"full", depth, drained_ewma, age_ms}: the bin's drain counter decayed to now
--         and the time since its first drain (-1: never drained), for Retry-After |
--         {"late", ahead, jobs/s, limit_ms}: refused by predicted wait, at that rate (or
--         its owner's turn comes after its deadline: ahead is that lead in jobs) |
--         {"share", depth, drained_ewma, age_ms, excess}: the owner is over its share.
-- Admission time is Redis's own clock, so the hosts' clocks never matter.
redis.replicate_commands()  -- needed on Redis 6.2 before writes that follow TIME

if ARGV[10] == "1" then
  local prior = redis.call("GET", KEYS[4])
  if prior then
    local sep = string.find(prior, " ", 1, true)
    local first_id = string.sub(prior, 1, sep - 1)
    if string.sub(prior, sep + 1) == ARGV[11] then
      return {"dup", first_id}
    end
    return {"conflict", first_id}
  end
end

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local depth = redis.call("ZCARD", KEYS[1])
if depth >= tonumber(ARGV[5]) then
  local st = redis.call("HMGET", KEYS[5], "rate_c", "rate_t", "rate_t0")
  if not st[3] then
    return {"full", depth, "0", -1}
  end
  local c = tonumber(st[1]) * math.exp(-(now_ms - tonumber(st[2])) / tonumber(ARGV[15]))
  return {"full", depth, string.format("%.6f", c), now_ms - tonumber(st[3])}
end

local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local score_us = now_us + tonumber(ARGV[14]) * 1000
local limit_ms = tonumber(ARGV[8])
if limit_ms <= 0 then limit_ms = tonumber(ARGV[16]) end
local drain = nil  -- {decayed count, age_ms, jobs/ms} once read
-- Past the first batch, the bin's drain rate (for the predicted wait, and for what one
-- job costs a tenant); none recent (cold start, scale from zero): depth alone.
if depth >= tonumber(ARGV[6]) and (limit_ms > 0 or ARGV[12] ~= "") then
  local st = redis.call("HMGET", KEYS[5], "rate_c", "rate_t", "rate_t0", "busy_c")
  if st[3] and now_ms - tonumber(st[2]) <= tonumber(ARGV[18]) then
    local tau = tonumber(ARGV[15])
    local c = tonumber(st[1]) * math.exp(-(now_ms - tonumber(st[2])) / tau)
    local age = math.max(now_ms - tonumber(st[3]), tonumber(ARGV[17]))
    -- Below saturation the drain rate is the arrival rate; how fast the workers drain
    -- while busy (jobs per claim-to-completion ms) is the better bound then.
    local busy_per_ms = st[4] and tonumber(st[1]) / math.max(1, tonumber(st[4])) or 0
    local per_ms = math.max(c / (tau * (1 - math.exp(-age / tau))), busy_per_ms)
    drain = {string.format("%.6f", c), now_ms - tonumber(st[3]), per_ms}
  end
end

-- >>> fair share between tenants (docs/admission.md) >>>
-- Field per owner: "decayed admissions, as of ms, weight, virtual clock (us)".
-- Share: near the bound (depth, or predicted wait of the whole bin, over ARGV[20] of
-- its limit), an owner over its weight's part of the active owners' weights is refused
-- first; one under its part is admitted. Its part: of the bin's bound, its queued
-- jobs as its clock's lead says; with no drain rate (no clock), of recent admissions.
-- Order (start-time fair queueing): with a drain rate, a job sorts later by how far
-- its owner's virtual clock is ahead of now; the clock then advances by one job's
-- service time at the owner's fair rate. It never leads now by more than ARGV[21] ms.
if ARGV[12] ~= "" then
  local tau, frac, w = tonumber(ARGV[15]), tonumber(ARGV[20]), tonumber(ARGV[19])
  local near = depth >= frac * tonumber(ARGV[5])
  if drain and limit_ms > 0 then near = near or depth >= frac * limit_ms * drain[3] end
  local mine, clock_us, sum_c, sum_w, found = 0, 0, 0, 0, false
  local all = {}
  if near or drain then
    all = redis.call("HGETALL", KEYS[6])
  else
    local prev = redis.call("HGET", KEYS[6], ARGV[12])
    if prev then all = {ARGV[12], prev} end
  end
  for i = 1, #all, 2 do
    local c, ct, wt, v = string.match(all[i + 1], "(%S+) (%S+) (%S+) ?(%S*)")
    c, v = tonumber(c) * math.exp(-(now_ms - tonumber(ct)) / tau), tonumber(v) or 0
    if all[i] == ARGV[12] then
      mine, clock_us, found = c, v, true
    elseif c < 0.01 and v < now_us then  -- idle for ~5 tau: forgotten, the hash stays small
      redis.call("HDEL", KEYS[6], all[i])
    end
    if c >= 0.5 or all[i] == ARGV[12] then  -- active: one admission within ~0.7 tau
      sum_c, sum_w = sum_c + c, sum_w + tonumber(wt)
    end
  end
  if not found then sum_w = sum_w + w end
  if near and sum_w > w then  -- others active: is this owner over its part of the bin?
    local excess = mine - sum_c * w / sum_w  -- in recent admissions, without a drain rate
    if drain then
      -- Its clock leads now by its queued jobs at its fair rate (rate * w / sum_w), so it
      -- holds over its part of the bin's bound when that lead is over the bound's drain
      -- time. The excess, in jobs at the bin's rate, gives its own Retry-After.
      local bound = tonumber(ARGV[5])
      if limit_ms > 0 then bound = math.min(bound, limit_ms * drain[3]) end
      excess = (math.max(clock_us, now_us) - now_us) / 1000 * drain[3] - bound
    end
    if excess > 0 then
      excess = string.format("%.3f", excess)
      if drain then return {"share", depth, drain[1], drain[2], excess} end
      return {"share", depth, "0", -1, excess}
    end
  end
  if drain then
    local cap_us = now_us + tonumber(ARGV[21]) * 1000
    local start_us = math.min(math.max(clock_us, now_us), cap_us)
    local dl_us = tonumber(ARGV[8]) * 1000
    if dl_us > 0 and start_us - now_us >= dl_us then  -- its turn comes after its deadline
      local ahead = math.ceil((start_us - now_us) / 1000 * drain[3])
      return {"late", ahead, string.format("%.6f", drain[3] * 1000), limit_ms}
    end
    score_us = score_us + start_us - now_us
    if dl_us > 0 then score_us = math.min(score_us, now_us + dl_us) end  -- never past it
    clock_us = math.min(start_us + 1000 * sum_w / (w * drain[3]), cap_us)
  end
  redis.call("HSET", KEYS[6], ARGV[12],
    string.format("%.4f %d %s %.0f", mine + 1, now_ms, ARGV[19], clock_us))
  redis.call("EXPIRE", KEYS[6], ARGV[7])
end
-- <<< fair share between tenants <<<
local score = string.format("%.0f", score_us)

-- >>> admission by predicted wait (docs/admission.md) >>>
-- Refuse a job whose predicted start (the jobs that sort ahead of it over the bin's
-- measured drain rate) is later than its deadline, else than max_queue_ms. Within
-- the first batch, or with no recent drain (cold start, scale from zero): depth alone.
if drain and limit_ms > 0 then
  local ahead = redis.call("ZCOUNT", KEYS[1], "-inf", "(" .. score)
  if ahead * 1.0 > limit_ms * drain[3] then
    return {"late", ahead, string.format("%.6f", drain[3] * 1000), limit_ms}
  end
end
-- <<< admission by predicted wait <<<
local deadline_ms = 0
if tonumber(ARGV[8]) > 0 then
  deadline_ms = now_ms + tonumber(ARGV[8])
end

redis.call("HSET", KEYS[2],
  "model", ARGV[2], "bin", ARGV[3], "input", ARGV[4], "status", "queued",
  "t_admit", now_ms, "deadline", deadline_ms, "priority", ARGV[9], "score", score,
  "attempts", 0, "digest", ARGV[11], "owner", ARGV[12])
redis.call("EXPIRE", KEYS[2], ARGV[7])
redis.call("ZADD", KEYS[1], score, ARGV[1])
redis.call("HINCRBY", KEYS[5], "admitted", 1)
if ARGV[10] == "1" then
  redis.call("SET", KEYS[4], ARGV[1] .. " " .. ARGV[11], "EX", ARGV[7])
end

-- Wake a worker only when its plan changes: the bin got its first job (a new
-- deadline), a new most urgent job (it overtook the head: an earlier deadline or
-- a higher priority), or just filled a batch. Other arrivals need no wake-up.
local after = depth + 1
if after == 1 or after == tonumber(ARGV[6]) or redis.call("ZRANK", KEYS[1], ARGV[1]) == 0 then
  redis.call("RPUSH", KEYS[3], ARGV[3])
  redis.call("LTRIM", KEYS[3], -tonumber(ARGV[13]), -1)
end
return {"ok", ARGV[1], after, now_ms}
