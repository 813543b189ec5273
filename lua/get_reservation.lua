-- Read one reservation. Read-only, so it keeps working while Redis refuses writes: an ACTIVE
-- reservation past expires_at + grace is reported OVERDUE, and the handler expires it (or
-- leaves that to the sweep when the store refuses writes) before answering 410.
-- KEYS[1] api key record (the reservation key again for admin calls)  KEYS[2] reservation
-- KEYS[3] its metadata
-- ARGV[1] key digest ('' for admin)  ARGV[2] accepted permissions  ARGV[3] reservation id
local now = now_ms()
local denied, filter = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
local r = read_reservation(KEYS[2], ARGV[3])
if not r then return err('NOT_FOUND', 'Reservation not found') end
if r.corrupt then return err('INTERNAL_ERROR', 'Reservation record is corrupt') end
denied = filter and scope_guard(filter, r.scope_path)
if denied then return denied end
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', 'Reservation has expired') end
if r.status == 'ACTIVE' and now > r.expires_at + r.grace then return {'OK', '[]', 'OVERDUE', tostring(now)} end
local rec = r.rec
-- metadata beside the record (records written before it moved there carry their own)
local meta = redis.call('HMGET', KEYS[3], 'metadata', 'cmeta')
local f = {rec.status, rec.ik, rec.subject, rec.action, rec.unit, rec.estimate, rec.charged, rec.created,
  rec.expires, rec.finalized, r.scope_path, meta[1] or rec.metadata, meta[2] or rec.cmeta}
for i = 1, 13 do f[i] = f[i] or '' end
return {'OK', cjson.encode(f), rec.status, tostring(now)}
