-- Listing: the raw records of one tenant's reservations ('' where a record is gone).
-- KEYS[1..] reservation records
local out = {}
for i = 1, #KEYS do out[i] = redis.call('GET', KEYS[i]) or '' end
if #out == 0 then return {'OK', '[]', '', '0'} end
return {'OK', cjson.encode(out), '', '0'}
