-- Budget ledgers: read, settled, written, and the balances answers carry.
-- needs: decimal, reply

-- A ledger keeps what changes with every charge in one field, `v`: its view, the fields of
-- LEDGER_VIEW.fields (the header has them from `ops::ledgers::VIEW_FIELDS`) joined by \31: scope,
-- unit, status, allocated, remaining, reserved, spent, debt, overdraft_limit, '1' when over the
-- limit, updated_at_ms, roll_at (the end of its period when it recurs; `roll_period`), the
-- commit overage policy, caps (JSON) and the burn window (`track_burn`), '' where it has none.
-- One read and one write of one field per ledger and request, where every field cost a read
-- and a write of its own. Its other fields (ids, period, metadata) change only by operator
-- requests. Ledgers written before the view keep those values in fields of the same names,
-- read as such until the next write folds them into the view.

-- LEDGER_VIEW.memo: the last view this script VM wrote or read of each ledger, with its decoded
-- fields (used only while the stored text is that one, so never stale; shared, so never
-- changed): the next request on a ledger finds its view here instead of matching it again.

-- A ledger from its fields in view order (strings; '' or nil for none; `f` is left as it is).
-- The optional fields are set only when present, so the table is made at the size it keeps
-- (a settle adds `grew`).
local function ledger_of(key, f)
  local allocated, remaining, reserved = f[4] ~= '' and f[4] or '0', f[5] ~= '' and f[5] or '0', f[6] ~= '' and f[6] or '0'
  local spent, debt, over, burn = f[7] ~= '' and f[7] or '0', f[8] ~= '' and f[8] or '0', (f[10] == '1'), f[15]
  if burn == '' then burn = nil end
  local b = {key = key, scope = f[1], unit = f[2], status = f[3] ~= '' and f[3] or 'ACTIVE', allocated = allocated,
    remaining = remaining, reserved = reserved, spent = spent, debt = debt, overdraft_limit = f[9] ~= '' and f[9] or '0',
    over = over, before = {allocated = allocated, remaining = remaining, reserved = reserved, spent = spent, debt = debt,
    over = over, burn = burn}}
  if f[12] ~= '' and f[12] then b.roll_at = f[12] end
  if f[13] ~= '' and f[13] then b.policy = f[13] end
  if f[14] ~= '' and f[14] then b.caps = f[14] end
  if burn then b.burn = burn end
  return b
end

-- Reads a ledger of today's layout (its view); nil when it does not exist, false when it keeps
-- its values in the fields of before the view (`read_budget` reads those). `scope` guards
-- against key-hash collisions.
local function read_view(key, scope)
  local raw = redis.call('HGET', key, 'v')
  -- (a scope without a ledger, the common case on a deep subject, is told by the cheapest
  -- read there is, not by reading the old fields)
  if not raw then
    if redis.call('EXISTS', key) == 0 then return nil end
    return false
  end
  local f = recall(LEDGER_VIEW.memo, key, raw)
  if not f then
    f = {string.match(raw, LEDGER_VIEW.pattern)}
    if #f == 0 then error('malformed ledger view at ' .. key) end
    remember(LEDGER_VIEW.memo, key, f, raw)
  end
  local b = ledger_of(key, f)
  if scope and b.scope ~= scope then error('budget key collision at ' .. key) end
  return b
end

-- Reads a ledger of either layout; nil when it does not exist.
local function read_budget(key, scope)
  local b = read_view(key, scope)
  if b ~= false then return b end
  local f = redis.call('HMGET', key, unpack(LEDGER_VIEW.fields))
  for i = 1, #LEDGER_VIEW.fields do f[i] = f[i] or '' end
  f[10] = (f[10] == 'true') and '1' or ''
  b = ledger_of(key, f)
  b.legacy = true
  if scope and b.scope ~= scope then error('budget key collision at ' .. key) end
  return b
end

-- A ledger's view as stored (`now_s`: the update time's digits), remembered decoded.
local function view_of(b, now_s)
  local f = {b.scope, b.unit, b.status, b.allocated, b.remaining, b.reserved, b.spent, b.debt,
    b.overdraft_limit, b.over and '1' or '', now_s, b.roll_at or '', b.policy or '', b.caps or '', b.burn or ''}
  local raw = table.concat(f, '\31')
  remember(LEDGER_VIEW.memo, b.key, f, raw)
  return raw
end

-- Writes a ledger's view; a ledger read from its old fields drops them, so the view is its
-- only copy.
local function save_view(b, now_s)
  redis.call('HSET', b.key, 'v', view_of(b, now_s))
  if b.legacy then
    redis.call('HDEL', b.key, unpack(LEDGER_VIEW.fields, 3))
    b.legacy = nil
  end
end

-- Charges the actual amount X against holds of E on every budget (the commit math of README's
-- "Behaviour worth knowing"): X <= E releases the rest; an overage c is capped at what every scope without an overdraft
-- limit (or, under ALLOW_IF_AVAILABLE, every scope) can cover; under ALLOW_WITH_OVERDRAFT the
-- unfunded shortfall becomes debt within each positive limit. Checks first, then mutates the
-- budget tables (nothing is written here). Returns the charged amount, or nil and the scope
-- whose overdraft limit would be exceeded.
local function settle(budgets, E, X, policy)
  -- (a commit's common case first: X <= E with every amount exact as a number, 15 characters
  -- at most, so each is read once: reading digits is what a settle costs most; an event holds
  -- nothing, E = '0')
  local short = E ~= '0' and #X <= 15 and #E <= 15
  for i = 1, #budgets do local b = budgets[i]
    short = short and #b.remaining <= 15 and #b.spent <= 15 and #b.reserved <= 15
  end
  local x, e = short and X + 0, short and E + 0
  if short and x <= e then
    for i = 1, #budgets do local b = budgets[i]
      b.remaining, b.spent, b.reserved, b.grew = itoa(b.remaining + (e - x)), itoa(b.spent + x), itoa(b.reserved - e), X
    end
    return X
  end
  local delta = d_sub(X, E)
  local c, overage = '0', d_pos(delta)
  if overage then
    c = delta
    for i = 1, #budgets do local b = budgets[i]
      local zero_limit = not d_pos(b.overdraft_limit)
      if (policy ~= 'ALLOW_WITH_OVERDRAFT' or zero_limit) and d_cmp(b.remaining, delta) < 0 then
        c = d_min(c, d_max(b.remaining, '0'))
      end
    end
    if policy == 'ALLOW_WITH_OVERDRAFT' then
      for i = 1, #budgets do local b = budgets[i]
        if d_pos(b.overdraft_limit) and d_cmp(b.remaining, c) < 0 then
          local shortfall = d_sub(c, d_max(b.remaining, '0'))
          if d_cmp(d_add(b.debt, shortfall), b.overdraft_limit) > 0 then return nil, b end
        end
      end
    end
  end
  local capped = d_cmp(c, delta) < 0
  local returned = not overage and d_sub(E, X)
  for i = 1, #budgets do local b = budgets[i]
    local funded = c
    if d_pos(c) and d_cmp(b.remaining, c) < 0 then
      funded = d_max(b.remaining, '0')
      b.debt = d_add(b.debt, d_sub(c, funded))
      if d_pos(b.overdraft_limit) and d_cmp(b.debt, b.overdraft_limit) > 0 then b.over = true end
    end
    if capped and d_cmp(b.remaining, delta) < 0 and (policy ~= 'ALLOW_WITH_OVERDRAFT' or not d_pos(b.overdraft_limit)) then
      b.over = true
    end
    -- (`grew`: what its spent grew by, for its burn window)
    if overage then
      b.remaining = d_sub(b.remaining, c)
      b.grew = d_add(funded, E)
    else
      b.remaining = d_add(b.remaining, returned)
      b.grew = X
    end
    b.spent = d_add(b.spent, b.grew)
    b.reserved = d_sub(b.reserved, E)
  end
  if overage then return d_add(E, c) end
  return X
end

-- Overage policy: the request's, else a matching policy's (`from_policy`, a policy_settings
-- entry), else the most specific budgeted ledger's, else the tenant's default, else
-- ALLOW_IF_AVAILABLE.
local function resolve_policy(requested, budgets, tenant, from_policy)
  if requested ~= '' then return requested end
  if from_policy then return from_policy.value end
  for i = #budgets, 1, -1 do
    if budgets[i].policy and budgets[i].policy ~= '' then return budgets[i].policy end
  end
  return (tenant and tenant.default_policy) or RULES.DEFAULT_OVERAGE_POLICY
end

-- Lists `unit` among the units of `scope` in the tenant's scope index `units_key` (",A,B,"),
-- once: a new scope (the common case) in one command.
local function add_scope_unit(units_key, scope, unit)
  if redis.call('HSETNX', units_key, scope, ',' .. unit .. ',') == 1 then return end
  local units = redis.call('HGET', units_key, scope)
  if not string.find(units, ',' .. unit .. ',', 1, true) then redis.call('HSET', units_key, scope, units .. unit .. ',') end
end

-- Checks that every new value fits int64, then writes all budgets (never half way), each with
-- the update time `now_s` (the digits `now_ms` returns).
local function write_budgets(budgets, now_s)
  for i = 1, #budgets do local b = budgets[i]
    -- (18 characters always fit: the common case, told without a call per amount)
    local long = #b.remaining > 18 or #b.reserved > 18 or #b.spent > 18 or #b.debt > 18
    if long and not (d_fits(b.remaining) and d_fits(b.reserved) and d_fits(b.spent) and d_fits(b.debt)) then
      return err('INTERNAL_ERROR', 'Amount overflow on scope ' .. b.scope)
    end
  end
  for i = 1, #budgets do save_view(budgets[i], now_s) end
  return nil
end

-- Writes a ledger an operator changed (after d_fits checks by the caller), at `now` (ms).
local function save_ledger(b, now)
  save_view(b, itoa(now))
end

-- What a ledger may deny a request for, in precedence order (`denial` answers the index).
local DENIALS = {
  {'BUDGET_FROZEN', MSG.BUDGET_FROZEN},
  {'BUDGET_CLOSED', MSG.BUDGET_CLOSED},
  {'OVERDRAFT_LIMIT_EXCEEDED', MSG.OVER_LIMIT},
  {'DEBT_OUTSTANDING', MSG.DEBT_OUTSTANDING},
  {'BUDGET_EXCEEDED', MSG.INSUFFICIENT_BUDGET},
}

local function denial(b, amount, charge)
  if b.status == 'FROZEN' then return 1 end
  if b.status == 'CLOSED' then return 2 end
  if charge then return nil end
  if b.over then return 3 end
  if b.debt ~= '0' and d_pos(b.debt) and not d_pos(b.overdraft_limit) then return 4 end
  if d_cmp(b.remaining, amount) < 0 then return 5 end
  return nil
end
