-- createTenant. KEYS[1] tenant record  KEYS[2] event stream  KEYS[3] audit log
-- ARGV[1] request context  ARGV[2] the new record's fields (JSON object of strings)
-- Same id and name again is an idempotent retry (status EXISTING, no event); another name 409.
local now = now_ms()
local ctx = request_context(ARGV[1])
local fields = cjson.decode(ARGV[2])
local existing = redis.call('HGET', KEYS[1], 'name')
if existing then
  if existing == fields.name then return {'OK', '[]', 'EXISTING', tostring(now), record_json(KEYS[1])} end
  return err('DUPLICATE_RESOURCE', 'Tenant ' .. fields.tenant_id .. ' already exists with a different name')
end
fields.status, fields.created_at_ms, fields.updated_at_ms = 'ACTIVE', tostring(now), tostring(now)
write_fields(KEYS[1], fields)
emit(KEYS[2], admin_event_id(ctx, 'tenant.created', fields.tenant_id), 'tenant.created', fields.tenant_id, nil, ctx,
  'cycles-admin', '{"tenant_id":' .. cjson.encode(fields.tenant_id) .. ',"new_status":"ACTIVE"}', now)
audit(KEYS[3], ctx, 'tenant.create', 'tenant', fields.tenant_id, now)
return {'OK', '[]', 'CREATED', tostring(now), record_json(KEYS[1])}
