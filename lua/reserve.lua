-- Live reservation: key check, idempotency, then the decision (`decide`: tenant, rate limit,
-- action rules, budgets, caps) and the hold on every budgeted scope with the record, in one
-- atomic step. The record is its own idempotency record (its key derives from the idempotency
-- key). A reserve that would fail for want of budget while the tenant has overdue holds
-- answers `reclaim` with their ids instead: the caller expires them and calls once more with
-- `reclaimed` set. In observe mode (the request's, else the tenant's) the reserve is an
-- evaluation (status OBSERVED, nothing held).
local now, now_s = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
local scope_path = string.sub(A.scopes[#A.scopes], 1, -10)
denied = filter and scope_guard(filter, scope_path)
if denied then return denied end

local existing = load_record(K.reservation)
if existing then
  if existing.ik ~= A.idempotency_key then return err('INTERNAL_ERROR', MSG.RESERVATION_ID_COLLISION) end
  if existing.ph ~= A.payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  return replayed(reserve_answer(existing, A.id_prefix .. existing.codes), existing.status, now_s)
end
local tenant = tenant_record(K.tenant)
if tenant ~= 'MALFORMED' and observing(A, tenant) then
  return evaluation({tenant = K.tenant, record = K.dry_run_record, live = K.reservation, scope_units = K.scope_units,
    events = K.events, policies = K.policies, budgets = K.budgets}, A, now, now_s, 'OBSERVED', tenant)
end
if redis.call('EXISTS', K.dry_run_record) == 1 then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH_DRY_RUN) end

local ask = ask_of('hold', K, A, now, tenant, scope_path)
local verdict = decide(ask)
if verdict then
  if verdict.fail then return verdict.fail end
  if verdict.deny.reason_code == 'BUDGET_EXCEEDED' and A.reclaimed == '' then
    -- Holds of dead reservations must never block a reserve: hand their ids back so the caller
    -- expires them (their keys are unknown here) and retries once.
    local overdue = redis.call('ZRANGEBYSCORE', K.expiry_index, '-inf', '(' .. now_s, 'LIMIT', '0', '50')
    if #overdue > 0 then return ok({reclaim = overdue}, 'RECLAIM', now_s) end
  end
  -- a denial moves no counter
  return refused(ask, verdict)
end
local budgets, pol, sc, amount = ask.e.budgets, ask.pol or {}, ask.sc, A.amount

-- TTL: request, else a policy's default, else the tenant's; capped by the tenant's maximum
-- and a policy's (a policy tightens the tenant's limits, never loosens them).
local settings = reservation_settings(tenant)
local max_ttl = pol.ttl_m and math.min(settings.max_ttl, pol.ttl_m.value) or settings.max_ttl
local ttl = math.min(tonumber(A.ttl_ms) or (pol.ttl_d and pol.ttl_d.value) or settings.default_ttl, max_ttl)
local max_ext = pol.ttl_x and math.min(settings.max_extensions, pol.ttl_x.value) or settings.max_extensions
local policy = resolve_policy(A.overage_policy, budgets, tenant, pol.ov)

for i = 1, #budgets do local b = budgets[i]
  b.reserved = d_add(b.reserved, amount)
  b.remaining = d_sub(b.remaining, amount)
end
local failed = write_budgets(budgets, now_s)
if failed then release_slots(ask); return failed end
budget_events(sc, budgets, A.unit, nil, policy)
-- (the counts a hold moves, kept in its record; none for most)
local runs = ask.counted and count_actions(sc, ask.counted, now_s) or ask.guarded and {} or nil
if ask.guarded then hold_guards(sc, ask.guarded, amount, runs) end

local codes = table.concat(ask.e.codes)
local rid = A.id_prefix .. codes
local expires = itoa(now + ttl)
local grace = tonumber(A.grace_ms)
-- The record keeps the answer (without the id: the record has it); answers carry it.
local rec = {status = 'ACTIVE', codes = codes, ik = A.idempotency_key, ph = A.payload_hash, unit = A.unit,
  estimate = amount, subject = A.subject, scope = scope_path, action = A.action, created = now_s, expires = expires,
  policy = policy, decision = ask.caps and 'ALLOW_WITH_CAPS' or nil, caps = ask.caps or nil, balances = balances(budgets)}
if grace ~= RULES.DEFAULT_GRACE_MS then rec.grace = A.grace_ms end
if max_ext ~= RULES.MAX_EXTENSIONS then rec.max_ext = itoa(max_ext) end
if runs and #runs > 0 then rec.qrun = cjson.encode(runs) end
-- metadata lives beside the record (`m` says so), so listings never load it unless asked
if A.metadata ~= '' then
  rec.m = '1'
  redis.call('HSET', K.meta, 'metadata', A.metadata)
end
save_record(K.reservation, rec, K.meta)
local due = itoa(now + ttl + grace)
redis.call('ZADD', K.expiry_index, due, rid)
-- the tenant's name: the id's first part (the prefix is "<tenant>.<14-character token>.")
redis.call('ZADD', K.due_index, 'LT', due, string.sub(A.id_prefix, 1, -17))
local token = string.sub(A.id_prefix, -15, -2)
index_reservation(K, token, rec)
return ok(reserve_answer(rec, rid), 'ACTIVE', now_s)
