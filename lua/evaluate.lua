-- Evaluation without a reservation (dry_run and decide): the key check and the key's scope
-- filter, then `evaluation` (lua/lib/decision.lua). dry_run shares reserve's idempotency
-- namespace: `live` is the reservation the same key would create (for decide, the
-- idempotency record again).
local now, now_s = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
denied = filter and scope_guard(filter, string.sub(A.scopes[#A.scopes], 1, -10))
if denied then return denied end
return evaluation(K, A, now, now_s, '')
