-- Listing, one chunk: authenticate and read index members in lexicographic order. The reply
-- context carries the key's scope filter (JSON array or ''): rows outside it are not listed.
-- KEYS[1] api key record (for admin-key calls any key of the slot, unchecked)  KEYS[2] created index
-- ARGV[1] key digest ('' for admin)  ARGV[2] accepted permissions  ARGV[3] start bound
-- ARGV[4] end bound  ARGV[5] 'REV' for descending  ARGV[6] count
local now = now_ms()
local denied, filter = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
local members
if ARGV[5] == 'REV' then
  members = redis.call('ZRANGE', KEYS[2], ARGV[3], ARGV[4], 'BYLEX', 'REV', 'LIMIT', 0, tonumber(ARGV[6]))
else
  members = redis.call('ZRANGE', KEYS[2], ARGV[3], ARGV[4], 'BYLEX', 'LIMIT', 0, tonumber(ARGV[6]))
end
local encoded = (#members == 0) and '[]' or cjson.encode(members)
return {'OK', encoded, '', tostring(now), filter or ''}
