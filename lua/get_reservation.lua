-- Read one reservation: its record as stored, with its metadata from beside it. Read-only, so
-- it keeps working while Redis refuses writes: an ACTIVE reservation past expires_at + grace is
-- reported OVERDUE, and the handler expires it (or leaves that to the sweep when the store
-- refuses writes) before answering 410.
local now, now_s = now_ms()
local denied, filter = authorize(K.auth, A.digest, A.accepted, now, true)
if denied then return denied end
local r = read_reservation(K.reservation, A.reservation_id)
if not r then return err('NOT_FOUND', MSG.RESERVATION_NOT_FOUND) end
if r.corrupt then return err('INTERNAL_ERROR', MSG.RESERVATION_CORRUPT) end
denied = filter and scope_guard(filter, r.scope_path)
if denied then return denied end
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', MSG.RESERVATION_EXPIRED) end
if r.status == 'ACTIVE' and now > r.expires_at + r.grace_ms then return ok({}, 'OVERDUE', now_s) end
-- records written before metadata moved beside them carry their own
local meta = redis.call('HMGET', K.meta, 'metadata', 'cmeta')
-- with evidence on, the receipts of its operations (operation -> evidence id)
local evidence = nil
if A.with_evidence ~= '' then
  local flat = redis.call('HGETALL', K.evidence)
  if #flat > 0 then
    evidence = {}
    for i = 1, #flat, 2 do evidence[flat[i]] = flat[i + 1] end
  end
end
-- (records of the first layout may hold their metadata inline)
local inline = r.rec.head_only and {} or r.rec
-- the record goes as it is stored, beside the answer: inside it, JSON would escape its quotes
return answer('OK', {scope = r.scope_path, metadata = meta[1] or inline.metadata,
  committed_metadata = meta[2] or inline.cmeta, evidence = evidence}, r.status, now_s, r.raw)
