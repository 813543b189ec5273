-- Commit: settle a reservation with its actual cost under the overage policy recorded at
-- reserve: charge every budgeted scope, return what was not used, record the commit.
local now, now_s = now_ms()
local r, answer = open_reservation(K, A, now, function(r)
  if r.status ~= 'COMMITTED' then return nil end
  local rec = whole_record(r.rec)
  if rec.fkey ~= A.idempotency_key then return nil end
  if rec.fhash ~= A.payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  return replayed(settle_answer(rec), r.status, now_s)
end)
if not r then return answer end
if A.unit ~= r.unit then
  return err('UNIT_MISMATCH', 'actual.unit ' .. A.unit .. ' does not match the reservation unit ' .. r.unit,
    cjson.encode({scope = r.scope_path, requested_unit = A.unit, expected_units = {r.unit}}))
end

-- a policy's commit rate limit on the reservation's scope (a limited commit changes nothing;
-- a tenant without policies has none)
local policed = not (type(r.tenant) == 'table' and r.tenant.policies == 0)
local commit_rate = policed and policy_settings(r.sc.prefix, r.scope_path, now, r.tenant).rl_c
if commit_rate then
  local limited = rate_check(r.sc.prefix, commit_rate, 'commits', counted_scope(commit_rate, r.sc, r.scope_path), now, true)
  if limited then return limited end
end

local budgets = read_budgets(K.budgets, r.sc)
for i = 1, #budgets do local b = budgets[i]
  if b.status == 'FROZEN' then return err('BUDGET_FROZEN', MSG.BUDGET_FROZEN .. b.scope) end
  if b.status == 'CLOSED' then return err('BUDGET_CLOSED', MSG.BUDGET_CLOSED .. b.scope) end
end

local E, X = r.estimate, A.amount
if r.policy == 'REJECT' and d_cmp(X, E) > 0 then
  return err('BUDGET_EXCEEDED', 'Actual ' .. X .. ' exceeds the reserved ' .. E .. ' under overage policy REJECT')
end
local charged, overflow = settle(budgets, E, X, r.policy)
if overflow then
  return err('OVERDRAFT_LIMIT_EXCEEDED', 'Commit would exceed the overdraft limit of scope ' .. overflow.scope)
end
track_spend(r.sc, budgets)
local failed = write_budgets(budgets, now_s)
if failed then return failed end
budget_events(r.sc, budgets, r.unit, r.rid, r.policy)
local ctx = d_cmp(X, E) > 0 and r.sc.ctx
if ctx then
  local debt = '0'
  for i = 1, #budgets do debt = d_max(debt, d_sub(budgets[i].debt, budgets[i].before.debt)) end
  emit(K.events, 'reservation.commit_overage', ctx.tenant, r.scope_path, ctx, 'cycles-server',
    '{"reservation_id":' .. cjson.encode(r.rid) .. ',"scope":' .. cjson.encode(r.scope_path) .. ',"unit":"' ..
    r.unit .. '","estimated_amount":' .. E .. ',"actual_amount":' .. X .. ',"overage":' .. d_sub(X, E) ..
    ',"overage_policy":"' .. r.policy .. '","debt_incurred":' .. debt .. '}', now)
end

local rec = r.rec
give_back(r.sc, rec, charged)
record_ending(r.sc, K.due_index, 'c', r, charged)
list_status(K.listing_index, r, 'COMMITTED')
if A.metadata ~= '' then
  -- (the record says it has metadata beside it: one set at the reserve, or this one)
  if not rec.m then rec = whole_record(rec); rec.m = '1' end
  redis.call('HSET', RECORD.metadata_key(K.reservation), 'cmeta', A.metadata)
end
finish_record(K.reservation, rec, 'COMMITTED', {fkey = A.idempotency_key, fhash = A.payload_hash,
  fbalances = balances(budgets), charged = charged, finished = now_s, metrics = A.metrics ~= '' and A.metrics or nil},
  A.record_ttl_ms)
redis.call('ZREM', K.expiry_index, r.rid)
return ok(settle_answer(rec), 'COMMITTED', now_s)
