-- admit.lua: admit one or more jobs into one bin, or refuse them, atomically.
--
-- One call admits a whole submission (POST /submit: one job; POST /submit/batch: the
-- jobs of one bin), so what does not depend on the job (the clock, the depth, the
-- counter, the drain rate, the wake check) is paid once per call, not once per job.
-- Each job is still checked as if admitted alone, in order: the bound, the byte
-- budget, its predicted wait, its owner's fair share. The first job refused ends the
-- call (every later one would be refused for the same reason), and the jobs before
-- it are queued.
--
-- KEYS[1]  bin zset      {p.s}:q:<model>:<bin>   ids scored by urgency (µs), most urgent first
-- KEYS[2]  wake list     {p.s}:wake:<model>      a token wakes one blocked worker
-- KEYS[3]  idempotency   {p.s}:idem:<model>:<k>  read/written only when ARGV[7] == "1"
-- KEYS[4]  stats hash    {p.s}:stats:<model>:<bin>  admitted += jobs admitted; drain rate
--                        read when full or when the predicted wait is checked
-- KEYS[5]  tenants hash  {p.s}:tenants:<model>:<bin>  owner -> "count as-of-ms weight",
--                        when owned
-- KEYS[6]  bytes hash    {p.s}:bytes:<model>  the model's byte budget (carpool/budget.py)
-- KEYS[7]  bytes hash    {p.s}:bytes:<model>:<owner>  the API key's (read when owned)
-- ARGV[1]  job key prefix "{p.s}:job:" (job hashes are <prefix><id>, created here; same slot)
-- ARGV[2]  model         ARGV[3] bin          ARGV[4] max_depth    ARGV[5] max_batch
-- ARGV[6]  ttl_s of a queued record
-- ARGV[7]  "1" if an idempotency key was given (then exactly one job); a key whose
--          first job is gone (result expired, deleted) is a new key; the job records
--          its key ("idem") so DELETE can drop the key with it
-- ARGV[8]  wake list cap
-- ARGV[9]  drain-rate time constant, ms (carpool/retry_after.py)
-- ARGV[10] deadline, ms after admission (0: none)   ARGV[11] priority
-- ARGV[12] sort offset, ms: score = admission (µs) + offset * 1000 (carpool/urgency.py)
-- ARGV[13] owner digest ("" when no API key)        ARGV[14] input digest ("" if no key)
-- ARGV[15] max_queue_ms: the longest predicted wait of a job without a deadline (0: none)
-- ARGV[16] drain-rate minimum age, ms  ARGV[17] a drain rate older than this is unknown, ms
-- ARGV[18] the owner's fair-share weight  ARGV[19] "near the bound" as a fraction of it
-- ARGV[20] model byte budget, bytes (0: none)  ARGV[21] per-key byte budget (0: none)
-- ARGV[22] bucket width, ms    ARGV[23] live buckets (carpool/budget.py)
-- ARGV[24..] per job, 2 values: id, input (JSON)
--
-- Returns, with `admitted` the number of jobs queued (the first ones) and depth_after
-- the bin's depth after them:
--         {"ok", admitted, depth_after, admit_ms} when every job was admitted;
--         {"full", admitted, depth_after, drained_ewma, age_ms} when the bin reached
--         max_depth: the bin's drain counter decayed to now and the time since its first
--         drain (-1: never drained), for Retry-After;
--         {"late", admitted, depth_after, ahead, jobs/s, limit_ms}: the next job was
--         refused by predicted wait (`ahead` jobs sort before it, drained at that rate);
--         {"share", admitted, depth_after, drained_ewma, age_ms, excess}: the next job's
--         owner is over its share (by `excess` recent jobs);
--         {"over", admitted, depth_after, "model" | "key", held_bytes, budget_bytes}:
--         the next job's input would pass the byte budget (held counts the call's
--         earlier jobs);
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
    -- A key whose job is gone (result expired, deleted) is a new key: admit below.
    if redis.call("EXISTS", ARGV[1] .. first_id) == 1 then
      if string.sub(prior, sep + 1) == ARGV[14] then
        return {"dup", first_id}
      end
      return {"conflict", first_id}
    end
  end
end

local FIRST_JOB = 24
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local depth = redis.call("ZCARD", KEYS[1])
local max_batch = tonumber(ARGV[5])
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

-- >>> byte budget (carpool/budget.py) >>>
-- Queued input bytes per admission bucket; buckets older than the record TTL are
-- dropped (their records have expired). Job i of the call is refused when its input,
-- on top of what is held and the call's earlier jobs, would pass a budget.
-- The counts are added once, for the jobs finally admitted (below).
local budgets = {}  -- {key, budget, scope, held, width, new hash}
if tonumber(ARGV[20]) > 0 then budgets[1] = {KEYS[6], tonumber(ARGV[20]), "model"} end
if ARGV[13] ~= "" and tonumber(ARGV[21]) > 0 then
  budgets[#budgets + 1] = {KEYS[7], tonumber(ARGV[21]), "key"}
end
local over = nil  -- {scope, held_bytes, budget_bytes} of the first job over a budget
for _, b in ipairs(budgets) do
  local h = redis.call("HGETALL", b[1])
  local w, held = nil, 0
  for i = 1, #h, 2 do
    if h[i] == "w" then w = tonumber(h[i + 1]) end
  end
  b[6] = w == nil  -- a new hash: record its bucket width
  w = w or tonumber(ARGV[22])
  local oldest = math.floor(now_ms / w) - tonumber(ARGV[23])
  for i = 1, #h, 2 do
    local bucket = tonumber(h[i])
    if bucket and bucket <= oldest then
      redis.call("HDEL", b[1], h[i])
    elseif bucket then
      held = held + tonumber(h[i + 1])
    end
  end
  b[4], b[5] = held, w
end
if #budgets > 0 then
  local sum = 0
  for i = 0, n - 1 do
    local in_bytes = #ARGV[FIRST_JOB + 2 * i + 1]
    for _, b in ipairs(budgets) do
      if b[4] + sum + in_bytes > b[2] then
        over = {b[3], b[4] + sum, b[2]}
        break
      end
    end
    if over then
      n = i
      break
    end
    sum = sum + in_bytes
  end
end
-- <<< byte budget <<<

-- Jobs of one call get consecutive scores, so they keep their order in the bin.
local base_us = tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[12]) * 1000

-- >>> admission by predicted wait (docs/admission.md) >>>
-- Refuse a job whose predicted start (the jobs that sort ahead of it over the bin's
-- measured drain rate) is later than its deadline, else than max_queue_ms. Within
-- the first batch, or with no recent drain (cold start, scale from zero): depth alone.
-- The rate and the jobs ahead of the call's first job are read once per call; job i
-- of the call has the call's i earlier jobs ahead of it as well.
local limit_ms = tonumber(ARGV[10])
if limit_ms <= 0 then limit_ms = tonumber(ARGV[15]) end
local drain = nil  -- {decayed count, age_ms, jobs/ms} once read
local late = nil   -- {ahead, jobs/s} of the first job refused by its predicted wait
if limit_ms > 0 and depth + n - 1 >= max_batch then
  local st = redis.call("HMGET", KEYS[4], "rate_c", "rate_t", "rate_t0", "busy_c")
  if st[3] and now_ms - tonumber(st[2]) <= tonumber(ARGV[17]) then
    local tau = tonumber(ARGV[9])
    local c = tonumber(st[1]) * math.exp(-(now_ms - tonumber(st[2])) / tau)
    local age = math.max(now_ms - tonumber(st[3]), tonumber(ARGV[16]))
    -- Below saturation the drain rate is the arrival rate; how fast the workers drain
    -- while busy (jobs per claim-to-completion ms) is the better bound then.
    local busy_per_ms = st[4] and tonumber(st[1]) / math.max(1, tonumber(st[4])) or 0
    local per_ms = math.max(c / (tau * (1 - math.exp(-age / tau))), busy_per_ms)
    drain = {string.format("%.6f", c), now_ms - tonumber(st[3]), per_ms}
    local ahead0 = redis.call("ZCOUNT", KEYS[1], "-inf", string.format("(%.0f", base_us))
    for i = math.max(0, max_batch - depth), n - 1 do
      if (ahead0 + i) * 1.0 > limit_ms * per_ms then
        late = {ahead0 + i, string.format("%.6f", per_ms * 1000)}
        n = i
        break
      end
    end
  end
end
-- <<< admission by predicted wait <<<

-- >>> fair share between tenants (docs/admission.md) >>>
-- Each owner's admissions into the bin are a decayed count (time constant ARGV[9]).
-- Near the bound (depth, or predicted wait of the whole bin, over ARGV[19] of its
-- limit), an owner whose part of the recent admissions is over its weight's part of
-- the active owners' weights is refused first; one under its part is admitted.
-- The owners' counts are read once per call; each job admitted adds one to its
-- owner's count (all jobs of a call have one owner), written back once.
local share = nil  -- the excess of the first job refused for its owner's share
if ARGV[13] ~= "" and n > 0 then
  local tau, frac, w = tonumber(ARGV[9]), tonumber(ARGV[19]), tonumber(ARGV[18])
  local function near(d)
    if d >= frac * tonumber(ARGV[4]) then return true end
    return drain ~= nil and d >= max_batch and d >= frac * limit_ms * drain[3]
  end
  local mine = 0
  if near(depth + n - 1) then  -- near only grows with depth: else no job of the call is
    local all = redis.call("HGETALL", KEYS[5])
    local sum_c, sum_w = 0, 0
    for i = 1, #all, 2 do
      local c, at, wt = string.match(all[i + 1], "(%S+) (%S+) (%S+)")
      c = tonumber(c) * math.exp(-(now_ms - tonumber(at)) / tau)
      if all[i] == ARGV[13] then mine = c end
      if c >= 0.5 or all[i] == ARGV[13] then  -- active: one admission within ~0.7 tau
        sum_c, sum_w = sum_c + c, sum_w + tonumber(wt)
      end
    end
    if mine == 0 then sum_w = sum_w + w end
    for i = 0, n - 1 do
      if near(depth + i) and sum_c > 0 and mine / sum_c > w / sum_w then
        share = string.format("%.3f", mine - sum_c * w / sum_w)
        n = i
        break
      end
      mine, sum_c = mine + 1, sum_c + 1
    end
  else
    local prev = redis.call("HGET", KEYS[5], ARGV[13])
    if prev then
      local pc, pt = string.match(prev, "(%S+) (%S+)")
      mine = tonumber(pc) * math.exp(-(now_ms - tonumber(pt)) / tau)
    end
    mine = mine + n
  end
  if n > 0 then
    redis.call("HSET", KEYS[5], ARGV[13], string.format("%.4f %d %s", mine, now_ms, ARGV[18]))
    redis.call("EXPIRE", KEYS[5], ARGV[6])
  end
end
-- <<< fair share between tenants <<<

local after = depth + n
if n > 0 then
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
  if ARGV[7] == "1" then  -- DELETE drops the idempotency key with its job (cancel.lua)
    fields[#fields + 1] = "idem"
    fields[#fields + 1] = KEYS[3]
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
  if head == nil or (depth < max_batch and after >= max_batch) or base_us < head then
    redis.call("RPUSH", KEYS[2], ARGV[3])
    redis.call("LTRIM", KEYS[2], -tonumber(ARGV[8]), -1)
  end

  -- >>> byte budget: count the admitted inputs in this admission bucket >>>
  if #budgets > 0 then
    local sum = 0
    for i = 0, n - 1 do sum = sum + #ARGV[FIRST_JOB + 2 * i + 1] end
    for _, b in ipairs(budgets) do
      if b[6] then redis.call("HSET", b[1], "w", b[5]) end
      local bucket = string.format("%d", math.floor(now_ms / b[5]))
      if redis.call("HINCRBY", b[1], bucket, sum) == sum then
        -- A new bucket: the hash outlives every record admitted in it (and before).
        redis.call("PEXPIRE", b[1], (tonumber(ARGV[23]) + 1) * b[5])
      end
    end
  end
  -- <<< byte budget <<<
end

-- Fair share ran on the jobs the predicted wait let through: it refused the earlier one.
if share then
  if drain then return {"share", n, after, drain[1], drain[2], share} end
  return {"share", n, after, "0", -1, share}
end
if late then
  return {"late", n, after, late[1], late[2], limit_ms}
end
if over then  -- byte budget: the bound let the job through, its input did not fit
  return {"over", n, after, over[1], over[2], over[3]}
end
if FIRST_JOB + 2 * n <= #ARGV then
  return full(n, after)
end
return {"ok", n, after, now_ms}
