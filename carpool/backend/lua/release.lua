-- release.lua: hand a claim's jobs back to their bin before their lease runs out (a
-- worker stopping, or a batch narrowed to isolate a suspect input). Each goes back
-- under the score admit.lua stored in its record, so at its old place: the claim took
-- the bin's most urgent jobs, so they are at its front again, in claim order (a record
-- without a score goes to the very front).
--
-- KEYS[1]  leases       {p.s}:leases
-- KEYS[2]  claim        {p.s}:claim:<token> (claim.lua)
-- ARGV[1]  token        lease token of the claim
-- ARGV[2]  job_prefix   "{p.s}:job:"
-- ARGV[3]  bin_prefix   "{p.s}:q:"
-- ARGV[4]  wake_prefix  "{p.s}:wake:"
-- ARGV[5]  wake_cap     a wake list's cap
-- ARGV[6]  refund       "1": refund the attempt the claim counted (the job never reached
--                       the model), "0": keep it counted
-- ARGV[7..] ids         in claim order
--
-- Keys built here, not in KEYS: the jobs' records (job_prefix .. id), and the bins and
-- wake lists their records name; all in KEYS[1]'s hash tag (carpool/backend/keys.py).
--
-- Returns one integer per id: 1 handed back, 0 no longer this claim's (untouched).
--#include lib/leave_claim.lua
--#include lib/record.lua
redis.replicate_commands()

local out = {}
if #ARGV < 7 then return out end
local held = redis.call("HMGET", KEYS[2], unpack(ARGV, 7))  -- each one's attempt count
local back = {}
for i = 7, #ARGV do
  if held[i - 6] then back[#back + 1] = ARGV[i] end
end
if #back > 0 then
  leave_claim(KEYS[2], KEYS[1], ARGV[1], back)  -- first: never refused for memory
end
local woken = {}
for i = 7, #ARGV do
  local id = ARGV[i]
  local key = ARGV[2] .. id
  local rec = held[i - 6] and redis.call("GET", key)
  local status, attempts, admission = nil, nil, nil
  if rec then status, attempts, admission = record_head(rec) end
  if status == "queued" then  -- held, and its record is there
    local score, model, bin = record_place(admission)
    -- Its record still says "queued" with the attempts before this claim (claim.lua
    -- writes neither): a refund leaves it so; else it keeps this claim's count.
    if ARGV[6] ~= "1" and attempts ~= held[i - 6] then
      redis.call("SET", key, requeued_record(rec, held[i - 6]))
    end
    redis.call("ZADD", ARGV[3] .. model .. ":" .. bin, score ~= "" and score or "0", id)
    woken[ARGV[4] .. model] = bin
    out[#out + 1] = 1
  else
    out[#out + 1] = 0
  end
end
for wake_key, bin_name in pairs(woken) do
  redis.call("RPUSH", wake_key, bin_name)
  redis.call("LTRIM", wake_key, -tonumber(ARGV[5]), -1)
end
return out
