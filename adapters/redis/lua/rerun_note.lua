-- RERUN_NOTE: record a rerun of a run in the run's hash (field reruns, a JSON array of trace
-- ids, oldest first; field rerun_noted, when the newest was recorded by the server's clock),
-- unless it has one already and the caller does not insist: the check and the write are one,
-- so of two reruns asked at once one is refused. With replacing (a rerun the caller found
-- never created), that rerun, when it is the newest and was recorded older_than seconds ago
-- or more, is forgotten and the new one recorded in its place. The fields expire with the
-- run's hash. A rerun that is the newest already is noted (a call sent again). Returns {0}
-- for no such run, {1} once recorded, {2, newest rerun} when refused
-- (nothing written).
--
-- KEYS[1]  the run's hash, P:r:<trace>
-- ARGV[1]  rerun       the trace id of the new rerun
-- ARGV[2]  again       "1": record it even when the run has a rerun already
-- ARGV[3]  keep        how many reruns the run names at most (the oldest go first)
-- ARGV[4]  replacing   the rerun to replace ('' for none)
-- ARGV[5]  older_than  seconds since it was recorded after which it may be replaced
local run = KEYS[1]
local rerun, again, keep, replacing, older_than = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], tonumber(ARGV[5])
if redis.call('EXISTS', run) == 0 then
    return {0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local raw = redis.call('HGET', run, 'reruns')
local reruns = {}
if raw then
    reruns = cjson.decode(raw)
end
if #reruns > 0 and reruns[#reruns] == rerun then
    return {1}  -- noted already: this very call, sent again (its reply was lost)
end
if #reruns > 0 and replacing ~= '' and reruns[#reruns] == replacing then
    local noted = tonumber(redis.call('HGET', run, 'rerun_noted')) or 0
    if now - noted < older_than then
        return {2, replacing}
    end
    table.remove(reruns)
elseif #reruns > 0 and again ~= '1' then
    return {2, reruns[#reruns]}
end
table.insert(reruns, rerun)
while #reruns > keep do
    table.remove(reruns, 1)
end
redis.call('HSET', run, 'reruns', cjson.encode(reruns), 'rerun_noted', string.format('%.6f', now))
return {1}
