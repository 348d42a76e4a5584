-- claim_batch.lua: not a script of its own. Scripts that lease a batch include it
-- (carpool/backend/connection.py: a line "--#include claim_batch"): claim.lua, and peek.lua and
-- complete.lua when the worker asks them to claim its next batch ahead (below). Needs
-- record.lua included before it.
--
-- claim_batch(c, out) leases up to c.max_n of the bin's most urgent live jobs to c.token
-- and appends "id, record" per job to `out`, most urgent first; returns how many it
-- ended "expired" instead. `c` holds: bin (zset key), leases (zset key), bytes (the
-- model's byte-budget hash), claim (the claim hash {p.s}:claim:<token>), max_n,
-- lease_ms, token, job_prefix, worker, done_channel, result_ttl_s, budget (most ids
-- taken off the bin, live or not), queued_ttl_s, now_ms, now_s. claim.lua says what it
-- reads and writes.
local function claim_batch(c, out)
  local expired, live, budget = 0, 0, c.budget
  local held = {"t", c.now_s, "w", c.worker}  -- the claim hash's fields
  local stale_ms = c.now_ms - c.queued_ttl_s * 1000  -- admitted then or before: too old

  -- >>> byte budget (carpool/admission/budget.py): sum the bytes leaving per budget hash
  local freed = {}  -- hash key -> bytes
  local function unbudget_job(input_bytes, owner)
    freed[c.bytes] = (freed[c.bytes] or 0) + input_bytes
    if owner ~= "" then
      local key = c.bytes .. ":" .. owner
      freed[key] = (freed[key] or 0) + input_bytes
    end
  end
  -- <<< byte budget

  while live < c.max_n and budget > 0 do
    -- ZPOPMIN's reply would carry each score, formatted as a float ("%.17g") per job.
    local popped = redis.call("ZRANGE", c.bin, 0, math.min(c.max_n - live, budget) - 1)
    if #popped == 0 then break end
    redis.call("ZREMRANGEBYRANK", c.bin, 0, #popped - 1)  -- the first write: never OOM
    budget = budget - #popped
    local asked = {}
    for i = 1, #popped do asked[i] = c.job_prefix .. popped[i] end
    local got = redis.call("MGET", unpack(asked))
    for i = 1, #popped do
      local id, rec = popped[i], got[i]
      local attempts_s, t_admit, deadline_s, owner, nl = nil, nil, nil, nil, nil
      if rec then
        attempts_s, t_admit, deadline_s, owner, nl = record_queued(rec)
      end
      if attempts_s then  -- a record there, still queued
        unbudget_job(#rec - nl, owner)
        local deadline = deadline_s ~= "" and tonumber(deadline_s) or 0
        local why = nil
        if deadline > 0 and c.now_ms >= deadline then
          why = "deadline passed while queued"
        elseif (tonumber(t_admit) or c.now_ms) <= stale_ms then
          why = "queued longer than CARPOOL_QUEUED_TTL_S (" .. c.queued_ttl_s .. " s)"
        end
        if why then
          redis.call("SET", asked[i],
            ended_record("expired", attempts_s, record_admission(rec, attempts_s, nl), "",
              c.now_s, "", "", why), "EX", c.result_ttl_s)
          redis.call("PUBLISH", c.done_channel, id)
          expired = expired + 1
        else
          local attempts = 1  -- "": never claimed before
          if attempts_s ~= "" then attempts = tonumber(attempts_s) + 1 end
          -- Nothing is written to the record (a write per job is most of a claim's
          -- cost): the worker, the claim time and the attempt count are the claim's.
          held[#held + 1] = id
          held[#held + 1] = string.format("%d", attempts)
          out[#out + 1] = id
          out[#out + 1] = rec
          live = live + 1
        end
      end
    end
  end
  if live > 0 then
    redis.call("HSET", c.claim, unpack(held))
    redis.call("ZADD", c.leases, c.now_ms + c.lease_ms, c.token)
  end
  for key, n in pairs(freed) do  -- byte budget: the hash goes with its last queued byte
    local queued = tonumber(redis.call("HGET", key, "queued"))
    if queued and queued > n then
      redis.call("HINCRBY", key, "queued", -n)
    elseif queued then  -- at 0, or below: a requeued job (reap, release) was counted once
      redis.call("DEL", key)
    end
  end
  return expired
end

-- claim_ahead(request, keys, bins, scans, first, job_prefix, now_ms, now_s, out): the batch a
-- worker asks for ahead, decided here from the bin states peek_bins just appended to
-- `out` from index `first` (4 values per bin), before any of them changed. `request`
-- is "token lease_ms worker queued_ttl_s done_channel result_ttl_s scan_factor max_n_1
-- ... max_n_b" (tab-separated; max_n_i 0: never bin i), `keys` {leases, bytes, claim}.
-- It claims only what the worker's own decision (carpool/scheduling/batching.py) is sure to be,
-- given that these bins are all the worker serves: exactly one bin holds jobs (a paused
-- bin's count too: then nothing is claimed ahead), it holds
-- a full batch (peek_bins' scan size, the worker's max_batch), and its most urgent job
-- has no deadline (a deadline may make the batch smaller). scans[i]: bin i's max_batch. Appends the bin's index and
-- the expired count, then "id, record" per job; or 0 alone when it claimed nothing.
-- The worker checks its decision against it and hands back a batch it does not run.
local function claim_ahead(request, keys, bins, scans, first, job_prefix, now_ms, now_s, out)
  local f, at = {}, 1  -- its fields, empty ones kept
  while true do
    local stop = string.find(request, "\t", at, true)
    f[#f + 1] = string.sub(request, at, (stop or 0) - 1)
    if not stop then break end
    at = stop + 1
  end
  local chosen = nil
  for i = 1, #bins do
    local at = first + (i - 1) * 4
    if out[at] > 0 then
      if chosen then chosen = nil; break end  -- two bins hold jobs: the worker decides
      chosen = i
      local max_n = tonumber(f[7 + i]) or 0
      if max_n <= 0 or out[at] < tonumber(scans[i]) or out[at + 2] ~= 0 then
        chosen = nil
        break
      end
    end
  end
  if not chosen then
    out[#out + 1] = 0
    return
  end
  out[#out + 1] = chosen
  local at = #out + 1
  out[at] = 0
  local max_n = tonumber(f[7 + chosen])
  out[at] = claim_batch({bin = bins[chosen], leases = keys[1], bytes = keys[2],
    claim = keys[3], max_n = max_n, lease_ms = tonumber(f[2]), token = f[1],
    job_prefix = job_prefix, worker = f[3], done_channel = f[5], result_ttl_s = f[6],
    budget = max_n * tonumber(f[7]), queued_ttl_s = tonumber(f[4]), now_ms = now_ms,
    now_s = now_s}, out)
end
