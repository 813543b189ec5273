-- validateApiKey: whether a presented key is usable now (its digest, status and expiry, and
-- its tenant's status) and what it may do. Read-only. A key that is unknown or whose secret
-- does not match answers INVALID alike; the other reasons are told only to a matching secret.
local now, now_s = now_ms()
local f = redis.call('HMGET', K.api_key, 'digest', 'status', 'expires_at_ms', 'permissions', 'scope_filter')
if not f[1] or (f[1] ~= A.digest and not KEY_AUTH.rotated_from(K.api_key, A.digest, now)) then
  return ok({valid = false, reason = 'INVALID'}, '', now_s)
end
local reason = nil
if f[2] ~= 'ACTIVE' then
  reason = f[2] or 'INVALID'
elseif f[3] and f[3] ~= '' and tonumber(f[3]) <= now then
  reason = 'EXPIRED'
else
  local tenant = tenant_record(K.tenant, true)
  if tenant == 'MALFORMED' then return err('INTERNAL_ERROR', MSG.TENANT_MALFORMED) end
  if tenant and tenant.status ~= 'ACTIVE' then reason = 'TENANT_' .. tenant.status end
end
local permissions = {}
for p in string.gmatch(f[4] or '', '[^,]+') do permissions[#permissions + 1] = p end
return ok({valid = reason == nil, reason = reason, permissions = permissions, scope_filter = f[5] or nil,
  expires_at_ms = f[3]}, '', now_s)
