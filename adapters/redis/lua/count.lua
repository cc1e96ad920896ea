-- COUNT: how many root runs the listings (see listed) hold in each status, of one pipeline or
-- of all: one ZCOUNT of a band of scores per status, O(log N) each. A listed run whose keys
-- expired counts until DUE takes it out. Reads only. Returns {status, count, ...}.
--
-- ARGV, as scripts.COUNT lays it out (a test holds this list to it):
--   ARGV[1]  prefix     P, before every key
--   ARGV[2]  pipeline   '' for the runs of every pipeline (and of none)
-- KEYS: not read (every key is built from P; on a cluster the store declares those it can name: scripts).
-- The arguments are bound to locals by their names (scripts.Script.preamble).
local key = prefix..':ix'
if pipeline ~= '' then key = prefix..':ixp:'..pipeline end
local out = {}
for b, status in ipairs(LISTED_STATUS) do
  local lo = b * LISTED_SPAN
  out[#out + 1] = status
  out[#out + 1] = redis.call('ZCOUNT', key, string.format('%d', lo), string.format('%d', lo + LISTED_SPAN - 1))
end
return out
