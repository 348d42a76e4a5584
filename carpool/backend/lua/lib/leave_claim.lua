-- leave_claim.lua: not a script of its own. Scripts that take jobs out of a claim
-- (complete.lua, release.lua) include it (carpool/backend/connection.py: a line
-- "--#include lib/leave_claim.lua").
--
-- leave_claim(claim_key, leases_key, token, ids) removes `ids` from the claim hash
-- {p.s}:claim:<token> (claim.lua: its jobs, and its "t" and "w"); with its last job the
-- claim is over: the hash goes, and its token leaves the leases zset. HDEL, DEL and
-- ZREM never grow memory, so as a script's first write this is never refused on a
-- full Redis (noeviction), and after it no write of that script is.
local function leave_claim(claim_key, leases_key, token, ids)
  redis.call("HDEL", claim_key, unpack(ids))
  if redis.call("HLEN", claim_key) <= 2 then  -- only "t" and "w" left
    redis.call("DEL", claim_key)
    redis.call("ZREM", leases_key, token)
  end
end
