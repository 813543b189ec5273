-- fundBudget: CREDIT, DEBIT, RESET, RESET_SPENT, REPAY_DEBT with the ledger math of
-- admin-and-events.md §4.3.4; the invariant remaining = allocated - spent - reserved - debt holds
-- after each, and is_over_limit is recomputed as debt > overdraft_limit.
-- KEYS[1] tenant record  KEYS[2] budget  KEYS[3] idempotency record (the tenant record again
-- when no key was given)  KEYS[4] event stream  KEYS[5] audit log
-- ARGV[1] request context  ARGV[2] scope  ARGV[3] operation  ARGV[4] amount  ARGV[5] spent
-- override ('' = not given)  ARGV[6] reason  ARGV[7] payload hash  ARGV[8] idempotency ttl ms
local now = now_ms()
local ctx = request_context(ARGV[1])
local keyed = KEYS[3] ~= KEYS[1]
if keyed then
  local prior = replay(KEYS[3], ARGV[7], 'FUNDED', now)
  if prior then return prior end
end
local b = read_budget(KEYS[2], ARGV[2])
if not b then return err('BUDGET_NOT_FOUND', 'Budget not found') end
local _, e = owner_guard(KEYS[1], nil)
if e then return e end
if b.status == 'FROZEN' then return err('BUDGET_FROZEN', 'Budget is frozen') end
if b.status == 'CLOSED' then return err('BUDGET_CLOSED', 'Budget is closed') end

local op, a = ARGV[3], ARGV[4]
local prev = {allocated = b.allocated, remaining = b.remaining, debt = b.debt, spent = b.spent, reserved = b.reserved}
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
  local s = (ARGV[5] ~= '') and ARGV[5] or '0'
  b.allocated, b.spent = a, s
  b.remaining = d_sub(d_sub(d_sub(a, s), b.reserved), b.debt)
else -- REPAY_DEBT: debt first, any surplus becomes new allocation
  local r = d_min(b.debt, a)
  b.debt = d_sub(b.debt, r)
  b.allocated = d_add(b.allocated, d_sub(a, r))
  b.remaining = d_add(b.remaining, a)
end
for _, v in ipairs({b.allocated, b.remaining, b.spent, b.debt}) do
  if not d_fits(v) then return err('INVALID_REQUEST', 'The operation would overflow the ledger (int64)') end
end
b.over = d_cmp(b.debt, b.overdraft_limit) > 0
save_ledger(b, now)

local result = {op, prev.allocated, b.allocated, prev.remaining, b.remaining, prev.debt, b.debt, prev.spent, b.spent,
  tostring(now)}
local result_json = cjson.encode(result)
if keyed then
  redis.call('HSET', KEYS[3], 'payload_hash', ARGV[7], 'result', result_json)
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[8]))
end
local kinds = {CREDIT = 'budget.funded', DEBIT = 'budget.debited', RESET = 'budget.reset',
  RESET_SPENT = 'budget.reset_spent', REPAY_DEBT = 'budget.debt_repaid'}
local tenant = redis.call('HGET', KEYS[2], 'tenant_id')
local ledger_id = redis.call('HGET', KEYS[2], 'ledger_id') or ''
emit(KEYS[4], admin_event_id(ctx, kinds[op], KEYS[2]), kinds[op], tenant, b.scope, ctx, 'cycles-admin',
  '{"ledger_id":' .. cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit ..
  '","operation":"' .. op .. '","previous_state":' .. before .. ',"new_state":' .. ledger_state(b, op == 'RESET_SPENT') ..
  (op == 'RESET_SPENT' and (',"spent_override_provided":' .. tostring(ARGV[5] ~= '')) or '') ..
  (ARGV[6] ~= '' and (',"reason":' .. cjson.encode(ARGV[6])) or '') .. '}', now)
over_limit_events(KEYS[4], ctx, b, tenant, now)
audit(KEYS[5], ctx, 'budget.fund', 'budget', ledger_id, now, {operation = op, amount = a, reason = ARGV[6]})
return {'OK', result_json, 'FUNDED', tostring(now)}
