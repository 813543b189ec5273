-- updateOperatorKey / revokeOperatorKey / rotateOperatorKey, with its audit entry. `A.mode`:
-- 'update' (`A.change` is a patch, a JSON object of strings; '' clears a field), 'revoke'
-- (`A.change` is the reason) or 'rotate' (`A.change`: {digest, prefix, grace_ms}: the current
-- secret keeps working `grace_ms` more, a secret from an earlier rotation stops now). Containers
-- trust a checked key at most `CYCLES_AUTH_CACHE_MS`, so a change is everywhere within that.
-- The answer is the key's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local k = redis.call('HMGET', K.operator_key, 'key_id', 'status', 'expires_at_ms', 'role')
if not k[1] then return err('NOT_FOUND', MSG.OPERATOR_KEY_NOT_FOUND) end
if k[2] == 'REVOKED' then return err('KEY_REVOKED', MSG.OPERATOR_KEY_ALREADY_REVOKED) end
local key_id = k[1]

-- An owner stops being one (revoked or demoted): refused for the last owner while the bootstrap
-- key is off (`A.bootstrap` ''), which would leave no one able to manage operator keys.
local function leave_owners()
  if redis.call('SISMEMBER', K.operator_owners, key_id) == 0 then return nil end
  if A.bootstrap == '' and redis.call('SCARD', K.operator_owners) <= 1 then
    return err('INVALID_REQUEST', MSG.LAST_OWNER, '', 409)
  end
  redis.call('SREM', K.operator_owners, key_id)
end

if A.mode == 'revoke' then
  local e = leave_owners()
  if e then return e end
  redis.call('HSET', K.operator_key, 'status', 'REVOKED', 'revoked_at_ms', now_s, 'updated_at_ms', now_s)
  redis.call('HDEL', K.operator_key, 'previous_digest', 'previous_until_ms')
  if A.change ~= '' then redis.call('HSET', K.operator_key, 'revoked_reason', A.change) end
  audit(K.audit_log, ctx, 'operator_key.revoke', 'operator_key', key_id, now, {reason = A.change})
  return ok(record_json(K.operator_key), 'REVOKED', now_s)
end

if k[3] and k[3] ~= '' and tonumber(k[3]) <= now then return err('KEY_EXPIRED', MSG.OPERATOR_KEY_EXPIRED) end
if A.mode == 'rotate' then
  local r = cjson.decode(A.change)
  rotate_secret(K.operator_key, r, now, now_s)
  audit(K.audit_log, ctx, 'operator_key.rotate', 'operator_key', key_id, now, {grace_period_ms = r.grace_ms})
  return ok(record_json(K.operator_key), 'ACTIVE', now_s)
end
local patch = cjson.decode(A.change)
local role = patch.role or k[4]
local pattern = patch.tenant_pattern or redis.call('HGET', K.operator_key, 'tenant_pattern') or ''
if role == 'owner' and pattern ~= '' then return err('INVALID_REQUEST', MSG.OWNER_UNLIMITED) end
if role == 'owner' then
  redis.call('SADD', K.operator_owners, key_id)
else
  local e = leave_owners()
  if e then return e end
end
patch.updated_at_ms = now_s
write_fields(K.operator_key, patch)
local details = nil
if patch.role and patch.role ~= k[4] then details = {previous_role = k[4], role = patch.role} end
audit(K.audit_log, ctx, 'operator_key.update', 'operator_key', key_id, now, details)
return ok(record_json(K.operator_key), 'ACTIVE', now_s)
