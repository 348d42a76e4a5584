-- admit.lua: admit one or more jobs into one bin, or refuse them, atomically.
--
-- One call admits a whole submission (POST /submit: one job; POST /submit/batch: the
-- jobs of one bin), so what does not depend on the job (the clock, the depth, the
-- counter, the drain rate, the owner's state, the wake check) is paid once per call,
-- not once per job. Each job is still checked as if admitted alone, in order: the
-- bound, the byte budget, its predicted wait, its owner's fair share; with an owner,
-- each job sorts by its owner's virtual clock as it stands after the call's earlier
-- jobs. The first job refused ends the call (every later one would be refused for the
-- same reason), and the jobs before it are queued.
--
-- KEYS[1]  bin           {p.s}:q:<model>:<bin> zset: ids scored by urgency (µs), most
--                        urgent first
-- KEYS[2]  wake          {p.s}:wake:<model> list: a token wakes one blocked worker
-- KEYS[3]  idem          {p.s}:idem:<model>:<k>: read/written only when ARGV[7] == "1"
-- KEYS[4]  stats         {p.s}:stats:<model>:<bin> hash: admitted += jobs admitted; drain
--                        rate read when full, when the predicted wait is checked, or owned
-- KEYS[5]  tenants       {p.s}:tenants:<model>:<bin> hash: owner -> "count as-of-ms weight
--                        clock", when owned
-- KEYS[6]  bytes         {p.s}:bytes:<model> hash: the model's byte budget
--                        (carpool/admission/budget.py)
-- KEYS[7]  owner_bytes   {p.s}:bytes:<model>:<owner> hash: the API key's (read when owned)
-- KEYS[8]  model_stats   {p.s}:mstats:<model> hash: the model's drain rate and busy time
--                        over all its bins (complete.lua): the pace of the predicted wait;
--                        and the workers starting (coming.lua), counted once they serve;
--                        "unloaded" set: the model takes no jobs (model_state.lua)
-- KEYS[9..] other_bins   the model's other bins, each its zset then its stats hash: their
--                        jobs that sort ahead of a job run before it too (one worker
--                        serves every bin of its model), each weighing its bin's cost
-- ARGV, by the names of carpool/admission/admit_args.py's AdmitArgs (one test checks
-- every script's header against its Python arguments):
-- ARGV[1]  job_prefix        "{p.s}:job:" (records are <prefix><id>, created here; same
--                            slot)
-- ARGV[2]  model             ARGV[3] bin          ARGV[4] max_depth    ARGV[5] max_batch
-- ARGV[6]  queued_ttl_s      ttl of the idempotency key and of the owners' state (a
--                            queued record has none: claim.lua ends it after this long)
-- ARGV[7]  idempotent        "1" if an idempotency key was given (then exactly one job); a
--                            key whose first job is gone (result expired, deleted) is a new
--                            key; the job records its key ("idem") so DELETE can drop it
-- ARGV[8]  wake_cap          wake list cap
-- ARGV[9]  drain_tau_ms      drain-rate time constant (carpool/admission/retry_after.py)
-- ARGV[10] deadline_ms       after admission (0: none)          ARGV[11] priority
-- ARGV[12] sort_offset_ms    score = admission (µs) + offset * 1000 (carpool/admission/urgency.py)
-- ARGV[13] owner             owner digest ("" when no API key)
-- ARGV[14] input_digest      ("" without an idempotency key)
-- ARGV[15] max_queue_ms      the longest predicted wait of a job without a deadline (0: none)
-- ARGV[16] drain_min_age_ms  drain-rate minimum age
-- ARGV[17] drain_stale_ms    a drain rate older than this is unknown
-- ARGV[18] owner_weight      the owner's fair-share weight
-- ARGV[19] fair_share_near   "near the bound" as a fraction of it
-- ARGV[20] fair_lead_cap_ms  the most an owner's virtual clock may lead now (fair queueing)
-- ARGV[21] max_queued_bytes  the model's byte budget (0: none)
-- ARGV[22] key_queued_bytes  the per-key byte budget (0: none)
-- ARGV[23] admitted_channel  pub/sub channel: the admitted ids, space-separated, one
--                            message per call that admits any (web/results/waiters.py)
-- ARGV[24] hook              the record's webhook field, "<letters> <url>" ("" none:
--                            carpool/core/webhooks.py), the same for every job of the call
-- ARGV[25] usage_prefix      {p.s}:usage:<model>: the hour's usage hash (lib/usage.lua):
--                            refusals counted, quotas read     ARGV[26] usage_ttl_s
-- ARGV[27] quota_device_ms_per_hour  ARGV[28] quota_jobs_per_s  the owner's (0: none)
-- ARGV[29] tier_share   its tier's share of max_depth and of the allowed wait (tiers.py)
-- ARGV[30] tier         its tier's name: refusals counted in KEYS[8]'s "refused:<tier>"
-- ARGV[31..] jobs      per job, 2 values: id, input (JSON)
--
-- Keys built here, not in KEYS: the jobs' records, job_prefix .. id, and the record of
-- an idempotency key's first job (an id read from KEYS[3]): one per job, as many as
-- the call brings, in KEYS[1]'s hash tag (carpool/backend/keys.py).
--
-- Returns, with `admitted` the number of jobs queued (the first ones) and depth_after
-- the bin's depth after them:
--         {"ok", admitted, depth_after, admit_ms} when every job was admitted;
--         {"full", admitted, depth_after, drained_ewma, age_ms} when the bin reached
--         max_depth: the bin's drain counter decayed to now and the time since its first
--         drain (-1: never drained), for Retry-After;
--         {"late", admitted, depth_after, ahead, jobs/s, limit_ms}: the next job was
--         refused by predicted wait (`ahead`: the model's jobs that sort before it, its
--         own batch included when it has a deadline, in average jobs (each at its bin's
--         weight), drained at the model's pace; limit_ms the wait it was allowed:
--         max_queue_ms, or 70 % of its deadline), or its
--         owner's turn comes after its deadline (`ahead` is that lead in jobs, at the
--         bin's rate);
--         {"share", admitted, depth_after, drained_ewma, age_ms, excess}: the next job's
--         owner is over its share (by `excess` jobs);
--         {"over", admitted, depth_after, "model" | "key", held_bytes, budget_bytes}:
--         the next job's input would pass the byte budget (held counts the call's
--         earlier jobs);
--         {"quota", admitted, depth_after, "device" | "jobs", used, limit, retry_after_s}:
--         the owner's quota (lib/quota.lua) is spent;
--         {"unloaded", 0, depth}: the model was unloaded (POST .../unload);
--         {"dup", first_id} | {"conflict", first_id} for a repeated idempotency key.
-- Every refusal but dup and conflict counts its jobs in the hour's usage (refused) and
-- in the model's refusals by tier (lib/usage.lua, usage_refused).
-- Admission time is Redis's own clock, so the hosts' clocks never matter. Fields that
-- hold their default (no deadline, priority 0, no owner, no digest, 0 attempts) are left
-- empty in the record: every reader treats an empty one as its default.
--#include lib/record.lua
--#include lib/pace.lua
--#include lib/budget.lua
--#include lib/quota.lua
--#include lib/fair_share.lua
redis.replicate_commands()  -- needed on Redis 6.2 before writes that follow TIME

-- Arguments of one MSET at most (2 per job): Lua's unpack is bounded by its C stack.
local MSET_ARGS = 4000

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

local FIRST_JOB = 31
local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local depth = redis.call("ZCARD", KEYS[1])
local max_batch = tonumber(ARGV[5])
local share = tonumber(ARGV[29])  -- its tier's: the rest is kept for the tiers above
local n = math.min((#ARGV - FIRST_JOB + 1) / 2, math.floor(tonumber(ARGV[4]) * share) - depth)
local function refused(reply, admitted)  -- the call's jobs not admitted count (lib/usage.lua)
  usage_refused(ARGV[25], now_ms, ARGV[26], ARGV[13], (#ARGV - FIRST_JOB + 1) / 2 - admitted,
    KEYS[8], ARGV[30])
  return reply
end

local function full(admitted, depth_now)
  local st = redis.call("HMGET", KEYS[4], "rate_c", "rate_t", "rate_t0")
  if not st[3] then
    return {"full", admitted, depth_now, "0", -1}
  end
  local c = tonumber(st[1]) * math.exp(-(now_ms - tonumber(st[2])) / tonumber(ARGV[9]))
  return {"full", admitted, depth_now, string.format("%.6f", c), now_ms - tonumber(st[3])}
end
if redis.call("HEXISTS", KEYS[8], "unloaded") == 1 then return refused({"unloaded", 0, depth}, 0)
elseif n <= 0 then return refused(full(0, depth), 0) end
-- The owner's quotas (lib/quota.lua): its device time this hour, its jobs per second.
local quota, tokens = nil, nil
n, quota, tokens = quota_allow(ARGV[25], ARGV[13], now_ms, tonumber(ARGV[27]),
  tonumber(ARGV[28]), n)
if n <= 0 then return refused({"quota", 0, depth, unpack(quota)}, 0) end

-- >>> byte budget (lib/budget.lua; carpool/admission/budget.py) >>>
-- Job i of the call is refused when its input, on top of what is held and the call's
-- earlier jobs, would pass a budget; the count is added once, for the jobs admitted.
local budgets = {}  -- {key, budget, scope}
if tonumber(ARGV[21]) > 0 then budgets[1] = {KEYS[6], tonumber(ARGV[21]), "model"} end
if ARGV[13] ~= "" and tonumber(ARGV[22]) > 0 then
  budgets[#budgets + 1] = {KEYS[7], tonumber(ARGV[22]), "key"}
end
local input_bytes = {}  -- of job i, when a budget is on
if #budgets > 0 then
  for i = 1, n do input_bytes[i] = #ARGV[FIRST_JOB + 2 * i - 1] end
end
local over = nil  -- {scope, held_bytes, budget_bytes} of the first job over a budget
n, over = budget_fit(budgets, input_bytes, n)
-- <<< byte budget <<<

-- Job i of a call sorts at base_us + i (later by its owner's clock lead, which only
-- grows within the call): the call's jobs keep their order in the bin.
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local base_us = now_us + tonumber(ARGV[12]) * 1000
local limit_ms = tonumber(ARGV[10])
if limit_ms <= 0 then limit_ms = tonumber(ARGV[15]) end
local owned = ARGV[13] ~= ""

-- The bin's drain rate, read once per call past the first batch, with an owner: for
-- its virtual clock (fair share). None recent (cold start, scale from zero): depth
-- alone. Job i is timed (its owner's clock moves at the rate) when depth + i is past
-- the first batch, as if admitted alone.
local drain = nil  -- {decayed count, age_ms, jobs/ms} once read
if depth + n - 1 >= max_batch and owned then
  drain = bin_drain(KEYS[4], now_ms, tonumber(ARGV[9]), tonumber(ARGV[16]), tonumber(ARGV[17]))
end
local rate_s = drain and string.format("%.6f", drain[3] * 1000)

-- >>> the model's pace (lib/pace.lua; docs/admission.md, "Refusing by predicted wait") >>>
local DEADLINE_SHARE = 0.7  -- of a deadline, the predicted end may take (below)
local pace = limit_ms > 0 and  -- jobs/ms, or false
  model_pace(KEYS[8], now_ms, tonumber(ARGV[9]), tonumber(ARGV[16]), tonumber(ARGV[17]))
-- Workers starting count from when they serve (lib/pace.lua, model_coming).
local coming = pace and model_coming(KEYS[8], now_ms, tonumber(ARGV[9]))
local function drained_by(ms) return drained_within(pace, coming, ms) end
local pace_s = pace and string.format("%.6f", pace * 1000)
-- Each bin's jobs weigh what they cost in average jobs (lib/pace.lua), a bin read once
-- per call, when it first has jobs ahead; k: the KEYS index of its zset (1: this bin).
local weigh = bin_weigher(KEYS[8])
local function weight(k) return weigh(k, k == 1 and KEYS[4] or KEYS[k + 1]) end
-- The jobs of the model that sort before score_us, in every bin: they run first.
-- Returns them in average jobs (weighed), and counted.
local function model_ahead(score_us)
  local bound = string.format("(%.0f", score_us)
  local count = redis.call("ZCOUNT", KEYS[1], "-inf", bound)
  local ahead = count > 0 and count * weight(1) or 0
  for k = 9, #KEYS, 2 do
    local c = redis.call("ZCOUNT", KEYS[k], "-inf", bound)
    if c > 0 then count, ahead = count + c, ahead + c * weight(k) end
  end
  return ahead, count
end
-- <<< the model's pace <<<

-- >>> fair share between tenants (docs/admission.md): the owner's state >>>
-- The owner's state (lib/fair_share.lua), written back once after the checks.
-- Share: near the bound (depth, or predicted wait of the whole bin, over ARGV[19] of
-- its limit), an owner over its weight's part of the active owners' weights is refused
-- first; one under its part is admitted. Its part: of the bin's bound, its queued
-- jobs as its clock's lead says; with no drain rate (no clock), of recent admissions.
-- Order (start-time fair queueing): with a drain rate, a job sorts later by how far
-- its owner's virtual clock is ahead of now; the clock then advances by one job's
-- service time at the owner's fair rate. It never leads now by more than ARGV[20] ms.
local tau, frac, w = tonumber(ARGV[9]), tonumber(ARGV[19]), tonumber(ARGV[18])
local function near(d)
  if d >= frac * tonumber(ARGV[4]) then return true end
  return drain ~= nil and limit_ms > 0 and d >= max_batch and d >= frac * limit_ms * drain[3]
end
local cap_us, dl_us = now_us + tonumber(ARGV[20]) * 1000, tonumber(ARGV[10]) * 1000
local mine, clock_us, sum_c, sum_w, forgotten = 0, 0, 0, 0, {}
if owned then  -- every owner's only where a share may be judged (near grows with depth)
  mine, clock_us, sum_c, sum_w, forgotten = fair_owner_state(KEYS[5], ARGV[13], w,
    drain ~= nil or near(depth + n - 1), now_ms, now_us, tau)
end
-- <<< fair share between tenants <<<

-- Each job in order: its predicted wait, then its owner's share. The first job
-- refused ends the call (every later one would be refused for the same reason).
local scores = {}  -- of the jobs admitted, in order
local refusal = nil  -- {"late", ahead, jobs/s} | {"share", excess}: the first job refused
local ahead0, count0, counted_us, counted, counted_n = nil, 0, nil, 0, 0
for i = 0, n - 1 do
  local timed = drain ~= nil and depth + i >= max_batch
  local sort_us = base_us

  -- >>> fair share between tenants: fair queueing of job i >>>
  local start_us = now_us  -- where its owner's clock stands for it
  if owned and timed then
    start_us = math.min(math.max(clock_us, now_us), cap_us)
    if dl_us > 0 and start_us - now_us >= dl_us then  -- its turn comes after its deadline
      refusal = {"late", math.ceil((start_us - now_us) / 1000 * drain[3]), rate_s}
      n = i
      break
    end
    sort_us = base_us + start_us - now_us
    if dl_us > 0 then sort_us = math.min(sort_us, now_us + dl_us) end  -- never past it
  end
  -- <<< fair share between tenants <<<

  -- >>> admission by predicted wait (docs/admission.md) >>>
  -- Refuse a job whose predicted end (the model's jobs that sort ahead of it, in
  -- every bin, and a batch of its own, over the model's pace) is later than its
  -- deadline, or whose predicted start (the same without its batch) is later than
  -- max_queue_ms when it has none. With fewer than a batch ahead (it leaves with the
  -- next batch), or with no recent pace: depth alone. The jobs ahead of the call's
  -- score are counted once per call, again only for a job fair queueing moved; the
  -- call's i earlier jobs sort ahead of job i as well.
  if pace then
    local ahead, count  -- in average jobs, and counted
    if sort_us == base_us then
      if not ahead0 then ahead0, count0 = model_ahead(base_us) end
      ahead, count = ahead0 + i * weight(1), count0 + i
    else
      if sort_us ~= counted_us then
        counted_us, counted, counted_n = sort_us, model_ahead(sort_us)
      end
      ahead, count = counted + i * weight(1), counted_n + i
    end
    -- A deadline is for the result: its own batch counts, and the end must come
    -- DEADLINE_SHARE of the way to it, leaving the rest to the prediction's noise and
    -- the answer's way back (max_queue_ms, without a deadline, leaves its own).
    local to_end, allowed_ms = ahead, limit_ms * share  -- the wait its tier may fill
    if dl_us > 0 then
      to_end, allowed_ms = ahead + max_batch * weight(1), allowed_ms * DEADLINE_SHARE
    end
    if count >= max_batch and to_end > drained_by(allowed_ms) then
      refusal = {"late", math.ceil(to_end), pace_s, string.format("%.0f", allowed_ms)}
      n = i
      break
    end
  end
  -- <<< admission by predicted wait <<<

  -- >>> fair share between tenants: job i's share; then its admission moves the clock >>>
  if owned then
    if near(depth + i) and sum_w > w then  -- others active: is it over its part?
      local excess = mine - sum_c * w / sum_w  -- in recent admissions, without a drain rate
      if timed then
        -- Its clock leads now by its queued jobs at its fair rate (rate * w / sum_w), so
        -- it holds over its part of the bin's bound when that lead is over the bound's
        -- drain time. The excess, in jobs at the bin's rate, gives its own Retry-After.
        local bound = tonumber(ARGV[4])
        if limit_ms > 0 then bound = math.min(bound, limit_ms * drain[3]) end
        excess = (start_us - now_us) / 1000 * drain[3] - bound
      end
      if excess > 0 then
        refusal = {"share", string.format("%.3f", excess)}
        n = i
        break
      end
    end
    mine, sum_c = mine + 1, sum_c + 1
    if timed then clock_us = math.min(start_us + 1000 * sum_w / (w * drain[3]), cap_us) end
  end
  -- <<< fair share between tenants <<<
  -- "%d" of a whole number: "%.0f" would take glibc's slow float path for each job.
  scores[i + 1] = string.format("%d", math.floor(sort_us + i + 0.5))
end
-- >>> fair share between tenants: the owner's state, written back once >>>
-- After every check: a full Redis refuses a script's first write only if it may grow
-- memory (docs/architecture.md), so an HDEL goes after the first HSET.
if owned and n > 0 then
  redis.call("HSET", KEYS[5], ARGV[13],
    string.format("%.4f %d %s %.0f", mine, now_ms, ARGV[18], clock_us))
  redis.call("EXPIRE", KEYS[5], ARGV[6])
end
if #forgotten > 0 then redis.call("HDEL", KEYS[5], unpack(forgotten)) end
-- <<< fair share between tenants <<<

local after = depth + n
if n > 0 then
  local head = nil
  if depth > 0 then
    head = tonumber(redis.call("ZRANGE", KEYS[1], 0, 0, "WITHSCORES")[2])
  end
  -- The record (carpool/backend/records.py) is one string, its input at its end: one MSET
  -- writes every job of the call, where a hash would cost each field its argument,
  -- its listpack entry and its line in the AOF. Numbers are formatted once.
  -- A queued record has no TTL: it stays until claimed (claim.lua ends it "expired"
  -- once queued longer than ARGV[6]) or cancelled, so the byte budget counts it exactly.
  local deadline = ""
  if tonumber(ARGV[10]) > 0 then deadline = string.format("%d", now_ms + tonumber(ARGV[10])) end
  local priority = ARGV[11]
  if priority == "0" then priority = "" end
  local idem = ""
  if ARGV[7] == "1" then idem = KEYS[3] end  -- DELETE drops it with its job (cancel.lua)
  local rec_head, rec_tail = queued_record_parts(string.format("%d", now_ms), deadline,
    ARGV[13], ARGV[2], ARGV[3], priority, ARGV[14], idem, ARGV[24])

  local members, writes = {}, {}
  for i = 0, n - 1 do
    local id = ARGV[FIRST_JOB + 2 * i]
    local score = scores[i + 1]
    writes[#writes + 1] = ARGV[1] .. id
    writes[#writes + 1] = rec_head .. score .. rec_tail .. ARGV[FIRST_JOB + 2 * i + 1]
    if #writes >= MSET_ARGS then  -- unpack's C stack bounds one call's arguments
      redis.call("MSET", unpack(writes))
      writes = {}
    end
    members[#members + 1] = score
    members[#members + 1] = id
  end
  if #writes > 0 then redis.call("MSET", unpack(writes)) end
  redis.call("ZADD", KEYS[1], unpack(members))
  redis.call("HINCRBY", KEYS[4], "admitted", n)
  if ARGV[7] == "1" then
    redis.call("SET", KEYS[3], ARGV[FIRST_JOB] .. " " .. ARGV[14], "EX", ARGV[6])
  end

  -- Wake a worker only when its plan changes: the bin got its first jobs (a new
  -- deadline), a new most urgent job (it overtook the head: an earlier deadline or a
  -- higher priority), or just filled a batch. Other arrivals need no wake-up.
  if head == nil or (depth < max_batch and after >= max_batch) or tonumber(scores[1]) < head then
    redis.call("RPUSH", KEYS[2], ARGV[3])
    redis.call("LTRIM", KEYS[2], -tonumber(ARGV[8]), -1)
  end

  budget_count(budgets, input_bytes, n)  -- the byte budget: count the admitted inputs
  quota_spend(ARGV[25], ARGV[13], now_ms, tokens, n, ARGV[26])

  -- The web's long-polls learn that these jobs are queued (and, from the done channel,
  -- when they end) without reading them. Not a write: after the first one anyway.
  local ids = {}
  for i = 0, n - 1 do ids[i + 1] = ARGV[FIRST_JOB + 2 * i] end
  redis.call("PUBLISH", ARGV[23], table.concat(ids, " "))
end

if refusal and refusal[1] == "share" then
  if drain then return refused({"share", n, after, drain[1], drain[2], refusal[2]}, n) end
  return refused({"share", n, after, "0", -1, refusal[2]}, n)
end
if refusal then
  return refused({"late", n, after, refusal[2], refusal[3], refusal[4] or limit_ms}, n)
end
if over then  -- byte budget: the bound let the job through, its input did not fit
  return refused({"over", n, after, over[1], over[2], over[3]}, n)
end
if quota then return refused({"quota", n, after, unpack(quota)}, n) end
if FIRST_JOB + 2 * n <= #ARGV then
  return refused(full(n, after), n)
end
return {"ok", n, after, now_ms}
