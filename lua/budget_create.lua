-- createBudget. KEYS[1] tenant record  KEYS[2] budget  KEYS[3] scope -> units index
-- KEYS[4] event stream  KEYS[5] audit log
-- ARGV[1] request context  ARGV[2] the ledger's fields (JSON object of strings)
local now = now_ms()
local ctx = request_context(ARGV[1])
local t, e = owner_guard(KEYS[1], err('TENANT_NOT_FOUND', 'Tenant not found', '', 400))
if e then return e end
if t.status ~= 'ACTIVE' then return err('INVALID_REQUEST', 'Tenant is not ACTIVE (status ' .. t.status .. ')') end
local f = cjson.decode(ARGV[2])
if redis.call('EXISTS', KEYS[2]) == 1 then
  return err('DUPLICATE_RESOURCE', 'A budget for scope ' .. f.scope .. ' and unit ' .. f.unit .. ' already exists')
end
f.status, f.remaining, f.reserved, f.spent, f.debt, f.is_over_limit = 'ACTIVE', f.allocated, '0', '0', '0', 'false'
f.created_at_ms, f.updated_at_ms = tostring(now), tostring(now)
write_fields(KEYS[2], f)
local units = redis.call('HGET', KEYS[3], f.scope) or ','
if not string.find(units, ',' .. f.unit .. ',', 1, true) then redis.call('HSET', KEYS[3], f.scope, units .. f.unit .. ',') end
local b = read_budget(KEYS[2])
emit(KEYS[4], admin_event_id(ctx, 'budget.created', KEYS[2]), 'budget.created', f.tenant_id, f.scope, ctx, 'cycles-admin',
  '{"ledger_id":' .. cjson.encode(f.ledger_id) .. ',"scope":' .. cjson.encode(f.scope) .. ',"unit":"' .. f.unit ..
  '","operation":"CREATE","new_state":' .. ledger_state(b) .. '}', now)
audit(KEYS[5], ctx, 'budget.create', 'budget', f.ledger_id, now)
return {'OK', '[]', 'ACTIVE', tostring(now), record_json(KEYS[2])}
