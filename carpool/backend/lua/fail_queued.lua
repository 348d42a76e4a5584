-- fail_queued.lua: end the queued jobs of one bin "failed", with one message for all,
-- atomically: the jobs of a model that every live worker refused, at once when none is
-- still loading it, else once the refusal has lasted its grace
-- (carpool/backend/refused_models.py). Several workers may run it at once: a job leaves
-- its bin by one ZREM, so exactly one call ends it, and a job a claim took first (no
-- longer in the bin) is left to its claim.
--
-- KEYS[1]  bin              {p.s}:q:<model>:<bin>
-- KEYS[2]  bytes            {p.s}:bytes:<model> (its API keys' hashes are
--                           "<KEYS[2]>:<owner>", same slot): a failed input leaves the
--                           budget, as in cancel.lua
-- KEYS[3]  outbox           {p.s}:outbox (lib/outbox.lua): each job ended here that asked
--                           for its "failed" webhook gets it, in this call
-- KEYS[4]  hook_wake        {p.s}:hook-wake
-- ARGV[1]  job_prefix       "{p.s}:job:"
-- ARGV[2]  done_channel
-- ARGV[3]  result_ttl_s
-- ARGV[4]  message          the error message (the record's payload)
-- ARGV[5]  max_n            most jobs ended per call (the caller calls again while it
--                           returns that many)
--
-- Each job's record ends as reap.lua writes a failure: "failed", its attempts, its
-- admission fields kept, no claim time, t_done now, no timings, no batch, the message
-- as payload, with the model's result TTL (the input goes). Its idempotency key goes,
-- as at a cancel: a retry once the model is served queues a new job. One PUBLISH
-- names the ids ended (space-separated, as complete.lua does), so long-polls wake.
--
-- Keys built here, not in KEYS: the jobs' records (job_prefix .. id: ids read from the
-- bin), their owners' byte budgets and their idempotency keys (named by each record);
-- all in KEYS[1]'s hash tag (carpool/backend/keys.py).
--
-- Returns {ended, dropped}: dropped are ids in the bin whose record was gone or no
-- longer queued (taken out of the bin all the same).
--#include lib/record.lua
--#include lib/budget.lua
--#include lib/outbox.lua
redis.replicate_commands()

local ids = redis.call("ZRANGE", KEYS[1], 0, tonumber(ARGV[5]) - 1)
if #ids == 0 then
  return {0, 0}
end
local t = redis.call("TIME")
local now_s = string.format("%d", tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
local ended, dropped, hooked = {}, 0, 0
local budget = {}  -- byte-budget key -> bytes leaving it
for _, id in ipairs(ids) do
  -- ZREM first: never refused for memory, so a full Redis still ends its jobs.
  redis.call("ZREM", KEYS[1], id)
  local key = ARGV[1] .. id
  local rec = redis.call("GET", key)
  local status, attempts, admission, nl = nil, nil, nil, nil
  if rec then status, attempts, admission, nl = record_head(rec) end
  if status ~= "queued" then
    dropped = dropped + 1
  else
    local fields = record_fields(admission, 9)
    local owner, idem = fields[3], fields[9] or ""
    local n = #rec - (nl or #rec)  -- the input: all after the head's newline
    budget[KEYS[2]] = (budget[KEYS[2]] or 0) + n
    if owner ~= "" then
      local own = KEYS[2] .. ":" .. owner
      budget[own] = (budget[own] or 0) + n
    end
    if idem ~= "" then
      local prior = redis.call("GET", idem)
      if prior and string.sub(prior, 1, #id + 1) == id .. " " then
        redis.call("DEL", idem)
      end
    end
    redis.call("SET", key, ended_record("failed", attempts, admission, "", now_s, "", "",
      ARGV[4]), "EX", ARGV[3])
    ended[#ended + 1] = id
    hooked = hooked + outbox_add(KEYS[3], id, "f", record_hook(admission), owner, now_s)
  end
end
budget_free(budget)  -- a hash goes with its last queued byte
if #ended > 0 then
  redis.call("PUBLISH", ARGV[2], table.concat(ended, " "))
end
outbox_wake(KEYS[4], hooked)
return {#ended, dropped}
