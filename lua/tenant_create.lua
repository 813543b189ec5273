-- createTenant, with its event and audit row. `A.fields` is the new record (a JSON object of
-- strings). Same id and name again is an idempotent retry (status EXISTING, no event); another
-- name is 409. The answer is the tenant's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local fields = cjson.decode(A.fields)
local existing = redis.call('HGET', K.tenant, 'name')
if existing then
  if existing == fields.name then return ok(record_json(K.tenant), 'EXISTING', now_s) end
  return err('DUPLICATE_RESOURCE', 'Tenant ' .. fields.tenant_id .. ' already exists with a different name')
end
fields.status, fields.created_at_ms, fields.updated_at_ms = 'ACTIVE', now_s, now_s
write_fields(K.tenant, fields)
refresh_tenant(K.tenant)
emit(K.events, 'tenant.created', fields.tenant_id, nil, ctx, 'cycles-admin',
  '{"tenant_id":' .. cjson.encode(fields.tenant_id) .. ',"new_status":"ACTIVE"}', now)
audit(K.audit_log, ctx, 'tenant.create', 'tenant', fields.tenant_id, now)
return ok(record_json(K.tenant), 'CREATED', now_s)
