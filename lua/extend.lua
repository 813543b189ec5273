-- Extend: push an ACTIVE reservation's expiry out by extend_by_ms (relative to its current expiry).
-- KEYS[1] tenant record  KEYS[2] api key record  KEYS[3] reservation  KEYS[4] expiry index
-- KEYS[5] extend idempotency record  KEYS[6] event stream  KEYS[7] listing index
-- KEYS[8] the reservation's metadata  KEYS[9..] the reservation's budgets (for expire-on-touch)
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] reservation id  ARGV[4] payload hash
-- ARGV[5] extend_by_ms  ARGV[6] how long finished records are kept (ms)
local now, now_s = now_ms()
local denied, filter = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end

local r = read_reservation(KEYS[3], ARGV[3])
if not r then return err('NOT_FOUND', 'Reservation not found') end
denied = filter and scope_guard(filter, r.scope_path)
if denied then return denied end
local replayed = replay(KEYS[5], ARGV[4], r.status, now)
if replayed then return replayed end

local guard = tenant_guard(tenant_record(KEYS[1]))
if guard then return guard end
local retention = tonumber(ARGV[6])
if r.corrupt then return err('INTERNAL_ERROR', 'Reservation record is corrupt') end
local ix = {record = KEYS[3], meta = KEYS[8], expiry = KEYS[4], events = KEYS[6], list = KEYS[7]}
expire_if_overdue(r, keys_from(9), ix, now, retention)
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', 'Reservation has expired') end
if r.status ~= 'ACTIVE' then return err('RESERVATION_FINALIZED', 'Reservation is already ' .. r.status) end
if now > r.expires_at then return err('RESERVATION_EXPIRED', 'Reservation has expired (extend allows no grace period)') end
if r.extensions >= r.max_extensions then
  return err('MAX_EXTENSIONS_EXCEEDED', 'Reservation was already extended ' .. r.extensions .. ' times (limit ' .. r.max_extensions .. ')')
end

local expires_at = r.expires_at + tonumber(ARGV[5])
local expires = itoa(expires_at)
local token = token_of(r.rid)
redis.call('ZREM', KEYS[7], 'x' .. padded(r.rec.expires, 13) .. token)
redis.call('ZADD', KEYS[7], 0, 'x' .. padded(expires, 13) .. token)
r.rec.expires, r.rec.ext = expires, tostring(r.extensions + 1)
save_record(KEYS[3], r.rec)
redis.call('ZADD', KEYS[4], expires_at + r.grace, r.rid)
local result = cjson.encode({expires})
redis.call('HSET', KEYS[5], 'payload_hash', ARGV[4], 'result', result)
redis.call('PEXPIRE', KEYS[5], expires_at + r.grace - now + retention)
return {'OK', result, 'ACTIVE', now_s}
