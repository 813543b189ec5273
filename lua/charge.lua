-- Direct charge (createEvent, the post-only debit): charge `actual` across the subject's
-- budgeted scopes under the overage policy, atomically, with no reservation. Debt and over-limit
-- never block it. Its idempotency namespace is its own (not commit's).
local now, now_s = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
denied = filter and scope_guard(filter, string.sub(A.scopes[#A.scopes], 1, -10))
if denied then return denied end

local replayed_answer = replay(K.record, A.payload_hash, 'APPLIED', now_s, function(old)
  return {event_id = old[1], charged = (old[2] ~= '') and old[2] or nil, codes = old[3], balances = FIRST_LAYOUT.balances(old, 4)}
end)
if replayed_answer then return replayed_answer end

local tenant = tenant_record(K.tenant)
local ask = ask_of('charge', K, A, now, tenant)
local verdict = decide(ask, GOVERNED)
if verdict then return verdict.fail end
local budgets, sc, X = ask.e.budgets, ask.sc, A.amount
local policy = resolve_policy(A.overage_policy, budgets, tenant, ask.pol.ov)
if policy == 'REJECT' then
  for i = 1, #budgets do local b = budgets[i]
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
count_spend(sc, ask.pol, ask.scope, A.unit, charged)
record_usage(sc, K.due_index, 'e', ask.scope, A.unit, A.action, charged)
local failed = write_budgets(budgets, now_s)
if failed then return failed end
budget_events(sc, budgets, A.unit, nil, policy)

-- `charged` is reported only when the policy capped the charge below `actual`
local result = {event_id = A.event_id, codes = table.concat(ask.e.codes), balances = balances(budgets)}
if d_cmp(charged, X) < 0 then result.charged = charged end
local json = cjson.encode(result)
redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', json, 'request', A.body,
  'charged', charged, 'policy', policy, 'created_at_ms', now_s)
redis.call('PEXPIRE', K.record, A.record_ttl_ms)
return ok(json, 'APPLIED', now_s)
