-- Reads every key of one tenant at one point (`keys_of_tenant`): its name, its type, its time
-- to live in ms (-1: none) and its value, shaped by type: a string; a hash, set, list or sorted
-- set as Redis lists it (a sorted set with scores); a stream as its entries.
local READERS = {
  string = function(k) return redis.call('GET', k) end,
  hash = function(k) return redis.call('HGETALL', k) end,
  set = function(k) return redis.call('SMEMBERS', k) end,
  list = function(k) return redis.call('LRANGE', k, 0, -1) end,
  zset = function(k) return redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end,
  stream = function(k) return redis.call('XRANGE', k, '-', '+') end,
}
if redis.call('EXISTS', K.tenant) == 0 then return err('NOT_FOUND', 'Tenant not found') end
local out = {}
for _, key in ipairs(keys_of_tenant(A.prefix, A.slot)) do
  local kind = redis.call('TYPE', key).ok
  if READERS[kind] then out[#out + 1] = {key, kind, redis.call('PTTL', key), READERS[kind](key)} end
end
return ok(out)
