-- Writes an exported tenant's keys: `K.keys` one per record of `A.records` (JSON {"type",
-- "ttl_ms", "value"} as `tenant_export` read them). Refused when the tenant exists, unless
-- `A.replace` is '1': then every key of the tenant here (`keys_of_tenant`) goes first. Every
-- record is checked before the first write, so a bad one writes nothing.
if A.replace ~= '1' and redis.call('EXISTS', K.tenant) == 1 then
  return err('DUPLICATE_RESOURCE', 'Tenant already exists here; import with replace to overwrite it')
end
-- Long values go in slices, within what one call may carry.
local function chunked(command, key, items, width)
  local slice = 256 * width
  for first = 1, #items, slice do
    redis.call(command, key, unpack(items, first, math.min(first + slice - 1, #items)))
  end
end
local WRITERS = {
  string = function(k, v) redis.call('SET', k, v) end,
  hash = function(k, v)
    chunked('HSET', k, v, 2)
    -- an API key's packed copy is made again from the fields imported beside it
    for i = 1, #v, 2 do if v[i] == 'auth' then KEY_AUTH.refresh(k) break end end
  end,
  set = function(k, v) chunked('SADD', k, v, 1) end,
  list = function(k, v) chunked('RPUSH', k, v, 1) end,
  zset = function(k, v)
    local flipped = {}
    for i = 1, #v, 2 do flipped[i], flipped[i + 1] = v[i + 1], v[i] end
    chunked('ZADD', k, flipped, 2)
  end,
  stream = function(k, v)
    for _, entry in ipairs(v) do redis.call('XADD', k, entry[1], unpack(entry[2])) end
  end,
}
local records = {}
for i, raw in ipairs(A.records) do
  local ok_, r = pcall(cjson.decode, raw)
  if not ok_ or type(r) ~= 'table' or not WRITERS[r.type] or r.value == nil then
    return err('INVALID_REQUEST', 'Record ' .. i .. ' is malformed')
  end
  records[i] = r
end
if A.replace == '1' then
  for _, key in ipairs(keys_of_tenant(A.prefix, A.slot)) do redis.call('DEL', key) end
end

local written = 0
for i, r in ipairs(records) do
  local key = K.keys[i]
  if type(r.value) ~= 'table' or #r.value > 0 then
    redis.call('DEL', key)
    WRITERS[r.type](key, r.value)
    local ttl = tonumber(r.ttl_ms) or -1
    if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
    written = written + 1
  end
end
-- the record's count and digest of the policy rules are made again from the rules imported
refresh_tenant(K.tenant)
return ok({written = written})
