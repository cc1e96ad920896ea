-- CIRCUIT_STATE: a circuit breaker's state, read at one instant of the server's clock (see
-- circuit_enter.lua and circuit_record.lua). Returns {state, failures in the window,
-- opened_at, retry_at, probing (0/1)}, times as text; an open circuit past its cool-down
-- reads as half_open (a probe may go).
--
-- KEYS[1]  the circuit (hash), P:{circuit:NAME}
-- KEYS[2]  its failures in the window (sorted set by time), P:{circuit:NAME}:f
-- ARGV[1]  window     seconds
local s = redis.call('HMGET', KEYS[1], 'state', 'opened_at', 'retry_at', 'probe', 'probe_until')
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local failures = redis.call('ZCOUNT', KEYS[2], '(' .. string.format('%.6f', now - tonumber(ARGV[1])), '+inf')
local state = s[1] or 'closed'
if state == 'closed' then return {'closed', failures, '0', '0', 0} end
local probing = 0
local retry_at = s[3] or '0'
if state == 'half_open' and s[4] and s[4] ~= '' and now < (tonumber(s[5]) or 0) then
  probing = 1
  retry_at = s[5]
elseif state == 'half_open' then
  retry_at = '0'
elseif now >= (tonumber(retry_at) or 0) then
  state = 'half_open'
end
return {state, failures, s[2] or '0', retry_at, probing}
