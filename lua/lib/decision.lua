-- The decision: the checks every request that may spend goes through, in one ordered table (CHECKS),
-- and how each kind of request answers them: a live reserve holds or refuses, an evaluation
-- (dry_run, decide, a reserve in observe mode) answers a decision, an event charges or refuses.
-- needs: decimal, reply, record, tenant, events, ledger, alerts, periods, policies, quotas, guards

-- An ask is one request's decision: `mode` ('hold', 'evaluate' or 'charge'), its keys `K` and
-- arguments `A`, Redis's clock `now`, the tenant record, the scene `sc`, the request's scope
-- path `scope`, whether it makes template ledgers (`makes`) and whether the tenant may have
-- policies (`policed`); `decide` adds the policies in force (`pol`, read once), the checks
-- the action's rules (`rules`), the quota counters a hold moves (`counted`), the guard counts
-- it moves (`guarded`) and the budgets' evaluation (`e`). A check returns nil to go on, or the verdict:
-- {deny = DenyDetail, message = ..., e = ...} or {fail = an error answer}.

-- The effective observe mode, decided here only: the request's, else the tenant's (DISABLED: ENFORCE).
local function observing(A, tenant)
  if A.observe ~= '' then return A.observe == 'OBSERVE' end
  return type(tenant) == 'table' and tenant.observe == 'OBSERVE'
end

-- The request's action as the v0.1.26 rules see it, decoded when first needed (false: none).
local function governance_of(ask)
  if ask.G == nil then ask.G = governance(ask.A.governance) or false end
  return ask.G
end

-- The request's action, where v0.1.26 rules apply to it (a hold or an evaluation, and a
-- policy in force with such rules), with those rules in `ask.rules`; decoded only then.
local function ruled_action(ask)
  if ask.ruled == nil then
    local pol = ask.mode ~= 'charge' and ask.policed and ask.pol
    ask.ruled = pol and pol.ruled and governance_of(ask) or false
    if ask.ruled then ask.rules = action_rules(pol, ask.ruled) end
  end
  return ask.ruled
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
-- with "<scope>|<8-character code>" in `A.scopes`), each rolled into its current period; a
-- scope without one gets one from a policy's budget template when one is in force for it
-- (a hold, an event or an enforced decide makes it; dry_run and observed evaluations see what
-- would be made).
local function scoped_budgets(ask)
  local budgets, codes = {}, {}
  local e = {budgets = budgets, codes = codes}
  for i = 1, #ask.K.budgets do local key = ask.K.budgets[i]
    local arg = ask.A.scopes[i]
    local scope, code = string.sub(arg, 1, -10), string.sub(arg, -8)
    local b = read_budget(key, scope)
    if b then
      roll_due(ask.sc, b)
    elseif ask.policed then
      local verdict
      b, verdict = template_ledger(ask, ask.pol.tpls, key, scope, code, ask.makes)
      if verdict and ask.mode ~= 'charge' then return nil, nil, verdict end
    end
    if b then
      budgets[#budgets + 1] = b
      codes[#codes + 1] = code
    end
  end
  if #budgets > 0 then return e end
  -- no budget in this unit: 400 when a derived scope has one in another, else BUDGET_NOT_FOUND
  for _, arg in ipairs(ask.A.scopes) do
    local scope = string.sub(arg, 1, -10)
    local units = redis.call('HGET', ask.K.scope_units, scope)
    if units and units ~= '' then
      local expected = {}
      for u in string.gmatch(units, '[^,]+') do expected[#expected + 1] = u end
      local unit = ask.A.unit
      return nil, err('UNIT_MISMATCH', 'No budget in ' .. unit .. ' for this subject; scope ' .. scope ..
        ' is budgeted in ' .. table.concat(expected, ', '),
        cjson.encode({scope = scope, requested_unit = unit, expected_units = expected}))
    end
  end
  return nil
end

local check = {} -- the checks, numbered in their order (CHECKS, below)

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

-- 2. A policy's per-minute reservation rate (holds; a reclaim retry is not counted twice).
function check.rate_limit(ask)
  local setting = ask.mode == 'hold' and ask.pol.rl_r
  if not setting then return nil end
  local limited = rate_check(ask.K.policies, setting, 'reservations', counted_scope(setting, ask.sc, ask.scope), ask.now,
    ask.A.reclaimed == '')
  return limited and {fail = limited}
end

-- Every live reserve marks its tenth for the rate alerts before it may make a reservation (the
-- reservations made are counted from the created stream; a denial counts itself,
-- `denied_event`); an event is counted as another API-key write.
function check.attempt(ask)
  if ask.mode == 'hold' then RATES.window(ask.sc, true) end
  if ask.mode == 'charge' and ask.A.digest ~= '' then RATES.count(ask.sc, 'a') end
  return nil
end

-- 3-5. The v0.1.26 action rules: access lists, then risk-class quotas, then per-kind quotas
-- (their counters read at once).
function check.action_rules(ask)
  local G = ruled_action(ask)
  if not G then return nil end
  local d = access_denial(ask.rules, G, ask.scope)
  if d then return {deny = d} end
  local plan = quota_plan(ask.sc, ask.rules, G, ask.scope)
  local denied, bad = quota_denial(ask.sc, plan, G)
  if bad then return {fail = bad} end
  if denied then return {deny = denied} end
  -- (the counters a hold moves)
  if #plan.members > 0 then ask.counted = plan end
  return nil
end

-- 6. The runaway-agent guards of the policies in force: ACTIVE reservations at once, spend
-- per minute and per hour (a hold or an evaluation; an event only counts its spend).
function check.guards(ask)
  if ask.mode == 'charge' or not ask.policed then return nil end
  return guard_denial(ask, ask.pol)
end

-- 7. The budgets of the derived scopes: each budgeted scope admits the amount (a hold or an
-- evaluation: one condition at a time across the scopes, the earliest condition first, then
-- the shallowest scope), or (a charge) none is frozen or closed.
function check.budgets(ask)
  local e, bad, verdict = scoped_budgets(ask)
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

-- The checks, in the normative order (protocol v0.1.26: access, risk-class quotas, per-kind
-- quotas, budgets; before them the tenant and a policy's rate limit; the runaway-agent guards
-- before the budgets; caps last). Those marked `policies` find nothing to check without a
-- policy, those marked `rules` nothing without a v0.1.26 action rule in the policies in force:
-- a request runs the others only (`CHECKS.plain`, `CHECKS.unruled`), in the same order.
local CHECKS = {
  {check.tenant_status},
  {check.rate_limit, policies = true},
  {check.attempt},
  {check.action_rules, policies = true, rules = true},
  {check.guards, policies = true},
  {check.budgets},
  {check.caps},
}

local function decide(ask)
  if not CHECKS.all then -- (made at the first call: a library's top level calls nothing)
    CHECKS.all, CHECKS.unruled, CHECKS.plain = {}, {}, {}
    for _, c in ipairs(CHECKS) do
      table.insert(CHECKS.all, c[1])
      if not c.rules then table.insert(CHECKS.unruled, c[1]) end
      if not c.policies then table.insert(CHECKS.plain, c[1]) end
    end
  end
  -- the policies in force for the request's scope, read once (none for a tenant without any)
  local pol = ask.policed and policy_settings(ask.K.policies, ask.scope, ask.now, ask.tenant) or NO_POLICIES
  ask.pol = pol
  local checks = not ask.policed and CHECKS.plain or pol.ruled and CHECKS.all or CHECKS.unruled
  for i = 1, #checks do local check = checks[i]
    local verdict = check(ask)
    -- (an active-hold slot the guards took goes back with a later refusal)
    if verdict then release_slots(ask); return verdict end
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

-- A live reserve's refusal of verdict `v`: reservation.denied, and the error carrying the
-- detail (a guard's: 409 LIMIT_EXCEEDED naming the limit, and policy.limit_reached).
local function refused(ask, v)
  local d = v.deny
  denied_event(ask, d, v.by)
  if v.limit then
    limit_reached(ask.sc, v)
    return err('LIMIT_EXCEEDED', v.message, '{"deny_detail":' .. detail_json(d) .. ',"limit":' .. limit_json(v.limit) ..
      '}', 409)
  end
  local message = v.message or gate_message(d, governance_of(ask).kind)
  return err(d.reason_code, message, '{"deny_detail":' .. detail_json(d) .. '}')
end

-- reservation.observed_denied / observed_allowed of an observe-mode evaluation.
local function observed_event(ask, result)
  local sc, A, G = ask.sc, ask.A, governance_of(ask) or {run = ''}
  local denied = result.decision == 'DENY'
  local correlation
  local data = '{"observe_mode":"OBSERVE","unit":"' .. A.unit .. '","estimated_amount":' .. A.amount .. ',"action":' ..
    A.action .. ',"subject":' .. A.subject
  local scope = ask.scope
  if denied then
    local d = result.deny_detail
    scope = d.blocked_by_scope or scope
    local v = d.quota_violation or {}
    correlation = redis.sha1hex(sc.name .. '|' .. scope .. '|' .. (G.kind or '') .. '|' .. (v.window_key or '') .. '|' ..
      d.reason_code .. '|' .. (d.blocked_by_policy or ''))
    data = data .. ',"scope":' .. cjson.encode(scope) .. ',"deny_detail":' .. detail_json(d) ..
      ',"would_have_blocked_at":' .. cjson.encode(scope) .. '}'
  else
    correlation = (G.run ~= '') and redis.sha1hex(sc.name .. '|' .. scope .. '|' .. G.run) or nil
    data = data .. ',"scope":' .. cjson.encode(scope) .. ',"decision":"' .. result.decision .. '"' ..
      (result.caps and (',"caps_applied":' .. result.caps) or '') ..
      (G.rate and (',"sample_rate":' .. G.rate) or '') .. '}'
  end
  emit(sc.events, denied and 'reservation.observed_denied' or 'reservation.observed_allowed', sc.name, scope,
    correlated(sc, correlation), 'cycles-server', data, sc.now)
end

-- Evaluation without a reservation (dry_run, decide, and a reserve in observe mode): the
-- checks in their order, answered as a decision; only the idempotency record is written, with
-- reservation.denied on a denial (or, observing, the observed_* event instead). `K.record` is
-- this namespace's idempotency record, `K.live` the reservation the same key would create (for
-- decide, the record again); `status` the answer's status ('OBSERVED' for a reserve in observe
-- mode).
local function evaluation(K, A, now, now_s, status, tenant)
  local replayed_answer = replay(K.record, A.payload_hash, status, now_s, function(old)
    return {decision = old[1], reason_code = (old[2] ~= '') and old[2] or nil, caps = (old[3] ~= '') and old[3] or nil,
      codes = old[4], balances = legacy_balances(old, 5)}
  end)
  if replayed_answer then return replayed_answer end
  local live = (K.live ~= K.record) and load_record(K.live)
  if live and live.ik == A.idempotency_key then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH_LIVE) end

  if tenant == nil then tenant = tenant_record(K.tenant) end
  if tenant == 'MALFORMED' then return err('INTERNAL_ERROR', MSG.TENANT_MALFORMED) end
  local ask = ask_of('evaluate', K, A, now, tenant)
  local observe = observing(A, tenant)
  -- decide (its record is its own `live`) makes template ledgers as a reserve would; dry_run
  -- and observed evaluations never write one
  ask.makes = K.live == K.record and not observe
  -- observed evaluations stay out of the production denial rate
  if A.digest ~= '' and not observe then RATES.count(ask.sc, 'n') end
  local verdict = decide(ask)
  if verdict and verdict.fail then return verdict.fail end
  local result = {decision = 'DENY', observed = observe or nil}
  if verdict then
    result.reason_code, result.deny_detail = verdict.deny.reason_code, verdict.deny
    result.codes = ask.e and verdict.e and table.concat(ask.e.codes) or ''
  else
    result.decision = ask.caps and 'ALLOW_WITH_CAPS' or 'ALLOW'
    result.caps, result.codes, result.balances = ask.caps or nil, table.concat(ask.e.codes), balances(ask.e.budgets)
  end
  if observe then
    -- observed ALLOWs are sampled (the handler drew `sampled`); every observed DENY is written
    if verdict or (governance_of(ask) and ask.G.sampled) then observed_event(ask, result) end
  elseif verdict then
    denied_event(ask, verdict.deny, verdict.by)
  end
  local json = detail_json(result)
  redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', json)
  redis.call('PEXPIRE', K.record, A.record_ttl_ms)
  return ok(json, status, now_s)
end
