-- reap.lua: take back the jobs of claims whose lease expired (their worker died, froze
-- or was killed), atomically, so several workers may run it at once: each expired
-- claim is taken back by exactly one call.
--
-- KEYS[1]  leases        {p.s}:leases  zset lease token -> lease deadline (ms)
-- KEYS[2]  dead          {p.s}:dead    ids failed here, newest first, capped
-- KEYS[3]  outbox        {p.s}:outbox (lib/outbox.lua): a job failed here that asked for
--                        its "failed" webhook gets it, in this call
-- KEYS[4]  hook_wake     {p.s}:hook-wake
-- ARGV[1]  batch         most jobs taken back per call (whole claims: at least one)
-- ARGV[2]  max_attempts
-- ARGV[3]  job_prefix    "{p.s}:job:"
-- ARGV[4]  bin_prefix    "{p.s}:q:"
-- ARGV[5]  wake_prefix   "{p.s}:wake:"
-- ARGV[6]  done_channel
-- ARGV[7]  dead_cap      the dead list's cap
-- ARGV[8]  wake_cap      a wake list's cap
-- ARGV[9]  result_ttl_s  for a model not listed below
-- ARGV[10] claim_prefix  "{p.s}:claim:"
-- ARGV[11..] ttls        pairs: model, result_ttl_s
--
-- Each expired claim's hash (claim.lua) names the jobs it still held, with their attempt
-- counts. A job under max_attempts goes back into its bin zset under the score admit.lua
-- stored in its record (so at its old place: usually the front, as it was among the most
-- urgent; a record without a score goes to the very front), its record keeps the
-- attempt (its status is still "queued": a claim does not write it), and its model's
-- workers are woken. A job at max_attempts ends "failed" with a reason (naming the
-- lost worker; no batch: it never completed one), its input goes, and its id goes on
-- the dead list.
--
-- Keys built here, not in KEYS: which claims expired, which jobs they held and which
-- bins those wait in are data read here, so claim, job, bin and wake keys are built
-- from the prefixes; all in KEYS[1]'s hash tag (carpool/backend/keys.py).
--
-- Returns {now_ms, requeued, failed, dropped}; dropped: jobs of an expired claim whose
-- record had already ended or expired.
--#include lib/record.lua
--#include lib/outbox.lua
redis.replicate_commands()

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local now_s = string.format("%d", now_ms)
local limit = tonumber(ARGV[1])
local tokens = redis.call("ZRANGEBYSCORE", KEYS[1], "-inf", now_ms, "LIMIT", 0, limit)
local max_attempts = tonumber(ARGV[2])
local ttl = {}
for i = 11, #ARGV, 2 do
  ttl[ARGV[i]] = ARGV[i + 1]
end

local requeued, failed, dropped, hooked = 0, 0, 0, 0
local woken = {}  -- wake key -> bin name
for _, token in ipairs(tokens) do
  if requeued + failed + dropped >= limit then break end
  -- ZREM and DEL first: they are never refused for memory, and after them the other
  -- writes of this script are not either, so a full Redis still gets its jobs back.
  redis.call("ZREM", KEYS[1], token)
  local claim_key = ARGV[10] .. token
  local fields = redis.call("HGETALL", claim_key)
  redis.call("DEL", claim_key)
  local claimed = {}  -- the claim's time ("t") and worker ("w"), as claim.lua wrote them
  for f = 1, #fields, 2 do claimed[fields[f]] = fields[f + 1] end
  for f = 1, #fields, 2 do
    local id = fields[f]
    if id ~= "t" and id ~= "w" then
      local key = ARGV[3] .. id
      local rec = redis.call("GET", key)
      local status, _, admission = nil, nil, nil
      if rec then status, _, admission = record_head(rec) end
      local attempts = fields[f + 1]  -- this claim's count (claim.lua)
      if status ~= "queued" then  -- its record ended or is gone: the claim held it no more
        dropped = dropped + 1
      elseif (tonumber(attempts) or 0) >= max_attempts then
        local _, model = record_place(admission)
        local worker = claimed.w or "?"
        redis.call("SET", key, ended_record("failed", attempts, admission,
          claimed.t or now_s, now_s, "", "",
          "worker lost " .. attempts .. " times (last: " .. worker ..
          "); the input may crash workers"), "EX", ttl[model] or ARGV[9])  -- input and all
        redis.call("PUBLISH", ARGV[6], id)
        redis.call("LPUSH", KEYS[2], id)
        redis.call("LTRIM", KEYS[2], 0, tonumber(ARGV[7]) - 1)
        failed = failed + 1
        hooked = hooked + outbox_add(KEYS[3], id, "f", record_hook(admission),
          record_fields(admission, 3)[3], now_s)
      else
        local score, model, bin = record_place(admission)
        redis.call("SET", key, requeued_record(rec, attempts))
        redis.call("ZADD", ARGV[4] .. model .. ":" .. bin, score ~= "" and score or "0", id)
        woken[ARGV[5] .. model] = bin
        requeued = requeued + 1
      end
    end
  end
end

for wake_key, bin_name in pairs(woken) do
  redis.call("RPUSH", wake_key, bin_name)
  redis.call("LTRIM", wake_key, -tonumber(ARGV[8]), -1)
end
outbox_wake(KEYS[4], hooked)
return {now_ms, requeued, failed, dropped}
