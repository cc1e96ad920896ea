-- CIRCUIT_SEEN: note that a process uses a circuit breaker, so that it can be listed (dflow
-- circuits, the metrics): its name in a sorted set by when it was last noted (the server's
-- time, in seconds), its settings in a hash. Names not noted within `ttl` seconds go, and
-- past `limit` names those noted longest ago go; both keys expire `ttl` seconds after the
-- last note. Returns how many names went.
--
-- KEYS[1]  the names (sorted set by time), P:{circuits}
-- KEYS[2]  their settings (hash: name -> "failures window cool_down probe_lease"), P:{circuits}:config
-- ARGV[1]  name      the circuit's name
-- ARGV[2]  settings  its settings, as the hash keeps them
-- ARGV[3]  limit     how many names are kept at most
-- ARGV[4]  ttl       seconds a name stays after it was last noted
local names, settings = KEYS[1], KEYS[2]
local ttl = tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local since = string.format('%.6f', now - ttl)
redis.call('ZADD', names, string.format('%.6f', now), ARGV[1])
redis.call('HSET', settings, ARGV[1], ARGV[2])
local gone = redis.call('ZRANGEBYSCORE', names, '-inf', '(' .. since)
local over = redis.call('ZCARD', names) - #gone - tonumber(ARGV[3])
if over > 0 then
  for _, name in ipairs(redis.call('ZRANGEBYSCORE', names, since, '+inf', 'LIMIT', 0, over)) do
    gone[#gone + 1] = name
  end
end
for i = 1, #gone, 500 do
  local chunk = {unpack(gone, i, math.min(i + 499, #gone))}
  redis.call('ZREM', names, unpack(chunk))
  redis.call('HDEL', settings, unpack(chunk))
end
redis.call('EXPIRE', names, ttl)
redis.call('EXPIRE', settings, ttl)
return #gone
