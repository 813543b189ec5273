-- The sweep's look at one tenant's API keys: each ACTIVE key past its expiry becomes EXPIRED,
-- with api_key.expired and an audit row (a key used after its expiry meets the same fate at
-- that request, whichever comes first; `expire_key` acts once).
local now, now_s = now_ms()
local sc = scene(K.events, nil, now, nil, A.tenant)
local expired = 0
for _, id in ipairs(redis.call('SMEMBERS', K.api_key_index)) do
  local key = KEY.api_key(sc.prefix, id)
  local k = redis.call('HMGET', key, 'key_id', 'name', 'status', 'expires_at_ms')
  if k[3] == 'ACTIVE' and k[4] and tonumber(k[4]) <= now then
    expire_key(sc, key, k)
    expired = expired + 1
  end
end
return ok({expired = expired}, '', now_s)
