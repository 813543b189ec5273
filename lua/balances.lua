-- Balances, step 1: check the key and list the tenant's ledgers (scope -> units index) that its
-- scope filter admits, as pairs scope, ",UNIT,UNIT,".
local now, now_s = now_ms()
local denied, raw_filter = authorize(K.api_key, A.digest, A.accepted, now, true)
if denied then return denied end
local flat = redis.call('HGETALL', K.scope_units)
local filter = scope_filter(raw_filter)
local ledgers = {}
for i = 1, #flat, 2 do
  if not filter or admits(filter, flat[i]) then ledgers[#ledgers + 1] = {flat[i], flat[i + 1]} end
end
return ok({ledgers = ledgers}, '', now_s)
