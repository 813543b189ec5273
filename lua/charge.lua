-- Direct charge (createEvent, the post-only debit): charge `actual` across the subject's
-- budgeted scopes under the overage policy, atomically, with no reservation. Debt and over-limit
-- never block it. Its idempotency namespace is its own (not commit's).
local now, now_s = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
denied = filter and scope_guard(filter, request_scope(A.scopes))
if denied then return denied end

local replayed_answer = replay(K.record, A.payload_hash, 'APPLIED', now_s, function(old)
  return {event_id = old[1], charged = (old[2] ~= '') and old[2] or nil, codes = old[3], balances = legacy_balances(old, 4)}
end)
if replayed_answer then return replayed_answer end

local tenant = tenant_record(K.tenant)
local guard = tenant_guard(tenant) or suspended_guard(tenant)
if guard then return guard end

local sc = scene(K.events, A.context, now, tenant)
if A.digest ~= '' then count(sc, 'a') end
local unit, X = A.unit, A.amount
local e = scoped_budgets(K.scope_units, K.budgets, A.scopes, unit, sc)
if e.unit_error then return e.unit_error end
if e.reason then return err('NOT_FOUND', e.message) end
local budgets = e.budgets
for _, b in ipairs(budgets) do
  if b.status == 'FROZEN' then return err('BUDGET_FROZEN', MSG.BUDGET_FROZEN .. b.scope) end
end
for _, b in ipairs(budgets) do
  if b.status == 'CLOSED' then return err('BUDGET_CLOSED', MSG.BUDGET_CLOSED .. b.scope) end
end

local policy = resolve_policy(A.overage_policy, budgets, tenant,
  policy_settings(K.policies, request_scope(A.scopes), now, tenant).ov)
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
track_spend(sc, budgets)
local failed = write_budgets(budgets, now_s)
if failed then return failed end
budget_events(sc, budgets, unit, nil, policy)

-- `charged` is reported only when the policy capped the charge below `actual`
local result = {event_id = A.event_id, codes = table.concat(e.codes), balances = balances(budgets)}
if d_cmp(charged, X) < 0 then result.charged = charged end
local json = cjson.encode(result)
redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', json, 'request', A.body,
  'charged', charged, 'policy', policy, 'created_at_ms', now_s)
redis.call('PEXPIRE', K.record, tonumber(A.record_ttl_ms))
return ok(json, 'APPLIED', now_s)
