-- Live reservation: auth, idempotency, tenant guard, budget checks, hold, record. One atomic step.
-- KEYS[1] tenant record      KEYS[2] api key record    KEYS[3] reservation (doubles as its
-- idempotency record)        KEYS[4] dry-run idempotency record (shared namespace)
-- KEYS[5] scope -> units index   KEYS[6] expiry index   KEYS[7] created-at index
-- KEYS[8] the slot's due index (the sweep finds due tenants there)  KEYS[9] listing index
-- KEYS[10] the reservation's metadata
-- KEYS[11..] one budget per derived scope, canonical order, in the request's unit
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] payload hash  ARGV[4] reservation id
-- prefix ("<tenant>.<token>.")  ARGV[5] unit  ARGV[6] amount  ARGV[7] ttl_ms or ''
-- ARGV[8] grace_ms  ARGV[9] overage policy or ''  ARGV[10] idempotency key  ARGV[11] subject json
-- ARGV[12] action json  ARGV[13] metadata json or ''  ARGV[14] retention ms (terminal records)
-- ARGV[15..] per budget key: "<scope>|<key code>" aligned with KEYS[11..]; then 'reclaimed' on
-- the retry after a lazy reclaim (so a reserve asks for a reclaim at most once)
local now, now_s = now_ms()
local denied, filter = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end
local scope_path = request_scope(11, 15)
denied = filter and scope_guard(filter, scope_path)
if denied then return denied end

local existing = load_record(KEYS[3])
if existing then
  if existing.ik ~= ARGV[10] then return err('INTERNAL_ERROR', 'Reservation id collision; retry with another idempotency_key') end
  if existing.ph ~= ARGV[3] then
    return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload')
  end
  return {'REPLAY', cjson.encode(with_id(existing.result, ARGV[4] .. existing.codes)), existing.status, now_s}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload (dry_run)')
end

local tenant = tenant_record(KEYS[1])
local guard = tenant_guard(tenant) or suspended_guard(tenant)
if guard then return guard end

local unit, amount = ARGV[5], ARGV[6]
local e = evaluate(KEYS[5], 11, 15, unit, amount)
if e.unit_error then return e.unit_error end
if e.reason == 'BUDGET_NOT_FOUND' then return err('NOT_FOUND', e.message) end
if e.reason == 'BUDGET_EXCEEDED' and ARGV[15 + #e.scopes] ~= 'reclaimed' then
  -- Holds of dead reservations must never block a reserve: hand their ids back so the caller
  -- expires them (their keys are unknown here) and retries once.
  local overdue = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. now, 'LIMIT', 0, 50)
  if #overdue > 0 then return {'RECLAIM', cjson.encode(overdue), '', now_s} end
end
if e.reason then return err(e.reason, e.message) end
local budgets = e.budgets

-- TTL: request, else tenant default, else 60 s; capped by the tenant's max (default 1 h).
local ttl = tonumber(ARGV[7]) or (tenant and tenant.default_ttl) or 60000
local max_ttl = (tenant and tenant.max_ttl) or 3600000
if ttl > max_ttl then ttl = max_ttl end
local policy = resolve_policy(ARGV[9], budgets, tenant)
local max_ext = (tenant and tenant.max_extensions) or 10

for _, b in ipairs(budgets) do
  b.reserved = d_add(b.reserved, amount)
  b.remaining = d_sub(b.remaining, amount)
end
local failed = write_budgets(budgets, now_s)
if failed then return failed end

local rid = ARGV[4] .. table.concat(e.codes)
local expires_at = now + ttl
local expires = itoa(expires_at)
local grace = tonumber(ARGV[8])
local decision = e.caps and 'ALLOW_WITH_CAPS' or 'ALLOW'
-- The stored replay omits the id (the record has it); answers carry it second.
local result = snapshot({decision, expires, e.caps or ''}, budgets)
local rec = {codes = table.concat(e.codes), status = 'ACTIVE', ik = ARGV[10], ph = ARGV[3], result = result,
  unit = unit, estimate = amount, subject = ARGV[11], scope = scope_path, action = ARGV[12],
  created = now_s, expires = expires, policy = policy}
if grace ~= 5000 then rec.grace = tostring(grace) end
if max_ext ~= 10 then rec.max_ext = tostring(max_ext) end
-- metadata lives beside the record (`m` says so), so listings never load it unless asked
if ARGV[13] ~= '' then
  rec.m = '1'
  redis.call('HSET', KEYS[10], 'metadata', ARGV[13])
end
save_record(KEYS[3], rec)
local due = itoa(expires_at + grace)
redis.call('ZADD', KEYS[6], due, rid)
redis.call('ZADD', KEYS[8], 'LT', due, string.match(rid, '^([^.]+)%.'))
-- Created index: lexicographic members "<13-digit created ms><token>", so one index serves
-- time windows, both directions and stable cursors (ZRANGE ... BYLEX).
local token = token_of(rid)
redis.call('ZADD', KEYS[7], 0, padded(now_s, 13) .. token)
list_add(KEYS[9], list_members(token, 'ACTIVE', ARGV[11], amount, scope_path, expires))
return {'OK', cjson.encode(with_id(result, rid)), 'ACTIVE', now_s}
