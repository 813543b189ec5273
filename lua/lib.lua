-- Shared helpers of every script (Lua has no imports): the library holds them once, and a
-- script run by EVALSHA carries the ones it uses. A generated header opens the library with
-- the rules and messages the Rust side owns (`RULES`, `MSG`; shared/src/domain.rs), and each
-- script body starts with its keys and arguments by name (`K`, `A`; its call in shared/src/ops).
-- Amounts are int64 decimal strings: they never pass through Lua doubles except on the
-- fast path, where both operands have at most 15 characters and every result is exact.

local INT64_MAX = '9223372036854775807'
local INT64_MIN_MAG = '9223372036854775808'

local function split_sign(s)
  if string.sub(s, 1, 1) == '-' then return true, string.sub(s, 2) end
  return false, s
end

-- compares two non-negative digit strings without leading zeros
local function mag_cmp(a, b)
  if #a ~= #b then return (#a < #b) and -1 or 1 end
  if a == b then return 0 end
  return (a < b) and -1 or 1
end

local function strip(m)
  local s = string.gsub(m, '^0+', '')
  if s == '' then return '0' end
  return s
end

local function mag_add(a, b)
  local out, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local x = (i > 0) and (string.byte(a, i) - 48) or 0
    local y = (j > 0) and (string.byte(b, j) - 48) or 0
    local s = x + y + carry
    out[#out + 1] = string.char(48 + s % 10)
    carry = math.floor(s / 10)
    i, j = i - 1, j - 1
  end
  return strip(string.reverse(table.concat(out)))
end

-- a >= b
local function mag_sub(a, b)
  local out, borrow = {}, 0
  local i, j = #a, #b
  while i > 0 do
    local x = string.byte(a, i) - 48 - borrow
    local y = (j > 0) and (string.byte(b, j) - 48) or 0
    if x < y then x = x + 10; borrow = 1 else borrow = 0 end
    out[#out + 1] = string.char(48 + x - y)
    i, j = i - 1, j - 1
  end
  return strip(string.reverse(table.concat(out)))
end

-- Integers as strings, without a float format: '%d' costs half of '%.0f', and arithmetic on
-- digit strings (Lua coerces them) a third of tonumber().
local function itoa(n) return string.format('%d', n) end

-- d_cmp(a, b): -1, 0 or 1 for signed decimal strings
local function d_cmp(a, b)
  if #a <= 15 and #b <= 15 then
    local x, y = a + 0, b + 0
    if x < y then return -1 elseif x > y then return 1 else return 0 end
  end
  local na, ma = split_sign(a)
  local nb, mb = split_sign(b)
  ma, mb = strip(ma), strip(mb)
  if ma == '0' then na = false end
  if mb == '0' then nb = false end
  if na ~= nb then return na and -1 or 1 end
  local c = mag_cmp(ma, mb)
  if na then return 0 - c end -- (never -0)
  return c
end

local function d_add(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a + b) end
  local na, ma = split_sign(a)
  local nb, mb = split_sign(b)
  ma, mb = strip(ma), strip(mb)
  local neg, mag
  if na == nb then
    neg, mag = na, mag_add(ma, mb)
  else
    local c = mag_cmp(ma, mb)
    if c == 0 then return '0' end
    if c > 0 then neg, mag = na, mag_sub(ma, mb) else neg, mag = nb, mag_sub(mb, ma) end
  end
  if mag == '0' then return '0' end
  if neg then return '-' .. mag end
  return mag
end

local function d_neg(a)
  if a == '0' then return '0' end
  if string.sub(a, 1, 1) == '-' then return string.sub(a, 2) end
  return '-' .. a
end

local function d_sub(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a - b) end
  return d_add(a, d_neg(b))
end
local function d_min(a, b) if d_cmp(a, b) <= 0 then return a end return b end
local function d_max(a, b) if d_cmp(a, b) >= 0 then return a end return b end
local function d_pos(a)
  if #a <= 15 then return a + 0 > 0 end
  return d_cmp(a, '0') > 0
end

-- true when the value fits in int64 (checked before any write, so no script ever
-- fails half way through its mutations)
local function d_fits(a)
  if #a <= 18 then return true end -- 18 digits, or a sign and 17, always fit (the common case)
  local neg, m = split_sign(a)
  m = strip(m)
  if neg then return mag_cmp(m, INT64_MIN_MAG) <= 0 end
  return mag_cmp(m, INT64_MAX) <= 0
end

-- Redis's clock in ms, as a number and as digits.
local function now_ms()
  local t = redis.call('TIME')
  local now = t[1] * 1000 + math.floor(t[2] / 1000)
  return now, itoa(now)
end

-- The replies every script gives: `ok` (the result, a table or JSON text, with the record's
-- status where it has one), `replayed` (the stored answer of an earlier identical request), or
-- `err` (an error code the Rust side knows, a message, optional JSON `details`, and an HTTP
-- status where it differs from the code's usual one). `now_s` is Redis's clock as digits.
local function ok(result, status, now_s)
  if type(result) ~= 'string' then result = cjson.encode(result) end
  return {'OK', result, status or '', now_s or '0'}
end

local function replayed(result, status, now_s)
  if type(result) ~= 'string' then result = cjson.encode(result) end
  return {'REPLAY', result, status or '', now_s or '0'}
end

local function err(code, message, details, status)
  return {'ERR', code, message, details or '', status and tostring(status) or ''}
end

-- API-key check inside the operation's own script: digest, status, expiry, permission.
-- Every failure yields the same 401 message; the reason travels separately for logs. On
-- success the second value is the key's raw scope_filter (nil when it has none), for
-- `scope_guard`.
local function authorize(key_record, digest, accepted, now)
  if digest == '' then return nil end -- admin-key call, authenticated by the handler
  local f = redis.call('HMGET', key_record, 'digest', 'status', 'expires_at_ms', 'permissions', 'scope_filter')
  local reason = nil
  if not f[1] then reason = 'KEY_NOT_FOUND'
  elseif f[1] ~= digest then reason = 'INVALID_KEY'
  elseif f[2] == 'EXPIRED' then reason = 'KEY_EXPIRED'
  elseif f[2] ~= 'ACTIVE' then reason = 'KEY_REVOKED'
  elseif f[3] and f[3] ~= '' and tonumber(f[3]) <= now then reason = 'KEY_EXPIRED' end
  if reason then return err('UNAUTHORIZED', MSG.UNAUTHORIZED, reason) end
  local filter = f[5]
  if not filter or filter == '' then filter = nil end
  if accepted == '' then return nil, filter end
  local held = f[4] or ''
  for p in string.gmatch(accepted, '[^,]+') do
    if string.find(held, ',' .. p .. ',', 1, true) then return nil, filter end
  end
  return err('FORBIDDEN', MSG.PERMISSION_MISSING .. string.match(accepted, '[^,]+'))
end

-- Tenant record: nil when absent (not governed), else its status and reservation settings
-- (each at its default where the record has none); 'MALFORMED' when the status cannot be
-- determined (fail closed with 500).
local function tenant_record(key)
  local f = redis.call('HMGET', key, 'status', 'default_reservation_ttl_ms', 'max_reservation_ttl_ms',
    'max_reservation_extensions', 'default_commit_overage_policy', 'policies', 'alerts', 'observe_mode')
  if not f[1] then
    if redis.call('EXISTS', key) == 1 then return 'MALFORMED' end
    return nil
  end
  if f[1] ~= 'ACTIVE' and f[1] ~= 'SUSPENDED' and f[1] ~= 'CLOSED' then return 'MALFORMED' end
  return { status = f[1], default_ttl = tonumber(f[2]) or RULES.DEFAULT_TTL_MS, max_ttl = tonumber(f[3]) or RULES.MAX_TTL_MS,
    max_extensions = tonumber(f[4]) or RULES.MAX_EXTENSIONS, default_policy = f[5] or RULES.DEFAULT_OVERAGE_POLICY,
    policies = tonumber(f[6]) or 0, alerts = f[7], observe = f[8] }
end

-- The settings a reservation takes from its tenant (the defaults for a tenant without a record).
local function reservation_settings(tenant)
  if tenant then return tenant end
  return { default_ttl = RULES.DEFAULT_TTL_MS, max_ttl = RULES.MAX_TTL_MS, max_extensions = RULES.MAX_EXTENSIONS,
    default_policy = RULES.DEFAULT_OVERAGE_POLICY }
end

-- A stored answer in the shape of today's answers: stored results are JSON objects; those
-- written before were arrays, which `legacy` turns into the object (nil: none are expected).
local function stored_answer(json, legacy)
  if legacy and string.sub(json, 1, 1) == '[' then return legacy(cjson.decode(json)) end
  return json
end

-- The answer stored under an idempotency record (a hash with `payload_hash` and `result`): its
-- replay for the same payload hash, 409 for another payload, nil when the key is new.
local function replay(record_key, payload_hash, status, now_s, legacy)
  local prior = redis.call('HMGET', record_key, 'payload_hash', 'result')
  if not prior[1] then return nil end
  if prior[1] ~= payload_hash then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH) end
  return replayed(stored_answer(prior[2], legacy), status, now_s)
end

-- A SUSPENDED tenant may settle what it started but not start new spending.
local function suspended_guard(tenant)
  if tenant and tenant ~= 'MALFORMED' and tenant.status == 'SUSPENDED' then
    return err('FORBIDDEN', MSG.TENANT_SUSPENDED_SPENDING)
  end
  return nil
end

-- The closed-tenant guard of the persisting surface (mutations).
local function tenant_guard(t)
  if t == 'MALFORMED' then return err('INTERNAL_ERROR', MSG.TENANT_MALFORMED) end
  if t and t.status == 'CLOSED' then return err('TENANT_CLOSED', MSG.TENANT_CLOSED) end
  return nil
end

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

-- Policies. A pattern is `/`-separated segments: `level:value` matches that segment,
-- `level:*` any value of the level, `*` one or more whole segments; a pattern that starts with
-- neither `tenant:` nor `*` is matched against the end of the path (`domain::policies` says
-- the same in Rust).
local function pattern_matches(pattern, path)
  local p, s = {}, {}
  for seg in string.gmatch(pattern, '[^/]+') do p[#p + 1] = seg end
  for seg in string.gmatch(path, '[^/]+') do s[#s + 1] = seg end
  if p[1] ~= '*' and string.sub(p[1] or '', 1, 7) ~= 'tenant:' then table.insert(p, 1, '*') end
  local function segment_ok(pat, seg)
    if pat == seg then return true end
    local level = string.match(pat, '^([a-z]+:)%*$')
    return level ~= nil and string.sub(seg, 1, #level) == level
  end
  local function walk(i, j)
    if i > #p then return j > #s end
    if p[i] == '*' then
      for k = j + 1, #s + 1 do
        if walk(i + 1, k) then return true end
      end
      return false
    end
    return j <= #s and segment_ok(p[i], s[j]) and walk(i + 1, j + 1)
  end
  return walk(1, 1)
end

-- The policy settings in force for a scope path: each setting (caps, ov, ttl_d, ttl_m, ttl_x,
-- rl_r, rl_c) from the highest-priority ACTIVE policy in effect now that matches the path and
-- sets it (equal priority: the later-created policy, whose id sorts higher). Each entry is
-- {value, id}. `tenant` (its record, already read) says how many policies it has: none, and
-- nothing more is read. Given the request's `action` ({kind, risk}), also its v0.1.26 rules,
-- each from the highest-priority policy that has one for it (rules are never merged across
-- policies): `ac` the allow/deny lists (value: the policy row), `rq` the risk-class quotas of
-- the action's class, `aq` the quotas of its kind (values: the policy's lists).
local POLICY_SETTINGS = {'caps', 'ov', 'ttl_d', 'ttl_m', 'ttl_x', 'rl_r', 'rl_c'}
local function names_rule(quotas, label)
  for _, q in ipairs(quotas or {}) do
    if q.k == label then return true end
  end
  return false
end
local function policy_settings(rules_key, scope_path, now, tenant, action)
  if type(tenant) == 'table' and tenant.policies == 0 then return {} end
  local best = {}
  local function consider(f, p)
    local b = best[f]
    if not b or p.pri > b.pri or (p.pri == b.pri and p.id > b.id) then best[f] = p end
  end
  for _, row in ipairs(redis.call('HVALS', rules_key)) do
    local p = cjson.decode(row)
    if p.st == 'ACTIVE' and (not p.from or now >= p.from) and (not p['until'] or now < p['until'])
        and pattern_matches(p.pat, scope_path) then
      for _, f in ipairs(POLICY_SETTINGS) do
        if p[f] ~= nil then consider(f, p) end
      end
      if action then
        if p.allow or p.deny then consider('ac', p) end
        if names_rule(p.rq, action.risk_label) then consider('rq', p) end
        if names_rule(p.aq, action.kind) then consider('aq', p) end
      end
    end
  end
  local out = {}
  for f, p in pairs(best) do out[f] = {value = (f == 'ac') and p or p[f], id = p.id} end
  return out
end

-- A policy's per-minute rate limit on `kind` (reservations, commits) for one scope path:
-- fixed calendar-minute windows counted in a hash per minute beside the rules (it expires
-- after two minutes). nil when within the limit (and counted, unless `count` is false), else
-- 429 LIMIT_EXCEEDED with when to retry.
local function rate_check(rules_key, setting, kind, scope_path, now, count)
  if not setting then return nil end
  local minute = math.floor(now / 60000)
  local key = rules_key .. ':rate:' .. minute
  local field = kind .. '|' .. setting.id .. '|' .. scope_path
  local n = tonumber(redis.call('HGET', key, field) or '0')
  if n >= setting.value then
    local reset_ms = (minute + 1) * 60000
    return err('LIMIT_EXCEEDED', 'Rate limit of policy ' .. setting.id .. ' reached: at most ' .. setting.value ..
      ' ' .. kind .. ' per minute on scope ' .. scope_path, cjson.encode({policy_id = setting.id, limit = setting.value,
      retry_after_seconds = math.ceil((reset_ms - now) / 1000), reset_at = reset_ms / 1000}))
  end
  if count then
    redis.call('HINCRBY', key, field, 1)
    redis.call('PEXPIRE', key, 120000)
  end
  return nil
end

-- Checks that every new value fits int64, then writes all budgets (never half way): only the
-- fields that changed (Redis charges per argument) and the update time (`now_s`, the digits
-- `now_ms` returns). Given the script's scene (`scene`), a ledger whose spent grew moves its
-- burn window first (`track_burn`, defined with the alerts below).
local LEDGER_FIELDS = {'remaining', 'reserved', 'spent', 'debt'}
local track_burn
local function write_budgets(budgets, now_s, sc)
  for _, b in ipairs(budgets) do
    for _, field in ipairs(LEDGER_FIELDS) do
      if not d_fits(b[field]) then return err('INTERNAL_ERROR', 'Amount overflow on scope ' .. b.scope) end
    end
  end
  for _, b in ipairs(budgets) do
    if sc and d_cmp(b.spent, b.before.spent) > 0 then track_burn(sc, b, d_sub(b.spent, b.before.spent)) end
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

-- The ledgers of `keys` that exist; with a scene, each rolled into its current period first.
local roll_due
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

-- A reservation is one JSON string (every value a string, or an array of strings), which
-- keeps a finished reservation, replay records included, well under 1 KB. Fields:
--   codes (the budget codes of its id) status ik (reserve idempotency key) ph (its payload
--   hash) result (reserve replay) unit estimate subject scope (its scope path; absent in records
--   written before 2026-12-03) action created expires grace policy ext max_ext (grace, ext and
--   max_ext are omitted at their defaults: RULES.DEFAULT_GRACE_MS, 0, RULES.MAX_EXTENSIONS)
--   m ('1' when metadata or commit metadata is stored beside the record; older records hold
--   `metadata` and `cmeta`)
--   on commit: ck ch cr (key, payload hash, replay) charged metrics finalized
--   on release: rk rh rr reason finalized;  on expiry: expired
-- `load_record` returns the decoded record ({} when it does not decode) and its JSON as stored.
local function load_record(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local ok, rec = pcall(cjson.decode, raw)
  if not ok or type(rec) ~= 'table' then return {}, raw end
  return rec, raw
end

-- The answer of a reserve from its stored result (a copy: the caller adds the id). Records
-- written before answers were objects hold [decision, expires, caps, balances...].
local function reserve_answer(stored)
  if stored[1] == nil then
    local out = {}
    for k, v in pairs(stored) do out[k] = v end
    return out
  end
  return {decision = stored[1], expires_at_ms = stored[2], caps = (stored[3] ~= '') and stored[3] or nil,
    balances = legacy_balances(stored, 4)}
end

-- The answer of a commit or a release: its stored result with the reservation's subject and
-- unit (the handler derives the balances' scopes from them). Records written before answers
-- were objects hold [charged, released, balances...] or [released, balances...].
local function settle_answer(stored, r)
  local answer = stored
  if stored[1] ~= nil then
    if r.status == 'COMMITTED' then
      answer = {charged = stored[1], released = (stored[2] ~= '') and stored[2] or nil, balances = legacy_balances(stored, 3)}
    else
      answer = {released = stored[1], balances = legacy_balances(stored, 2)}
    end
  end
  local out = {subject = r.rec.subject, unit = r.unit}
  for k, v in pairs(answer) do out[k] = v end
  return out
end

local function save_record(key, rec)
  redis.call('SET', key, cjson.encode(rec), 'KEEPTTL')
end

local LEVELS = {'tenant', 'workspace', 'app', 'workflow', 'agent', 'toolset'}

-- The deepest canonical scope of a subject (levels in order, values lower-cased), as the
-- handlers derive it; for records written before they kept their scope path.
local function scope_path_of(subject)
  local parts = {}
  for _, level in ipairs(LEVELS) do
    if type(subject[level]) == 'string' then parts[#parts + 1] = level .. ':' .. string.lower(subject[level]) end
  end
  return table.concat(parts, '/')
end

-- The request's scope path (its deepest derived scope), from the last "<scope>|<code>"
-- argument the handler passes; a subject always has at least one level.
local function request_scope(scopes)
  return string.match(scopes[#scopes], '^(.*)|')
end

-- A key's scope_filter (JSON array of `kind:value` / `kind:*` segments, as `authorize`
-- returns it), decoded and lower-cased; nil when it admits every scope.
local function scope_filter(raw)
  if not raw then return nil end
  local ok, filter = pcall(cjson.decode, raw)
  if not ok or type(filter) ~= 'table' or #filter == 0 then return nil end
  for i, entry in ipairs(filter) do filter[i] = string.lower(entry) end
  return filter
end

-- Whether a decoded filter admits a scope: some entry names one of its segments exactly, or
-- (`kind:*`) the kind of one of them.
local function admits(filter, scope)
  for _, entry in ipairs(filter) do
    local kind = string.match(entry, '^([^:]+:)%*$')
    for segment in string.gmatch(scope, '[^/]+') do
      if segment == entry or (kind and string.sub(segment, 1, #kind) == kind) then return true end
    end
  end
  return false
end

-- The filter must admit the scope an operation targets, else 403. Callers skip
-- it when the key has no filter: `denied = filter and scope_guard(filter, scope)`.
local function scope_guard(raw, scope)
  local filter = scope_filter(raw)
  if not filter or admits(filter, scope) then return nil end
  return err('FORBIDDEN', MSG.SCOPE_NOT_ADMITTED .. scope)
end

-- Reads a reservation; nil when absent (or when the id does not match the record). A record
-- whose essential fields do not parse is returned with `corrupt` set (never acted on:
-- callers quarantine or fail).
local STATUSES = {ACTIVE = true, COMMITTED = true, RELEASED = true, EXPIRED = true}
local function read_reservation(key, rid)
  local rec, raw = load_record(key)
  if not rec then return nil end
  -- The id names the ledgers whose keys the caller declared: it must be this record's id.
  if rec.codes ~= nil and rec.codes ~= string.match(rid, '^[^.]*%.[^.]*%.(.*)$') then return nil end
  local r = { rec = rec, raw = raw, rid = rid, status = rec.status, unit = rec.unit, estimate = rec.estimate,
    expires_at = tonumber(rec.expires), grace = tonumber(rec.grace) or RULES.DEFAULT_GRACE_MS, policy = rec.policy,
    extensions = tonumber(rec.ext or '0'), max_extensions = tonumber(rec.max_ext) or RULES.MAX_EXTENSIONS,
    created_at = tonumber(rec.created) }
  -- Records keep their scope path since 2026-12-03; older ones derive it from the subject.
  r.scope_path = rec.scope
  if not r.scope_path then
    local subject_ok, subject = pcall(cjson.decode, rec.subject or '')
    if subject_ok and type(subject) == 'table' then r.scope_path = scope_path_of(subject) end
  end
  if not (rec.codes and r.scope_path and r.expires_at and r.grace and r.created_at and STATUSES[r.status] and type(r.estimate) == 'string'
      and string.match(r.estimate, '^%d+$') and d_fits(r.estimate)) then
    r.corrupt = true
  end
  return r
end

-- Calendar arithmetic in UTC, proleptic Gregorian (Lua in Redis has no os.date): the date of a
-- day number (days since 1970-01-01) and back.
local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  return yoe + era * 400 + ((m <= 2) and 1 or 0), m, d
end

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end

-- RFC 3339 UTC with milliseconds, from epoch ms.
local function iso8601(ms)
  local secs, frac = math.floor(ms / 1000), ms % 1000
  local days, rem = math.floor(secs / 86400), secs % 86400
  local y, m, d = civil_from_days(days)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(rem / 3600),
    math.floor(rem % 3600 / 60), rem % 60, frac)
end

-- Appends an event (the spec's `Event` JSON) to the tenant's event stream, in the same script
-- as the state change that causes it. `data_json` is pre-built JSON (amounts as raw digits).
-- `ctx` carries the causing request (request_id, trace_id, actor, key_id, tenant); nil for
-- system work such as the expiry sweep.
local function emit(events_key, event_type, tenant, scope, ctx, source, data_json, now)
  -- The id names the stream entry and the tenant (evt_<ms>-<seq>.<tenant>), so getEvent finds
  -- an event with one read; the entry id is chosen here (monotonic even if TIME steps back).
  local last = redis.call('XREVRANGE', events_key, '+', '-', 'COUNT', 1)[1]
  local ms, seq = now, 0
  if last then
    local lms, lseq = string.match(last[1], '^(%d+)-(%d+)$')
    lms, lseq = tonumber(lms), tonumber(lseq)
    if lms >= now then ms, seq = lms, lseq + 1 end
  end
  local entry = string.format('%d-%d', ms, seq)
  local event_id = 'evt_' .. entry .. '.' .. tenant
  -- quota.* (v0.1.26) belong to the reservation path: EventCategory has no `quota`
  local category = string.match(event_type, '^([^.]+)')
  if category == 'quota' then category = 'reservation' end
  local actor = '{"type":' .. cjson.encode((ctx and ctx.actor) or 'system')
  if ctx and ctx.key_id and ctx.key_id ~= '' then actor = actor .. ',"key_id":' .. cjson.encode(ctx.key_id) end
  local json = '{"event_id":' .. cjson.encode(event_id) .. ',"event_type":' .. cjson.encode(event_type) ..
    ',"category":' .. cjson.encode(category) .. ',"timestamp":"' .. iso8601(now) .. '","tenant_id":' ..
    cjson.encode(tenant) .. (scope and (',"scope":' .. cjson.encode(scope)) or '') ..
    ',"actor":' .. actor .. '},"source":' .. cjson.encode(source) .. ',"data":' .. data_json
  if ctx then
    if ctx.request_id and ctx.request_id ~= '' then json = json .. ',"request_id":' .. cjson.encode(ctx.request_id) end
    if ctx.trace_id and ctx.trace_id ~= '' then json = json .. ',"trace_id":' .. cjson.encode(ctx.trace_id) end
    if ctx.correlation_id then json = json .. ',"correlation_id":' .. cjson.encode(ctx.correlation_id) end
  end
  json = json .. '}'
  -- the inbound traceparent flags travel beside the (closed) Event, for the outbound traceparent
  local flags = ctx and ctx.trace_flags
  if flags and flags ~= '' then
    redis.call('XADD', events_key, entry, 'type', event_type, 'event', json, 'flags', flags)
  else
    redis.call('XADD', events_key, entry, 'type', event_type, 'event', json)
  end
  -- The overview's counters (`ops::overview`), kept with the event so that it never reads the
  -- stream: per hour, "<minute>|<category>" and "<minute>|denied|<reason>" counts (the hash
  -- lives two hours), and the ten latest denials and expiries.
  local minute = math.floor(ms / 60000)
  local stats = events_key .. ':stats:' .. math.floor(minute / 60)
  redis.call('HINCRBY', stats, minute .. '|' .. category, 1)
  if event_type == 'reservation.denied' or event_type == 'reservation.expired' then
    if event_type == 'reservation.denied' then
      local reason = string.match(data_json, '"reason_code":"([A-Z_]+)"') or 'UNKNOWN'
      redis.call('HINCRBY', stats, minute .. '|denied|' .. reason, 1)
    end
    local recent = events_key .. ':recent:' .. event_type
    redis.call('LPUSH', recent, json)
    redis.call('LTRIM', recent, 0, 9)
  end
  redis.call('EXPIRE', stats, 7200, 'NX')
end

-- The listing index of a tenant (one sorted set, all scores 0, read BYLEX) holds, per
-- reservation, one status member "<S><T><token>" (S: A, C, E or R for ACTIVE, COMMITTED,
-- EXPIRED, RELEASED; T: 0 when its subject names a tenant, else 1) and three value members:
-- "r<estimate, 19 digits><token>", "p<scope path>\0<token>" and "x<expires_at_ms, 13
-- digits><token>", so every sort order of the listing is a walk of ranges of it (the created
-- index serves created_at).
local STATUS_MARK = {ACTIVE = 'A', COMMITTED = 'C', EXPIRED = 'E', RELEASED = 'R'}

local function padded(digits, width)
  return string.rep('0', width - #digits) .. digits
end

local function token_of(rid)
  return string.match(rid, '^[^.]+%.([^.]+)%.')
end

-- '0' when a stored subject names a tenant, else '1'. Subjects are stored as the handler
-- serialized them, fields in canonical order, so a tenant is always the first field.
local function tenant_mark(subject_json)
  if string.sub(subject_json, 1, 10) == '{"tenant":' then return '0' end
  return '1'
end

-- The members of one reservation: `status`, `subject` (JSON), `estimate` (digits), `scope`
-- and `expires` (digits).
local function list_members(token, status, subject, estimate, scope, expires)
  return {STATUS_MARK[status] .. tenant_mark(subject) .. token, 'r' .. padded(estimate, 19) .. token,
    'p' .. scope .. '\0' .. token, 'x' .. padded(expires, 13) .. token}
end

local function list_add(list_key, members)
  local args = {}
  for _, m in ipairs(members) do args[#args + 1] = 0; args[#args + 1] = m end
  redis.call('ZADD', list_key, unpack(args))
end

-- A reservation's status member moves with its status (`r` as `read_reservation` returns it).
local function list_status(list_key, r, to)
  local token, t = token_of(r.rid), tenant_mark(r.rec.subject or '')
  redis.call('ZREM', list_key, STATUS_MARK[r.status] .. t .. token)
  redis.call('ZADD', list_key, 0, STATUS_MARK[to] .. t .. token)
end

-- Keys of a finished reservation are kept `ttl` ms: the record, and its metadata when it has
-- some (`rec.m`).
local function keep_finished(record_key, meta_key, rec, ttl)
  redis.call('PEXPIRE', record_key, ttl)
  if rec.m then redis.call('PEXPIRE', meta_key, ttl) end
end

-- The request context scripts receive as one JSON argument (strings only).
local function request_context(json)
  local ok, ctx = pcall(cjson.decode, json)
  if ok and type(ctx) == 'table' then return ctx end
  return nil
end

local function ratio(a, b)
  local x, y = tonumber(a), tonumber(b)
  if not y or y == 0 then return '0' end
  return string.format('%.4f', x / y)
end

-- Appends an audit entry to its owner's audit stream (in the tenant's slot) in the same step as
-- the change it records. `ctx` (the request context) names the operation, its caller and the
-- status the request answers; `action` says what this entry changed (a cascade writes several).
local function audit(key, ctx, action, resource_type, resource_id, now, details)
  -- a bulk action's rows: the invocation's one entry is written apart, with every row's outcome
  if ctx and ctx.bulk then return end
  ctx = ctx or {}
  local entry = { timestamp_ms = now, tenant_id = ctx.tenant or '', operation = ctx.operation or action,
    status = tonumber(ctx.status) or 200, resource_type = resource_type, resource_id = resource_id,
    key_id = ctx.key_id or '', request_id = ctx.request_id or '', trace_id = ctx.trace_id or '',
    user_agent = ctx.user_agent, source_ip = ctx.source_ip, actor_type = ctx.actor or 'system', action = action,
    correlation_id = ctx.correlation_id, details = details }
  redis.call('XADD', key, '*', 'entry', cjson.encode(entry))
end

-- Ledger state as EventDataBudgetLifecycle's previous_state/new_state (amounts as raw digits).
local function ledger_state(b, with_reserved)
  return '{"allocated":' .. b.allocated .. ',"remaining":' .. b.remaining .. ',"debt":' .. b.debt ..
    ',"spent":' .. b.spent .. (with_reserved and (',"reserved":' .. b.reserved) or '') ..
    ',"status":"' .. b.status .. '"}'
end

-- budget.over_limit_entered / budget.over_limit_exited when a write flips the flag: a runtime
-- change, an admin write or a period roll (`source`, else 'cycles-admin').
local function over_limit_events(events_key, ctx, b, tenant, now, source)
  if b.over == b.before.over then return end
  local kind = b.over and 'budget.over_limit_entered' or 'budget.over_limit_exited'
  emit(events_key, kind, tenant, b.scope, ctx, source or 'cycles-admin',
    '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","debt":' .. b.debt ..
    ',"overdraft_limit":' .. b.overdraft_limit .. ',"is_over_limit":' .. tostring(b.over) ..
    ',"debt_utilization":' .. ratio(b.debt, b.overdraft_limit) .. '}', now)
end

-- ---------------------------------------------------------------------------------------------
-- Alerts and budget periods. A script that changes ledgers carries a scene: its tenant's event
-- stream and key prefix, the tenant's name (tenant ids need no escaping in keys) and record, the
-- request context (nil for system work) and Redis's clock. Every key below shares the tenant's
-- prefix, so its slot. A context given as its JSON text is decoded only when an event needs it.

local LAZY_CONTEXT = {__index = function(sc, field)
  if field ~= 'ctx' then return nil end
  local ctx = request_context(sc.raw_ctx) or false
  rawset(sc, 'ctx', ctx)
  return ctx
end}

local function scene(events_key, ctx, now, tenant, name)
  local prefix = string.match(events_key, '^(cy:{[^}]*})')
  local sc = {events = events_key, prefix = prefix, now = now, tenant = tenant,
    name = name or string.match(prefix, '^cy:{(.*)}$')}
  if type(ctx) == 'string' then
    sc.raw_ctx = ctx
    return setmetatable(sc, LAZY_CONTEXT)
  end
  sc.ctx = ctx
  return sc
end

-- The alert settings in force for the scene's tenant: its record's `alerts` (the union of its
-- webhook subscriptions' thresholds, kept by the webhook writes), over the spec's defaults.
local function alert_settings(sc)
  if sc.cfg then return sc.cfg end
  local raw = (type(sc.tenant) == 'table') and sc.tenant.alerts
  if raw == nil then raw = redis.call('HGET', sc.prefix .. ':tenant', 'alerts') end
  local cfg = RULES.ALERTS
  if raw then
    local ok_, own = pcall(cjson.decode, raw)
    if ok_ and type(own) == 'table' then
      for k, v in pairs(RULES.ALERTS) do if own[k] == nil then own[k] = v end end
      cfg = own
    end
  end
  sc.cfg = cfg
  return cfg
end

-- (spent + reserved) / allocated; nil for a ledger without an allocation.
local function utilization(allocated, spent, reserved)
  local a = tonumber(allocated)
  if not a or a <= 0 then return nil end
  return (tonumber(spent) + tonumber(reserved)) / a
end

-- budget.threshold_crossed for each threshold the ledger's utilization crossed since `from` (a
-- state with allocated, spent and reserved): rising from below to at-or-above, falling the
-- other way. A change that leaves the utilization on one side of a threshold emits nothing,
-- so each crossing is announced once per direction.
local function threshold_events(sc, b, from)
  local u0 = utilization(from.allocated, from.spent, from.reserved)
  local u1 = utilization(b.allocated, b.spent, b.reserved)
  if not u0 or not u1 or u0 == u1 then return end
  for _, t in ipairs(alert_settings(sc).th) do
    local dir = nil
    if u0 < t and u1 >= t then dir = 'rising' elseif u0 >= t and u1 < t then dir = 'falling' end
    if dir then
      emit(sc.events, 'budget.threshold_crossed', sc.name, b.scope, sc.ctx, 'cycles-server',
        '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","threshold":' .. t ..
        ',"utilization":' .. string.format('%.4f', u1) .. ',"allocated":' .. b.allocated .. ',"remaining":' ..
        b.remaining .. ',"spent":' .. b.spent .. ',"reserved":' .. b.reserved .. ',"direction":"' .. dir .. '"}', sc.now)
    end
  end
end

-- A ledger's burn window, kept in its `burn` field as "<window start>:<spend>:<baseline>:
-- <closed windows>:<alerted>": tumbling windows of burn_rate_window_seconds, and a baseline that
-- is the exponential average of the closed windows' spend (weight 1/12, empty windows
-- included). When this window's spend reaches burn_rate_multiplier x the baseline (after
-- RULES.ALERTS.min_burn_windows windows of history), `b.anomaly` is set for
-- budget.burn_rate_anomaly, once per window.
local BURN_WEIGHT = 1 / 12
track_burn = function(sc, b, delta)
  local cfg = alert_settings(sc)
  local w, now = cfg.bw * 1000, sc.now
  local ws, spend, base, n, alerted = string.match(b.burn or '', '^(%d+):([^:]+):([^:]+):(%d+):(%d)$')
  ws, spend, base, n = tonumber(ws), tonumber(spend), tonumber(base), tonumber(n)
  if not (ws and spend and base and n) then ws, spend, base, n, alerted = now - now % w, 0, 0, 0, '0' end
  if now >= ws + w then
    local k = math.floor((now - ws) / w)
    if n == 0 then base = spend else base = base + BURN_WEIGHT * (spend - base) end
    base = base * (1 - BURN_WEIGHT) ^ (k - 1)
    ws, spend, n, alerted = ws + k * w, 0, n + k, '0'
  end
  spend = spend + tonumber(delta)
  if alerted == '0' and n >= RULES.ALERTS.min_burn_windows and base >= 1 and spend >= cfg.bm * base then
    alerted = '1'
    local minutes = w / 60000
    local rate = spend / minutes
    b.anomaly = '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","current_rate":' ..
      string.format('%.4f', rate) .. ',"baseline_rate":' .. string.format('%.4f', base / minutes) ..
      ',"multiplier":' .. string.format('%.4f', spend / base) .. ',"window_seconds":' .. itoa(cfg.bw) ..
      ',"projected_exhaustion_minutes":' .. string.format('%.4f', math.max(tonumber(b.remaining), 0) / rate) .. '}'
  end
  b.burn = string.format('%d:%.17g:%.17g:%d:%s', ws, spend, base, n, alerted)
end

-- Windowed counters of a tenant for the rate spikes: per tenth of its rate window one hash of
-- counts (n: reservation attempts, d: their denials, x: expiries, a: other API-key writes,
-- f: authentication failures) that expires after eleven tenths, so a tenant's counters take
-- at most eleven small hashes whatever its traffic.
local function count(sc, field)
  local size = alert_settings(sc).rw * 100
  local key = sc.prefix .. ':rt:' .. size .. ':' .. math.floor(sc.now / size)
  local n = redis.call('HINCRBY', key, field, 1)
  if n == 1 then redis.call('PEXPIRE', key, size * 11) end
  return n
end

local SPIKES = {
  d = {metric = 'denial_rate', event = 'reservation.denial_rate_spike', setting = 'dr'},
  x = {metric = 'expiry_rate', event = 'reservation.expiry_rate_spike', setting = 'er'},
  f = {metric = 'auth_failure_rate', event = 'api_key.auth_failure_rate_spike', setting = 'ar'},
}

-- After a count of `field` (d, x or f): the share over the last window (ten tenths) of
-- denials among reservation attempts, of expiries among reservations made, or of failures
-- among authentications; above its threshold, with at least RULES.ALERTS.min_samples in the
-- window, the spike event, at most once per window.
local function spike_check(sc, field)
  local cfg, s = alert_settings(sc), SPIKES[field]
  local window = cfg.rw * 1000
  local alerted = sc.prefix .. ':alerted'
  if sc.now < tonumber(redis.call('HGET', alerted, s.metric) or '0') + window then return end
  local size = cfg.rw * 100
  local last = math.floor(sc.now / size)
  local t = {0, 0, 0, 0, 0}
  for i = last - 9, last do
    local v = redis.call('HMGET', sc.prefix .. ':rt:' .. size .. ':' .. i, 'n', 'd', 'x', 'a', 'f')
    for j = 1, 5 do t[j] = t[j] + (tonumber(v[j]) or 0) end
  end
  local hits, total
  if field == 'd' then hits, total = t[2], t[1]
  elseif field == 'x' then hits, total = t[3], math.max(t[1] - t[2], t[3])
  else hits, total = t[5], t[1] + t[4] + t[5] end
  if total < RULES.ALERTS.min_samples or hits / total <= cfg[s.setting] then return end
  redis.call('HSET', alerted, s.metric, itoa(sc.now))
  redis.call('PEXPIRE', alerted, 2 * 86400000)
  emit(sc.events, s.event, sc.name, nil, nil, 'cycles-server', '{"metric":"' .. s.metric .. '","current_rate":' ..
    string.format('%.4f', hits / total) .. ',"threshold_rate":' .. cfg[s.setting] .. ',"window_seconds":' ..
    itoa(cfg.rw) .. ',"sample_count":' .. itoa(total) .. '}', sc.now)
end

-- A counted occurrence that may make a spike (d, x, f). The window is looked at for each of
-- the first occurrences of a tenth, then for every tenth one, so a burst (a sweep expiring
-- thousands) pays about one look per ten.
local function count_and_check(sc, field)
  local n = count(sc, field)
  if n <= RULES.ALERTS.min_samples or n % 10 == 0 then spike_check(sc, field) end
end

-- An ACTIVE key (`k`: its key_id, name, status, expires_at_ms) past its expiry becomes
-- EXPIRED, with api_key.expired and an audit row.
local function expire_key(sc, key, k)
  redis.call('HSET', key, 'status', 'EXPIRED')
  emit(sc.events, 'api_key.expired', sc.name, nil, nil, 'cycles-server', '{"key_id":' .. cjson.encode(k[1]) ..
    ',"key_name":' .. cjson.encode(k[2] or '') .. ',"previous_status":"ACTIVE","new_status":"EXPIRED"}', sc.now)
  audit(sc.prefix .. ':auditlog', {tenant = sc.name, operation = 'expireApiKey', actor = 'system', status = 200},
    'api_key.expire', 'api_key', k[1], sc.now)
end

-- The end of the period after one ending at `end_ms`: `every` is its length in ms, or 'M'
-- (monthly: on day `day` of the next month, or its last day when it is shorter; without a
-- day, the day `end_ms` falls on).
local function next_period_end(end_ms, every, day)
  if every ~= 'M' then return end_ms + tonumber(every) end
  local days, rem = math.floor(end_ms / 86400000), end_ms % 86400000
  local y, m, d = civil_from_days(days)
  day = tonumber(day) or d
  if m == 12 then y, m = y + 1, 1 else m = m + 1 end
  local length = (m == 12) and (days_from_civil(y + 1, 1, 1) - days_from_civil(y, 12, 1))
    or (days_from_civil(y, m + 1, 1) - days_from_civil(y, m, 1))
  return days_from_civil(y, m, math.min(day, length)) * 86400000 + rem
end

-- Rolls a recurring ledger whose period has ended into the current one, a period at a time,
-- as RESET_SPENT does: spent cleared, holds and debt kept, and the allocation per
-- rollover_policy: NONE the base allocation, CARRY_FORWARD the base plus what was unused
-- (remaining above zero), CAP_AT_ALLOCATED the base plus the unused part up to the base. The
-- base is the allocation less what the previous roll carried in. Each roll writes
-- budget.reset_spent and an audit row; the new period is written at once, so no period is
-- ever rolled twice. At most RULES.MAX_ROLLS rolls per call.
local function roll_period(sc, b)
  local f = redis.call('HMGET', b.key, 'period_every', 'period_start_ms', 'rollover_policy', 'period_carried', 'ledger_id',
    'period_day')
  if not f[1] or b.status == 'CLOSED' then
    redis.call('HDEL', b.key, 'roll_at_ms')
    redis.call('ZREM', sc.prefix .. ':periods', b.key)
    b.roll_at = nil
    return
  end
  local from = {allocated = b.allocated, spent = b.spent, reserved = b.reserved}
  local every, policy, ledger_id = f[1], f[3] or 'NONE', f[5] or ''
  local start_ms, end_ms, carried = tonumber(f[2]), tonumber(b.roll_at), f[4] or '0'
  local actx = {tenant = sc.name, operation = 'rollBudgetPeriod', actor = 'system', status = 200,
    request_id = sc.ctx and sc.ctx.request_id, trace_id = sc.ctx and sc.ctx.trace_id}
  local rolls = 0
  while end_ms <= sc.now and rolls < RULES.MAX_ROLLS do
    rolls = rolls + 1
    local before = ledger_state(b, true)
    local base = d_max(d_sub(b.allocated, carried), '0')
    local unused = d_max(b.remaining, '0')
    local carry = '0'
    if policy == 'CARRY_FORWARD' then carry = unused elseif policy == 'CAP_AT_ALLOCATED' then carry = d_min(unused, base) end
    if not d_fits(d_add(base, carry)) then carry = '0' end
    b.allocated, b.spent, carried = d_add(base, carry), '0', carry
    b.remaining = d_sub(d_sub(b.allocated, b.reserved), b.debt)
    start_ms, end_ms = end_ms, next_period_end(end_ms, every, f[6])
    emit(sc.events, 'budget.reset_spent', sc.name, b.scope, nil, 'cycles-periods', '{"ledger_id":' ..
      cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit ..
      '","operation":"RESET_SPENT","previous_state":' .. before .. ',"new_state":' .. ledger_state(b, true) ..
      ',"spent_override_provided":false,"reason":"period rollover (' .. policy .. ')"}', sc.now)
    audit(sc.prefix .. ':auditlog', actx, 'budget.roll_period', 'budget', ledger_id, sc.now,
      {period_start = iso8601(start_ms), period_end = iso8601(end_ms), rollover_policy = policy, carried = carry})
  end
  local start_s, end_s = itoa(start_ms), itoa(end_ms)
  -- a new period is judged afresh, as RESET_SPENT does: over the limit only while the debt is
  b.over = d_cmp(b.debt, b.overdraft_limit) > 0
  redis.call('HSET', b.key, 'allocated', b.allocated, 'remaining', b.remaining, 'spent', b.spent, 'period_start_ms',
    start_s, 'period_end_ms', end_s, 'roll_at_ms', end_s, 'period_carried', carried, 'is_over_limit', tostring(b.over),
    'updated_at_ms', itoa(sc.now))
  over_limit_events(sc.events, nil, b, sc.name, sc.now, 'cycles-periods')
  redis.call('ZADD', sc.prefix .. ':periods', end_ms, b.key)
  b.roll_at = end_s
  b.before.allocated, b.before.remaining, b.before.spent, b.before.over = b.allocated, b.remaining, b.spent, b.over
  threshold_events(sc, b, from)
end

-- After a write of a ledger's period fields: a recurring ledger is due at its period's end
-- (`roll_at_ms`, the tenant's periods index and its slot's due index, which the sweep reads);
-- any other is due never.
local function schedule_period(key, due_index, tenant)
  local f = redis.call('HMGET', key, 'period_every', 'period_end_ms', 'status')
  local periods = string.match(key, '^(cy:{[^}]*})') .. ':periods'
  if f[1] and f[2] and f[3] ~= 'CLOSED' then
    redis.call('HSET', key, 'roll_at_ms', f[2])
    redis.call('ZADD', periods, f[2], key)
    redis.call('ZADD', due_index, 'LT', f[2], tenant)
  else
    redis.call('HDEL', key, 'roll_at_ms')
    redis.call('ZREM', periods, key)
  end
end

-- Rolls the ledger first when its period has ended (every script that changes a ledger).
roll_due = function(sc, b)
  if sc and b.roll_at and tonumber(b.roll_at) <= sc.now then roll_period(sc, b) end
end

-- A released or expired reservation gives its per_run action calls back (v0.1.26 quotas; never
-- below 0, and a counter that has expired stays gone). `prefix` is the tenant's key prefix.
local function uncount_runs(prefix, rec)
  if type(rec.qrun) ~= 'table' then return end
  for _, member in ipairs(rec.qrun) do
    local key = prefix .. ':q:' .. member
    if tonumber(redis.call('HGET', key, 'n') or '0') > 0 then redis.call('HINCRBY', key, 'n', -1) end
  end
end

-- Expires an ACTIVE reservation past expires_at + grace: its hold returns to every budgeted
-- scope exactly once. Used by every script that touches a reservation, and by the sweep.
-- `ix`: the reservation's record and meta keys and the tenant's expiry, event and listing keys
-- (`record`, `meta`, `expiry`, `events`, `list`).
local function expire_if_overdue(r, budget_keys, ix, now, retention_ms)
  if r.status ~= 'ACTIVE' or now <= r.expires_at + r.grace then return false end
  local tenant = string.match(r.rid, '^([^.]+)%.')
  local sc = ix.sc or scene(ix.events, nil, now, ix.tenant, tenant)
  local budgets = read_budgets(budget_keys, sc)
  for _, b in ipairs(budgets) do
    b.reserved = d_sub(b.reserved, r.estimate)
    b.remaining = d_add(b.remaining, r.estimate)
  end
  local e = write_budgets(budgets, itoa(now))
  if e then error(e[3]) end
  r.rec.status, r.rec.expired = 'EXPIRED', tostring(now)
  uncount_runs(sc.prefix, r.rec)
  save_record(ix.record, r.rec)
  keep_finished(ix.record, ix.meta, r.rec, retention_ms)
  redis.call('ZREM', ix.expiry, r.rid)
  list_status(ix.list, r, 'EXPIRED')
  r.status = 'EXPIRED'
  local data = '{"reservation_id":' .. cjson.encode(r.rid) .. ',"scope":' .. cjson.encode(r.scope_path) ..
    ',"unit":' .. cjson.encode(r.unit) .. ',"estimated_amount":' .. r.estimate .. ',"created_at":"' ..
    iso8601(r.created_at) .. '","expired_at":"' .. iso8601(now) .. '","ttl_ms":' ..
    string.format('%d', r.expires_at - r.created_at) .. ',"extensions_used":' .. string.format('%d', r.extensions) .. '}'
  emit(ix.events, 'reservation.expired', tenant, r.scope_path, nil, 'cycles-expiry', data, now)
  for _, b in ipairs(budgets) do threshold_events(sc, b, b.before) end
  count_and_check(sc, 'x')
  return true
end

-- The opening every script on one reservation (commit, release, extend) shares, in order: the
-- key check, the record (404), the key's scope filter, the answer to an earlier identical
-- request (`replay_of(r)` gives it, or nil), the tenant guard, and expiry on touch; then only
-- an ACTIVE reservation goes on. `K` and `A` are the script's keys and arguments, named alike
-- in the three. Returns the reservation, or nil and the answer to give.
local function open_reservation(K, A, now, replay_of)
  local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
  if denied then return nil, denied end
  local r = read_reservation(K.reservation, A.reservation_id)
  if not r then return nil, err('NOT_FOUND', MSG.RESERVATION_NOT_FOUND) end
  denied = filter and scope_guard(filter, r.scope_path)
  if denied then return nil, denied end
  local answer = replay_of(r)
  if answer then return nil, answer end
  r.tenant = tenant_record(K.tenant)
  local guard = tenant_guard(r.tenant)
  if guard then return nil, guard end
  if r.corrupt then return nil, err('INTERNAL_ERROR', MSG.RESERVATION_CORRUPT) end
  r.sc = scene(K.events, A.context, now, r.tenant)
  if A.digest ~= '' then count(r.sc, 'a') end
  local ix = {record = K.reservation, meta = K.meta, expiry = K.expiry_index, events = K.events, list = K.listing_index,
    tenant = r.tenant}
  expire_if_overdue(r, K.budgets, ix, now, tonumber(A.record_ttl_ms))
  if r.status == 'EXPIRED' then return nil, err('RESERVATION_EXPIRED', MSG.RESERVATION_EXPIRED) end
  if r.status ~= 'ACTIVE' then return nil, err('RESERVATION_FINALIZED', MSG.RESERVATION_FINALIZED .. r.status) end
  return r
end

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

-- reservation.denied for a denied evaluation `e` (live reserve, dry_run, decide; `A` its
-- arguments): the scope that denied, else the deepest derived scope; and the denial counted
-- for the denial-rate alert.
-- JSON of a table holding a DenyDetail: budget_remaining (kept as digits) becomes a number.
local function detail_json(t)
  return (string.gsub(cjson.encode(t), '"budget_remaining":"(%-?%d+)"', '"budget_remaining":%1'))
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

-- Budget events on real transitions of the budgets a script just wrote: remaining reached 0
-- (budget.exhausted), is_over_limit turned on (budget.over_limit_entered; the runtime never
-- turns it off), debt grew
-- (budget.debt_incurred, with `reservation_id` when a commit caused it), a utilization
-- threshold crossed (budget.threshold_crossed), a burn-rate anomaly (`track_burn`). They are
-- written only by the script that makes the change, never on a replay, so a request never
-- writes one twice.
local function budget_events(sc, budgets, unit, reservation_id, policy)
  local events_key, now, tenant = sc.events, sc.now, sc.name
  for _, b in ipairs(budgets) do
    threshold_events(sc, b, b.before)
    if b.anomaly then
      emit(events_key, 'budget.burn_rate_anomaly', tenant, b.scope, sc.ctx, 'cycles-server', b.anomaly, now)
    end
    if d_pos(b.before.remaining) and b.remaining == '0' then
      local used = d_add(b.spent, b.reserved)
      emit(events_key, 'budget.exhausted', tenant, b.scope, sc.ctx, 'cycles-server',
        '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. unit .. '","threshold":1.0,"utilization":' .. ratio(used, b.allocated) ..
        ',"allocated":' .. b.allocated .. ',"remaining":' .. b.remaining .. ',"spent":' .. b.spent ..
        ',"reserved":' .. b.reserved .. ',"direction":"rising"}', now)
    end
    over_limit_events(events_key, sc.ctx, b, tenant, now, 'cycles-server')
    if d_cmp(b.debt, b.before.debt) > 0 then
      emit(events_key, 'budget.debt_incurred', tenant, b.scope, sc.ctx, 'cycles-server',
        '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. unit .. '"' ..
        (reservation_id and (',"reservation_id":' .. cjson.encode(reservation_id)) or '') ..
        ',"debt_incurred":' .. d_sub(b.debt, b.before.debt) .. ',"total_debt":' .. b.debt ..
        ',"overdraft_limit":' .. b.overdraft_limit .. ',"overage_policy":"' .. policy .. '"}', now)
    end
  end
end

-- ---------------------------------------------------------------------------------------------
-- Operator plane helpers

-- A hash record as one JSON object of strings (scripts hand records back this way).
local function record_json(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then return '{}' end
  local t = {}
  for i = 1, #flat, 2 do t[flat[i]] = flat[i + 1] end
  return cjson.encode(t)
end

-- HSET of a table of string fields; '' values delete the field (an optional cleared).
local function write_fields(key, fields)
  local set, del = {}, {}
  for f, v in pairs(fields) do
    if v == '' then del[#del + 1] = f else set[#set + 1] = f; set[#set + 1] = v end
  end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
  if #del > 0 then redis.call('HDEL', key, unpack(del)) end
end

-- A JSON array of strings from a ",a,b," list (cjson would encode an empty table as {}).
local function csv_json(csv)
  local out = {}
  for v in string.gmatch(csv or '', '[^,]+') do out[#out + 1] = cjson.encode(v) end
  return '[' .. table.concat(out, ',') .. ']'
end

-- The owning tenant of an admin mutation: TENANT_CLOSED for a closed one, 500 for a
-- malformed record; `missing` is the error for an unknown tenant.
local function owner_guard(tenant_key, missing)
  local t = tenant_record(tenant_key)
  if t == 'MALFORMED' then return nil, err('INTERNAL_ERROR', MSG.TENANT_MALFORMED) end
  if not t then return nil, missing end
  if t.status == 'CLOSED' then return nil, err('TENANT_CLOSED', MSG.TENANT_CLOSED) end
  return t, nil
end

-- Writes a ledger's amounts, flag, status and update time (after d_fits checks by the caller).
local function save_ledger(b, now)
  redis.call('HSET', b.key, 'allocated', b.allocated, 'remaining', b.remaining, 'reserved', b.reserved,
    'spent', b.spent, 'debt', b.debt, 'overdraft_limit', b.overdraft_limit, 'is_over_limit', b.over and 'true' or 'false',
    'status', b.status, 'updated_at_ms', tostring(now))
end


-- ---------------------------------------------------------------------------------------------
-- Action authority (protocol v0.1.26): allow/deny lists, risk-class and per-kind quotas,
-- DenyDetail and observe mode. `G` is the request's action as the handler resolved it
-- (`A.governance`): kind, risk (its risk class), risk_label ("__risk__:<class>"), keys (the
-- policy keys its kind declares), run (subject.dimensions.run_id or ''), observe (the
-- request's observe_mode or ''), sampled (whether an observed ALLOW is written), rate (the
-- sample rate when below 1).
--
-- Quota counters are hashes `<prefix>:q:<scope>|<kind or __risk__:class>|<window>|<bucket>`
-- (n: used, lim, pol, last: last increment ms, ttl: per_run TTL, al: threshold announced),
-- indexed by member in `<prefix>:quotas` (lexicographic, for listing) and by cleanup deadline
-- in `<prefix>:quotas:due` (each new counter prunes up to two dead ones, so the indexes hold
-- about the live counters only).

local QUOTA_TTL_MS = {per_minute_tumbling = 120000, per_hour_tumbling = 3660000, per_day_tumbling = 90000000,
  per_tenant_per_day = 90000000}
local BUCKET_LEN = {per_minute_tumbling = 16, per_hour_tumbling = 13, per_day_tumbling = 10, per_tenant_per_day = 10}

local function governance(raw)
  local ok_, G = pcall(cjson.decode, raw or '')
  if not ok_ or type(G) ~= 'table' or not G.kind then return nil end
  G.risk_label = '__risk__:' .. G.risk
  if type(G.keys) ~= 'table' then G.keys = {} end
  return G
end

-- A counter's index member in parts: scope, label (the kind, or "__risk__:<class>"), window,
-- bucket, and `risk`, the class of a risk-class counter.
local function quota_member(member)
  local scope, label, window, bucket = string.match(member, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return {scope = scope, label = label, window = window, bucket = bucket, risk = string.match(label or '', '^__risk__:(.*)$')}
end

-- The correlation id of a counter's events (threshold, reset): a hash of the tenant, scope,
-- kind or class, window and window key.
local function quota_correlation(tenant, m)
  return redis.sha1hex(tenant .. '|' .. m.scope .. '|' .. (m.risk or m.label) .. '|' .. m.window .. '|' .. m.bucket)
end

-- The scene's request context (a copy) carrying `correlation_id`.
local function correlated(sc, correlation_id)
  local ctx = {}
  for k, v in pairs(sc.ctx or {}) do ctx[k] = v end
  ctx.correlation_id = correlation_id
  return ctx
end

local function contains(list, v)
  for _, x in ipairs(list or {}) do
    if x == v then return true end
  end
  return false
end

-- The window instance of a quota at `now` (UTC calendar buckets; per_run: the run id).
local function quota_bucket(window, now, run)
  if window == 'per_run' then return run end
  return string.sub(iso8601(now), 1, BUCKET_LEN[window])
end

-- A per-kind quota applies when each of its non-empty allowlists lists the request's key of
-- that dimension; an absent key skips the rule (unknown routing is never denied by it).
local ALLOWLISTS = {h = 'host', d = 'recipient_domain', r = 'resource_type'}
local function keys_admit(q, keys)
  for list, dim in pairs(ALLOWLISTS) do
    if q[list] and not contains(q[list], keys[dim]) then return false end
  end
  return true
end

-- Steps 1-3 of the reservation evaluation order, reading only: the access lists, then the
-- risk-class quotas, then the per-kind quotas of the rules `pol` found. Returns a DenyDetail
-- (the first failing step; among violated quotas of a step the one with the least headroom),
-- or nil, an error (400: a per_run quota applies and the run id is missing), or nil, nil and
-- the counters a live reserve increments (`count_actions`).
local function action_gate(sc, pol, G, scope_path)
  local ac = pol.ac
  if ac then
    local p = ac.value
    if p.deny and contains(p.deny, G.kind) then
      return {reason_code = 'ACTION_KIND_DENIED', blocked_by_policy = ac.id, blocked_by_scope = scope_path,
        suggested_fix = "Remove '" .. G.kind .. "' from denied_action_kinds in policy '" .. ac.id .. "'"}
    end
    if p.allow and not contains(p.allow, G.kind) then
      return {reason_code = 'ACTION_KIND_NOT_ALLOWED', blocked_by_policy = ac.id, blocked_by_scope = scope_path,
        suggested_fix = "Add '" .. G.kind .. "' to allowed_action_kinds in policy '" .. ac.id .. "'"}
    end
  end
  local staged = {}
  for _, step in ipairs({{pol.rq, G.risk_label, true}, {pol.aq, G.kind, false}}) do
    local setting, label, by_risk = step[1], step[2], step[3]
    local worst
    for _, q in ipairs(setting and setting.value or {}) do
      if q.k == label and (by_risk or keys_admit(q, G.keys)) then
        if q.w == 'per_run' and G.run == '' then
          return nil, err('INVALID_REQUEST', 'subject.dimensions.run_id is required: policy ' .. setting.id ..
            ' has a per_run quota on ' .. label)
        end
        local scope = (q.w == 'per_tenant_per_day') and ('tenant:' .. sc.name) or scope_path
        local bucket = quota_bucket(q.w, sc.now, G.run)
        local member = scope .. '|' .. label .. '|' .. q.w .. '|' .. bucket
        local key = sc.prefix .. ':q:' .. member
        local used = tonumber(redis.call('HGET', key, 'n') or '0')
        if used >= q.n then
          if not worst or q.n - used < worst.limit - worst.used then
            worst = {action_kind = G.kind, window = q.w, window_key = bucket, used = used, limit = q.n, scope = scope,
              policy_id = setting.id, risk_class = by_risk and G.risk or nil}
          end
        else
          staged[#staged + 1] = {key = key, member = member, q = q, used = used, policy = setting.id}
        end
      end
    end
    if worst then
      return {reason_code = 'ACTION_QUOTA_EXCEEDED', quota_violation = worst, blocked_by_policy = worst.policy_id,
        blocked_by_scope = worst.scope, suggested_fix = 'Increase the ' .. (by_risk and (G.risk .. ' risk-class') or
        G.kind) .. ' quota from ' .. worst.limit .. ' ' .. worst.window .. " in policy '" .. worst.policy_id ..
        "', or wait for the window to reset"}
    end
  end
  return nil, nil, staged
end

-- The message of an access or quota denial `d` of `kind` (the 409's; the detail says more).
local function gate_message(d, kind)
  if d.reason_code == 'ACTION_KIND_DENIED' then
    return "Action kind '" .. kind .. "' is denied by policy " .. d.blocked_by_policy
  end
  if d.reason_code == 'ACTION_KIND_NOT_ALLOWED' then
    return "Action kind '" .. kind .. "' is not among the allowed kinds of policy " .. d.blocked_by_policy
  end
  local v = d.quota_violation
  return 'Action quota exceeded: ' .. (v.risk_class and (v.risk_class .. ' risk class') or v.action_kind) .. ' used ' ..
    v.used .. ' of ' .. v.limit .. ' (' .. v.window .. ' ' .. v.window_key .. ') on ' .. v.scope
end

-- Step 5 for the quotas: each staged counter +1 (its TTL set when new, refreshed for per_run),
-- quota.threshold_approaching once per window instance when it reaches its threshold. Returns
-- the per_run counters (the reservation keeps them, to give the call back on release/expiry).
local function count_actions(sc, staged)
  local runs = {}
  for _, s in ipairs(staged) do
    local q = s.q
    local n = redis.call('HINCRBY', s.key, 'n', 1)
    redis.call('HSET', s.key, 'lim', q.n, 'pol', s.policy, 'last', itoa(sc.now))
    if q.w == 'per_run' then runs[#runs + 1] = s.member end
    if n == 1 or q.w == 'per_run' then
      local ttl = q.ttl or QUOTA_TTL_MS[q.w]
      redis.call('PEXPIRE', s.key, ttl)
      if q.ttl then redis.call('HSET', s.key, 'ttl', q.ttl) end
      local due = sc.prefix .. ':quotas:due'
      redis.call('ZADD', due, sc.now + ttl, s.member)
      if n == 1 then
        redis.call('ZADD', sc.prefix .. ':quotas', 0, s.member)
        for _, dead in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', sc.now, 'LIMIT', 0, 2)) do
          if redis.call('EXISTS', sc.prefix .. ':q:' .. dead) == 0 then
            redis.call('ZREM', due, dead)
            redis.call('ZREM', sc.prefix .. ':quotas', dead)
          end
        end
      end
    end
    if n / q.n >= q.th and s.used / q.n < q.th and redis.call('HSETNX', s.key, 'al', '1') == 1 then
      local m = quota_member(s.member)
      emit(sc.events, 'quota.threshold_approaching', sc.name, m.scope, correlated(sc, quota_correlation(sc.name, m)),
        'cycles-server', cjson.encode({scope = m.scope, action_kind = m.risk and '__risk__' or m.label,
        risk_class = m.risk, window = m.window, window_key = m.bucket, used = n, limit = q.n, threshold_pct = q.th,
        policy_id = s.policy, tenant_id = sc.name}), sc.now)
    end
  end
  return runs
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
