-- BUSINESS_KEY: give a run a business key, in place of the one it had: the field bkey of its
-- hash, and its entry in the index of the key (a sorted set of trace ids by the runs'
-- creation time, in the run's bucket, so one slot with its hash on a Redis Cluster), out of
-- the index of the key before. An index keeps the newest runs given the key (keep); entries
-- of runs that expired are dropped by the reads that meet them. Returns 0 for no such run.
--
-- KEYS[1]  the run's hash, P:r:<trace>
-- KEYS[2]  the index of the key, P:bk:<key>
-- ARGV[1]  key     the business key
-- ARGV[2]  base    the name of an index without its key, P:bk:
-- ARGV[3]  trace   the run's trace id
-- ARGV[4]  keep    how many runs an index keeps at most
local run, index = KEYS[1], KEYS[2]
if redis.call('EXISTS', run) == 0 then
    return 0
end
local before = redis.call('HGET', run, 'bkey')
if before and before ~= ARGV[1] then
    redis.call('ZREM', ARGV[2] .. before, ARGV[3])
end
redis.call('HSET', run, 'bkey', ARGV[1])
redis.call('ZADD', index, tonumber(redis.call('HGET', run, 'created')) or 0, ARGV[3])
local over = redis.call('ZCARD', index) - tonumber(ARGV[4])
if over > 0 then
    redis.call('ZREMRANGEBYRANK', index, 0, over - 1)
end
return 1
