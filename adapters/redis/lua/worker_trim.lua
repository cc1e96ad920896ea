-- WORKER_TRIM: take out of the set of workers those named whose key is gone (their last beat
-- expired), each checked in the same script as its removal: a worker that beat again since
-- the caller saw its key gone stays listed. Returns how many left the set.
--
-- KEYS[1]  the set of workers, <prefix>:{workers} (a worker's key is it + ':w:' + its id)
-- ARGV[1..]  the ids of the workers whose key the caller found gone
local index = KEYS[1]
local removed = 0
for _, w in ipairs(ARGV) do
    if redis.call('EXISTS', index .. ':w:' .. w) == 0 then
        removed = removed + redis.call('ZREM', index, w)
    end
end
return removed
