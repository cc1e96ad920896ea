-- CIRCUIT_RECORD: how a call let through a circuit breaker ended (see circuit_enter.lua).
-- A probe's outcome counts only while it holds the probe: success closes the circuit
-- (its keys go), failure opens it again, abandoned frees the probe for the next caller. A
-- failure of another call while the circuit is closed joins the failures of the window (a
-- sorted set that expires with the window); the threshold opens the circuit. Returns what
-- it did: 0 nothing, 1 counted or closed, 2 opened, 3 freed the probe.
--
-- KEYS[1]  the circuit (hash), P:{circuit:NAME}
-- KEYS[2]  its failures in the window (sorted set by time), P:{circuit:NAME}:f
-- ARGV[1]  token      the caller's token (a failure's member; the probe's lease holder)
-- ARGV[2]  probe      1 when the call held the probe, else 0
-- ARGV[3]  outcome    1 success, 2 failure, 3 abandoned
-- ARGV[4]  failures   how many failures in the window open the circuit
-- ARGV[5]  window     seconds
-- ARGV[6]  cool_down  seconds the circuit stays open
local key, fails = KEYS[1], KEYS[2]
local outcome = tonumber(ARGV[3])
local state = redis.call('HGET', key, 'state') or 'closed'
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function open()
  redis.call('DEL', fails)
  redis.call('HSET', key, 'state', 'open', 'opened_at', string.format('%.6f', now),
             'retry_at', string.format('%.6f', now + tonumber(ARGV[6])), 'probe', '', 'probe_until', '0')
  return 2
end
if ARGV[2] == '1' then
  if state ~= 'half_open' or redis.call('HGET', key, 'probe') ~= ARGV[1] then return 0 end
  if outcome == 1 then
    redis.call('DEL', key, fails)
    return 1
  end
  if outcome == 2 then return open() end
  redis.call('HSET', key, 'probe', '', 'probe_until', '0')
  return 3
end
if outcome ~= 2 or state ~= 'closed' then return 0 end
local window = tonumber(ARGV[5])
redis.call('ZREMRANGEBYSCORE', fails, '-inf', string.format('%.6f', now - window))
redis.call('ZADD', fails, string.format('%.6f', now), ARGV[1])
if redis.call('ZCARD', fails) >= tonumber(ARGV[4]) then return open() end
redis.call('PEXPIRE', fails, math.ceil(window * 1000))
return 1
