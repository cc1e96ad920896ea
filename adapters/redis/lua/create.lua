-- CREATE: a run, its step records and data, then its first step message (or, for a run
-- finished at creation, its end). Returns false when the run exists, {'need', refs} when
-- blobs it refers to are not stored, else {'ok', messages to publish}. The same call again
-- (its ``token``: a client may send a script again when the connection dropped before the
-- reply) finds the run it made and returns {'ok', its first message when not on a stream}.
--
-- ARGV, as scripts.CREATE lays it out (a test holds this list to it):
--   ARGV[1]  prefix          P, before every key
--   ARGV[2]  trace           the run id
--   ARGV[3]  now             seconds
--   ARGV[4]  redispatch      seconds before an unclaimed outbox message is published again
--   ARGV[5]  ttl_ms          how long a finished run is kept
--   ARGV[6]  stream          the stream step messages go to ('' for the outbox)
--   ARGV[7]  blob_grace_ms   how long a blob no run references is kept
--   ARGV[8]  blobs           the blobs the frames refer to, space-separated
--   ARGV[9]  frames          the frames record
--   ARGV[10] value           the step's input
--   ARGV[11] msg             the first step message ('' for a run finished at creation)
--   ARGV[12] seq             its seq, key and kind
--   ARGV[13] key
--   ARGV[14] kind
--   ARGV[15] result          the result of a run finished at creation
--   ARGV[16] parent_trace    '' for a run that is not a branch
--   ARGV[17] parent_seq
--   ARGV[18] parent_index
--   ARGV[19] pipeline        the pipeline that starts it ('' for none)
--   ARGV[20] listed_ms       its creation in whole milliseconds, for the listings ('' for a branch)
--   ARGV[21] token           this call's own id, kept in the run as ``ctok``
--   ARGV[22] compensations   its compensations flag: none, held or running (dflow.store.Compensations)
--   ARGV[23] deadline        seconds after which it ends timed out (dflow.store.deadline_text; '' for none)
--   ARGV[24] n_records       how many ARGV slots each part takes
--   ARGV[25] n_data
--   ARGV[26..] records, data   the parts, in this order: step records; (field, value) pairs
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P, t = prefix, trace
STREAM, GRACE = stream, tonumber(blob_grace_ms)
local rk = P..':r:'..t
if redis.call('EXISTS', rk) == 1 then
  if redis.call('HGET', rk, 'ctok') ~= token then return false end
  if stream == '' and msg ~= '' then return {'ok', {msg}} end
  return {'ok', {}}
end
local missing = {}
missing_blobs(P, blobs, missing)
if #missing > 0 then return {'need', missing} end
local created = now
now, redispatch, ttl_ms = tonumber(now), tonumber(redispatch), tonumber(ttl_ms)
local pl, ix = pipeline ~= '' and pipeline, listed_ms ~= '' and listed_ms
local fields = {'frames', frames, 'value', value, 'seq', seq, 'attempt', '0', 'key', key,
                'kind', kind, 'created', created, 'updated', created, 'ctok', token, 'dv', token,
                'comp', compensations}
if pl then fields[#fields + 1] = 'pipeline'; fields[#fields + 1] = pl end
if ix then fields[#fields + 1] = 'ix'; fields[#fields + 1] = ix end
local deadline_at = msg ~= '' and parent_trace == '' and deadline ~= '' and now + tonumber(deadline)
if deadline_at then fields[#fields + 1] = 'deadline'; fields[#fields + 1] = deadline end
redis.call('HSET', rk, unpack(fields))
set_blobs(P, rk, blobs)
if parent_trace ~= '' then
  redis.call('HSET', rk, 'p_trace', parent_trace, 'p_seq', parent_seq, 'p_index', parent_index)
end
if n_records > 0 then redis.call('RPUSH', P..':s:'..t, unpack(ARGV, at_records, at_records + n_records - 1)) end
if n_data > 0 then redis.call('HSET', P..':d:'..t, unpack(ARGV, at_data, at_data + n_data - 1)) end
redis.call('ZADD', P..':runs', now, t)
-- the id of a run whose keys expired before DUE saw them go: a new root run takes its place in
-- the listings (of another pipeline: DUE takes the old one out, and pages pass it over)
if redis.call('ZREM', P..':expiry', t) == 1 and not ix then unlisted(P, t, false) end
local out = {}
if msg ~= '' then
  redis.call('HSET', rk, 'status', 'running')
  listed(P, t, ix, pl, 'running')
  if deadline_at then redis.call('ZADD', P..':deadlines', deadline_at, t) end
  if ix then redis.call('ZADD', P..':ids', 0, t) end
  emit(P, now, redispatch, msg, out)
else
  redis.call('HSET', rk, 'status', 'done', 'result', result)
  listed(P, t, ix, pl, 'done')
  if ix then redis.call('ZADD', P..':ids', 0, t) end
  finished(P, t, rk, now, redispatch, ttl_ms, out, ix and pl)
end
return {'ok', out}
