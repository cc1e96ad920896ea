-- BUSINESS_KEY (after the fragment listed): give a run a business key, in place of the one it
-- had: the field bkey of its hash, and its entry in the index of the key (a sorted set of
-- trace ids by the runs' creation time, in the run's bucket, so one slot with its hash on a
-- Redis Cluster), out of the index of the key before. An index keeps the newest runs given
-- the key (keep). A run that finished already (its keys expire: a step's key is written after
-- the commit that ended the run) has its entry in the expiry sets name the new key
-- (``expiry_entry``, as finish writes it for a run that had its key when it ended), at the
-- time it had, so that DUE takes the run out of the index when its keys expired. Returns 0
-- for no such run.
--
-- KEYS[1]  the run's hash, P:r:<trace>
-- KEYS[2]  the index of the key, P:bk:<key>
-- KEYS[3]  P:expiry, KEYS[4] P:expiryp: where finished runs wait for their keys to expire
-- ARGV[1]  key     the business key
-- ARGV[2]  prefix  P, the prefix of the run's bucket
-- ARGV[3]  trace   the run's trace id
-- ARGV[4]  keep    how many runs an index keeps at most
-- ARGV[5]  now     seconds
local run, index = KEYS[1], KEYS[2]
local key, P, t = ARGV[1], ARGV[2], ARGV[3]
if redis.call('EXISTS', run) == 0 then
    return 0
end
local r = redis.call('HMGET', run, 'bkey', 'ix', 'pipeline')
local before = r[1]
if before and before ~= key then
    redis.call('ZREM', P .. ':bk:' .. before, t)
end
redis.call('HSET', run, 'bkey', key)
redis.call('ZADD', index, tonumber(redis.call('HGET', run, 'created')) or 0, t)
local over = redis.call('ZCARD', index) - tonumber(ARGV[4])
if over > 0 then
    redis.call('ZREMRANGEBYRANK', index, 0, over - 1)
end
local left = redis.call('PTTL', run)
if left >= 0 and before ~= key then
    local pl = r[2] and r[3]
    local set, member = expiry_entry(P, t, pl, before)
    local at = redis.call('ZSCORE', set, member) or (tonumber(ARGV[5]) + left / 1000)
    redis.call('ZREM', set, member)
    set, member = expiry_entry(P, t, pl, key)
    redis.call('ZADD', set, at, member)
end
return 1
