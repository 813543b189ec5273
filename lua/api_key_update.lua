-- updateApiKey / revokeApiKey / rotateApiKey, with its events and audit row. `A.mode`: 'update'
-- (`A.change` is a patch, a JSON object of strings), 'revoke' (`A.change` is the reason) or
-- 'rotate' (`A.change`: {digest, prefix, grace_ms}: the new secret's digest and prefix; the
-- current secret keeps working `grace_ms` more, a secret from an earlier rotation stops now). A revocation is
-- effective on the very next request: every operation's script reads the key record. The
-- answer is the key's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local k = redis.call('HMGET', K.api_key, 'key_id', 'status', 'expires_at_ms', 'name', 'permissions', 'scope_filter', 'tenant_id')
if not k[1] then return err('NOT_FOUND', MSG.API_KEY_NOT_FOUND) end
local _, e = owner_guard(K.tenant, nil)
if e then return e end
if k[2] == 'REVOKED' then return err('KEY_REVOKED', MSG.API_KEY_ALREADY_REVOKED) end
local key_id, tenant = k[1], k[7]
local ids = '"key_id":' .. cjson.encode(key_id) .. ',"key_name":' .. cjson.encode(k[4] or '')

if A.mode == 'revoke' then
  redis.call('HSET', K.api_key, 'status', 'REVOKED', 'revoked_at_ms', now_s)
  if A.change ~= '' then redis.call('HSET', K.api_key, 'revoked_reason', A.change) end
  KEY_AUTH.refresh(K.api_key)
  emit(K.events, 'api_key.revoked', tenant, nil, ctx, 'cycles-admin',
    '{' .. ids .. ',"previous_status":"ACTIVE","new_status":"REVOKED"}', now)
  audit(K.audit_log, ctx, 'api_key.revoke', 'api_key', key_id, now, {reason = A.change})
  return ok(record_json(K.api_key), 'REVOKED', now_s)
end

if k[3] and tonumber(k[3]) <= now then return err('KEY_EXPIRED', MSG.API_KEY_EXPIRED) end
if A.mode == 'rotate' then
  local r = cjson.decode(A.change)
  rotate_secret(K.api_key, r, now, now_s)
  KEY_AUTH.refresh(K.api_key)
  audit(K.audit_log, ctx, 'api_key.rotate', 'api_key', key_id, now, {grace_period_ms = r.grace_ms})
  return ok(record_json(K.api_key), 'ACTIVE', now_s)
end
local patch = cjson.decode(A.change)
local access_changed = (patch.permissions and patch.permissions ~= (k[5] or '')) or
  (patch.scope_filter and patch.scope_filter ~= (k[6] or ''))
patch.updated_at_ms = now_s
write_fields(K.api_key, patch)
KEY_AUTH.refresh(K.api_key)
if access_changed then
  local held = redis.call('HGET', K.api_key, 'permissions')
  emit(K.events, 'api_key.permissions_changed', tenant, nil, ctx, 'cycles-admin',
    '{' .. ids .. ',"previous_status":"ACTIVE","new_status":"ACTIVE","permissions":' .. csv_json(held) .. '}', now)
end
audit(K.audit_log, ctx, 'api_key.update', 'api_key', key_id, now)
return ok(record_json(K.api_key), 'ACTIVE', now_s)
