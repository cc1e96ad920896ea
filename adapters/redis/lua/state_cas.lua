-- STATE_CAS: write a shared State's next version if its current version is the expected
-- one (or unconditionally), keeping its last versions. Versions are kept newest first in
-- one list, each a msgpack array {version, value, run, step, at, restores} (step -1: none;
-- restores 0: not a rollback); the head is the current value. Times are the server's.
-- An updater that takes turns names itself (turn): while another holds the turn, its
-- write is refused; refused for another version, it takes the turn if free (take), for
-- turn_ms or until its write succeeds. A write without a turn ignores turns.
-- Returns {1, version} for the version written, or {0, version, entry, turn held (0/1)}
-- with the version and its entry (nil for version 0) found.
--
-- KEYS[1]  the state's versions (list), P:{state:NAME}
-- KEYS[2]  the updater with the turn (string, expiring), P:{state:NAME}:turn
-- ARGV[1]  value     the encoded value
-- ARGV[2]  expect    the expected version, -1 for any
-- ARGV[3]  run       the writer's run, or 'external'
-- ARGV[4]  step      the writer's step number, -1 for none
-- ARGV[5]  keep      how many versions to keep
-- ARGV[6]  turn      the updater's token, '' for none
-- ARGV[7]  take      1 to take the turn when refused for another version
-- ARGV[8]  turn_ms   how long a turn lasts, in milliseconds
local key, turn_key = KEYS[1], KEYS[2]
local head = redis.call('LINDEX', key, 0)
local current = 0
if head then current = cmsgpack.unpack(head)[1] end
local holder = false
if ARGV[6] ~= '' then
  holder = redis.call('GET', turn_key)
  if holder and holder ~= ARGV[6] then return {0, current, head, 1} end
end
local expect = tonumber(ARGV[2])
if expect >= 0 and expect ~= current then
  if ARGV[7] == '1' and not holder then redis.call('SET', turn_key, ARGV[6], 'PX', ARGV[8]) end
  return {0, current, head, 0}
end
local t = redis.call('TIME')
local at = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('LPUSH', key, cmsgpack.pack({current + 1, ARGV[1], ARGV[3], tonumber(ARGV[4]), at, 0}))
redis.call('LTRIM', key, 0, tonumber(ARGV[5]) - 1)
if holder then redis.call('DEL', turn_key) end
return {1, current + 1}
