-- Budget periods that recur: the roll into the current period, its schedule, and ledger
-- reads that roll first.
-- needs: decimal, calendar, events, ledger, alerts

-- Rolls a recurring ledger whose period has ended into the current one, in one step however
-- far behind (so no request is ever judged against an ended period, and a burst after a long
-- idle time admits one period's allocation), as RESET_SPENT does: spent cleared, holds and
-- debt kept, and the allocation per rollover_policy: NONE the base allocation, CARRY_FORWARD
-- the base plus what the ended period left unused (remaining above zero), CAP_AT_ALLOCATED the
-- base plus that unused part up to the base. The base is the allocation less what the previous
-- roll carried in. Periods that passed whole without a request carry nothing. One
-- budget.reset_spent and one audit row (naming how many periods ended); the new period is
-- written at once, so no period is ever rolled twice.
local function roll_period(sc, b)
  local f = redis.call('HMGET', b.key, 'period_every', 'period_start_ms', 'rollover_policy', 'period_carried', 'ledger_id',
    'period_day')
  if not f[1] or b.status == 'CLOSED' then
    b.roll_at = nil
    save_view(b, itoa(sc.now))
    redis.call('ZREM', KEY.periods(sc.prefix), b.key)
    return
  end
  local from = {allocated = b.allocated, spent = b.spent, reserved = b.reserved}
  local every, policy, ledger_id = f[1], f[3] or 'NONE', f[5] or ''
  local carried = f[4] or '0'
  local start_ms, end_ms, ended = current_period(tonumber(b.roll_at), every, f[6], sc.now)
  local before = ledger_state(b, true)
  local base = d_max(d_sub(b.allocated, carried), '0')
  local unused = d_max(b.remaining, '0')
  local carry = '0'
  if policy == 'CARRY_FORWARD' then carry = unused elseif policy == 'CAP_AT_ALLOCATED' then carry = d_min(unused, base) end
  if not d_fits(d_add(base, carry)) then carry = '0' end
  b.allocated, b.spent, carried = d_add(base, carry), '0', carry
  b.remaining = d_sub(d_sub(b.allocated, b.reserved), b.debt)
  emit(sc.events, 'budget.reset_spent', sc.name, b.scope, nil, 'cycles-periods', '{"ledger_id":' ..
    cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit ..
    '","operation":"RESET_SPENT","previous_state":' .. before .. ',"new_state":' .. ledger_state(b, true) ..
    ',"spent_override_provided":false,"reason":"period rollover (' .. policy .. ')"}', sc.now)
  local actx = {tenant = sc.name, operation = 'rollBudgetPeriod', actor = 'system', status = 200,
    request_id = sc.ctx and sc.ctx.request_id, trace_id = sc.ctx and sc.ctx.trace_id}
  audit(KEY.audit_log(sc.prefix), actx, 'budget.roll_period', 'budget', ledger_id, sc.now,
    {period_start = iso8601(start_ms), period_end = iso8601(end_ms), rollover_policy = policy, carried = carry,
      periods_ended = ended})
  local start_s, end_s = itoa(start_ms), itoa(end_ms)
  -- a new period is judged afresh, as RESET_SPENT does: over the limit only while the debt is
  b.over = d_cmp(b.debt, b.overdraft_limit) > 0
  b.roll_at = end_s
  save_view(b, itoa(sc.now))
  redis.call('HSET', b.key, 'period_start_ms', start_s, 'period_end_ms', end_s, 'period_carried', carried)
  over_limit_events(sc.events, nil, b, sc.name, sc.now, 'cycles-periods')
  redis.call('ZADD', KEY.periods(sc.prefix), end_ms, b.key)
  b.before.allocated, b.before.remaining, b.before.spent, b.before.over = b.allocated, b.remaining, b.spent, b.over
  threshold_events(sc, b, from)
end

-- After a write of ledger `b`'s period fields (at `now_s`): a recurring ledger is due at its
-- period's end (its `roll_at`, the tenant's periods index and its slot's due index, which the
-- sweep reads); any other is due never.
local function schedule_period(b, due_index, tenant, now_s)
  local f = redis.call('HMGET', b.key, 'period_every', 'period_end_ms')
  local periods = KEY.periods(KEY.prefix_of(b.key))
  if f[1] and f[2] and b.status ~= 'CLOSED' then
    b.roll_at = f[2]
    redis.call('ZADD', periods, f[2], b.key)
    redis.call('ZADD', due_index, 'LT', f[2], tenant)
  else
    b.roll_at = nil
    redis.call('ZREM', periods, b.key)
  end
  save_view(b, now_s)
end

-- Rolls the ledger first when its period has ended (every script that changes a ledger).
local function roll_due(sc, b)
  if sc and b.roll_at and tonumber(b.roll_at) <= sc.now then roll_period(sc, b) end
end

-- The ledgers of `keys` that exist; with a scene, each rolled into its current period first.
local function read_budgets(keys, sc)
  local budgets = {}
  for _, key in ipairs(keys) do
    local b = read_budget(key)
    if b then
      if sc then roll_due(sc, b) end
      budgets[#budgets + 1] = b
    end
  end
  return budgets
end
