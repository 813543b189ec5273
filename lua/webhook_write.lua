-- Webhook subscription writes: create, update (compare-and-set on updated_at_ms: the handler
-- validated both invariants on the merged state it read), delete. One lifecycle event each.
-- KEYS[1] owner's tenant record  KEYS[2] subscription  KEYS[3] owner's subscription index
-- KEYS[4] owner's event stream  KEYS[5] owner's audit log
-- ARGV[1] request context  ARGV[2] 'create' | 'update' | 'delete'  ARGV[3] fields (JSON object
-- of strings)  ARGV[4] updated_at_ms the update was computed from  ARGV[5] owner tenant id
-- ARGV[6] subscription id
local now = now_ms()
local ctx = request_context(ARGV[1]) or {}
local mode, owner, id = ARGV[2], ARGV[5], ARGV[6]
if owner ~= '__system__' then
  local _, e = owner_guard(KEYS[1], err('TENANT_NOT_FOUND', 'Tenant not found'))
  if e then return e end
end

local function lifecycle(kind, previous, new, changed)
  emit(KEYS[4], nil, kind, owner, nil, ctx, 'cycles-admin', '{"subscription_id":' .. cjson.encode(id) ..
    ',"tenant_id":' .. cjson.encode(owner) .. (previous and (',"previous_status":"' .. previous .. '"') or '') ..
    (new and (',"new_status":"' .. new .. '"') or '') .. ',"changed_fields":' .. changed .. '}', now)
end

if mode == 'create' then
  local f = cjson.decode(ARGV[3])
  f.status, f.consecutive_failures, f.created_at_ms, f.updated_at_ms = 'ACTIVE', '0', tostring(now), tostring(now)
  write_fields(KEYS[2], f)
  redis.call('SADD', KEYS[3], id)
  ctx.correlation_id = 'webhook_create:' .. id
  lifecycle('webhook.created', nil, 'ACTIVE', '[]')
  audit(KEYS[5], ctx, 'webhook.create', 'webhook', id, now)
  return {'OK', '[]', 'ACTIVE', tostring(now), record_json(KEYS[2])}
end

local cur = redis.call('HMGET', KEYS[2], 'subscription_id', 'status', 'updated_at_ms')
if not cur[1] then return err('WEBHOOK_NOT_FOUND', 'Webhook subscription not found') end
if mode == 'delete' then
  redis.call('DEL', KEYS[2])
  redis.call('SREM', KEYS[3], id)
  ctx.correlation_id = 'webhook_delete:' .. id
  lifecycle('webhook.deleted', cur[2], nil, '[]')
  audit(KEYS[5], ctx, 'webhook.delete', 'webhook', id, now)
  return {'OK', '[]', 'DELETED', tostring(now), '{}'}
end

if cur[3] ~= ARGV[4] then return err('CONCURRENT_UPDATE', 'The subscription changed meanwhile; retry') end
local patch = cjson.decode(ARGV[3])
local from = cur[2]
local to = patch.status or from
patch.status = nil
local changed = {}
for f, v in pairs(patch) do
  if f == 'secret' or (redis.call('HGET', KEYS[2], f) or '') ~= v then
    changed[#changed + 1] = (f == 'secret') and 'signing_secret' or f
  end
end
table.sort(changed)
if #changed == 0 and to == from then return {'OK', '[]', from, tostring(now), record_json(KEYS[2])} end
patch.updated_at_ms = tostring(now)
if to ~= from then
  patch.status = to
  if to == 'ACTIVE' then patch.consecutive_failures = '0' end
end
write_fields(KEYS[2], patch)
local fields = csv_json(',' .. table.concat(changed, ',') .. ',')
ctx.correlation_id = 'webhook_update:' .. id .. ':' .. (ctx.request_id or '')
if to == from then lifecycle('webhook.updated', from, to, fields)
elseif to == 'PAUSED' then lifecycle('webhook.paused', from, to, fields)
else lifecycle('webhook.resumed', from, to, fields) end
audit(KEYS[5], ctx, 'webhook.update', 'webhook', id, now, {previous_status = from, new_status = to, changed_fields = changed})
return {'OK', '[]', to, tostring(now), record_json(KEYS[2])}
