-- Runaway-agent guards (an extension of policies): ledgers made from a policy's budget
-- template, a cap on the reservations ACTIVE at once and spend-rate limits per calendar
-- minute and hour, per matched scope; and what ending a reservation gives back.
-- needs: decimal, reply, calendar, events, ledger, policies, quotas

-- The counters a reservation moved, given back when it ends; its record keeps them in `qrun`
-- (a JSON list): a string is a v0.1.26 per_run quota member (given back by a release or an
-- expiry, not a commit: the call happened), {a = field} an active-hold count, {w = window,
-- f = field, ttl} an estimate counted in a spend window, which moves to what was `charged`
-- (nothing when released or expired; a window that has ended stays gone).
-- One active-hold slot of `field` given back (the field goes when none is left).
local function give_slot(prefix, field)
  local key = KEY.active_holds(prefix)
  if redis.call('HINCRBY', key, field, -1) <= 0 then redis.call('HDEL', key, field) end
end

local function give_back(sc, rec, charged)
  if not rec.qrun then return end
  local prefix = sc.prefix
  local decoded, items = pcall(cjson.decode, rec.qrun)
  if not decoded or type(items) ~= 'table' then return end
  for _, item in ipairs(items) do
    if type(item) == 'string' then
      if not charged then COUNTER.take_back(prefix, item, sc.now) end
    elseif item.a then
      give_slot(prefix, item.a)
    elseif item.w then
      local key = KEY.spend_window(prefix, item.w)
      local delta = d_sub(charged or '0', rec.estimate)
      if delta ~= '0' and redis.call('EXISTS', key) == 1 then redis.call('HINCRBY', key, item.f, delta) end
    end
  end
end

-- The spend windows: the policy setting, its wire name, the window's length and key letter.
local SPEND_WINDOWS = {{'sm', 'max_amount_per_minute', 60000, 'm'}, {'sh', 'max_amount_per_hour', 3600000, 'h'}}

-- What the 409's details and policy.limit_reached say of a limit, as JSON (amounts are digit
-- strings, written as numbers whatever their size).
local LIMIT_FIELDS = {'policy_id', 'limit_name', 'limit', 'current', 'requested', 'unit', 'scope', 'window_key',
  'retry_after_ms', 'reason_code', 'tenant_id', numbers = {limit = true, current = true, requested = true, retry_after_ms = true}}
local function limit_json(lim)
  local parts = {}
  for _, k in ipairs(LIMIT_FIELDS) do
    local v = lim[k]
    if v ~= nil then parts[#parts + 1] = '"' .. k .. '":' .. (LIMIT_FIELDS.numbers[k] and tostring(v) or cjson.encode(v)) end
  end
  return '{' .. table.concat(parts, ',') .. '}'
end

-- Where a refusal without a window of its own (active holds, instances) marks that its
-- policy.limit_reached was written: the minute's policy rate hash, for two minutes.
local function minute_mark(sc) return {KEY.policy_rate(sc.prefix, math.floor(sc.now / 60000)), 120000} end

-- A live reserve's refusal by a guard's verdict `v`: 409 LIMIT_EXCEEDED naming the limit, and
-- policy.limit_reached once per limit, policy, scope and window (a marker beside the counts).
local function limit_refusal(sc, v)
  local lim, key = v.limit, v.mark[1]
  if redis.call('HSETNX', key, '!' .. lim.limit_name .. '|' .. lim.policy_id .. '|' .. lim.scope, '1') == 1 then
    redis.call('PEXPIRE', key, v.mark[2])
    local data = {tenant_id = sc.name, reason_code = v.deny.reason_code}
    for k, x in pairs(lim) do data[k] = x end
    emit(sc.events, 'policy.limit_reached', sc.name, lim.scope, sc.ctx, 'cycles-server', limit_json(data), sc.now)
  end
  return err('LIMIT_EXCEEDED', v.message, '{"deny_detail":' .. detail_json(v.deny) .. ',"limit":' .. limit_json(lim) ..
    '}', 409)
end

-- A guard's denial: the DenyDetail, the message, and what the 409 and policy.limit_reached
-- say of the limit (`mark`: where the event's once-per-window marker lives).
local function limit_verdict(reason, lim, fix, message, mark)
  local d = {reason_code = reason, blocked_by_policy = lim.policy_id, blocked_by_scope = lim.scope, suggested_fix = fix}
  return {deny = d, message = message, limit = lim, mark = mark, refusal = limit_refusal}
end

-- The active-hold slots a live reserve took (`ask.guarded`), given back when a later check
-- refuses it after all.
local function release_slots(ask)
  for _, g in ipairs(ask.guarded or {}) do if g.a then give_slot(ask.sc.prefix, g.a) end end
  ask.guarded = nil
end

-- The active-hold cap and spend-rate limits of the policies in force on the request's scope
-- (`pol`: `policy_settings`): a verdict, or nil after noting in `ask.guarded` what a live
-- reserve counts. A live reserve takes its active-hold slot here, in one command (the count
-- before it decides; `release_slots` gives it back if a later check refuses); an evaluation
-- only reads the count.
local function guard_denial(ask, pol)
  if not (pol.ma or pol.sm or pol.sh) then return nil end
  local sc, A = ask.sc, ask.A
  local guarded = {}
  ask.guarded = guarded
  local s = pol.ma
  if s then
    local scope = counted_scope(s, sc, ask.scope)
    local field = s.id .. '|' .. scope
    local key = KEY.active_holds(sc.prefix)
    local taking = ask.mode == 'hold'
    local n = taking and redis.call('HINCRBY', key, field, 1) - 1 or tonumber(redis.call('HGET', key, field) or '0')
    if taking then guarded[1] = {a = field} end
    if n >= s.value then
      release_slots(ask)
      local lim = {policy_id = s.id, limit_name = 'max_active_reservations', limit = itoa(s.value), current = itoa(n),
        scope = scope}
      return limit_verdict('ACTIVE_RESERVATIONS_EXCEEDED', lim, 'Commit or release one of the ' .. n ..
        ' active reservations on ' .. scope .. ", or raise rate_limits.max_active_reservations in policy '" .. s.id .. "'",
        'At most ' .. s.value .. ' reservations may be active at once on ' .. scope .. ' (policy ' .. s.id .. ')',
        minute_mark(sc))
    end
  end
  for _, w in ipairs(SPEND_WINDOWS) do
    s = pol[w[1]]
    if s and s.value.u == A.unit then
      local scope = counted_scope(s, sc, ask.scope)
      local field = s.id .. '|' .. scope
      local n = math.floor(sc.now / w[3])
      local window = w[4] .. n
      local key = KEY.spend_window(sc.prefix, window)
      local spent = redis.call('HGET', key, field) or '0'
      if d_cmp(d_add(spent, A.amount), s.value.n) > 0 then
        release_slots(ask)
        local resets = (n + 1) * w[3]
        local lim = {policy_id = s.id, limit_name = w[2], limit = s.value.n, current = spent, requested = A.amount,
          unit = A.unit, scope = scope, window_key = iso8601(n * w[3]), retry_after_ms = itoa(resets - sc.now)}
        return limit_verdict('SPEND_RATE_EXCEEDED', lim, 'Wait ' .. math.ceil((resets - sc.now) / 1000) ..
          ' s for the window to end (' .. spent .. ' of ' .. s.value.n .. ' ' .. A.unit .. ' spent), or raise rate_limits.' ..
          w[2] .. " in policy '" .. s.id .. "'", 'Spend on ' .. scope .. ' would exceed ' .. s.value.n .. ' ' .. A.unit ..
          ' per ' .. string.sub(w[2], 15) .. ' (policy ' .. s.id .. '): ' .. spent .. ' spent, ' .. A.amount .. ' asked',
          {key, w[3] * 2})
      end
      guarded[#guarded + 1] = {w = window, f = field, ttl = w[3] * 2}
    end
  end
  if #guarded == 0 then ask.guarded = nil end
  return nil
end

-- A live reserve's counts (the estimate `amount`; its active-hold slot it took at the check);
-- each guard goes to `items`, what its record keeps to give back.
local function hold_guards(sc, guarded, amount, items)
  for _, g in ipairs(guarded) do
    if not g.a then
      local key = KEY.spend_window(sc.prefix, g.w)
      redis.call('HINCRBY', key, g.f, amount)
      redis.call('PEXPIRE', key, g.ttl)
    end
    items[#items + 1] = g
  end
end

-- An event's charge counts in the spend windows of the policies in force on its scope
-- (events record what happened: never refused by them).
local function count_spend(sc, pol, scope_path, unit, amount)
  for _, w in ipairs(SPEND_WINDOWS) do
    local s = pol[w[1]]
    if s and s.value.u == unit and amount ~= '0' then
      local key = KEY.spend_window(sc.prefix, w[4] .. math.floor(sc.now / w[3]))
      redis.call('HINCRBY', key, s.id .. '|' .. counted_scope(s, sc, scope_path), amount)
      redis.call('PEXPIRE', key, w[3] * 2)
    end
  end
end

-- The template in force for a scope without a ledger in `unit`: among the ACTIVE policies'
-- templates in that unit whose pattern matches it, the highest priority (then the latest).
local function template_for(tpls, scope, unit)
  local best
  for _, p in ipairs(tpls or {}) do
    if p.tpl.u == unit and (not best or p.pri > best.pri or (p.pri == best.pri and p.id > best.id))
        and pattern_matches(p.pat, scope) then
      best = p
    end
  end
  return best
end

-- A ledger id in the shape createBudget gives (a UUID), from the ledger's key and the time.
local function template_ledger_id(key, now)
  local h = redis.sha1hex(key .. '|' .. now)
  return string.sub(h, 1, 8) .. '-' .. string.sub(h, 9, 12) .. '-4' .. string.sub(h, 14, 16) .. '-a' ..
    string.sub(h, 18, 20) .. '-' .. string.sub(h, 21, 32)
end

-- The ledger of `scope` (`key`, budget code `code`) made from the template in force for it,
-- before any check: a normal ledger (listed, funded, frozen, closed like any other), with
-- budget.created naming the policy and an audit row, counted against the policy's
-- max_instances. With `write` false (an evaluation) it is only what would be made. Returns the
-- ledger, or nil (no template), or nil and the verdict when the policy has made its most.
local function template_ledger(ask, tpls, key, scope, code, write)
  local sc, A = ask.sc, ask.A
  local p = template_for(tpls, scope, A.unit)
  if not p then return nil end
  -- a ledger made counts at once (given back when refused): one command, not two
  local counts = KEY.template_counts(sc.prefix)
  local made = write and redis.call('HINCRBY', counts, p.id, 1) - 1 or tonumber(redis.call('HGET', counts, p.id) or '0')
  if made >= p.tpl.n then
    if write then redis.call('HINCRBY', counts, p.id, -1) end
    local lim = {policy_id = p.id, limit_name = 'max_instances', limit = itoa(p.tpl.n), current = itoa(made), scope = scope}
    return nil, limit_verdict('TEMPLATE_INSTANCES_EXCEEDED', lim, "Raise budget_template.max_instances in policy '" ..
      p.id .. "', or create a budget for " .. scope, 'Policy ' .. p.id .. ' has made its most ledgers (' .. p.tpl.n ..
      '); ' .. scope .. ' has none', minute_mark(sc))
  end
  local t = p.tpl.f
  local b = {key = key, scope = scope, unit = A.unit, status = 'ACTIVE', allocated = t.allocated, remaining = t.allocated,
    reserved = '0', spent = '0', debt = '0', overdraft_limit = t.overdraft_limit, over = false,
    policy = t.commit_overage_policy}
  b.before = {allocated = b.allocated, remaining = b.remaining, reserved = '0', spent = '0', debt = '0', over = false}
  if not write then return b end
  local now_s = itoa(sc.now)
  local f = {ledger_id = template_ledger_id(key, now_s), tenant_id = sc.name, scope = scope, unit = A.unit,
    rollover_policy = t.rollover_policy, created_at_ms = now_s, template_policy = p.id}
  if t.period_every then
    -- the first period starts now; the sweep rolls it at its end (as `schedule_period` does)
    local start_ms, end_ms = current_period(sc.now, t.period_every, nil, sc.now)
    f.period_recurrence, f.period_every = t.period_recurrence, t.period_every
    f.period_start_ms, f.period_end_ms = itoa(start_ms), itoa(end_ms)
    f.period_day = tostring(tonumber(string.sub(iso8601(end_ms), 9, 10)))
    b.roll_at = f.period_end_ms
    redis.call('ZADD', KEY.periods(sc.prefix), b.roll_at, key)
    redis.call('ZADD', ask.K.due_index, 'LT', b.roll_at, sc.name)
  end
  f.v = view_of(b, now_s)
  write_fields(key, f)
  add_scope_unit(KEY.scope_units(sc.prefix), scope, A.unit)
  redis.call('ZADD', KEY.template_ledgers(sc.prefix), sc.now, code)
  emit(sc.events, 'budget.created', sc.name, scope, sc.ctx, 'cycles-server', '{"ledger_id":' ..
    cjson.encode(f.ledger_id) .. ',"scope":' .. cjson.encode(scope) .. ',"unit":"' .. A.unit ..
    '","operation":"CREATE","policy_id":' .. cjson.encode(p.id) .. ',"new_state":' .. ledger_state(b) .. '}', sc.now)
  local actx = {tenant = sc.name, operation = 'budgetTemplate', actor = 'system', status = 200,
    request_id = sc.ctx and sc.ctx.request_id, trace_id = sc.ctx and sc.ctx.trace_id}
  audit(KEY.audit_log(sc.prefix), actx, 'budget.create', 'budget', f.ledger_id, sc.now, {policy_id = p.id, scope = scope})
  return b
end
