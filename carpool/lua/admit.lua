-- admit.lua: admit one job into its bin, or refuse it, atomically.
--
-- KEYS[1]  bin zset      {p}:q:<model>:<bin>   ids scored by urgency (µs), most urgent first
-- KEYS[2]  job hash      {p}:job:<id>          created here
-- KEYS[3]  wake list     {p}:wake:<model>      a token wakes one blocked worker
-- KEYS[4]  idempotency   {p}:idem:<model>:<k>  read/written only when ARGV[10] == "1"
-- KEYS[5]  stats hash    {p}:stats:<model>:<bin>  admitted += 1; drain rate read when full
-- KEYS[6]  tenants hash  {p}:tenants:<model>:<bin> owner -> "count at weight", when owned
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
-- ARGV[21] job key prefix "{p}:job:" (an idempotency key's first job may be gone; same slot)
-- Byte budget (carpool/budget.py): KEYS[7] model's bytes hash {p}:bytes:<model>,
--   KEYS[8] the API key's {p}:bytes:<model>:<owner> (read only when ARGV[12] ~= "");
--   ARGV[22] model budget, bytes  ARGV[23] per-key budget, bytes (0: none)
--   ARGV[24] bucket width, ms     ARGV[25] live buckets
--
-- Returns {"ok", id, depth_after, admit_ms} | {"dup", first_id} | {"conflict", first_id} |
--         {"full", depth, drained_ewma, age_ms}: the bin's drain counter decayed to now
--         and the time since its first drain (-1: never drained), for Retry-After |
--         {"late", ahead, jobs/s, limit_ms}: refused by predicted wait, at that rate |
--         {"share", depth, drained_ewma, age_ms, excess}: the owner is over its share |
--         {"over", "model" | "key", held_bytes, budget_bytes}: the byte budget is spent.
-- A job hash records its idempotency key ("idem") so DELETE can drop the key with it.
-- Admission time is Redis's own clock, so the hosts' clocks never matter.
redis.replicate_commands()  -- needed on Redis 6.2 before writes that follow TIME

if ARGV[10] == "1" then
  local prior = redis.call("GET", KEYS[4])
  if prior then
    local sep = string.find(prior, " ", 1, true)
    local first_id = string.sub(prior, 1, sep - 1)
    -- A key whose job is gone (result expired, deleted) is a new key: admit below.
    if redis.call("EXISTS", ARGV[21] .. first_id) == 1 then
      if string.sub(prior, sep + 1) == ARGV[11] then
        return {"dup", first_id}
      end
      return {"conflict", first_id}
    end
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

-- >>> byte budget (carpool/budget.py) ------------------------------------------
-- Queued input bytes per admission bucket; buckets older than the record TTL are
-- dropped (their records have expired). Refuse when this input would pass a budget.
local in_bytes = #ARGV[4]
local budgets = {}
if tonumber(ARGV[22]) > 0 then budgets[1] = {KEYS[7], tonumber(ARGV[22]), "model"} end
if ARGV[12] ~= "" and tonumber(ARGV[23]) > 0 then
  budgets[#budgets + 1] = {KEYS[8], tonumber(ARGV[23]), "key"}
end
for _, b in ipairs(budgets) do
  local h = redis.call("HGETALL", b[1])
  local w, held = nil, 0
  for i = 1, #h, 2 do
    if h[i] == "w" then w = tonumber(h[i + 1]) end
  end
  b[5] = w == nil  -- a new hash: record its bucket width
  w = w or tonumber(ARGV[24])
  local oldest = math.floor(now_ms / w) - tonumber(ARGV[25])
  for i = 1, #h, 2 do
    local bucket = tonumber(h[i])
    if bucket and bucket <= oldest then
      redis.call("HDEL", b[1], h[i])
    elseif bucket then
      held = held + tonumber(h[i + 1])
    end
  end
  if held + in_bytes > b[2] then
    return {"over", b[3], held, b[2]}
  end
  b[4] = w
end
-- <<< byte budget (the counts are added after the job is written, below) ---------

local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local score = string.format("%.0f", now_us + tonumber(ARGV[14]) * 1000)

-- >>> admission by predicted wait (docs/admission.md) >>>
-- Refuse a job whose predicted start (the jobs that sort ahead of it over the bin's
-- measured drain rate) is later than its deadline, else than max_queue_ms. Within
-- the first batch, or with no recent drain (cold start, scale from zero): depth alone.
local limit_ms = tonumber(ARGV[8])
if limit_ms <= 0 then limit_ms = tonumber(ARGV[16]) end
local drain = nil  -- {decayed count, age_ms, jobs/ms} once read
if limit_ms > 0 and depth >= tonumber(ARGV[6]) then
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
    local ahead = redis.call("ZCOUNT", KEYS[1], "-inf", "(" .. score)
    if ahead * 1.0 > limit_ms * drain[3] then
      return {"late", ahead, string.format("%.6f", per_ms * 1000), limit_ms}
    end
  end
end
-- <<< admission by predicted wait <<<

-- >>> fair share between tenants (docs/admission.md) >>>
-- Each owner's admissions into the bin are a decayed count (time constant ARGV[15]).
-- Near the bound (depth, or predicted wait of the whole bin, over ARGV[20] of its
-- limit), an owner whose part of the recent admissions is over its weight's part of
-- the active owners' weights is refused first; one under its part is admitted.
if ARGV[12] ~= "" then
  local tau, frac = tonumber(ARGV[15]), tonumber(ARGV[20])
  local near = depth >= frac * tonumber(ARGV[5])
  if drain and limit_ms > 0 then near = near or depth >= frac * limit_ms * drain[3] end
  if near then
    local all = redis.call("HGETALL", KEYS[6])
    local mine, sum_c, sum_w, w = 0, 0, 0, tonumber(ARGV[19])
    for i = 1, #all, 2 do
      local c, t, wt = string.match(all[i + 1], "(%S+) (%S+) (%S+)")
      c = tonumber(c) * math.exp(-(now_ms - tonumber(t)) / tau)
      if all[i] == ARGV[12] then mine = c end
      if c >= 0.5 or all[i] == ARGV[12] then  -- active: one admission within ~0.7 tau
        sum_c, sum_w = sum_c + c, sum_w + tonumber(wt)
      end
    end
    if mine == 0 then sum_w = sum_w + w end
    if sum_c > 0 and mine / sum_c > w / sum_w then
      local excess = string.format("%.3f", mine - sum_c * w / sum_w)
      if drain then return {"share", depth, drain[1], drain[2], excess} end
      return {"share", depth, "0", -1, excess}
    end
  end
  local prev = redis.call("HGET", KEYS[6], ARGV[12])
  local c = 0
  if prev then
    local pc, pt = string.match(prev, "(%S+) (%S+)")
    c = tonumber(pc) * math.exp(-(now_ms - tonumber(pt)) / tau)
  end
  redis.call("HSET", KEYS[6], ARGV[12], string.format("%.4f %d %s", c + 1, now_ms, ARGV[19]))
  redis.call("EXPIRE", KEYS[6], ARGV[7])
end
-- <<< fair share between tenants <<<
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
  redis.call("HSET", KEYS[2], "idem", KEYS[4])
end
for _, b in ipairs(budgets) do  -- byte budget: count this input in its admission bucket
  if b[5] then redis.call("HSET", b[1], "w", b[4]) end
  local bucket = string.format("%d", math.floor(now_ms / b[4]))
  if redis.call("HINCRBY", b[1], bucket, in_bytes) == in_bytes then
    -- A new bucket: the hash outlives every record admitted in it (and before).
    redis.call("PEXPIRE", b[1], (tonumber(ARGV[25]) + 1) * b[4])
  end
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
