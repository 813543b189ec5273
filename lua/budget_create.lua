-- createBudget: a new ledger of an ACTIVE tenant, with its event and audit row. `A.fields` is
-- the ledger's record (a JSON object of strings). The answer is the ledger's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local t, e = owner_guard(K.tenant, err('TENANT_NOT_FOUND', MSG.TENANT_NOT_FOUND, '', 400))
if e then return e end
if t.status ~= 'ACTIVE' then return err('INVALID_REQUEST', MSG.TENANT_NOT_ACTIVE .. t.status .. ')') end
local f = cjson.decode(A.fields)
if redis.call('EXISTS', K.budget) == 1 then
  return err('DUPLICATE_RESOURCE', 'A budget for scope ' .. f.scope .. ' and unit ' .. f.unit .. ' already exists')
end
-- what changes with charges lives in the ledger's view, the rest in fields of their own
local b = {key = K.budget, scope = f.scope, unit = f.unit, status = 'ACTIVE', allocated = f.allocated,
  remaining = f.allocated, reserved = '0', spent = '0', debt = '0', overdraft_limit = f.overdraft_limit or '0',
  over = false, policy = f.commit_overage_policy, caps = f.caps}
f.allocated, f.overdraft_limit, f.commit_overage_policy, f.caps = nil, nil, nil, nil
f.created_at_ms = now_s
write_fields(K.budget, f)
add_scope_unit(K.scope_units, f.scope, f.unit)
schedule_period(b, K.due_index, f.tenant_id, now_s)
b = read_budget(K.budget)
emit(K.events, 'budget.created', f.tenant_id, f.scope, ctx, 'cycles-admin',
  '{"ledger_id":' .. cjson.encode(f.ledger_id) .. ',"scope":' .. cjson.encode(f.scope) .. ',"unit":"' .. f.unit ..
  '","operation":"CREATE","new_state":' .. ledger_state(b) .. '}', now)
audit(K.audit_log, ctx, 'budget.create', 'budget', f.ledger_id, now)
-- a period that has already ended rolls at once
roll_due(scene(K.events, ctx, now, t, f.tenant_id), b)
return ok(record_json(K.budget), 'ACTIVE', now_s)
