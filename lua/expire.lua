-- Expiry sweep over a batch of one tenant's due reservations: each ACTIVE reservation past
-- expires_at + grace becomes EXPIRED exactly once, its hold returns to every budgeted scope
-- and one reservation.expired event is written. Finalized or vanished entries leave the index;
-- corrupt records are quarantined, never refunded. Safe to run concurrently with itself.
-- Per reservation, `K.reservation_keys` holds its record, then its budget keys, and
-- `A.reservations` its id and its number of budget keys.
local now, now_s = now_ms()
local expired, dropped, quarantined = 0, 0, 0
local sc = scene(K.events, nil, now) -- one per batch: the tenant's alert settings read once
local k = 1
for i = 1, #A.reservations, 2 do
  local rid, nb = A.reservations[i], tonumber(A.reservations[i + 1])
  local record = K.reservation_keys[k]
  local ix = {reservation = record, expiry_index = K.expiry_index, events = K.events, listing_index = K.listing_index,
    budgets = {}}
  for j = 1, nb do ix.budgets[j] = K.reservation_keys[k + j] end
  k = k + 1 + nb
  local r = read_reservation(record, rid)
  if not r or (r.status ~= 'ACTIVE' and not r.corrupt) then
    redis.call('ZREM', K.expiry_index, rid)
    dropped = dropped + 1
  elseif r.corrupt then
    redis.call('ZREM', K.expiry_index, rid)
    redis.call('HSET', K.quarantine, rid, 'unreadable status, amount or times at ' .. now_s)
    quarantined = quarantined + 1
  else
    r.sc = sc
    if expire_if_overdue(r, ix, now, A.record_ttl_ms) then expired = expired + 1 end
  end
end
return ok({expired = expired, dropped = dropped, quarantined = quarantined}, '', now_s)
