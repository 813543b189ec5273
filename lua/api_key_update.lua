-- updateApiKey / revokeApiKey. KEYS[1] tenant record  KEYS[2] key record  KEYS[3] event stream
-- KEYS[4] audit log
-- ARGV[1] request context  ARGV[2] 'update' or 'revoke'  ARGV[3] patch (JSON object of
-- strings) or the revocation reason
-- A revocation is effective on the very next request: every operation's script reads the
-- key record.
local now = now_ms()
local ctx = request_context(ARGV[1])
local k = redis.call('HMGET', KEYS[2], 'key_id', 'status', 'expires_at_ms', 'name', 'permissions', 'scope_filter', 'tenant_id')
if not k[1] then return err('NOT_FOUND', 'API key not found') end
local _, e = owner_guard(KEYS[1], nil)
if e then return e end
if k[2] == 'REVOKED' then return err('KEY_REVOKED', 'API key is already revoked') end
local key_id, tenant = k[1], k[7]
local ids = '"key_id":' .. cjson.encode(key_id) .. ',"key_name":' .. cjson.encode(k[4] or '')

if ARGV[2] == 'revoke' then
  redis.call('HSET', KEYS[2], 'status', 'REVOKED', 'revoked_at_ms', tostring(now))
  if ARGV[3] ~= '' then redis.call('HSET', KEYS[2], 'revoked_reason', ARGV[3]) end
  emit(KEYS[3], admin_event_id(ctx, 'api_key.revoked', key_id), 'api_key.revoked', tenant, nil, ctx, 'cycles-admin',
    '{' .. ids .. ',"previous_status":"ACTIVE","new_status":"REVOKED"}', now)
  audit(KEYS[4], ctx, 'api_key.revoke', 'api_key', key_id, now, {reason = ARGV[3]})
  return {'OK', '[]', 'REVOKED', tostring(now), record_json(KEYS[2])}
end

if k[3] and tonumber(k[3]) <= now then return err('KEY_EXPIRED', 'API key has expired; create a new one') end
local patch = cjson.decode(ARGV[3])
local access_changed = (patch.permissions and patch.permissions ~= (k[5] or '')) or
  (patch.scope_filter and patch.scope_filter ~= (k[6] or ''))
patch.updated_at_ms = tostring(now)
write_fields(KEYS[2], patch)
if access_changed then
  local held = redis.call('HGET', KEYS[2], 'permissions')
  emit(KEYS[3], admin_event_id(ctx, 'api_key.permissions_changed', key_id), 'api_key.permissions_changed', tenant,
    nil, ctx, 'cycles-admin', '{' .. ids .. ',"previous_status":"ACTIVE","new_status":"ACTIVE","permissions":' ..
    csv_json(held) .. '}', now)
end
audit(KEYS[4], ctx, 'api_key.update', 'api_key', key_id, now)
return {'OK', '[]', 'ACTIVE', tostring(now), record_json(KEYS[2])}
