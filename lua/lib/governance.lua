-- Governance: what a tenant with policies adds to the decision (lua/lib/decision.lua), as
-- `GOVERNED`: the policies in force, read once; their checks (a reservation rate, the v0.1.26
-- action rules, the runaway-agent guards); ledgers made from budget templates, and ledgers
-- rolled into their current period; the quota and guard counts a hold moves. Evaluations
-- (dry_run, decide, a reserve in observe mode) and events always decide with it, a live
-- reserve when the tenant has policies or a period to roll (lua/reserve_governed.lua). It also
-- reads what a plain tenant's reserve hands over for this call only: a record of the first
-- layout, a ledger of before the view, a request no budget of its unit admits
-- (`reserve_opening`, `scoped_budgets`).
-- needs: reply, record, ledger, tenant, events, alerts, periods, policies, quotas, guards, decision

local GOVERNED = {check = {}, policies = policy_settings, template_ledger = template_ledger, release_slots = release_slots,
  roll_period = roll_period, read_budget = read_budget, decoded_record = decoded_record}

-- A request without a budget in its unit: 400 UNIT_MISMATCH when a derived scope is budgeted in
-- another unit (from the tenant's scope index), else nil (the caller's BUDGET_NOT_FOUND).
function GOVERNED.unit_mismatch(ask)
  for _, arg in ipairs(ask.A.scopes) do
    local scope = string.sub(arg, 1, -10)
    local units = redis.call('HGET', KEY.scope_units(ask.sc.prefix), scope)
    if units and units ~= '' then
      local expected = {}
      for u in string.gmatch(units, '[^,]+') do expected[#expected + 1] = u end
      local unit = ask.A.unit
      return err('UNIT_MISMATCH', 'No budget in ' .. unit .. ' for this subject; scope ' .. scope ..
        ' is budgeted in ' .. table.concat(expected, ', '),
        cjson.encode({scope = scope, requested_unit = unit, expected_units = expected}))
    end
  end
  return nil
end

-- The request's action as the v0.1.26 rules see it, decoded when first needed (false: none).
function GOVERNED.action(ask)
  if ask.G == nil then ask.G = governance(ask.A.governance) or false end
  return ask.G
end

-- 2. A policy's per-minute reservation rate (holds; a reclaim retry is not counted twice).
function GOVERNED.check.rate_limit(ask)
  local setting = ask.mode == 'hold' and ask.pol.rl_r
  if not setting then return nil end
  local limited = rate_check(ask.sc.prefix, setting, 'reservations', counted_scope(setting, ask.sc, ask.scope), ask.now,
    ask.A.reclaimed == '')
  return limited and {fail = limited}
end

-- 3-5. The v0.1.26 action rules, where a policy in force has some (a hold or an evaluation):
-- access lists, then risk-class quotas, then per-kind quotas (their counters read at once).
function GOVERNED.check.action_rules(ask)
  local pol = ask.mode ~= 'charge' and ask.policed and ask.pol
  if not (pol and pol.ruled) then return nil end
  local gate = action_gate(ask.sc, pol, ask.A.governance, ask.scope)
  ask.G = gate.G
  if not gate.G then return nil end
  local d, bad = gate.access, nil
  if not d then d, bad = quota_denial(ask.sc, gate.plan, gate.G) end
  if bad then return {fail = bad} end
  if d then return {deny = d, message = gate_message(d, gate.G.kind)} end
  -- (the counters a hold moves)
  if #gate.plan.members > 0 then ask.counted = gate.plan end
  return nil
end

-- 6. The runaway-agent guards of the policies in force: ACTIVE reservations at once, spend
-- per minute and per hour (a hold or an evaluation; an event only counts its spend).
function GOVERNED.check.guards(ask)
  if ask.mode == 'charge' or not ask.policed then return nil end
  return guard_denial(ask, ask.pol)
end

-- The quota and guard counts a live reserve's hold moves (after its checks), and what its
-- record keeps to give them back (`hold`'s `moves`).
function GOVERNED.moves(ask, now_s)
  local runs = ask.counted and count_actions(ask.sc, ask.counted, now_s) or ask.guarded and {} or nil
  if ask.guarded then hold_guards(ask.sc, ask.guarded, ask.A.amount, runs) end
  return runs
end

-- reservation.observed_denied / observed_allowed of an observe-mode evaluation.
function GOVERNED.observed_event(ask, result)
  local sc, A, G = ask.sc, ask.A, GOVERNED.action(ask) or {run = ''}
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
      codes = old[4], balances = FIRST_LAYOUT.balances(old, 5)}
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
  local verdict = decide(ask, GOVERNED)
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
    if verdict or (GOVERNED.action(ask) and ask.G.sampled) then GOVERNED.observed_event(ask, result) end
  elseif verdict then
    denied_event(ask, verdict.deny, verdict.by)
  end
  local json = detail_json(result)
  redis.call('HSET', K.record, 'payload_hash', A.payload_hash, 'result', json)
  redis.call('PEXPIRE', K.record, A.record_ttl_ms)
  return ok(json, status, now_s)
end
