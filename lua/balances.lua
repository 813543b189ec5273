-- Balances, step 1: authenticate and list the tenant's ledgers (scope -> units index).
-- KEYS[1] api key record  KEYS[2] scope -> units index  ARGV[1] key digest  ARGV[2] permissions
local now = now_ms()
local denied = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
local flat = redis.call('HGETALL', KEYS[2])
-- cjson encodes an empty table as {}; a tenant without ledgers lists none
return {'OK', (#flat == 0) and '[]' or cjson.encode(flat), '', tostring(now)}
