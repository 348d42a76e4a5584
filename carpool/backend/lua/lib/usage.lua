-- usage.lua: not a script of its own. What each API key's jobs cost, per model and
-- hour (docs/admission.md, "Usage"): complete.lua adds a batch's jobs, device and queue
-- time once per owner in the batch (not per job); admit.lua counts refusals (here and
-- per model and service tier) and reads it for quotas. The hour's hash is built here
-- from Redis's clock: a usage prefix "{p.s}:usage:<model>:" (carpool/backend/keys.py)
-- and the hour since the epoch; its fields "<owner>:<letter>": j jobs written, d device
-- µs, q queue ms, r refused.
-- Its TTL is set when an owner's field is new only (HINCRBY answers the count it added:
-- EXPIRE NX would need Redis 7), so a busy hour pays no extra command. usage_add reads
-- lib/wire.lua's lines: a script that calls it includes that (complete.lua does,
-- through lib/outbox.lua); admit.lua does not pay for defining it.
local USAGE_HOUR_MS = 3600000

local function usage_key(prefix, now_ms)  -- nil without a prefix: nothing counted
  if prefix == "" then return nil end
  return prefix .. string.format("%d", math.floor(now_ms / USAGE_HOUR_MS))
end

-- Add a completed batch's usage (wire.py's UsageLine lines) to the hour's hash;
-- `written` (out[k] == 1) says which of the per_job jobs were written: with every one
-- written (all_written), the owners' sums as they came; else the written ones alone.
local function usage_add(key, ttl_s, text, written, all_written)
  if text == "" then return end
  local fresh = false
  for owner, jobs, device_us, queue_ms, each in wire_usage_lines(text) do
    if not all_written then
      jobs, device_us, queue_ms = 0, 0, 0
      for k, d, q in wire_usage_each(each) do
        if written[k] == 1 then
          jobs, device_us, queue_ms = jobs + 1, device_us + d, queue_ms + q
        end
      end
    end
    if jobs > 0 then
      fresh = redis.call("HINCRBY", key, owner .. ":j", jobs) == jobs or fresh
      redis.call("HINCRBY", key, owner .. ":d", device_us)
      redis.call("HINCRBY", key, owner .. ":q", queue_ms)
    end
  end
  if fresh then redis.call("EXPIRE", key, ttl_s) end
end

-- Count `count` jobs refused at admission: in the hour's hash for their owner (prefix:
-- the usage prefix; "" none), and in the model's stats hash (model_stats,
-- {p.s}:mstats:<model>) for their service tier, field "refused:<tier>", which GET
-- /models shows. redis.pcall: on a full Redis (noeviction) the write fails, and the
-- refusal is still answered.
local function usage_refused(prefix, now_ms, ttl_s, owner, count, model_stats, tier)
  if count <= 0 then return end
  redis.pcall("HINCRBY", model_stats, "refused:" .. tier, count)
  if prefix == "" then return end
  local key = usage_key(prefix, now_ms)
  local added = redis.pcall("HINCRBY", key, owner .. ":r", count)
  if added == count then redis.pcall("EXPIRE", key, ttl_s) end
end
