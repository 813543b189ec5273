-- updateBudget / freezeBudget / unfreezeBudget. KEYS[1] tenant record  KEYS[2] budget
-- KEYS[3] event stream  KEYS[4] audit log
-- ARGV[1] request context  ARGV[2] 'update' | 'freeze' | 'unfreeze'  ARGV[3] scope
-- ARGV[4] patch (JSON object of strings) or the reason
local now = now_ms()
local ctx = request_context(ARGV[1])
local b = read_budget(KEYS[2], ARGV[3])
if not b then return err('BUDGET_NOT_FOUND', 'Budget not found') end
local _, e = owner_guard(KEYS[1], nil)
if e then return e end
if b.status == 'CLOSED' then return err('BUDGET_CLOSED', 'Budget is closed') end
local tenant = redis.call('HGET', KEYS[2], 'tenant_id')
local ledger_id = redis.call('HGET', KEYS[2], 'ledger_id') or ''
local ids = '"ledger_id":' .. cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '"'
local before = ledger_state(b)
local mode = ARGV[2]

if mode == 'freeze' or mode == 'unfreeze' then
  local from, to = (mode == 'freeze') and 'ACTIVE' or 'FROZEN', (mode == 'freeze') and 'FROZEN' or 'ACTIVE'
  if b.status ~= from then return err('INVALID_REQUEST', 'Budget is ' .. b.status .. ', not ' .. from, '', 409) end
  b.status = to
  save_ledger(b, now)
  local kind = (mode == 'freeze') and 'budget.frozen' or 'budget.unfrozen'
  emit(KEYS[3], admin_event_id(ctx, kind, KEYS[2]), kind, tenant, b.scope, ctx, 'cycles-admin', '{' .. ids ..
    ',"operation":"STATUS_CHANGE","previous_state":' .. before .. ',"new_state":' .. ledger_state(b) ..
    (ARGV[4] ~= '' and (',"reason":' .. cjson.encode(ARGV[4])) or '') .. '}', now)
  audit(KEYS[4], ctx, 'budget.' .. mode, 'budget', ledger_id, now, {reason = ARGV[4]})
  return {'OK', '[]', b.status, tostring(now), record_json(KEYS[2])}
end

local patch = cjson.decode(ARGV[4])
if patch.overdraft_limit then b.overdraft_limit = patch.overdraft_limit end
b.over = d_cmp(b.debt, b.overdraft_limit) > 0
save_ledger(b, now)
patch.overdraft_limit = nil
write_fields(KEYS[2], patch)
emit(KEYS[3], admin_event_id(ctx, 'budget.updated', KEYS[2]), 'budget.updated', tenant, b.scope, ctx, 'cycles-admin',
  '{' .. ids .. ',"operation":"UPDATE","previous_state":' .. before .. ',"new_state":' .. ledger_state(b) .. '}', now)
over_limit_events(KEYS[3], ctx, b, tenant, now)
audit(KEYS[4], ctx, 'budget.update', 'budget', ledger_id, now)
return {'OK', '[]', b.status, tostring(now), record_json(KEYS[2])}
