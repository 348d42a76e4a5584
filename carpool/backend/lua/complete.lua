-- complete.lua: write the results of one batch, once, and wake their waiters.
--
-- KEYS[1]  leases           {p.s}:leases
-- KEYS[2]  stats            {p.s}:stats:<model>:<bin>  drained += jobs written; the drain
--                           rate and the busy time behind it (busy_c)
-- KEYS[3]  claim            {p.s}:claim:<token> (claim.lua)
-- KEYS[4]  model_stats      {p.s}:mstats:<model>  the same drain and busy time summed over
--                           all the model's bins, and late_c: admit.lua's pace
-- KEYS[5]  outbox           {p.s}:outbox (lib/outbox.lua; same slot)
-- KEYS[6]  hook_wake        {p.s}:hook-wake
-- KEYS[7..6+n]    bins      (optional) bin zsets of this model to peek after the write,
--                           as peek.lua does: the worker decides its next batch from this
--                           reply, without a peek's round trip of its own
-- KEYS[7+n..6+2n] bin_stats their stats hashes
-- ARGV[1]  token            lease token of the claim
-- ARGV[2]  job_prefix       "{p.s}:job:"
-- ARGV[3]  done_channel
-- ARGV[4]  result_ttl_s
-- ARGV[5]  batch_json       {"size","bin","worker"}
-- ARGV[6]  drain_tau_ms     drain-rate time constant (carpool/admission/retry_after.py)
-- ARGV[7]  results_channel  (carpool/backend/pushed.py)
-- ARGV[8]  pushed           the jobs' pushed views (carpool/backend/pushed.py): one JSON
--                           line each, "\n" between, those not pushed left out
-- ARGV[9]  jobs             j, the number of jobs that follow
-- ARGV[10] late             the claim's jobs that were late (past their deadline at the
--                           batch's end or started past their admitted end, else
--                           queued past max_queue_ms) or it expired:
--                           late_c, decayed as rate_c, corrects admit.lua's pace
-- ARGV[11] hooks            the webhook events of this batch (lib/wire.lua's completion
--                           hooks; k: the job's place in per_job, from 1); each goes to
--                           the outbox if, and only if, its job is written here
-- ARGV[12] usage_prefix     {p.s}:usage:<model>: the hour's usage hash is this and the
--                           hour (lib/usage.lua; same slot)
-- ARGV[13] usage_ttl_s      its TTL, set when the hour's hash is created
-- ARGV[14] usage            the batch's usage, one line per owner (lib/wire.lua); added
--                           for the jobs written only, once per owner, "" none
-- ARGV[15] busy_ms          how long the worker was busy with this batch alone: from its
--                           start, or the end of the batch before it when they overlapped
--                           (a pipelined worker claims batch N+1 while N computes); 0:
--                           claim to completion. busy_c sums it: admit.lua's busy share
--                           and busy speed
-- ARGV[16..15+4j] per_job   4 values per job: id, the byte length of its line in
--   `pushed` (0: not pushed), and its ended record but for t_done, in two parts
--   (carpool/backend/records.py's `ended_parts`): the head up to t_claim, built by the
--   worker from the admission fields and the attempt count the claim handed out, and
--   the rest from the timings on, payload included (the result JSON when done, the error
--   message when failed); the record written is head .. t_done .. rest (Redis's clock)
-- ARGV[16+4j..] scans      the max_batch of each bin peeked, in KEYS' order
--
-- The claim hash (KEYS[3]) says which jobs the claim still holds, and its time: one
-- HMGET for the batch. Per job: one SET ... XX EX of its ended record, which takes the
-- input with it; the worker built all of it but t_done (only claim.lua writes a
-- claim's attempt counts, so the worker's equal them for every job still held). The
-- claim loses its ids in one HDEL, its token leaves the leases zset with its last
-- job, and one PUBLISH names the jobs written (space-separated:
-- carpool.backend.queue.ended_ids).
--
-- Returns one integer per job: 1 written, 0 refused (the claim no longer holds it: the
-- job was reclaimed by the reaper, handed back, or already finished). A late, zombie
-- worker therefore cannot overwrite a result. With bins to peek, then now_ms and their
-- states (peek_bins.lua), as they are after the write and before any claim.
--
-- Keys built here, not in KEYS: each job's record, job_prefix .. id (a batch's ids are
-- data: the worker's claim), and the hour's usage hash (its hour is Redis's clock), in
-- KEYS[1]'s hash tag (carpool/backend/keys.py).
--#include lib/record.lua
--#include lib/peek_bins.lua
--#include lib/leave_claim.lua
--#include lib/outbox.lua
--#include lib/usage.lua
redis.replicate_commands()

local STRIDE = 4  -- values per job in ARGV
local FIRST_JOB = 16  -- ARGV index of the first job's id
local npeek = (#KEYS - 6) / 2
local jobs_end = FIRST_JOB - 1 + tonumber(ARGV[9]) * STRIDE  -- the last per-job argument

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format("%d", now_ms)  -- once: a number argument is formatted per call
local out = {}
local ours = {}  -- ARGV index of each job the claim still holds
local asked = {"t"}  -- the claim's time, then its jobs
for i = FIRST_JOB, jobs_end, STRIDE do asked[#asked + 1] = ARGV[i] end
local held = redis.call("HMGET", KEYS[3], unpack(asked))
local claimed_ms = tonumber(held[1])  -- when this batch was claimed: its busy time ends now
for k = 2, #held do
  -- Held, and handed back with the record its claim handed out (an outcome without it
  -- is refused, and its job stays in the claim: the reaper returns it).
  if held[k] and ARGV[FIRST_JOB + (k - 2) * STRIDE + 2] ~= "" then
    out[#out + 1] = 1
    ours[#ours + 1] = FIRST_JOB + (k - 2) * STRIDE
  else
    out[#out + 1] = 0
  end
end
if #ours > 0 then
  -- Out of the claim first, every one of them (written or refused below): Redis refuses
  -- a script for memory only at its first write, and only if that write may grow
  -- memory (leave_claim's cannot). So completions, which free memory (the inputs go),
  -- go on while a full Redis (noeviction) refuses admissions.
  local leaving = {}
  for k, i in ipairs(ours) do leaving[k] = ARGV[i] end
  leave_claim(KEYS[3], KEYS[1], ARGV[1], leaving)
end
-- One SET ... XX EX per job writes its ended record and its TTL at once, over the queued
-- record (its input goes with it), without reading it: the worker built it from what
-- claim.lua handed out, and no one writes a record its claim holds. XX: a record gone
-- meanwhile (an evicting maxmemory policy, a key deleted by hand) is not written
-- again as a partial record but refused.
local kept = {}
for _, i in ipairs(ours) do
  local set = redis.call("SET", ARGV[2] .. ARGV[i], ARGV[i + 2] .. now_s .. ARGV[i + 3],
    "XX", "EX", ARGV[4])
  if set then
    kept[#kept + 1] = i
  else
    out[(i - FIRST_JOB) / STRIDE + 1] = 0
  end
end
ours = kept
local written = #ours
local ended = {}  -- the ids written
for k, i in ipairs(ours) do ended[k] = ARGV[i] end
if written > 0 then
  -- The views of the jobs written, pushed to the web (carpool/backend/pushed.py): the web
  -- answers their polls without a read. Before the ids: a poll woken finds it there.
  -- Every job written (the usual case): ARGV[8] as it came, never rebuilt line by line
  -- (each string a script builds costs a copy and the Lua collector's time).
  local pushed = ARGV[8]
  if written < #out and pushed ~= "" then  -- only the lines of the jobs written
    local mine, lines, at = {}, {}, 1
    for _, i in ipairs(ours) do mine[i] = true end
    for i = FIRST_JOB, jobs_end, STRIDE do
      local len = tonumber(ARGV[i + 1])
      if len > 0 then
        if mine[i] then lines[#lines + 1] = string.sub(pushed, at, at + len - 1) end
        at = at + len + 1
      end
    end
    pushed = table.concat(lines, "\n")
  end
  if pushed ~= "" then
    redis.call("PUBLISH", ARGV[7], "done " .. now_s .. "\n" .. ARGV[5] .. "\n" .. pushed)
  end
  redis.call("PUBLISH", ARGV[3], table.concat(ended, " "))
  if ARGV[11] ~= "" then  -- webhook events, of the jobs written only (lib/outbox.lua)
    local hooked = 0
    for k, letter, owner, hook in wire_completion_hooks(ARGV[11]) do
      if out[k] == 1 then
        hooked = hooked + outbox_add(KEYS[5], ARGV[FIRST_JOB + (k - 1) * STRIDE], letter,
          hook, owner, now_s)
      end
    end
    outbox_wake(KEYS[6], hooked)
  end
  -- What the jobs written cost, per owner and hour (lib/usage.lua): a few HINCRBY per
  -- owner in the batch, none per job.
  usage_add(usage_key(ARGV[12], now_ms), ARGV[13], ARGV[14], out, written == #out)
  -- The drain rate is an exponentially decayed count of written jobs (rate_c, as of
  -- rate_t) and the time of the first drain (rate_t0); admit.lua reads it on a full
  -- bin and carpool/admission/retry_after.py turns it into jobs/s: the sum over all workers.
  -- busy_c, decayed alike, sums the ms each batch kept its worker busy (ARGV[15]; else
  -- claim to completion): rate_c / busy_c is how fast the workers drain while busy,
  -- whatever the load. Overlapping batches of one worker count once, or a pipelined
  -- worker would look twice as busy and half as fast as it is. The model's hash
  -- (KEYS[4]) sums both over all its bins, with late_c: admit.lua's pace.
  local busy_ms = tonumber(ARGV[15])
  if busy_ms <= 0 then busy_ms = now_ms - (claimed_ms or now_ms) end
  busy_ms = math.max(1, busy_ms)
  local tau_ms = tonumber(ARGV[6])
  for _, key in ipairs({KEYS[2], KEYS[4]}) do
    local st = redis.call("HMGET", key, "rate_c", "rate_t", "rate_t0", "busy_c", "late_c")
    local c, busy, late, decay = 0, 0, 0, 1
    if st[1] then
      decay = math.exp(-(now_ms - tonumber(st[2])) / tau_ms)
      c, busy, late = tonumber(st[1]) * decay, tonumber(st[4] or 0) * decay,
        tonumber(st[5] or 0) * decay
    end
    redis.call("HSET", key, "last_batch_ms", now_ms, "rate_t", now_ms,
      "rate_c", string.format("%.6f", c + written), "rate_t0", st[3] or now_ms,
      "busy_c", string.format("%.3f", busy + busy_ms),
      "late_c", string.format("%.6f", late + tonumber(ARGV[10])))
  end
  redis.call("HINCRBY", KEYS[2], "drained", written)
end
if npeek > 0 then
  local bins, stats = {}, {}
  for i = 1, npeek do
    bins[i], stats[i] = KEYS[6 + i], KEYS[6 + npeek + i]
  end
  out[#out + 1] = now_ms
  local scans = {unpack(ARGV, jobs_end + 1)}
  peek_bins(bins, stats, scans, ARGV[2], now_ms, out)
end
return out
