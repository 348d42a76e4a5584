-- admit.lua: admit one job into its bin, or refuse it, atomically.
--
-- KEYS[1]  bin list      {p}:q:<model>:<bin>   ids, oldest first
-- KEYS[2]  job hash      {p}:job:<id>          created here
-- KEYS[3]  wake list     {p}:wake:<model>      a token wakes one blocked worker
-- KEYS[4]  idempotency   {p}:idem:<model>:<k>  read/written only when ARGV[10] == "1"
-- ARGV[1]  id            ARGV[2] model        ARGV[3] bin
-- ARGV[4]  input (JSON)  ARGV[5] max_depth    ARGV[6] max_batch
-- ARGV[7]  ttl_s of a queued record           ARGV[8] deadline, ms after admission (0: none)
-- ARGV[9]  priority      ARGV[10] "1" if an idempotency key was given
-- ARGV[11] input digest  ARGV[12] owner digest ("" when no API key)
-- ARGV[13] wake list cap
--
-- Returns {"ok", id, depth_after, admit_ms} | {"full", depth} |
--         {"dup", first_id} | {"conflict", first_id}
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

local depth = redis.call("LLEN", KEYS[1])
if depth >= tonumber(ARGV[5]) then
  return {"full", depth}
end

local t = redis.call("TIME")
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local deadline_ms = 0
if tonumber(ARGV[8]) > 0 then
  deadline_ms = now_ms + tonumber(ARGV[8])
end

redis.call("HSET", KEYS[2],
  "model", ARGV[2], "bin", ARGV[3], "input", ARGV[4], "status", "queued",
  "t_admit", now_ms, "deadline", deadline_ms, "priority", ARGV[9],
  "attempts", 0, "digest", ARGV[11], "owner", ARGV[12])
redis.call("EXPIRE", KEYS[2], ARGV[7])
redis.call("RPUSH", KEYS[1], ARGV[1])
if ARGV[10] == "1" then
  redis.call("SET", KEYS[4], ARGV[1] .. " " .. ARGV[11], "EX", ARGV[7])
end

-- Wake a worker only when its plan changes: the bin got a new oldest job (a new
-- deadline) or just filled a batch. Other arrivals need no wake-up.
local after = depth + 1
if after == 1 or after == tonumber(ARGV[6]) then
  redis.call("RPUSH", KEYS[3], ARGV[3])
  redis.call("LTRIM", KEYS[3], -tonumber(ARGV[13]), -1)
end
return {"ok", ARGV[1], after, now_ms}
