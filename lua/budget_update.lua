-- updateBudget / freezeBudget / unfreezeBudget on one ledger, with its event and audit row.
-- `A.mode`: 'update' (`A.change` is a patch, a JSON object of strings) or 'freeze' /
-- 'unfreeze' (`A.change` is the reason). The answer is the ledger's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local b = read_budget(K.budget, A.scope)
if not b then return err('BUDGET_NOT_FOUND', MSG.BUDGET_MISSING) end
local t, e = owner_guard(K.tenant, nil)
if e then return e end
if b.status == 'CLOSED' then return err('BUDGET_CLOSED', MSG.BUDGET_CLOSED_PLAIN) end
local tenant = redis.call('HGET', K.budget, 'tenant_id')
local sc = scene(K.events, ctx, now, t, tenant)
roll_due(sc, b)
local ledger_id = redis.call('HGET', K.budget, 'ledger_id') or ''
local ids = '"ledger_id":' .. cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '"'
local before = ledger_state(b)

if A.mode == 'freeze' or A.mode == 'unfreeze' then
  local from, to = (A.mode == 'freeze') and 'ACTIVE' or 'FROZEN', (A.mode == 'freeze') and 'FROZEN' or 'ACTIVE'
  if b.status ~= from then return err('INVALID_REQUEST', 'Budget is ' .. b.status .. ', not ' .. from, '', 409) end
  b.status = to
  save_ledger(b, now)
  local kind = (A.mode == 'freeze') and 'budget.frozen' or 'budget.unfrozen'
  emit(K.events, kind, tenant, b.scope, ctx, 'cycles-admin', '{' .. ids .. ',"operation":"STATUS_CHANGE","previous_state":' ..
    before .. ',"new_state":' .. ledger_state(b) .. (A.change ~= '' and (',"reason":' .. cjson.encode(A.change)) or '') .. '}', now)
  audit(K.audit_log, ctx, 'budget.' .. A.mode, 'budget', ledger_id, now, {reason = A.change})
  return ok(record_json(K.budget), b.status, now_s)
end

local patch = cjson.decode(A.change)
if (patch.period_every or '') ~= '' and not patch.period_end_ms and not redis.call('HGET', K.budget, 'period_end_ms') then
  return err('INVALID_REQUEST', 'period_recurrence needs a period_end (the end of the first period)')
end
if patch.overdraft_limit then b.overdraft_limit = patch.overdraft_limit end
if patch.commit_overage_policy then b.policy = patch.commit_overage_policy end
b.over = d_cmp(b.debt, b.overdraft_limit) > 0
save_ledger(b, now)
patch.overdraft_limit, patch.commit_overage_policy = nil, nil
write_fields(K.budget, patch)
emit(K.events, 'budget.updated', tenant, b.scope, ctx, 'cycles-admin',
  '{' .. ids .. ',"operation":"UPDATE","previous_state":' .. before .. ',"new_state":' .. ledger_state(b) .. '}', now)
over_limit_events(K.events, ctx, b, tenant, now)
audit(K.audit_log, ctx, 'budget.update', 'budget', ledger_id, now)
-- a changed period takes effect now: scheduled, and rolled at once when it has already ended
if patch.period_every or patch.period_end_ms then
  schedule_period(b, K.due_index, tenant, now_s)
  roll_due(sc, b)
end
return ok(record_json(K.budget), b.status, now_s)
