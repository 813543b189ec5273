-- Read one reservation (expiring it first if it is overdue, so its status is never stale).
-- KEYS[1] api key record (the reservation key again for admin calls)  KEYS[2] reservation
-- KEYS[3] expiry index  KEYS[4] event stream  KEYS[5..] the reservation's budgets
-- ARGV[1] key digest ('' for admin)  ARGV[2] accepted permissions  ARGV[3] reservation id
-- ARGV[4] retention ms
local now = now_ms()
local denied = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
local r = read_reservation(KEYS[2], ARGV[3])
if not r then return err('NOT_FOUND', 'Reservation not found') end
if r.corrupt then return err('INTERNAL_ERROR', 'Reservation record is corrupt') end
expire_if_overdue(KEYS[2], r, keys_from(5), KEYS[3], KEYS[4], now, tonumber(ARGV[4]))
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', 'Reservation has expired') end
local rec = r.rec
local f = {rec.status, rec.ik, rec.subject, rec.action, rec.unit, rec.estimate, rec.charged, rec.created,
  rec.expires, rec.finalized, r.scope_path, rec.metadata, rec.cmeta}
for i = 1, 13 do f[i] = f[i] or '' end
return {'OK', cjson.encode(f), rec.status, tostring(now)}
