-- Release: return a reservation's whole hold to every budgeted scope. An admin-key release
-- writes its audit entry in the same step.
local now, now_s = now_ms()
local r, answer = open_reservation(K, A, now, function(r)
  if r.status ~= 'RELEASED' then return nil end
  local rec = whole_record(r.rec)
  if rec.fkey ~= A.idempotency_key then return nil end
  if rec.fhash ~= A.payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  return replayed(settle_answer(rec), r.status, now_s)
end)
if not r then return answer end

local budgets = read_budgets(K.budgets, r.sc)
for i = 1, #budgets do local b = budgets[i]
  b.reserved = d_sub(b.reserved, r.estimate)
  b.remaining = d_add(b.remaining, r.estimate)
end
local failed = write_budgets(budgets, now_s)
if failed then return failed end
for i = 1, #budgets do hold_events(r.sc, budgets[i], r.unit) end

local rec = r.rec
give_back(r.sc, rec)
record_ending(r.sc, K.due_index, 'r', r)
list_status(K.listing_index, r, 'RELEASED')
finish_record(K.reservation, rec, 'RELEASED', {fkey = A.idempotency_key, fhash = A.payload_hash,
  fbalances = balances(budgets), finished = now_s, reason = A.reason ~= '' and A.reason or nil}, A.record_ttl_ms)
redis.call('ZREM', K.expiry_index, r.rid)
if A.audit ~= '' then
  -- admin-on-behalf-of: the audit entry is written in the same atomic step as the release
  audit(KEY.audit_log(r.sc.prefix), request_context(A.audit), 'reservation.release', 'reservation', r.rid, now,
    A.reason ~= '' and {reason = client_text(A.reason)} or nil)
end
return ok(settle_answer(rec), 'RELEASED', now_s)
