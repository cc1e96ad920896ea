-- RERUN_NOTE: record a rerun of a run in the run's hash (field reruns, a JSON array of trace
-- ids, oldest first), unless it has one already and the caller does not insist: the check
-- and the write are one, so of two reruns asked at once one is refused. The field expires
-- with the run's hash. Returns {0} for no such run, {1} once recorded, {2, newest rerun}
-- when refused (nothing written).
--
-- KEYS[1]  the run's hash, P:r:<trace>
-- ARGV[1]  rerun  the trace id of the new rerun
-- ARGV[2]  again  "1": record it even when the run has a rerun already
-- ARGV[3]  keep   how many reruns the run names at most (the oldest go first)
local run = KEYS[1]
if redis.call('EXISTS', run) == 0 then
    return {0}
end
local raw = redis.call('HGET', run, 'reruns')
local reruns = {}
if raw then
    reruns = cjson.decode(raw)
end
if #reruns > 0 and ARGV[2] ~= '1' then
    return {2, reruns[#reruns]}
end
table.insert(reruns, ARGV[1])
while #reruns > tonumber(ARGV[3]) do
    table.remove(reruns, 1)
end
redis.call('HSET', run, 'reruns', cjson.encode(reruns))
return {1}
