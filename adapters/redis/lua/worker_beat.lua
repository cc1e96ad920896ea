-- WORKER_BEAT: keep a worker's last beat (its key, expiring ttl_ms after) and list it in the
-- set of workers, scored by the server's clock (TIME), never a worker's own (which may be off
-- by any amount). Workers whose score is forget seconds old by that clock leave the set, each
-- only when its key is gone (checked here, in the same script as the removal: a worker that
-- beats is never taken out). The set expires forget seconds after the last beat of any worker.
--
-- KEYS[1]  the set of workers, <prefix>:{workers} (a worker's key is it + ':w:' + its id)
-- ARGV[1]  worker_id  the worker that beats
-- ARGV[2]  body       its beat, as JSON
-- ARGV[3]  ttl_ms     how long its key is kept, in milliseconds
-- ARGV[4]  forget     seconds after its last beat that a worker whose key is gone leaves the set
local index = KEYS[1]
local worker_id, body, ttl_ms, forget = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('SET', index .. ':w:' .. worker_id, body, 'PX', ttl_ms)
redis.call('ZADD', index, string.format('%.6f', now), worker_id)
local old = redis.call('ZRANGEBYSCORE', index, '-inf', string.format('%.6f', now - forget), 'LIMIT', 0, 100)
for _, w in ipairs(old) do
    if redis.call('EXISTS', index .. ':w:' .. w) == 0 then
        redis.call('ZREM', index, w)
    end
end
redis.call('EXPIRE', index, math.floor(forget))
return 1
