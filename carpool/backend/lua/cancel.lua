-- cancel.lua: cancel a queued job, or delete a finished one; or, queued-only, cancel a
-- job only while it is queued (a synchronous caller that hung up: web/common/sync_wait.py).
--
-- KEYS[1]  job              the job record {p.s}:job:<id> (carpool/backend/records.py)
-- KEYS[2]  outbox           {p.s}:outbox (lib/outbox.lua): a cancelled job that asked for
--                           its "cancelled" webhook gets it, in this call
-- KEYS[3]  hook_wake        {p.s}:hook-wake
-- ARGV[1]  id
-- ARGV[2]  bin_prefix       "{p.s}:q:" (the bin zset is <prefix><model>:<bin>, read from
--                           the record; same slot)
-- ARGV[3]  done_channel
-- ARGV[4]  result_ttl_s
-- ARGV[5]  bytes_prefix     "{p.s}:bytes:" (same slot): a cancelled input leaves its
--                           model's (and its API key's) byte budget, as in claim.lua
-- ARGV[6]  results_channel  a deleted job's id is published there ("del <id>"), so no
--                           web process answers from a result it was pushed
--                           (carpool/backend/pushed.py)
-- ARGV[7]  notify           "1": the "cancelled" webhook is recorded (above); "0": not,
--                           for a cancel that undoes the job's own admission (a /v2
--                           request refused in part: web/open_inference/routes.py), of
--                           which no client knew
-- ARGV[8]  queued_only      "1": only a queued job is touched (cancelled); a running,
--                           finished or missing one is left as it is, and the answer
--                           says which ("running", "ended", "missing")
-- ARGV[9]  reason           the cancelled job's error, as its document shows it
--
-- Either way the job's idempotency key ("idem", when it still names this job) is
-- deleted: a retry with that key queues a new job instead of finding this one.
--
-- Keys built here, not in KEYS: the job's bin, its byte budgets and its idempotency key
-- are named by its record (model, bin, owner, idem), which the caller has not read; all
-- in KEYS[1]'s hash tag (carpool/backend/keys.py).
--
-- Returns "cancelled" | "deleted" | "running" (not cancellable) | "missing"; queued-only
-- never "deleted": "ended" for a finished job.
--#include lib/record.lua
--#include lib/budget.lua
--#include lib/outbox.lua
redis.replicate_commands()

local rec = redis.call("GET", KEYS[1])
if not rec then
  return "missing"
end
local status, attempts, admission, nl = record_head(rec)
local fields = record_fields(admission, 9)
local owner, model, bin, idem = fields[3], fields[5], fields[6], fields[9] or ""
-- A claimed job's record still says "queued" (claim.lua writes none): it is running
-- when it is no longer in its bin. ZREM first: it is the check and the cancel's first
-- write at once (never refused for memory, so a full Redis still cancels).
local bin_key = ARGV[2] .. model .. ":" .. bin
if status == "queued" and redis.call("ZREM", bin_key, ARGV[1]) == 0 then
  status = "running"
end
if ARGV[8] == "1" and status ~= "queued" then
  return status == "running" and "running" or "ended"  -- queued-only: nothing written
end
if status ~= "running" and idem ~= "" then
  local prior = redis.call("GET", idem)
  if prior and string.sub(prior, 1, #ARGV[1] + 1) == ARGV[1] .. " " then
    redis.call("DEL", idem)
  end
end
if status == "queued" then
  -- >>> byte budget (carpool/admission/budget.py): the input leaves the count, as in claim.lua
  local n = #rec - (nl or #rec)  -- the input: all after the head's newline
  local freed = {[ARGV[5] .. model] = n}
  if owner ~= "" then freed[ARGV[5] .. model .. ":" .. owner] = n end
  budget_free(freed)
  -- <<< byte budget
  local t = redis.call("TIME")
  local now_s = string.format("%d", tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
  redis.call("SET", KEYS[1], ended_record("cancelled", attempts, admission, "", now_s, "", "",
    ARGV[9]), "EX", ARGV[4])  -- the input goes with the old record
  redis.call("PUBLISH", ARGV[3], ARGV[1])
  if ARGV[7] == "1" then
    outbox_wake(KEYS[3], outbox_add(KEYS[2], ARGV[1], "c", record_hook(admission), owner,
      now_s))
  end
  return "cancelled"
end
if status == "running" then
  return "running"
end
redis.call("DEL", KEYS[1])
redis.call("PUBLISH", ARGV[6], "del " .. ARGV[1])
return "deleted"
