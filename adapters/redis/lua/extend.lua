-- EXTEND: renew the leases of claims whose tokens still hold them.
--
-- ARGV, as scripts.EXTEND lays it out (a test holds this list to it):
--   ARGV[1]  prefix     P, before every key
--   ARGV[2]  now        seconds
--   ARGV[3]  lease      seconds
--   ARGV[4]  n_claims   how many ARGV slots the part takes
--   ARGV[5..] claims    the part: (trace, token) pairs
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local seconds = tonumber(lease)
for i = at_claims, at_claims + n_claims - 1, 2 do
  local t, token = ARGV[i], ARGV[i + 1]
  local rk = prefix..':r:'..t
  if redis.call('HGET', rk, 'lease_token') == token then
    local until_ = tostring(tonumber(now) + seconds)
    redis.call('HSET', rk, 'lease_until', until_, 'lease_len', lease)
    redis.call('ZADD', prefix..':leases', until_, t)
  end
end
return 1
