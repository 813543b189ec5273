-- Checks an API key and reports what it may do (operator-plane calls, and rare runtime error
-- paths such as telling a caller that a reservation belongs to another tenant): its held
-- permissions, its scope filter, and its tenant's status when its tenant record is given (the
-- optional `K.tenant[1]`).
local now, now_s = now_ms()
local denied, filter, k = authorize(K.api_key, A.digest, A.accepted, now, true)
if denied then return denied end
-- (an admin-key call is not checked, so its key is read here)
k = k or KEY_AUTH.read(K.api_key, true) or KEY_AUTH.of({})
local status = ''
if K.tenant[1] then status = redis.call('HGET', K.tenant[1], 'status') or '' end
local permissions = {}
for p in string.gmatch(k.held, '[^,]+') do permissions[#permissions + 1] = p end
return ok({permissions = permissions, scope_filter = filter or k.filter}, status, now_s)
