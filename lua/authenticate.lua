-- Verifies an API key and reports what it may do (operator-plane calls, and rare runtime error
-- paths such as telling a caller that a reservation belongs to another tenant).
-- KEYS[1] api key record  KEYS[2] (optional) the tenant record
-- ARGV[1] key digest  ARGV[2] accepted permissions ('' = any valid key)
-- Reply context: held permissions (",a,b,"), scope filter (JSON array or '')
local now = now_ms()
local denied = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
local f = redis.call('HMGET', KEYS[1], 'permissions', 'scope_filter')
local status = ''
if KEYS[2] then status = redis.call('HGET', KEYS[2], 'status') or '' end
return {'OK', '[]', status, tostring(now), f[1] or '', f[2] or ''}
