-- Fragment: the run listings (assembled first: claim_step, finish and the scripts that change
-- a run's status call it). A root run (one without a parent: branches are reached through
-- theirs) has in its hash ``ix``, its creation time in whole milliseconds, and ``pipeline``
-- when a pipeline started it. It is listed in the sorted set ``P:ix`` and, with a pipeline, in
-- ``P:ixp:<pipeline>``, scored ``band * LISTED_SPAN + ix``: the band of its status now, then its
-- creation; members of one score are in byte order. A status change is one ZADD per set the
-- run is in (the member stays, its score moves to its new band); a step that leaves the status
-- as it was writes nothing here. A listed run of a pipeline that finished waits for its keys to
-- expire in ``P:expiryp`` (member: msgpack [trace id, pipeline]) instead of ``P:expiry``, so
-- that DUE knows which listings it leaves; so does a finished run with a business key (member:
-- msgpack [trace id, pipeline or '', key]), so that DUE takes it out of the key's index
-- ``P:bk:<key>`` too (``expiry_entry``). The ids of the listed runs are also in ``P:ids``, all
-- scored 0 (in byte order: a search by an id's start is one ZRANGEBYLEX), from CREATE until
-- they leave the listings.
local LISTED_BAND = {running = 1, sleeping = 2, waiting = 3, done = 4, failed = 5, cancelled = 6, compensated = 7,
                     timed_out = 8}
local LISTED_STATUS = {'running', 'sleeping', 'waiting', 'done', 'failed', 'cancelled', 'compensated', 'timed_out'}
local LISTED_SPAN = 1e13  -- milliseconds: creation times up to the year 2286

-- List run ``t`` (its ``ix`` and ``pipeline`` fields, false when absent) under ``status``.
local function listed(P, t, ix, pl, status)
  if not ix then return end  -- a branch run
  local score = string.format('%d', LISTED_BAND[status] * LISTED_SPAN + tonumber(ix))
  redis.call('ZADD', P..':ix', score, t)
  if pl then redis.call('ZADD', P..':ixp:'..pl, score, t) end
end

-- Take run ``t`` (of pipeline ``pl``, false for none) out of the listings (and the ids).
local function unlisted(P, t, pl)
  redis.call('ZREM', P..':ix', t)
  redis.call('ZREM', P..':ids', t)
  if pl then redis.call('ZREM', P..':ixp:'..pl, t) end
end

-- Where finished run ``t`` (of pipeline ``pl`` when listed, else false; with business key
-- ``bkey``, else false) waits for its keys to expire: the sorted set and the member.
local function expiry_entry(P, t, pl, bkey)
  if bkey then return P..':expiryp', cmsgpack.pack({t, pl or '', bkey}) end
  if pl then return P..':expiryp', cmsgpack.pack({t, pl}) end
  return P..':expiry', t
end
