-- PARK: release a claim without running its step (this worker cannot run it, e.g. it lacks the
-- step's pipeline): the message comes back after a pause that doubles with each park, up to
-- ``cap``. Returns how many times the run was parked, or false when the lease is lost.
--
-- ARGV, as scripts.PARK lays it out (a test holds this list to it):
--   ARGV[1]  prefix   P, before every key
--   ARGV[2]  trace    the run id
--   ARGV[3]  token    the claim's lease token
--   ARGV[4]  reason   shown in the run's record
--   ARGV[5]  now      seconds
--   ARGV[6]  msg      the step message
--   ARGV[7]  base     seconds of the first pause
--   ARGV[8]  cap      the longest pause
--   ARGV[9]  claimable  1: the message stays claimable as it is (no new attempt, no due time)
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P, t = prefix, trace
local rk = P..':r:'..t
if redis.call('HGET', rk, 'lease_token') ~= token then return false end
redis.call('HDEL', rk, 'lease_token', 'lease_until', 'lease_len', 'lease_msg')
redis.call('ZREM', P..':leases', t)
redis.call('HSET', rk, 'parked', reason)
local count = redis.call('HINCRBY', rk, 'park_count', 1)
local f = cmsgpack.unpack(msg)
if claimable ~= '1' then f[4] = redis.call('HINCRBY', rk, 'attempt', 1) end
local at = tonumber(now) + math.min(tonumber(cap), tonumber(base) * 2 ^ (count - 1))
redis.call('ZADD', P..':timers', at, cmsgpack.pack(f))
if claimable == '1' then
  redis.call('HDEL', rk, 'due')
else
  redis.call('HSET', rk, 'due', tostring(at))
end
return count
