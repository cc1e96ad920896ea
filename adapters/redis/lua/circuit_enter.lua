-- CIRCUIT_ENTER: may a call go through a circuit breaker? A closed circuit has no hash (its
-- failures, if any, are in the sorted set of circuit_record.lua); an open or half-open one
-- has {state, opened_at, retry_at, probe, probe_until}. An open circuit past its cool-down,
-- or a half-open one whose probe lease ran out, leases the probe to this caller. Times are
-- the server's, in seconds. Returns {1, probe (0/1), state found} when the call may go, or
-- {0, 0, state, when a probe may go, seconds until then} (times as text).
--
-- KEYS[1]  the circuit (hash), P:{circuit:NAME}
-- ARGV[1]  token        the caller's token (the probe's lease holder)
-- ARGV[2]  probe_lease  seconds a probe holds the circuit
local key = KEYS[1]
local s = redis.call('HMGET', key, 'state', 'retry_at', 'probe', 'probe_until')
local state = s[1] or 'closed'
if state == 'closed' then return {1, 0, 'closed'} end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local retry_at = tonumber(s[2]) or 0
if state == 'open' and now < retry_at then
  return {0, 0, 'open', s[2], string.format('%.6f', retry_at - now)}
end
local probe_until = tonumber(s[4]) or 0
if state == 'half_open' and s[3] and s[3] ~= '' and now < probe_until then
  return {0, 0, 'half_open', s[4], string.format('%.6f', probe_until - now)}
end
redis.call('HSET', key, 'state', 'half_open', 'probe', ARGV[1],
           'probe_until', string.format('%.6f', now + tonumber(ARGV[2])))
return {1, 1, state}
