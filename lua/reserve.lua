-- Live reservation: auth, idempotency, tenant guard, budget checks, hold, record. One atomic step.
-- KEYS[1] tenant record      KEYS[2] api key record    KEYS[3] reservation (doubles as its
-- idempotency record)        KEYS[4] dry-run idempotency record (shared namespace)
-- KEYS[5] scope -> units index   KEYS[6] expiry index   KEYS[7] created-at index
-- KEYS[8..] one budget per derived scope, canonical order, in the request's unit
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] payload hash  ARGV[4] reservation id
-- prefix ("<tenant>.<token>.")  ARGV[5] unit  ARGV[6] amount  ARGV[7] ttl_ms or ''
-- ARGV[8] grace_ms  ARGV[9] overage policy or ''  ARGV[10] idempotency key  ARGV[11] subject json
-- ARGV[12] action json  ARGV[13] metadata json or ''  ARGV[14] retention ms (terminal records)
-- ARGV[15..] per budget key: "<scope>|<key code>" aligned with KEYS[8..]
local now = now_ms()
local denied = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end

local existing = redis.call('HMGET', KEYS[3], 'payload_hash', 'result', 'status', 'idempotency_key')
if existing[1] then
  if existing[4] ~= ARGV[10] then return err('INTERNAL_ERROR', 'Reservation id collision; retry with another idempotency_key') end
  if existing[1] ~= ARGV[3] then
    return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload')
  end
  return {'REPLAY', existing[2], existing[3], tostring(now)}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload (dry_run)')
end

local tenant = tenant_record(KEYS[1])
local guard = tenant_guard(tenant)
if guard then return guard end
if tenant and tenant.status == 'SUSPENDED' then
  return err('FORBIDDEN', 'Tenant is suspended; new reservations are not accepted')
end

local unit, amount = ARGV[5], ARGV[6]
local budgets, codes, scopes = {}, {}, {}
for i = 8, #KEYS do
  local scope, code = string.match(ARGV[i + 7], '^(.*)|(.*)$')
  scopes[#scopes + 1] = scope
  local b = read_budget(KEYS[i], scope)
  if b then
    budgets[#budgets + 1] = b
    codes[#codes + 1] = code
  end
end

if #budgets == 0 then
  for _, scope in ipairs(scopes) do
    local units = redis.call('HGET', KEYS[5], scope)
    if units and units ~= '' then
      local expected = {}
      for u in string.gmatch(units, '[^,]+') do expected[#expected + 1] = u end
      return err('UNIT_MISMATCH', 'No budget in ' .. unit .. ' for this subject; scope ' .. scope ..
        ' is budgeted in ' .. table.concat(expected, ', '),
        cjson.encode({scope = scope, requested_unit = unit, expected_units = expected}))
    end
  end
  return err('NOT_FOUND', 'Budget not found for provided scope: ' .. scopes[#scopes])
end

-- Evaluate per condition across all budgeted scopes; the first failing pass decides.
for _, b in ipairs(budgets) do
  if b.status == 'FROZEN' then return err('BUDGET_FROZEN', 'Budget is frozen for scope ' .. b.scope) end
end
for _, b in ipairs(budgets) do
  if b.status == 'CLOSED' then return err('BUDGET_CLOSED', 'Budget is closed for scope ' .. b.scope) end
end
for _, b in ipairs(budgets) do
  if b.over then return err('OVERDRAFT_LIMIT_EXCEEDED', 'Scope ' .. b.scope .. ' is over its overdraft limit') end
end
for _, b in ipairs(budgets) do
  if d_pos(b.debt) and not d_pos(b.overdraft_limit) then
    return err('DEBT_OUTSTANDING', 'Scope ' .. b.scope .. ' has outstanding debt')
  end
end
for _, b in ipairs(budgets) do
  if d_cmp(b.remaining, amount) < 0 then
    return err('BUDGET_EXCEEDED', 'Insufficient budget for scope ' .. b.scope .. ': remaining ' ..
      b.remaining .. ', requested ' .. amount)
  end
end

-- TTL: request, else tenant default, else 60 s; capped by the tenant's max (default 1 h).
local ttl = tonumber(ARGV[7]) or (tenant and tenant.default_ttl) or 60000
local max_ttl = (tenant and tenant.max_ttl) or 3600000
if ttl > max_ttl then ttl = max_ttl end
-- Policy: request > most specific budgeted ledger > tenant default > ALLOW_IF_AVAILABLE.
local policy = ARGV[9]
if policy == '' then
  for i = #budgets, 1, -1 do
    if budgets[i].policy and budgets[i].policy ~= '' then policy = budgets[i].policy; break end
  end
end
if policy == '' then policy = (tenant and tenant.default_policy) or 'ALLOW_IF_AVAILABLE' end
local max_ext = (tenant and tenant.max_extensions) or 10

for _, b in ipairs(budgets) do
  b.reserved = d_add(b.reserved, amount)
  b.remaining = d_sub(b.remaining, amount)
end
local failed = write_budgets(budgets, now)
if failed then return failed end

local rid = ARGV[4] .. table.concat(codes)
local expires_at = now + ttl
local grace = tonumber(ARGV[8])
local decision, caps = 'ALLOW', ''
local deepest = budgets[#budgets]
if deepest.scope == scopes[#scopes] and deepest.caps and deepest.caps ~= '' then
  decision, caps = 'ALLOW_WITH_CAPS', deepest.caps
end
local result = cjson.encode(snapshot({decision, rid, tostring(expires_at), caps}, budgets))

redis.call('HSET', KEYS[3], 'rid', rid, 'status', 'ACTIVE', 'idempotency_key', ARGV[10],
  'payload_hash', ARGV[3], 'result', result, 'unit', unit, 'estimate', amount,
  'subject', ARGV[11], 'action', ARGV[12], 'metadata', ARGV[13], 'scope_path', scopes[#scopes],
  'created_at_ms', now, 'expires_at_ms', expires_at, 'grace_ms', grace, 'overage_policy', policy,
  'extensions', 0, 'max_extensions', max_ext)
redis.call('ZADD', KEYS[6], expires_at + grace, rid)
redis.call('ZADD', KEYS[7], now, rid)
return {'OK', result, 'ACTIVE', tostring(now)}
