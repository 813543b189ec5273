-- Evaluation without a reservation (dry_run and decide): the checks of a live reserve,
-- answered as a decision; only the idempotency record is written (and reservation.denied on a
-- denial). dry_run shares reserve's idempotency namespace: `live` is the reservation the same
-- key would create (for decide, the idempotency record again).
local now, now_s = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
denied = filter and scope_guard(filter, request_scope(A.scopes))
if denied then return denied end

local replayed_answer = replay(K.record, A.payload_hash, '', now_s, function(old)
  return {decision = old[1], reason_code = (old[2] ~= '') and old[2] or nil, caps = (old[3] ~= '') and old[3] or nil,
    codes = old[4], balances = legacy_balances(old, 5)}
end)
if replayed_answer then return replayed_answer end
local live = (K.live ~= K.record) and load_record(K.live)
if live and live.ik == A.idempotency_key then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH_LIVE) end

local sc -- the scene, once the tenant is read
local function decide(decision, reason, e)
  local result = {decision = decision, reason_code = reason, caps = e and e.caps, codes = e and table.concat(e.codes) or ''}
  if e and decision ~= 'DENY' then result.balances = balances(e.budgets) end
  if decision == 'DENY' then denied_event(sc, e, reason, A) end
  local json = cjson.encode(result)
  redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', json)
  redis.call('PEXPIRE', K.record, tonumber(A.record_ttl_ms))
  return ok(json, '', now_s)
end

local tenant = tenant_record(K.tenant)
if tenant == 'MALFORMED' then return err('INTERNAL_ERROR', MSG.TENANT_MALFORMED) end
sc = scene(K.events, A.context, now, tenant)
if A.digest ~= '' then count(sc, 'n') end
if tenant and tenant.status == 'CLOSED' then return decide('DENY', 'TENANT_CLOSED') end
if tenant and tenant.status == 'SUSPENDED' then return decide('DENY', 'TENANT_SUSPENDED') end

local e = evaluate(K.scope_units, K.budgets, A.scopes, A.unit, A.amount, sc)
if e.unit_error then return e.unit_error end
if e.reason then return decide('DENY', e.reason, e) end
-- a matching policy's caps take precedence over the budget's
local pol = policy_settings(K.policies, request_scope(A.scopes), now, tenant)
if pol.caps then e.caps = pol.caps.value end
return decide(e.caps and 'ALLOW_WITH_CAPS' or 'ALLOW', nil, e)
