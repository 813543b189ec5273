-- Reads every listed key of one tenant at one point (the keys of its slot, as the caller found
-- them): per key its type, its time to live in ms (-1: none) and its value, shaped by type:
-- a string; a hash, set, list or sorted set as Redis lists it (a sorted set with scores); a
-- stream as its entries. A key gone since it was listed answers type 'none'.
local READERS = {
  string = function(k) return redis.call('GET', k) end,
  hash = function(k) return redis.call('HGETALL', k) end,
  set = function(k) return redis.call('SMEMBERS', k) end,
  list = function(k) return redis.call('LRANGE', k, 0, -1) end,
  zset = function(k) return redis.call('ZRANGE', k, 0, -1, 'WITHSCORES') end,
  stream = function(k) return redis.call('XRANGE', k, '-', '+') end,
}
local out = {}
for i, key in ipairs(K.records) do
  local kind = redis.call('TYPE', key).ok
  local read = READERS[kind]
  if read then
    out[i] = {kind, redis.call('PTTL', key), read(key)}
  else
    out[i] = {'none', -2, ''}
  end
end
return ok(out)
