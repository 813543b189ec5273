-- Post-only debit (createEvent): charge `actual` across the subject's budgeted scopes under
-- the overage policy, atomically, with no reservation. Debt and over-limit never block it.
-- KEYS[1] tenant record  KEYS[2] api key record  KEYS[3] idempotency record (event namespace,
-- separate from commit's)  KEYS[4] scope -> units index  KEYS[5] event stream
-- KEYS[6..] one budget per derived scope, canonical order, in the request's unit
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] payload hash  ARGV[4] new event id
-- ARGV[5] unit  ARGV[6] actual  ARGV[7] overage policy or ''  ARGV[8] record retention ms
-- ARGV[9] request context json  ARGV[10] the request body (kept with the record)
-- ARGV[11..] per budget key: "<scope>|<key code>" aligned with KEYS[6..]
local now, now_s = now_ms()
local denied, filter = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end
denied = filter and scope_guard(filter, request_scope(6, 11))
if denied then return denied end

local replayed = replay(KEYS[3], ARGV[3], 'APPLIED', now)
if replayed then return replayed end

local tenant = tenant_record(KEYS[1])
local guard = tenant_guard(tenant) or suspended_guard(tenant)
if guard then return guard end

local unit, X = ARGV[5], ARGV[6]
local e = scoped_budgets(KEYS[4], 6, 11, unit)
if e.unit_error then return e.unit_error end
if e.reason then return err('NOT_FOUND', e.message) end
local budgets = e.budgets
for _, b in ipairs(budgets) do
  if b.status == 'FROZEN' then return err('BUDGET_FROZEN', 'Budget is frozen for scope ' .. b.scope) end
end
for _, b in ipairs(budgets) do
  if b.status == 'CLOSED' then return err('BUDGET_CLOSED', 'Budget is closed for scope ' .. b.scope) end
end

local policy = resolve_policy(ARGV[7], budgets, tenant)
if policy == 'REJECT' then
  for _, b in ipairs(budgets) do
    if d_cmp(b.remaining, X) < 0 then
      return err('BUDGET_EXCEEDED', 'Insufficient budget on scope ' .. b.scope .. ' under overage policy REJECT')
    end
  end
end
local charged, overflow = settle(budgets, '0', X, policy)
if overflow then
  return err('OVERDRAFT_LIMIT_EXCEEDED', 'Event would exceed the overdraft limit of scope ' .. overflow.scope)
end
local failed = write_budgets(budgets, now_s)
if failed then return failed end
budget_events(KEYS[5], budgets, request_context(ARGV[9]), now, unit, nil, policy)

local capped = ''
if d_cmp(charged, X) < 0 then capped = charged end
local result = cjson.encode(snapshot({ARGV[4], capped, table.concat(e.codes)}, budgets))
redis.call('HSET', KEYS[3], 'payload_hash', ARGV[3], 'result', result, 'request', ARGV[10],
  'charged', charged, 'policy', policy, 'created_at_ms', now)
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[8]))
return {'OK', result, 'APPLIED', now_s}
