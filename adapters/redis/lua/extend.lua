-- EXTEND: renew the leases of claims whose tokens still hold them.
--
-- ARGV, as _scripts.EXTEND lays it out (a test holds this list to it):
--   ARGV[1]  prefix     P, before every key
--   ARGV[2]  now        seconds
--   ARGV[3]  lease      seconds
--   ARGV[4]  n_claims   how many ARGV slots the part takes
--   ARGV[5..] claims    the part: (trace, token) pairs
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: _scripts).
local P, now, lease = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 5, 4 + tonumber(ARGV[4]), 2 do
  local rk = P..':r:'..ARGV[i]
  if redis.call('HGET', rk, 'lease_token') == ARGV[i + 1] then
    local until_ = tostring(now + lease)
    redis.call('HSET', rk, 'lease_until', until_, 'lease_len', ARGV[3])
    redis.call('ZADD', P..':leases', until_, ARGV[i])
  end
end
return 1
