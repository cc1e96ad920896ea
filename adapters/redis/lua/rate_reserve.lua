-- RATE_RESERVE: take the next token of a token bucket (a generic cell rate schedule) and
-- say how long until it is free. The bucket is one string: its tat, the time (the server's,
-- seconds) when it is full again. Each token moves tat on by one interval; a token is free
-- once tat is at most burst intervals ahead of now. A token is reserved even when it is not
-- free yet, so that waiting callers are served in the order they asked. The key expires
-- when the bucket is full again. Returns the seconds until the token is free (text; "0").
--
-- KEYS[1]  the bucket (string), P:{rate:NAME}
-- ARGV[1]  interval  seconds between two tokens (per / rate)
-- ARGV[2]  burst     how many tokens may go at once
local key = KEYS[1]
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local tat = tonumber(redis.call('GET', key)) or now
if tat < now then tat = now end
tat = tat + interval
redis.call('SET', key, string.format('%.6f', tat), 'PX', math.ceil((tat - now) * 1000) + 1)
local wait = tat - burst * interval - now
if wait <= 0.000001 then return '0' end
return string.format('%.6f', wait)
