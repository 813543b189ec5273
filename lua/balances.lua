-- Balances, step 1: authenticate and list the tenant's ledgers (scope -> units index) that
-- the key's scope filter admits.
-- KEYS[1] api key record  KEYS[2] scope -> units index  ARGV[1] key digest  ARGV[2] permissions
local now = now_ms()
local denied, raw_filter = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
local flat = redis.call('HGETALL', KEYS[2])
local filter = scope_filter(raw_filter)
if filter then
  local kept = {}
  for i = 1, #flat, 2 do
    if admits(filter, flat[i]) then kept[#kept + 1] = flat[i]; kept[#kept + 1] = flat[i + 1] end
  end
  flat = kept
end
-- cjson encodes an empty table as {}; a tenant without ledgers lists none
return {'OK', (#flat == 0) and '[]' or cjson.encode(flat), '', tostring(now)}
