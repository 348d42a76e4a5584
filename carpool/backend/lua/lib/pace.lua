-- pace.lua: not a script of its own. admit.lua includes it (carpool/backend/connection.py:
-- a line "--#include lib/pace.lua"): the drain rates it reads from the stats hashes
-- complete.lua writes (rate_c, rate_t, rate_t0, busy_c, late_c). Read-only.
--
-- bin_drain(stats_key, now_ms, tau_ms, min_age_ms, stale_ms) -> {decayed count ("%.6f"),
--   ms since the first drain, jobs/ms} of one bin, or nil when none is recent (older
--   than stale_ms): the rate of fair share's virtual clocks
-- model_pace(model_stats_key, now_ms, tau_ms, min_age_ms, stale_ms) -> the model's pace
--   (jobs/ms) over all its bins, or nil when none is recent: the predicted wait's
-- model_coming(model_stats_key, now_ms, tau_ms) -> {jobs/ms, ms until then} that workers
--   still starting add (coming.lua wrote how many and when they serve), or nil
-- bin_weigher(model_stats_key) -> weigh(k, stats_key): what a job of the bin of
--   stats_key costs in the model's average jobs (1 where unknown), read once per k
--
-- One worker serves every bin of its model, so a job's wait is the model's work ahead
-- of it at the model's pace, never its own bin's alone: a bin's own rates count only
-- the time its worker spends on it. The pace is the model's drain rate (jobs written
-- per ms, all bins, all workers) once its workers were busy nearly all the time
-- (BUSY_SATURATED of the window: the drain is then what they can do, the host's
-- load, the other bins and every overhead included); before, the larger of that and
-- its busy speed (jobs per ms of claim-to-completion), so a burst into a quiet model
-- is not judged by the arrivals of the quiet spell. None recent: depth alone.
-- It corrects itself: the jobs that started later than their wait allowed (late_c,
-- counted by the worker at each completion: past their deadline at their batch's end
-- or started past the end admission allowed them, else queued past max_queue_ms, or
-- expired) were let in by a pace that was too fast,
-- so the pace slows by LATE_GAIN times the part of the model's recent jobs they are
-- (at most to MIN_ON_TIME of itself), and recovers as they stop.
-- LATE_GAIN: a late job weighs this many on time, so the pace settles where about
-- 1 % of jobs are late, not where every fourth one is.
local BUSY_SATURATED, MIN_ON_TIME, LATE_GAIN = 0.9, 0.25, 4

local function bin_drain(stats_key, now_ms, tau_ms, min_age_ms, stale_ms)
  local st = redis.call("HMGET", stats_key, "rate_c", "rate_t", "rate_t0", "busy_c")
  if not st[3] or now_ms - tonumber(st[2]) > stale_ms then return nil end
  local c = tonumber(st[1]) * math.exp(-(now_ms - tonumber(st[2])) / tau_ms)
  local age = math.max(now_ms - tonumber(st[3]), min_age_ms)
  -- Below saturation the drain rate is the arrival rate; how fast the workers drain
  -- while busy (jobs per claim-to-completion ms) is the better bound then.
  local busy_per_ms = st[4] and tonumber(st[1]) / math.max(1, tonumber(st[4])) or 0
  local per_ms = math.max(c / (tau_ms * (1 - math.exp(-age / tau_ms))), busy_per_ms)
  return {string.format("%.6f", c), now_ms - tonumber(st[3]), per_ms}
end

local function model_pace(model_stats_key, now_ms, tau_ms, min_age_ms, stale_ms)
  local ms = redis.call("HMGET", model_stats_key, "rate_c", "rate_t", "rate_t0", "busy_c",
    "late_c")
  if not ms[3] or now_ms - tonumber(ms[2]) > stale_ms then return nil end
  local age_ms = math.max(now_ms - tonumber(ms[3]), min_age_ms)
  local window_ms = tau_ms * (1 - math.exp(-age_ms / tau_ms))
  local decay = math.exp(-(now_ms - tonumber(ms[2])) / tau_ms)
  local written, busy_ms = tonumber(ms[1]), tonumber(ms[4] or 0)
  local pace = written * decay / window_ms
  if busy_ms * decay < BUSY_SATURATED * window_ms then
    pace = math.max(pace, written / math.max(1, busy_ms))
  end
  -- Decayed alike, so their ratio needs no decay.
  local late = tonumber(ms[5] or 0)
  return pace * math.max(MIN_ON_TIME, 1 - LATE_GAIN * late / math.max(1, written + late))
end

-- A bin's jobs are not all alike: a text of 512 tokens costs many of 16. Each bin's
-- rate_c and busy_c (decayed alike, so their ratio needs no decay) give its busy ms
-- per job, the model's hash the same over all its bins; a bin's weight is their ratio,
-- so the jobs ahead count in average jobs, the unit of the pace. 1 while either is
-- unknown; bounded, so one odd batch cannot swing the prediction far.
local WEIGHT_MIN, WEIGHT_MAX = 1 / 16, 16

local function ms_per_job(stats_key)
  local st = redis.call("HMGET", stats_key, "rate_c", "busy_c")
  local written, busy = tonumber(st[1] or 0), tonumber(st[2] or 0)
  if written <= 0 or busy <= 0 then return nil end
  return busy / written
end

local function bin_weight(stats_key, avg_ms)
  local own = avg_ms and ms_per_job(stats_key)
  if not own then return 1 end
  return math.min(WEIGHT_MAX, math.max(WEIGHT_MIN, own / avg_ms))
end

local function bin_weigher(model_stats_key)
  local avg_ms, memo = nil, {}
  return function(k, stats_key)
    if memo[k] == nil then
      if avg_ms == nil then avg_ms = ms_per_job(model_stats_key) or false end
      memo[k] = bin_weight(stats_key, avg_ms)
    end
    return memo[k]
  end
end

-- Workers starting (`carpool up`'s autoscaler writes coming_n and coming_at, Redis time,
-- with coming.lua) drain at one worker's busy speed (rate_c / busy_c, decayed alike)
-- from coming_at on, slowed by late jobs as the pace is. Past coming_at they fade as
-- exp(-since / tau): the drain rate, decayed over tau, learns them at that speed, so
-- pace + coming stays near what the pool drains. Nothing before the first drain (no
-- speed to count them at); nothing COMING_TAUS taus after coming_at.
local COMING_TAUS = 3

local function model_coming(model_stats_key, now_ms, tau_ms)
  local ms = redis.call("HMGET", model_stats_key, "coming_n", "coming_at", "rate_c", "busy_c",
    "late_c")
  if not ms[1] or not ms[2] or not ms[4] then return nil end
  local since_ms = now_ms - tonumber(ms[2])
  if tonumber(ms[1]) <= 0 or since_ms > COMING_TAUS * tau_ms then return nil end
  local written, late = tonumber(ms[3]), tonumber(ms[5] or 0)
  local on_time = math.max(MIN_ON_TIME, 1 - LATE_GAIN * late / math.max(1, written + late))
  local fade = since_ms > 0 and math.exp(-since_ms / tau_ms) or 1
  return {tonumber(ms[1]) * written / math.max(1, tonumber(ms[4])) * on_time * fade,
    math.max(0, -since_ms)}
end

-- Jobs the model drains within ms from now: at its pace (jobs/ms), plus the coming
-- workers' ({workers, ms until they serve}, or nil) once they serve.
local function drained_within(pace, coming, ms)
  local jobs = ms * pace
  if coming then jobs = jobs + coming[1] * math.max(0, ms - coming[2]) end
  return jobs
end
