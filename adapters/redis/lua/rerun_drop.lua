-- RERUN_DROP: forget a rerun among those recorded in a run's hash (one whose creation
-- failed after it was recorded). Nothing for a run or a rerun not there.
--
-- KEYS[1]  the run's hash, P:r:<trace>
-- ARGV[1]  rerun  the trace id to forget
local run = KEYS[1]
local raw = redis.call('HGET', run, 'reruns')
if not raw then
    return 0
end
local kept = {}
for _, r in ipairs(cjson.decode(raw)) do
    if r ~= ARGV[1] then
        table.insert(kept, r)
    end
end
if #kept == 0 then
    redis.call('HDEL', run, 'reruns')
else
    redis.call('HSET', run, 'reruns', cjson.encode(kept))
end
return 1
