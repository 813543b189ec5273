-- Budget ledgers: read, settled, written, and the balances answers carry.
-- needs: decimal, reply

local BUDGET_FIELDS = {'scope', 'unit', 'status', 'allocated', 'remaining', 'reserved', 'spent', 'debt',
  'overdraft_limit', 'is_over_limit', 'caps', 'commit_overage_policy', 'roll_at_ms', 'burn'}

-- Reads a budget hash; nil when it does not exist. `scope` guards against key-hash collisions.
-- `roll_at` is the end of its period when it recurs (`roll_period`), `burn` its burn window
-- (`track_burn`).
local function read_budget(key, scope)
  local f = redis.call('HMGET', key, unpack(BUDGET_FIELDS))
  if not f[2] then return nil end
  if scope and f[1] ~= scope then error('budget key collision at ' .. key) end
  local b = { key = key, scope = f[1], unit = f[2], status = f[3] or 'ACTIVE', allocated = f[4] or '0',
    remaining = f[5] or '0', reserved = f[6] or '0', spent = f[7] or '0', debt = f[8] or '0',
    overdraft_limit = f[9] or '0', over = (f[10] == 'true'), caps = f[11], policy = f[12], roll_at = f[13], burn = f[14] }
  b.before = {allocated = b.allocated, remaining = b.remaining, reserved = b.reserved, spent = b.spent, debt = b.debt,
    over = b.over, burn = b.burn}
  return b
end

-- Charges the actual amount X against holds of E on every budget (the commit math of README's
-- "Behaviour worth knowing"): X <= E releases the rest; an overage c is capped at what every scope without an overdraft
-- limit (or, under ALLOW_IF_AVAILABLE, every scope) can cover; under ALLOW_WITH_OVERDRAFT the
-- unfunded shortfall becomes debt within each positive limit. Checks first, then mutates the
-- budget tables (nothing is written here). Returns the charged amount, or nil and the scope
-- whose overdraft limit would be exceeded.
local function settle(budgets, E, X, policy)
  local delta = d_sub(X, E)
  local c = '0'
  if d_pos(delta) then
    c = delta
    for _, b in ipairs(budgets) do
      local zero_limit = not d_pos(b.overdraft_limit)
      if (policy ~= 'ALLOW_WITH_OVERDRAFT' or zero_limit) and d_cmp(b.remaining, delta) < 0 then
        c = d_min(c, d_max(b.remaining, '0'))
      end
    end
    if policy == 'ALLOW_WITH_OVERDRAFT' then
      for _, b in ipairs(budgets) do
        if d_pos(b.overdraft_limit) and d_cmp(b.remaining, c) < 0 then
          local shortfall = d_sub(c, d_max(b.remaining, '0'))
          if d_cmp(d_add(b.debt, shortfall), b.overdraft_limit) > 0 then return nil, b end
        end
      end
    end
  end
  local capped = d_cmp(c, delta) < 0
  for _, b in ipairs(budgets) do
    local funded = c
    if d_pos(c) and d_cmp(b.remaining, c) < 0 then
      funded = d_max(b.remaining, '0')
      b.debt = d_add(b.debt, d_sub(c, funded))
      if d_pos(b.overdraft_limit) and d_cmp(b.debt, b.overdraft_limit) > 0 then b.over = true end
    end
    if capped and d_cmp(b.remaining, delta) < 0 and (policy ~= 'ALLOW_WITH_OVERDRAFT' or not d_pos(b.overdraft_limit)) then
      b.over = true
    end
    if d_pos(delta) then
      b.remaining = d_sub(b.remaining, c)
      b.spent = d_add(b.spent, d_add(funded, E))
    else
      b.remaining = d_add(b.remaining, d_sub(E, X))
      b.spent = d_add(b.spent, X)
    end
    b.reserved = d_sub(b.reserved, E)
  end
  if d_pos(delta) then return d_add(E, c) end
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

-- Checks that every new value fits int64, then writes all budgets (never half way): only the
-- fields that changed (Redis charges per argument) and the update time (`now_s`, the digits
-- `now_ms` returns).
local LEDGER_FIELDS = {'remaining', 'reserved', 'spent', 'debt'}
local function write_budgets(budgets, now_s)
  for _, b in ipairs(budgets) do
    for _, field in ipairs(LEDGER_FIELDS) do
      if not d_fits(b[field]) then return err('INTERNAL_ERROR', 'Amount overflow on scope ' .. b.scope) end
    end
  end
  for _, b in ipairs(budgets) do
    local args = {'updated_at_ms', now_s}
    for _, field in ipairs(LEDGER_FIELDS) do
      if b[field] ~= b.before[field] then args[#args + 1] = field; args[#args + 1] = b[field] end
    end
    if b.over ~= b.before.over then args[#args + 1] = 'is_over_limit'; args[#args + 1] = b.over and 'true' or 'false' end
    if b.burn ~= b.before.burn then args[#args + 1] = 'burn'; args[#args + 1] = b.burn end
    redis.call('HSET', b.key, unpack(args))
  end
  return nil
end

-- The balances an answer carries: per budget, in canonical scope order, its amounts as
-- [allocated, remaining, reserved, spent, debt, overdraft_limit, '1' when over the limit]
-- (the handler knows the scopes and the unit, so stored answers do not repeat them; the Rust
-- side reads them as `LedgerState`).
local function balances(budgets)
  local out = {}
  for i, b in ipairs(budgets) do
    out[i] = {b.allocated, b.remaining, b.reserved, b.spent, b.debt, b.overdraft_limit, b.over and '1' or '0'}
  end
  return out
end

-- Stored answers written before answers were objects kept the balances flat: 7 strings per
-- budget from `first` on.
local function legacy_balances(flat, first)
  local out = {}
  for i = first, #flat, 7 do
    out[#out + 1] = {flat[i], flat[i + 1], flat[i + 2], flat[i + 3], flat[i + 4], flat[i + 5], flat[i + 6]}
  end
  return out
end

-- Writes a ledger's amounts, flag, status and update time (after d_fits checks by the caller).
local function save_ledger(b, now)
  redis.call('HSET', b.key, 'allocated', b.allocated, 'remaining', b.remaining, 'reserved', b.reserved,
    'spent', b.spent, 'debt', b.debt, 'overdraft_limit', b.overdraft_limit, 'is_over_limit', b.over and 'true' or 'false',
    'status', b.status, 'updated_at_ms', tostring(now))
end
