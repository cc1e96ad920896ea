-- PAGE: a page of the run listings (see listed): at most ``limit`` root runs, newest first
-- (or, with ``oldest``, oldest first), after the position (``after_ms``, ``after_trace``) when given, of one status or of all, of
-- one pipeline or of all, each with the fields ``fields`` of its hash. A listed run whose
-- keys expired (DUE has not taken it out yet) is passed over. Reads only. Returns {the runs,
-- msgpack: [trace id, [values of the fields, false for none], ...]; the position of the
-- page's last run when more follow, else false, false} (one string for the runs is cheaper
-- to read than a reply of many).
--
-- ARGV, as scripts.PAGE lays it out (a test holds this list to it):
--   ARGV[1]  prefix        P, before every key
--   ARGV[2]  pipeline      '' for the runs of every pipeline (and of none)
--   ARGV[3]  status        '' for every status
--   ARGV[4]  after_ms      the position the page starts after ('' for the newest, or the oldest)
--   ARGV[5]  after_trace
--   ARGV[6]  limit         how many runs at most
--   ARGV[7]  oldest        '1': oldest first, '' newest first
--   ARGV[8]  n_fields      how many ARGV slots each part takes
--   ARGV[9..] fields   the parts: the fields of the hash to return, status and pipeline first
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- Each status is a band of scores (see listed): a page of every status merges the bands. From a
-- position whose run is still at its place the band is read on from its rank, O(log N + page);
-- else (it moved or went) the runs of its very millisecond are read first, then the older ones.
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local P, pl = prefix, pipeline
limit = tonumber(limit)
local fields = {unpack(ARGV, at_fields, at_fields + n_fields - 1)}
local key = P..':ix'
if pl ~= '' then key = P..':ixp:'..pl end
local bands = {1, 2, 3, 4, 5, 6, 7}
if status ~= '' then bands = {LISTED_BAND[status]} end

local up = oldest == '1'

local function fmt(x) return string.format('%d', x) end

-- Whether member ``a`` comes before ``b`` byte by byte, as a sorted set orders them (Lua's own
-- ``<`` follows the server's locale).
local function bytes_before(a, b)
  for k = 1, math.min(#a, #b) do
    local x, y = string.byte(a, k), string.byte(b, k)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Whether listing position ``x`` ({ms, trace}) is newer than ``y``.
local function newer(x, y)
  if x[1] ~= y[1] then return x[1] > y[1] end
  return bytes_before(y[2], x[2])
end

-- Whether position ``x`` comes before ``y`` in the order asked for.
local function first(x, y)
  if up then return newer(y, x) end
  return newer(x, y)
end

-- Up to ``n`` positions of band ``b`` after position (``ms``, ``t``) (nil: from the oldest),
-- oldest first. ``at``: the score of ``t`` in the set (false when it is not there).
local function band_up(b, ms, t, at, n)
  local lo = b * LISTED_SPAN
  local hi = lo + LISTED_SPAN - 1
  local out = {}
  local function take(reply)  -- member, score, ...: those of the band, while n are missing
    for k = 1, #reply, 2 do
      local score = tonumber(reply[k + 1])
      if #out >= n or score > hi then return end
      out[#out + 1] = {score - lo, reply[k]}
    end
  end
  if not ms then
    take(redis.call('ZRANGEBYSCORE', key, fmt(lo), fmt(hi), 'WITHSCORES', 'LIMIT', 0, n))
    return out
  end
  local s = lo + ms
  if at and tonumber(at) == s then  -- the position's run is at its place: read on from its rank
    local rank = redis.call('ZRANK', key, t)
    take(redis.call('ZRANGE', key, rank + 1, rank + n, 'WITHSCORES'))
    return out
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, fmt(s), fmt(s))) do
    if #out >= n then return out end
    if bytes_before(t, m) then out[#out + 1] = {ms, m} end
  end
  if #out < n then
    take(redis.call('ZRANGEBYSCORE', key, '('..fmt(s), fmt(hi), 'WITHSCORES', 'LIMIT', 0, n - #out))
  end
  return out
end

-- Up to ``n`` positions of band ``b`` after position (``ms``, ``t``) (nil: from the newest),
-- newest first. ``at``: the score of ``t`` in the set (false when it is not there).
local function band_after(b, ms, t, at, n)
  if up then return band_up(b, ms, t, at, n) end
  local lo = b * LISTED_SPAN
  local out = {}
  local function take(reply)  -- member, score, ...: those of the band, while n are missing
    for k = 1, #reply, 2 do
      local score = tonumber(reply[k + 1])
      if #out >= n or score < lo then return end
      out[#out + 1] = {score - lo, reply[k]}
    end
  end
  if not ms then
    take(redis.call('ZREVRANGEBYSCORE', key, fmt(lo + LISTED_SPAN - 1), fmt(lo), 'WITHSCORES', 'LIMIT', 0, n))
    return out
  end
  local s = lo + ms
  if at and tonumber(at) == s then  -- the position's run is at its place: read on from its rank
    local rank = redis.call('ZREVRANK', key, t)
    take(redis.call('ZREVRANGE', key, rank + 1, rank + n, 'WITHSCORES'))
    return out
  end
  for _, m in ipairs(redis.call('ZREVRANGEBYSCORE', key, fmt(s), fmt(s))) do
    if #out >= n then return out end
    if bytes_before(m, t) then out[#out + 1] = {ms, m} end
  end
  if #out < n then
    take(redis.call('ZREVRANGEBYSCORE', key, '('..fmt(s), fmt(lo), 'WITHSCORES', 'LIMIT', 0, n - #out))
  end
  return out
end

-- Up to ``n`` positions after (``ms``, ``t``) of every band asked for, in the order asked for.
local function after(ms, t, n)
  local at = ms and redis.call('ZSCORE', key, t)
  local lists, heads = {}, {}
  for k, b in ipairs(bands) do
    lists[k] = band_after(b, ms, t, at, n)
    heads[k] = 1
  end
  if #lists == 1 then return lists[1] end
  local out = {}
  while #out < n do
    local best
    for k = 1, #lists do
      local x = lists[k][heads[k]]
      if x and (not best or first(x, lists[best][heads[best]])) then best = k end
    end
    if not best then break end
    out[#out + 1] = lists[best][heads[best]]
    heads[best] = heads[best] + 1
  end
  return out
end

local runs = {}
local found, want = 0, limit + 1
local last = false
local ms, t = tonumber(after_ms), after_trace
while found < want do
  local n = want - found
  local batch = after(ms, t, n)
  for _, x in ipairs(batch) do
    local values = redis.call('HMGET', P..':r:'..x[2], unpack(fields))
    if values[1] and (status == '' or values[1] == status) and (pl == '' or values[2] == pl) then
      found = found + 1
      if found <= limit then
        runs[#runs + 1] = x[2]
        runs[#runs + 1] = values
        last = x
      end
    end
    ms, t = x[1], x[2]
  end
  if #batch < n then break end
end
if found <= limit then return {cmsgpack.pack(runs), false, false} end
return {cmsgpack.pack(runs), last[1], last[2]}
