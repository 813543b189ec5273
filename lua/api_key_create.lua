-- createApiKey. KEYS[1] tenant record  KEYS[2] key record  KEYS[3] the tenant's key index
-- KEYS[4] event stream  KEYS[5] audit log
-- ARGV[1] request context  ARGV[2] the record's fields (JSON object of strings, the digest
-- included; never the secret)
local now = now_ms()
local ctx = request_context(ARGV[1])
local t, e = owner_guard(KEYS[1], err('TENANT_NOT_FOUND', 'Tenant not found', '', 400))
if e then return e end
if t.status ~= 'ACTIVE' then return err('INVALID_REQUEST', 'Tenant is not ACTIVE (status ' .. t.status .. ')') end
if redis.call('EXISTS', KEYS[2]) == 1 then return err('INTERNAL_ERROR', 'API key id collision; retry') end
local fields = cjson.decode(ARGV[2])
fields.status, fields.created_at_ms = 'ACTIVE', tostring(now)
write_fields(KEYS[2], fields)
redis.call('SADD', KEYS[3], fields.key_id)
emit(KEYS[4], admin_event_id(ctx, 'api_key.created', fields.key_id), 'api_key.created', fields.tenant_id, nil, ctx,
  'cycles-admin', '{"key_id":' .. cjson.encode(fields.key_id) .. ',"key_name":' .. cjson.encode(fields.name or '') ..
  ',"new_status":"ACTIVE","permissions":' .. csv_json(fields.permissions) .. '}', now)
audit(KEYS[5], ctx, 'api_key.create', 'api_key', fields.key_id, now)
return {'OK', '[]', 'ACTIVE', tostring(now), record_json(KEYS[2])}
