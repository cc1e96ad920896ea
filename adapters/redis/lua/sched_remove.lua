-- SCHED_REMOVE: forget a schedule. Returns 1 when there was one, else 0.
--
-- KEYS[1]  P:{schedules}:specs, KEYS[2] P:{schedules}:due, KEYS[3] P:{schedules}:holds,
-- KEYS[4]  what each fired last (hash: name -> dflow.schedules.Fired), P:{schedules}:last
-- ARGV[1]  name
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
