-- The decision: budgets evaluated for a hold, denials and their detail, observe mode, and the
-- evaluation without a reservation (dry_run, decide).
-- needs: decimal, reply, access, tenant, events, ledger, alerts, periods, policies, quotas, reservation

-- Reads the budgets of the derived scopes (`budget_keys`, with "<scope>|<code>" aligned in
-- `scopes`) and evaluates a hold of `amount` in `unit`, one condition at a time
-- across all budgeted scopes: FROZEN, CLOSED, over-limit, debt without overdraft,
-- insufficient. Returns an evaluation: budgets, scopes, codes of the budgeted scopes, and
-- either `unit_error` (no budget in this unit, but in another: 400), or `reason` (a denial
-- reason code, 'BUDGET_NOT_FOUND' included) with `message`.
local DENIALS = {
  {'BUDGET_FROZEN', MSG.BUDGET_FROZEN},
  {'BUDGET_CLOSED', MSG.BUDGET_CLOSED},
  {'OVERDRAFT_LIMIT_EXCEEDED', MSG.OVER_LIMIT},
  {'DEBT_OUTSTANDING', MSG.DEBT_OUTSTANDING},
  {'BUDGET_EXCEEDED', MSG.INSUFFICIENT_BUDGET},
}

-- The first of DENIALS that holds for budget b, as an index; nil when b admits the hold.
local function denial(b, amount)
  if b.status == 'FROZEN' then return 1 end
  if b.status == 'CLOSED' then return 2 end
  if b.over then return 3 end
  if d_pos(b.debt) and not d_pos(b.overdraft_limit) then return 4 end
  if d_cmp(b.remaining, amount) < 0 then return 5 end
  return nil
end

-- The budgets of the derived scopes in `unit`; `unit_error` / `reason = 'BUDGET_NOT_FOUND'`
-- when no derived scope has one.
local function scoped_budgets(units_key, budget_keys, scope_args, unit, sc)
  local budgets, scopes, codes = {}, {}, {}
  local e = {budgets = budgets, scopes = scopes, codes = codes}
  for i, key in ipairs(budget_keys) do
    local scope, code = string.match(scope_args[i], '^(.*)|(.*)$')
    scopes[#scopes + 1] = scope
    local b = read_budget(key, scope)
    if b then
      roll_due(sc, b)
      budgets[#budgets + 1] = b
      codes[#codes + 1] = code
    end
  end
  if #budgets == 0 then
    for _, scope in ipairs(scopes) do
      local units = redis.call('HGET', units_key, scope)
      if units and units ~= '' then
        local expected = {}
        for u in string.gmatch(units, '[^,]+') do expected[#expected + 1] = u end
        e.unit_error = err('UNIT_MISMATCH', 'No budget in ' .. unit .. ' for this subject; scope ' .. scope ..
          ' is budgeted in ' .. table.concat(expected, ', '),
          cjson.encode({scope = scope, requested_unit = unit, expected_units = expected}))
        return e
      end
    end
    e.reason = 'BUDGET_NOT_FOUND'
    e.message = MSG.BUDGET_NOT_FOUND .. scopes[#scopes]
  end
  return e
end

local function evaluate(units_key, budget_keys, scope_args, unit, amount, sc)
  local e = scoped_budgets(units_key, budget_keys, scope_args, unit, sc)
  if e.unit_error or e.reason then return e end
  -- One condition at a time across all scopes: the earliest condition wins, then the
  -- shallowest scope.
  local worst, denied_by
  for _, b in ipairs(e.budgets) do
    local k = denial(b, amount)
    if k and (not worst or k < worst) then worst, denied_by = k, b end
  end
  if worst then
    e.reason, e.message, e.denied_by = DENIALS[worst][1], DENIALS[worst][2] .. denied_by.scope, denied_by
    return e
  end
  -- Operator caps come from the deepest derived scope's budget, when it has one.
  local deepest = e.budgets[#e.budgets]
  if deepest.scope == e.scopes[#e.scopes] and deepest.caps and deepest.caps ~= '' then e.caps = deepest.caps end
  return e
end

local function denied_event(sc, e, reason, A, detail)
  local scope, remaining = e and e.denied_by and e.denied_by.scope, e and e.denied_by and e.denied_by.remaining
  scope = (detail and detail.blocked_by_scope) or scope or request_scope(A.scopes)
  emit(sc.events, 'reservation.denied', sc.name, scope, sc.ctx, 'cycles-server', '{"scope":' .. cjson.encode(scope) ..
    ',"unit":"' .. A.unit .. '","reason_code":"' .. reason .. '","requested_amount":' .. A.amount ..
    (remaining and (',"remaining":' .. remaining) or '') .. ',"action":' .. A.action .. ',"subject":' .. A.subject ..
    (detail and detail.blocked_by_policy and (',"policy_id":' .. cjson.encode(detail.blocked_by_policy)) or '') ..
    (detail and (',"deny_detail":' .. detail_json(detail)) or '') .. '}', sc.now)
  count_and_check(sc, 'd')
end

-- The DenyDetail of a budget or tenant denial of evaluation `e` (`A` the request).
local FIXES = {
  BUDGET_FROZEN = 'Unfreeze the budget of %s',
  BUDGET_CLOSED = 'The budget of %s is closed; fund another scope',
  OVERDRAFT_LIMIT_EXCEEDED = 'Repay the debt of %s or raise its overdraft_limit',
  DEBT_OUTSTANDING = 'Repay the outstanding debt of %s before new reservations',
  BUDGET_NOT_FOUND = 'Create a budget for %s',
  TENANT_CLOSED = 'The tenant is closed; no new reservations are possible',
  TENANT_SUSPENDED = 'Reactivate the tenant',
}
local function deny_detail(reason, e, A, tenant)
  local b = e and e.denied_by
  local scope = (b and b.scope) or (tenant and ('tenant:' .. tenant)) or request_scope(A.scopes)
  local d = {reason_code = reason, blocked_by_scope = scope}
  if reason == 'BUDGET_EXCEEDED' and b then
    d.budget_remaining = b.remaining
    d.suggested_fix = 'Fund ' .. scope .. ' by at least ' .. d_sub(A.amount, b.remaining) .. ' ' .. A.unit
  elseif FIXES[reason] then
    d.suggested_fix = string.format(FIXES[reason], scope)
  end
  return d
end

-- A live reserve's refusal with DenyDetail `d` (of evaluation `e`, when budgets refused):
-- reservation.denied, and the error carrying the detail.
local function refused(sc, e, A, d, message)
  denied_event(sc, e, d.reason_code, A, d)
  return err(d.reason_code, message, '{"deny_detail":' .. detail_json(d) .. '}')
end

-- The effective observe mode: the request's, else the tenant's OBSERVE; DISABLED is ENFORCE.
local function observing(G, tenant)
  if G and G.observe ~= '' then return G.observe == 'OBSERVE' end
  return type(tenant) == 'table' and tenant.observe == 'OBSERVE'
end

-- reservation.observed_denied / observed_allowed of an observe-mode evaluation.
local function observed_event(sc, A, G, result, scope_path)
  local denied = result.decision == 'DENY'
  local correlation
  local data = '{"observe_mode":"OBSERVE","unit":"' .. A.unit .. '","estimated_amount":' .. A.amount .. ',"action":' ..
    A.action .. ',"subject":' .. A.subject
  local scope = scope_path
  if denied then
    local d = result.deny_detail
    scope = d.blocked_by_scope or scope_path
    local v = d.quota_violation or {}
    correlation = redis.sha1hex(sc.name .. '|' .. scope .. '|' .. G.kind .. '|' .. (v.window_key or '') .. '|' ..
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
-- checks of a live reserve in the normative order, answered as a decision; only the
-- idempotency record is written, with reservation.denied on a denial (or, observing, the
-- observed_* event instead). `K.record` is this namespace's idempotency record, `K.live` the
-- reservation the same key would create (for decide, the record again); `status` the
-- answer's status ('OBSERVED' for a reserve in observe mode).
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
  local sc = scene(K.events, A.context, now, tenant)
  local G = governance(A.governance)
  local observe = observing(G, tenant)
  local scope_path = request_scope(A.scopes)
  local function decide(decision, reason, e, detail)
    local result = {decision = decision, reason_code = reason, caps = e and e.caps,
      codes = e and table.concat(e.codes) or '', deny_detail = detail, observed = observe or nil}
    if e and decision ~= 'DENY' then result.balances = balances(e.budgets) end
    if observe then
      -- observed ALLOWs are sampled (the handler drew `sampled`); every observed DENY is written
      if decision == 'DENY' or G.sampled then observed_event(sc, A, G, result, scope_path) end
    elseif decision == 'DENY' then
      denied_event(sc, e, reason, A, detail)
    end
    local json = detail_json(result)
    redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', json)
    redis.call('PEXPIRE', K.record, tonumber(A.record_ttl_ms))
    return ok(json, status, now_s)
  end
  -- observed evaluations stay out of the production denial rate
  if A.digest ~= '' and not observe then count(sc, 'n') end
  local t = type(tenant) == 'table' and tenant
  if t and (t.status == 'CLOSED' or t.status == 'SUSPENDED') then
    local reason = 'TENANT_' .. t.status
    return decide('DENY', reason, nil, deny_detail(reason, nil, A, sc.name))
  end
  local pol = policy_settings(K.policies, scope_path, now, tenant, G)
  if G then
    local gate, bad = action_gate(sc, pol, G, scope_path)
    if bad then return bad end
    if gate then return decide('DENY', gate.reason_code, nil, gate) end
  end
  local e = evaluate(K.scope_units, K.budgets, A.scopes, A.unit, A.amount, sc)
  if e.unit_error then return e.unit_error end
  if e.reason then return decide('DENY', e.reason, e, deny_detail(e.reason, e, A)) end
  -- a matching policy's caps take precedence over the budget's
  if pol.caps then e.caps = pol.caps.value end
  return decide(e.caps and 'ALLOW_WITH_CAPS' or 'ALLOW', nil, e)
end
