-- audit.lua: one consistent, read-only snapshot of where every job is, for the
-- invariant checker (tests, and an operator chasing a stuck job). Uses KEYS: it
-- walks the whole keyspace of this node, so run it on test data or rarely.
--
-- KEYS[1]  leases        {p.s}:leases
-- ARGV[1]  bin_glob      glob of every bin zset "{p.s}:q:*"
-- ARGV[2]  job_glob      glob of every job record "{p.s}:job:*"
-- ARGV[3]  job_prefix    "{p.s}:job:"
-- ARGV[4]  claim_prefix  "{p.s}:claim:"
--
-- Returns {bins, leases, jobs}: bins = {bin key, id, bin key, id, ...} (one pair per
-- entry, most urgent first; a zset holds an id once, so a duplicate can only be across
-- bins), leases = {id, deadline_ms, ...}, jobs = {id, status, ...}.
--
-- Keys built here, not in KEYS: every bin and record of the shard (found by KEYS with
-- the globs) and each claim's hash (claim_prefix .. token, tokens read from KEYS[1]);
-- all in KEYS[1]'s hash tag (carpool/backend/keys.py).
local bins = {}
for _, bin_key in ipairs(redis.call("KEYS", ARGV[1])) do
  for _, id in ipairs(redis.call("ZRANGE", bin_key, 0, -1)) do
    bins[#bins + 1] = bin_key
    bins[#bins + 1] = id
  end
end
local leases = {}  -- each job a claim holds, with its claim's lease deadline
local claims = redis.call("ZRANGE", KEYS[1], 0, -1, "WITHSCORES")
for i = 1, #claims, 2 do
  for _, id in ipairs(redis.call("HKEYS", ARGV[4] .. claims[i])) do
    if id ~= "t" and id ~= "w" then
      leases[#leases + 1] = id
      leases[#leases + 1] = claims[i + 1]
    end
  end
end
local jobs = {}
local skip = string.len(ARGV[3])
for _, key in ipairs(redis.call("KEYS", ARGV[2])) do
  jobs[#jobs + 1] = string.sub(key, skip + 1)
  -- A record's status is its first field (carpool/backend/records.py).
  jobs[#jobs + 1] = string.match(redis.call("GETRANGE", key, 0, 15), "^[^\t\n]*")
end
return {bins, leases, jobs}
