-- STATE_ROLLBACK: write the value of a kept version of a shared State again, as its next
-- version (entries as in state_cas.lua, with restores = the version restored). Returns
-- {1, version} for the version written, or {0, v...} with the versions kept when the one
-- asked for is not among them.
--
-- KEYS[1]  the state's versions (list), P:{state:NAME}
-- ARGV[1]  version   the version to restore
-- ARGV[2]  run       the writer's run, or 'external'
-- ARGV[3]  step      the writer's step number, -1 for none
-- ARGV[4]  keep      how many versions to keep
local key = KEYS[1]
local wanted = tonumber(ARGV[1])
local entries = redis.call('LRANGE', key, 0, -1)
local kept = {0}
local found = nil
local current = 0
for i, raw in ipairs(entries) do
  local e = cmsgpack.unpack(raw)
  if i == 1 then current = e[1] end
  if e[1] == wanted then found = e end
  kept[#kept + 1] = e[1]
end
if not found then return kept end
local t = redis.call('TIME')
local at = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('LPUSH', key, cmsgpack.pack({current + 1, found[2], ARGV[2], tonumber(ARGV[3]), at, wanted}))
redis.call('LTRIM', key, 0, tonumber(ARGV[4]) - 1)
return {1, current + 1}
