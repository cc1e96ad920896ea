-- SCHED_DUE: the schedules not paused whose next fire time is now_ms or before, soonest
-- first: {soonest later fire time or false, name, next_ms, schedule, last or false, ...}.
--
-- KEYS[1]  P:{schedules}:specs, KEYS[2] P:{schedules}:due, KEYS[3] P:{schedules}:last
-- ARGV[1]  now_ms
-- ARGV[2]  limit
local due = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'WITHSCORES', 'LIMIT', 0, tonumber(ARGV[2]))
local later = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. ARGV[1], '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local out = {later[2] or false}
for i = 1, #due, 2 do
  local spec = redis.call('HGET', KEYS[1], due[i])
  if spec then
    out[#out + 1] = due[i]
    out[#out + 1] = due[i + 1]
    out[#out + 1] = spec
    out[#out + 1] = redis.call('HGET', KEYS[3], due[i]) or false
  end
end
return out
