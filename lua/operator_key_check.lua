-- The check of an operator key presented in X-Admin-API-Key: its digest (or, within the grace
-- period of a rotation, its previous one), status and expiry. Stamps `last_used_at_ms` at most
-- once a minute. Every failure is the same 401; the reason travels separately for logs.
local now, now_s = now_ms()
local f = redis.call('HMGET', K.operator_key, 'digest', 'status', 'expires_at_ms', 'role', 'tenant_pattern', 'name',
  'last_used_at_ms')
local reason = nil
if not f[1] then reason = 'KEY_NOT_FOUND'
elseif f[1] ~= A.digest and not KEY_AUTH.rotated_from(K.operator_key, A.digest, now) then reason = 'INVALID_KEY'
elseif f[2] ~= 'ACTIVE' then reason = 'KEY_REVOKED'
elseif f[3] and f[3] ~= '' and tonumber(f[3]) <= now then reason = 'KEY_EXPIRED' end
if reason then return err('UNAUTHORIZED', MSG.UNAUTHORIZED, reason) end
if now - (tonumber(f[7]) or 0) >= 60000 then redis.call('HSET', K.operator_key, 'last_used_at_ms', now_s) end
return ok({role = f[4], tenant_pattern = f[5] or nil, name = f[6] or nil}, 'ACTIVE', now_s)
