-- fundBudget: CREDIT, DEBIT, RESET, RESET_SPENT, REPAY_DEBT with the ledger math README
-- documents; the invariant remaining = allocated - spent - reserved - debt holds after each,
-- and is_over_limit is recomputed as debt > overdraft_limit. With an idempotency key
-- (`K.record` differs from `K.tenant`) the answer is kept and replayed for 24 hours.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local keyed = K.record ~= K.tenant
if keyed then
  local prior = replay(K.record, A.payload_hash, 'FUNDED', now_s, function(old)
    return {operation = old[1], previous_allocated = old[2], new_allocated = old[3], previous_remaining = old[4],
      new_remaining = old[5], previous_debt = old[6], new_debt = old[7], previous_spent = old[8], new_spent = old[9],
      timestamp_ms = old[10]}
  end)
  if prior then return prior end
end
local b = read_budget(K.budget, A.scope)
if not b then return err('BUDGET_NOT_FOUND', MSG.BUDGET_MISSING) end
local t, e = owner_guard(K.tenant, nil)
if e then return e end
local sc = scene(K.events, ctx, now, t, redis.call('HGET', K.budget, 'tenant_id'))
roll_due(sc, b)
if b.status == 'FROZEN' then return err('BUDGET_FROZEN', MSG.BUDGET_FROZEN_PLAIN) end
if b.status == 'CLOSED' then return err('BUDGET_CLOSED', MSG.BUDGET_CLOSED_PLAIN) end

local op, a = A.operation, A.amount
local prev = {allocated = b.allocated, remaining = b.remaining, debt = b.debt, spent = b.spent}
local before = ledger_state(b, op == 'RESET_SPENT')
if op == 'CREDIT' then
  b.allocated, b.remaining = d_add(b.allocated, a), d_add(b.remaining, a)
elseif op == 'DEBIT' then
  if d_cmp(b.remaining, a) < 0 then
    return err('BUDGET_EXCEEDED', 'DEBIT of ' .. a .. ' exceeds the remaining ' .. b.remaining)
  end
  b.allocated, b.remaining = d_sub(b.allocated, a), d_sub(b.remaining, a)
elseif op == 'RESET' then
  b.allocated = a
  b.remaining = d_sub(d_sub(d_sub(a, b.reserved), b.spent), b.debt)
elseif op == 'RESET_SPENT' then
  local s = (A.spent ~= '') and A.spent or '0'
  b.allocated, b.spent = a, s
  b.remaining = d_sub(d_sub(d_sub(a, s), b.reserved), b.debt)
else -- REPAY_DEBT: debt first, any surplus becomes new allocation
  local r = d_min(b.debt, a)
  b.debt = d_sub(b.debt, r)
  b.allocated = d_add(b.allocated, d_sub(a, r))
  b.remaining = d_add(b.remaining, a)
end
for _, v in ipairs({b.allocated, b.remaining, b.spent, b.debt}) do
  if not d_fits(v) then return err('INVALID_REQUEST', MSG.LEDGER_OVERFLOW) end
end
b.over = d_cmp(b.debt, b.overdraft_limit) > 0
save_ledger(b, now)
-- an allocation set outright starts the next period's base afresh
if op == 'RESET' or op == 'RESET_SPENT' then redis.call('HDEL', K.budget, 'period_carried') end
threshold_events(sc, b, b.before)

local result = cjson.encode({operation = op, previous_allocated = prev.allocated, new_allocated = b.allocated,
  previous_remaining = prev.remaining, new_remaining = b.remaining, previous_debt = prev.debt, new_debt = b.debt,
  previous_spent = prev.spent, new_spent = b.spent, timestamp_ms = now_s})
if keyed then
  redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', result)
  redis.call('PEXPIRE', K.record, A.record_ttl_ms)
end
local kinds = {CREDIT = 'budget.funded', DEBIT = 'budget.debited', RESET = 'budget.reset',
  RESET_SPENT = 'budget.reset_spent', REPAY_DEBT = 'budget.debt_repaid'}
local tenant = redis.call('HGET', K.budget, 'tenant_id')
local ledger_id = redis.call('HGET', K.budget, 'ledger_id') or ''
emit(K.events, kinds[op], tenant, b.scope, ctx, 'cycles-admin',
  '{"ledger_id":' .. cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit ..
  '","operation":"' .. op .. '","previous_state":' .. before .. ',"new_state":' .. ledger_state(b, op == 'RESET_SPENT') ..
  (op == 'RESET_SPENT' and (',"spent_override_provided":' .. tostring(A.spent ~= '')) or '') ..
  (A.reason ~= '' and (',"reason":' .. cjson.encode(A.reason)) or '') .. '}', now)
over_limit_events(K.events, ctx, b, tenant, now)
audit(K.audit_log, ctx, 'budget.fund', 'budget', ledger_id, now, {operation = op, amount = a, reason = A.reason})
return ok(result, 'FUNDED', now_s)
