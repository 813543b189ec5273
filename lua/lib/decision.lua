-- The decision: the checks every request that may spend goes through, in one ordered table (CHECKS),
-- and how a live reserve answers them (holds or refuses). The checks only a tenant with policies
-- needs (rate limits, action rules, guards, template ledgers, period rolls) are `GOVERNED`'s
-- (lua/lib/governance.lua): a tenant without policies runs the others, in the same order.
-- needs: decimal, reply, access, record, tenant, events, ledger, alerts, policies, listing

-- An ask is one request's decision: `mode` ('hold', 'evaluate' or 'charge'), its keys `K` and
-- arguments `A`, Redis's clock `now`, the tenant record, the scene `sc`, the request's scope
-- path `scope`, whether it makes template ledgers (`makes`) and whether the tenant may have
-- policies (`policed`); `decide` adds the policies in force (`pol`, read once), the checks
-- the action's rules (`rules`), the quota counters a hold moves (`counted`), the guard counts
-- it moves (`guarded`) and the budgets' evaluation (`e`). A check returns nil to go on, or the
-- verdict: {deny = DenyDetail, message = ..., e = ...} or {fail = an error answer}; a verdict
-- with `refusal` says itself how a live reserve refuses it.

-- The effective observe mode, decided here only: the request's, else the tenant's (DISABLED: ENFORCE).
local function observing(A, tenant)
  if A.observe ~= '' then return A.observe == 'OBSERVE' end
  return type(tenant) == 'table' and tenant.observe == 'OBSERVE'
end

-- The DenyDetail of a budget or tenant denial (`b`: the ledger that denied).
local FIXES = {
  BUDGET_FROZEN = 'Unfreeze the budget of %s',
  BUDGET_CLOSED = 'The budget of %s is closed; fund another scope',
  OVERDRAFT_LIMIT_EXCEEDED = 'Repay the debt of %s or raise its overdraft_limit',
  DEBT_OUTSTANDING = 'Repay the outstanding debt of %s before new reservations',
  BUDGET_NOT_FOUND = 'Create a budget for %s',
  TENANT_CLOSED = 'The tenant is closed; no new reservations are possible',
  TENANT_SUSPENDED = 'Reactivate the tenant',
}
local function deny_detail(reason, b, ask, scope)
  scope = scope or (b and b.scope) or ask.scope
  local d = {reason_code = reason, blocked_by_scope = scope}
  if reason == 'BUDGET_EXCEEDED' and b then
    d.budget_remaining = b.remaining
    d.suggested_fix = 'Fund ' .. scope .. ' by at least ' .. d_sub(ask.A.amount, b.remaining) .. ' ' .. ask.A.unit
  elseif FIXES[reason] then
    d.suggested_fix = string.format(FIXES[reason], scope)
  end
  return d
end

-- The budgets of the derived scopes in the request's unit (their keys in `K.budgets`, aligned
-- with "<scope>|<8-character code>" in `A.scopes`). With `governed` (lua/lib/governance.lua),
-- each is rolled into its current period, and a scope without one gets one from a policy's
-- budget template when one is in force for it (a hold, an event or an enforced decide makes
-- it; dry_run and observed evaluations see what would be made). Without it (a plain tenant's
-- reserve), a ledger whose period has ended, or no budget in the unit, hands the reserve to
-- lua/reserve_governed.lua (nothing written before but the rate alerts' once-per-window mark,
-- which it sets alike).
local function scoped_budgets(ask, governed)
  local budgets, codes = {}, {}
  local e = {budgets = budgets, codes = codes}
  for i = 1, #ask.K.budgets do local key = ask.K.budgets[i]
    local arg = ask.A.scopes[i]
    local scope, code = string.sub(arg, 1, -10), string.sub(arg, -8)
    local b = read_view(key, scope)
    -- (a ledger of before the view, or whose period has ended: the governed reserve reads it,
    -- writing its view or rolling it, for this call only)
    if b == false then
      if not governed then return nil, {'HANDOVER', 'reserve_governed', 'once'} end
      b = governed.read_budget(key, scope)
    end
    if b then
      if b.roll_at and tonumber(b.roll_at) <= ask.now then
        if not governed then return nil, {'HANDOVER', 'reserve_governed', 'once'} end
        governed.roll_period(ask.sc, b)
      end
    elseif governed and ask.policed then
      local verdict
      b, verdict = governed.template_ledger(ask, ask.pol.tpls, key, scope, code, ask.makes)
      if verdict and ask.mode ~= 'charge' then return nil, nil, verdict end
    end
    if b then
      budgets[#budgets + 1] = b
      codes[#codes + 1] = code
    end
  end
  if #budgets > 0 then return e end
  -- (no budget in this unit: the governed reserve tells a unit mismatch from a missing budget)
  if not governed then return nil, {'HANDOVER', 'reserve_governed', 'once'} end
  return nil, governed.unit_mismatch(ask)
end

local check = {} -- the checks of every request, numbered in their order (CHECKS, below)

-- 1. The tenant accepts new spending: an evaluation answers DENY, a hold or a charge refuses.
function check.tenant_status(ask)
  local t = ask.tenant
  if t == 'MALFORMED' then return {fail = err('INTERNAL_ERROR', MSG.TENANT_MALFORMED)} end
  if type(t) ~= 'table' or t.status == 'ACTIVE' then return nil end
  if ask.mode == 'evaluate' then
    local reason = 'TENANT_' .. t.status
    return {deny = deny_detail(reason, nil, ask, 'tenant:' .. ask.sc.name)}
  end
  if t.status == 'CLOSED' then return {fail = err('TENANT_CLOSED', MSG.TENANT_CLOSED)} end
  return {fail = err('FORBIDDEN', MSG.TENANT_SUSPENDED_SPENDING)}
end

-- Every live reserve marks its tenth for the rate alerts before it may make a reservation (the
-- reservations made are counted from the created stream; a denial counts itself,
-- `denied_event`); an event is counted as another API-key write.
function check.attempt(ask)
  if ask.mode == 'hold' then RATES.window(ask.sc, true) end
  if ask.mode == 'charge' and ask.A.digest ~= '' then RATES.count(ask.sc, 'a') end
  return nil
end

-- 7. The budgets of the derived scopes: each budgeted scope admits the amount (a hold or an
-- evaluation: one condition at a time across the scopes, the earliest condition first, then
-- the shallowest scope), or (a charge) none is frozen or closed.
function check.budgets(ask, governed)
  local e, bad, verdict = scoped_budgets(ask, governed)
  if bad then return {fail = bad} end
  if verdict then return verdict end
  if not e then
    if ask.mode ~= 'evaluate' then return {fail = err('NOT_FOUND', MSG.BUDGET_NOT_FOUND .. ask.scope)} end
    return {deny = deny_detail('BUDGET_NOT_FOUND', nil, ask), message = MSG.BUDGET_NOT_FOUND .. ask.scope}
  end
  ask.e = e
  local worst, by
  for i = 1, #e.budgets do local b = e.budgets[i]
    local k = denial(b, ask.A.amount, ask.mode == 'charge')
    if k and (not worst or k < worst) then worst, by = k, b end
  end
  if not worst then return nil end
  local reason, message = DENIALS[worst][1], DENIALS[worst][2] .. by.scope
  if ask.mode == 'charge' then return {fail = err(reason, message)} end
  return {deny = deny_detail(reason, by, ask), message = message, e = e, by = by}
end

-- 8. Caps: a matching policy's over those of the deepest derived scope's budget (when it has one).
function check.caps(ask)
  if ask.mode == 'charge' then return nil end
  local pol = ask.pol
  if pol.caps then
    ask.caps = pol.caps.value
  else
    local deepest = ask.e.budgets[#ask.e.budgets]
    if deepest.scope == ask.scope and deepest.caps then ask.caps = deepest.caps end
  end
  return nil
end

-- The checks, by name, in the normative order (protocol v0.1.26: access, risk-class quotas,
-- per-kind quotas, budgets; before them the tenant and a policy's rate limit; the runaway-agent
-- guards before the budgets; caps last). Those marked `policies` are `GOVERNED`'s and run only
-- where the settings in force have what they check (`CHECKS.under`): a request runs the others
-- only, in the same order.
local CHECKS = {
  {'tenant_status'},
  {'rate_limit', policies = 1},
  {'attempt'},
  {'action_rules', policies = 2},
  {'guards', policies = 4},
  {'budgets'},
  {'caps'},
  lists = {},
}

-- The checks that run under the settings `pol`: the policies' checks whose bit (`policies`) the
-- settings have (1 a reservation rate, 2 v0.1.26 action rules, 4 a runaway-agent guard), listed
-- once per such shape and kept on the settings, which a script VM remembers: a request on
-- settings it knows finds its list at once.
function CHECKS.under(pol, governed)
  local shape = (pol.rl_r and 1 or 0) + (pol.ruled and 2 or 0) + ((pol.ma or pol.sm or pol.sh) and 4 or 0)
  local checks = CHECKS.lists[shape]
  if not checks then -- (made at the first call: a library's top level calls nothing)
    checks = {}
    for _, c in ipairs(CHECKS) do
      local run = check[c[1]] or c.policies and math.floor(shape / c.policies) % 2 == 1 and governed.check[c[1]]
      if run then checks[#checks + 1] = run end
    end
    CHECKS.lists[shape] = checks
  end
  pol.checks = checks
  return checks
end

-- The verdict of the checks on `ask` (nil: admitted). `governed` (lua/lib/governance.lua), when
-- the script has it, reads the policies in force once and adds their checks.
local function decide(ask, governed)
  local policed = governed and ask.policed
  local pol = policed and governed.policies(ask.sc.prefix, ask.scope, ask.now, ask.tenant) or NO_POLICIES
  ask.pol = pol
  local checks = pol.checks or CHECKS.under(pol, governed)
  for i = 1, #checks do
    local verdict = checks[i](ask, governed)
    -- (an active-hold slot the guards took goes back with a later refusal)
    if verdict then
      if ask.guarded then governed.release_slots(ask) end
      return verdict
    end
  end
  return nil
end

-- The ask of a request (its mode, keys, arguments, clock and tenant record; its scope path
-- when the caller has it).
local function ask_of(mode, K, A, now, tenant, scope)
  local sc = scene(K.events, A.context, now, tenant)
  -- (`e`, `pol` and `caps` named here, so the table is made at the size the checks fill; a
  -- tenant's record counts its policies, and one without a record has them read)
  return {mode = mode, K = K, A = A, now = now, tenant = tenant, sc = sc, scope = scope or string.sub(A.scopes[#A.scopes], 1, -10),
    makes = mode ~= 'evaluate', e = false, pol = false, caps = false,
    policed = not (type(tenant) == 'table' and tenant.policies == 0)}
end

-- reservation.denied for a denial `d` (a live refusal or an evaluated DENY), counted for the
-- denial-rate alert.
local function denied_event(ask, d, by)
  local sc, A = ask.sc, ask.A
  local scope = d.blocked_by_scope or ask.scope
  emit(sc.events, 'reservation.denied', sc.name, scope, sc.ctx, 'cycles-server', '{"scope":' .. cjson.encode(scope) ..
    ',"unit":"' .. A.unit .. '","reason_code":"' .. d.reason_code .. '","requested_amount":' .. A.amount ..
    (by and (',"remaining":' .. by.remaining) or '') .. ',"action":' .. A.action .. ',"subject":' .. A.subject ..
    (d.blocked_by_policy and (',"policy_id":' .. cjson.encode(d.blocked_by_policy)) or '') ..
    ',"deny_detail":' .. detail_json(d) .. '}', sc.now)
  -- (an evaluation counted its attempt already)
  if ask.mode == 'hold' then RATES.count(sc, 'n') end
  count_and_check(sc, 'd')
end

-- A live reserve's answer to verdict `v`: its failure; for want of budget while the tenant has
-- overdue holds, their ids to reclaim (holds of dead reservations must never block a reserve:
-- the caller expires them, their keys unknown here, and retries once); else reservation.denied
-- and the error carrying the detail (or the verdict's own `refusal`: a guard's 409
-- LIMIT_EXCEEDED naming the limit). A denial moves no counter.
local function refused(ask, v, now_s)
  if v.fail then return v.fail end
  if v.deny.reason_code == 'BUDGET_EXCEEDED' and ask.A.reclaimed == '' then
    local overdue = redis.call('ZRANGEBYSCORE', ask.K.expiry_index, '-inf', '(' .. now_s, 'LIMIT', '0', '50')
    if #overdue > 0 then return ok({reclaim = overdue}, 'RECLAIM', now_s) end
  end
  local d = v.deny
  denied_event(ask, d, v.by)
  if v.refusal then return v.refusal(ask.sc, v) end
  return err(d.reason_code, v.message, '{"deny_detail":' .. detail_json(d) .. '}')
end

-- What every live reserve does first: the key check, its scope filter, and the replay of the
-- reservation its idempotency key made before (nil: none; go on).
local function reserve_opening(K, A, now, now_s, scope_path, governed)
  local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
  if denied then return denied end
  denied = filter and scope_guard(filter, scope_path)
  if denied then return denied end
  local raw = redis.call('GET', K.reservation)
  if not raw then return nil end
  local existing = current_record(raw)
  -- (a record of the first layout: the governed reserve reads it, for this call only)
  if existing == false then
    if not governed then return {'HANDOVER', 'reserve_governed', 'once'} end
    existing = governed.decoded_record(raw)
  end
  if existing.ik ~= A.idempotency_key then return err('INTERNAL_ERROR', MSG.RESERVATION_ID_COLLISION) end
  if existing.ph ~= A.payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  return replayed(reserve_answer(existing, A.id_prefix .. existing.codes), existing.status, now_s)
end

-- The hold of a live reserve the checks admitted: the estimate held on every budgeted scope,
-- the record and its indexes, and the answer. `moves` (a governed reserve's) moves the quota
-- and guard counts the hold takes and returns what the record keeps to give them back. The
-- second value is true when nothing was written (an amount past a ledger's digits).
local function hold(ask, now_s, moves)
  local K, A, tenant = ask.K, ask.A, ask.tenant
  local budgets, pol, sc, amount = ask.e.budgets, ask.pol, ask.sc, A.amount
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
  if failed then return failed, true end
  for i = 1, #budgets do hold_events(sc, budgets[i], A.unit) end
  -- (the counts a hold moves, kept in its record; none for most)
  local runs = moves and moves(ask, now_s)

  local codes = table.concat(ask.e.codes)
  local rid = A.id_prefix .. codes
  local now = ask.now
  local expires = itoa(now + ttl)
  local grace = tonumber(A.grace_ms)
  -- The record keeps the answer (without the id: the record has it); answers carry it.
  local rec = {status = 'ACTIVE', codes = codes, ik = A.idempotency_key, ph = A.payload_hash, unit = A.unit,
    estimate = amount, subject = A.subject, scope = ask.scope, action = A.action, created = now_s, expires = expires,
    policy = policy, decision = ask.caps and 'ALLOW_WITH_CAPS' or nil, caps = ask.caps or nil, balances = balances(budgets)}
  if grace ~= RULES.DEFAULT_GRACE_MS then rec.grace = A.grace_ms end
  if max_ext ~= RULES.MAX_EXTENSIONS then rec.max_ext = itoa(max_ext) end
  if runs and #runs > 0 then rec.qrun = cjson.encode(runs) end
  -- metadata lives beside the record (`m` says so; `record_text` puts it there), so listings
  -- never load it unless asked
  if A.metadata ~= '' then rec.metadata = A.metadata end
  save_record(K.reservation, rec)
  local due = itoa(now + ttl + grace)
  redis.call('ZADD', K.expiry_index, due, rid)
  -- the tenant's name: the id's first part (the prefix is "<tenant>.<14-character token>.")
  redis.call('ZADD', K.due_index, 'LT', due, string.sub(A.id_prefix, 1, -17))
  index_reservation(K, string.sub(A.id_prefix, -15, -2), rec)
  return ok(reserve_answer(rec, rid), 'ACTIVE', now_s)
end
