-- quota.lua: not a script of its own. admit.lua's quotas (docs/admission.md, "Quotas"):
-- an API key's device time per hour and model (read from the hour's usage hash,
-- lib/usage.lua: what its completed jobs used), and its jobs per second and model (a
-- token bucket, "<tokens> <as of ms>", in the same hash's field "<owner>:s"; a new
-- hour starts it full). No extra round trip: the admission's own call reads them.
--#include lib/usage.lua

-- How many of n jobs the owner's quotas let in now (n: none binds), and when they
-- bind, the refusal {kind, used, limit, retry_after_s} and the bucket's tokens.
-- prefix: the usage prefix; device_ms: the hour's device quota (ms; 0: none);
-- jobs_per_s (0: none). Without a quota, nothing is read.
local function quota_allow(prefix, owner, now_ms, device_ms, jobs_per_s, n)
  if device_ms <= 0 and jobs_per_s <= 0 then return n, nil, nil end
  local st = redis.call("HMGET", usage_key(prefix, now_ms), owner .. ":d", owner .. ":s")
  local used_us = tonumber(st[1] or 0)
  if device_ms > 0 and used_us >= device_ms * 1000 then  -- spent until the next hour
    return 0, {"device", string.format("%d", used_us / 1000), device_ms,
      string.format("%.3f", (USAGE_HOUR_MS - now_ms % USAGE_HOUR_MS) / 1000)}, nil
  end
  if jobs_per_s <= 0 then return n, nil, nil end
  local burst, tokens = math.max(1, jobs_per_s), math.max(1, jobs_per_s)
  if st[2] then
    local left, at = string.match(st[2], "(%S+) (%S+)")
    tokens = math.min(burst, tonumber(left) + (now_ms - tonumber(at)) / 1000 * jobs_per_s)
  end
  local allowed = math.min(n, math.max(0, math.floor(tokens)))
  if allowed >= n then return n, nil, tokens end
  -- The next job waits for its token: one, on top of those the admitted jobs take.
  local wait_s = (allowed + 1 - tokens) / jobs_per_s
  return allowed, {"jobs", "0", jobs_per_s, string.format("%.3f", wait_s)}, tokens
end

-- After the admission (a write): the bucket less the n jobs admitted.
local function quota_spend(prefix, owner, now_ms, tokens, n, ttl_s)
  if not tokens or n <= 0 then return end  -- no bucket: no quota_jobs_per_s
  local key = usage_key(prefix, now_ms)
  local new = redis.call("HSET", key, owner .. ":s", string.format("%.4f %d", tokens - n, now_ms))
  if new == 1 and redis.call("TTL", key) < 0 then redis.call("EXPIRE", key, ttl_s) end
end
