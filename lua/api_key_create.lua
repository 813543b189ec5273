-- createApiKey for an ACTIVE tenant, with its event and audit row. `A.fields` is the key's
-- record (a JSON object of strings, the digest included; never the secret). The answer is the
-- key's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local t, e = owner_guard(K.tenant, err('TENANT_NOT_FOUND', MSG.TENANT_NOT_FOUND, '', 400))
if e then return e end
if t.status ~= 'ACTIVE' then return err('INVALID_REQUEST', MSG.TENANT_NOT_ACTIVE .. t.status .. ')') end
if redis.call('EXISTS', K.api_key) == 1 then return err('INTERNAL_ERROR', MSG.API_KEY_ID_COLLISION) end
local fields = cjson.decode(A.fields)
fields.status, fields.created_at_ms = 'ACTIVE', now_s
write_fields(K.api_key, fields)
KEY_AUTH.refresh(K.api_key)
redis.call('SADD', K.api_key_index, fields.key_id)
emit(K.events, 'api_key.created', fields.tenant_id, nil, ctx, 'cycles-admin',
  '{"key_id":' .. cjson.encode(fields.key_id) .. ',"key_name":' .. cjson.encode(fields.name or '') ..
  ',"new_status":"ACTIVE","permissions":' .. csv_json(fields.permissions) .. '}', now)
audit(K.audit_log, ctx, 'api_key.create', 'api_key', fields.key_id, now)
return ok(record_json(K.api_key), 'ACTIVE', now_s)
