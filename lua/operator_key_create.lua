-- createOperatorKey, with its audit entry in the `__admin__` stream (the same slot). `A.fields` is
-- the key's record (a JSON object of strings, the digest included; never the secret). At most
-- 1,000 operator keys exist, revoked ones included. The answer is the key's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
if redis.call('EXISTS', K.operator_key) == 1 then return err('INTERNAL_ERROR', MSG.API_KEY_ID_COLLISION) end
if redis.call('SCARD', K.operator_key_index) >= 1000 then return err('INVALID_REQUEST', MSG.OPERATOR_KEYS_FULL, '', 409) end
local fields = cjson.decode(A.fields)
fields.status, fields.created_at_ms, fields.updated_at_ms = 'ACTIVE', now_s, now_s
write_fields(K.operator_key, fields)
redis.call('SADD', K.operator_key_index, fields.key_id)
if fields.role == 'owner' then redis.call('SADD', K.operator_owners, fields.key_id) end
audit(K.audit_log, ctx, 'operator_key.create', 'operator_key', fields.key_id, now,
  {role = fields.role, tenant_pattern = fields.tenant_pattern})
return ok(record_json(K.operator_key), 'ACTIVE', now_s)
