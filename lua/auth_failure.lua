-- A failed authentication, in its owner's slot (the key's tenant, or `__system__` for the admin
-- key and unknown key ids): api_key.auth_failed when sampled (`A.sample`: the first failure of
-- its key id or source in a minute), the tenant's failure count for the auth-failure-rate
-- alert (`A.counted`: the first failure of its key id in a minute), and an ACTIVE key found past its expiry becomes EXPIRED (api_key.expired).
local now, now_s = now_ms()
local ctx = request_context(A.context)
local sc = scene(K.events, ctx, now, nil, A.owner)
local k = redis.call('HMGET', K.api_key, 'key_id', 'name', 'status', 'expires_at_ms')
if A.sample ~= '' then
  emit(K.events, 'api_key.auth_failed', A.owner, nil, ctx, 'cycles-server', '{"key_id":' ..
    cjson.encode(k[1] or A.key_id) .. (k[2] and (',"key_name":' .. cjson.encode(k[2])) or '') ..
    ',"failure_reason":' .. cjson.encode(A.reason) .. (A.source ~= '' and (',"source_ip":' .. cjson.encode(A.source)) or '') ..
    '}', now)
end
if A.owner ~= '__system__' and A.counted ~= '' then count_and_check(sc, 'f') end
if k[3] == 'ACTIVE' and k[4] and tonumber(k[4]) <= now then expire_key(sc, K.api_key, k) end
return ok({})
