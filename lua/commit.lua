-- Commit: settle a reservation with its actual cost under the overage policy recorded at reserve.
-- KEYS[1] tenant record  KEYS[2] api key record  KEYS[3] reservation  KEYS[4] expiry index
-- KEYS[5] event stream  KEYS[6] listing index  KEYS[7] the reservation's metadata
-- KEYS[8..] the reservation's budgets (decoded from its id)
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] reservation id  ARGV[4] idempotency key
-- ARGV[5] payload hash  ARGV[6] actual unit  ARGV[7] actual amount  ARGV[8] metrics json or ''
-- ARGV[9] metadata json or ''  ARGV[10] how long finished records are kept (ms)  ARGV[11] request context json
local now, now_s = now_ms()
local denied, filter = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end

local r = read_reservation(KEYS[3], ARGV[3])
if not r then return err('NOT_FOUND', 'Reservation not found') end
denied = filter and scope_guard(filter, r.scope_path)
if denied then return denied end
if r.status == 'COMMITTED' and r.rec.ck == ARGV[4] then
  if r.rec.ch ~= ARGV[5] then
    return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload')
  end
  return {'REPLAY', cjson.encode(r.rec.cr), r.status, now_s, r.rec.subject, r.unit}
end

local guard = tenant_guard(tenant_record(KEYS[1]))
if guard then return guard end
local retention = tonumber(ARGV[10])
if r.corrupt then return err('INTERNAL_ERROR', 'Reservation record is corrupt') end
local ix = {record = KEYS[3], meta = KEYS[7], expiry = KEYS[4], events = KEYS[5], list = KEYS[6]}
expire_if_overdue(r, keys_from(8), ix, now, retention)
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', 'Reservation has expired') end
if r.status ~= 'ACTIVE' then return err('RESERVATION_FINALIZED', 'Reservation is already ' .. r.status) end
if ARGV[6] ~= r.unit then
  return err('UNIT_MISMATCH', 'actual.unit ' .. ARGV[6] .. ' does not match the reservation unit ' .. r.unit,
    cjson.encode({scope = r.scope_path, requested_unit = ARGV[6], expected_units = {r.unit}}))
end

local budgets = read_budgets(KEYS, 8)
for _, b in ipairs(budgets) do
  if b.status == 'FROZEN' then return err('BUDGET_FROZEN', 'Budget is frozen for scope ' .. b.scope) end
  if b.status == 'CLOSED' then return err('BUDGET_CLOSED', 'Budget is closed for scope ' .. b.scope) end
end

local E, X = r.estimate, ARGV[7]
if r.policy == 'REJECT' and d_cmp(X, E) > 0 then
  return err('BUDGET_EXCEEDED', 'Actual ' .. X .. ' exceeds the reserved ' .. E .. ' under overage policy REJECT')
end
local charged, overflow = settle(budgets, E, X, r.policy)
if overflow then
  return err('OVERDRAFT_LIMIT_EXCEEDED', 'Commit would exceed the overdraft limit of scope ' .. overflow.scope)
end
local failed = write_budgets(budgets, now_s)
if failed then return failed end
local ctx = request_context(ARGV[11])
budget_events(KEYS[5], budgets, ctx, now, r.unit, r.rid, r.policy)
if ctx and d_cmp(X, E) > 0 then
  local debt = '0'
  for _, b in ipairs(budgets) do debt = d_max(debt, d_sub(b.debt, b.before.debt)) end
  emit(KEYS[5], 'evt_' .. string.sub(redis.sha1hex(r.rid .. '|overage'), 1, 16), 'reservation.commit_overage',
    ctx.tenant, r.scope_path, ctx, 'cycles-server', '{"reservation_id":' .. cjson.encode(r.rid) .. ',"scope":' ..
    cjson.encode(r.scope_path) .. ',"unit":"' .. r.unit .. '","estimated_amount":' .. E .. ',"actual_amount":' .. X ..
    ',"overage":' .. d_sub(X, E) .. ',"overage_policy":"' .. r.policy .. '","debt_incurred":' .. debt .. '}', now)
end

local released = ''
if d_cmp(charged, E) < 0 then released = d_sub(E, charged) end
local result = snapshot({charged, released}, budgets)
local rec = r.rec
rec.status, rec.charged, rec.finalized, rec.ck, rec.ch, rec.cr = 'COMMITTED', charged, now_s, ARGV[4], ARGV[5], result
if ARGV[8] ~= '' then rec.metrics = ARGV[8] end
if ARGV[9] ~= '' then
  rec.m = '1'
  redis.call('HSET', KEYS[7], 'cmeta', ARGV[9])
end
save_record(KEYS[3], rec)
keep_finished(KEYS[3], KEYS[7], rec, retention)
redis.call('ZREM', KEYS[4], r.rid)
list_status(KEYS[6], r, 'COMMITTED')
return {'OK', cjson.encode(result), 'COMMITTED', now_s, rec.subject, rec.unit}
