-- Live reservation: key check, idempotency, tenant guard, budget checks, the hold on every
-- budgeted scope and the record, in one atomic step. The record is its own idempotency record
-- (its key derives from the idempotency key). A reserve that would fail for want of budget
-- while the tenant has overdue holds answers `reclaim` with their ids instead: the caller
-- expires them and calls once more with `reclaimed` set. v0.1.26: in observe mode (the
-- request's, else the tenant's) the reserve is an evaluation (status OBSERVED, nothing held);
-- otherwise the action's access lists and quotas are checked before the budgets, and its
-- counters move with the hold.
local now, now_s = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
local scope_path = request_scope(A.scopes)
denied = filter and scope_guard(filter, scope_path)
if denied then return denied end

local existing = load_record(K.reservation)
if existing then
  if existing.ik ~= A.idempotency_key then return err('INTERNAL_ERROR', MSG.RESERVATION_ID_COLLISION) end
  if existing.ph ~= A.payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  local result = reserve_answer(existing.result)
  result.reservation_id = A.id_prefix .. existing.codes
  return replayed(result, existing.status, now_s)
end
local tenant = tenant_record(K.tenant)
local G = governance(A.governance)
if tenant ~= 'MALFORMED' and observing(G, tenant) then
  return evaluation({tenant = K.tenant, record = K.dry_run_record, live = K.reservation, scope_units = K.scope_units,
    events = K.events, policies = K.policies, budgets = K.budgets}, A, now, now_s, 'OBSERVED', tenant)
end
if redis.call('EXISTS', K.dry_run_record) == 1 then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH_DRY_RUN) end

local guard = tenant_guard(tenant) or suspended_guard(tenant)
if guard then return guard end
-- Policies: a rate-limited reserve touches no balance (the reclaim retry is not counted twice).
local pol = policy_settings(K.policies, scope_path, now, tenant, G)
local limited = rate_check(K.policies, pol.rl_r, 'reservations', scope_path, now, A.reclaimed == '')
if limited then return limited end

local sc = scene(K.events, A.context, now, tenant)
-- the first attempt of a request is counted (a reclaim retry is the same attempt)
if A.digest ~= '' and A.reclaimed == '' then count(sc, 'n') end
local unit, amount = A.unit, A.amount
-- Steps 1-3 (access lists, risk-class quotas, per-kind quotas): a denial touches no balance.
local staged = {}
if G then
  local gate, bad
  gate, bad, staged = action_gate(sc, pol, G, scope_path)
  if bad then return bad end
  if gate then return refused(sc, nil, A, gate, gate_message(gate, G.kind)) end
end
local e = evaluate(K.scope_units, K.budgets, A.scopes, unit, amount, sc)
if e.unit_error then return e.unit_error end
if e.reason == 'BUDGET_NOT_FOUND' then return err('NOT_FOUND', e.message) end
if e.reason == 'BUDGET_EXCEEDED' and A.reclaimed == '' then
  -- Holds of dead reservations must never block a reserve: hand their ids back so the caller
  -- expires them (their keys are unknown here) and retries once.
  local overdue = redis.call('ZRANGEBYSCORE', K.expiry_index, '-inf', '(' .. now, 'LIMIT', 0, 50)
  if #overdue > 0 then return ok({reclaim = overdue}, 'RECLAIM', now_s) end
end
-- a budget denial moves no counter
if e.reason then return refused(sc, e, A, deny_detail(e.reason, e, A), e.message) end
local budgets = e.budgets

-- TTL: request, else a policy's default, else the tenant's; capped by the tenant's maximum
-- and a policy's (a policy tightens the tenant's limits, never loosens them).
local settings = reservation_settings(tenant)
local max_ttl = math.min(settings.max_ttl, pol.ttl_m and pol.ttl_m.value or settings.max_ttl)
local ttl = math.min(tonumber(A.ttl_ms) or (pol.ttl_d and pol.ttl_d.value) or settings.default_ttl, max_ttl)
local max_ext = math.min(settings.max_extensions, pol.ttl_x and pol.ttl_x.value or settings.max_extensions)
local policy = resolve_policy(A.overage_policy, budgets, tenant, pol.ov)
local caps = (pol.caps and pol.caps.value) or e.caps

for _, b in ipairs(budgets) do
  b.reserved = d_add(b.reserved, amount)
  b.remaining = d_sub(b.remaining, amount)
end
local failed = write_budgets(budgets, now_s)
if failed then return failed end
budget_events(sc, budgets, unit, nil, policy)
local runs = count_actions(sc, staged)

local codes = table.concat(e.codes)
local rid = A.id_prefix .. codes
local expires_at = now + ttl
local expires = itoa(expires_at)
local grace = tonumber(A.grace_ms)
-- The stored answer omits the id (the record has it); answers carry it.
local result = {decision = caps and 'ALLOW_WITH_CAPS' or 'ALLOW', expires_at_ms = expires, caps = caps,
  balances = balances(budgets)}
local rec = {codes = codes, status = 'ACTIVE', ik = A.idempotency_key, ph = A.payload_hash, result = result,
  unit = unit, estimate = amount, subject = A.subject, scope = scope_path, action = A.action,
  created = now_s, expires = expires, policy = policy}
if grace ~= RULES.DEFAULT_GRACE_MS then rec.grace = A.grace_ms end
if max_ext ~= RULES.MAX_EXTENSIONS then rec.max_ext = itoa(max_ext) end
if #runs > 0 then rec.qrun = runs end
-- metadata lives beside the record (`m` says so), so listings never load it unless asked
if A.metadata ~= '' then
  rec.m = '1'
  redis.call('HSET', K.meta, 'metadata', A.metadata)
end
save_record(K.reservation, rec)
local due = itoa(expires_at + grace)
redis.call('ZADD', K.expiry_index, due, rid)
redis.call('ZADD', K.due_index, 'LT', due, string.match(rid, '^([^.]+)%.'))
-- Created index: lexicographic members "<13-digit created ms><token>", so one index serves
-- time windows, both directions and stable cursors (ZRANGE ... BYLEX).
local token = token_of(rid)
redis.call('ZADD', K.created_index, 0, padded(now_s, 13) .. token)
list_add(K.listing_index, list_members(token, 'ACTIVE', A.subject, amount, scope_path, expires))
result.reservation_id = rid
return ok(result, 'ACTIVE', now_s)
