-- Release: return a reservation's whole hold to every budgeted scope.
-- KEYS[1] tenant record  KEYS[2] api key record (the tenant record again for admin calls)
-- KEYS[3] reservation  KEYS[4] expiry index  KEYS[5] audit log  KEYS[6] event stream
-- KEYS[7] listing index  KEYS[8] the reservation's metadata  KEYS[9..] the reservation's budgets
-- ARGV[1] key digest ('' for an admin-key call)  ARGV[2] accepted permissions  ARGV[3] reservation id
-- ARGV[4] idempotency key  ARGV[5] payload hash  ARGV[6] reason or ''  ARGV[7] how long finished
-- records are kept (ms)
-- ARGV[8] audit entry json ('' unless an admin released on behalf of the tenant)
local now, now_s = now_ms()
local denied, filter = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end

local r = read_reservation(KEYS[3], ARGV[3])
if not r then return err('NOT_FOUND', 'Reservation not found') end
denied = filter and scope_guard(filter, r.scope_path)
if denied then return denied end
if r.status == 'RELEASED' and r.rec.rk == ARGV[4] then
  if r.rec.rh ~= ARGV[5] then
    return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload')
  end
  return {'REPLAY', cjson.encode(r.rec.rr), r.status, now_s, r.rec.subject, r.unit}
end

local guard = tenant_guard(tenant_record(KEYS[1]))
if guard then return guard end
local retention = tonumber(ARGV[7])
if r.corrupt then return err('INTERNAL_ERROR', 'Reservation record is corrupt') end
local ix = {record = KEYS[3], meta = KEYS[8], expiry = KEYS[4], events = KEYS[6], list = KEYS[7]}
expire_if_overdue(r, keys_from(9), ix, now, retention)
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', 'Reservation has expired') end
if r.status ~= 'ACTIVE' then return err('RESERVATION_FINALIZED', 'Reservation is already ' .. r.status) end

local budgets = read_budgets(KEYS, 9)
for _, b in ipairs(budgets) do
  b.reserved = d_sub(b.reserved, r.estimate)
  b.remaining = d_add(b.remaining, r.estimate)
end
local failed = write_budgets(budgets, now_s)
if failed then return failed end

local result = snapshot({r.estimate}, budgets)
local rec = r.rec
rec.status, rec.finalized, rec.rk, rec.rh, rec.rr = 'RELEASED', now_s, ARGV[4], ARGV[5], result
if ARGV[6] ~= '' then rec.reason = ARGV[6] end
save_record(KEYS[3], rec)
keep_finished(KEYS[3], KEYS[8], rec, retention)
redis.call('ZREM', KEYS[4], r.rid)
list_status(KEYS[7], r, 'RELEASED')
if ARGV[8] ~= '' then
  -- admin-on-behalf-of: the audit entry is written in the same atomic step as the release
  local entry = cjson.decode(ARGV[8])
  entry.timestamp_ms = now
  redis.call('RPUSH', KEYS[5], cjson.encode(entry))
end
return {'OK', cjson.encode(result), 'RELEASED', now_s, rec.subject, rec.unit}
