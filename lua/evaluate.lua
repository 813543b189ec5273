-- Evaluation without reservation (dry_run and decide): the same checks as a live reserve,
-- reported as a decision; only the idempotency record is written.
-- KEYS[1] tenant record  KEYS[2] api key record  KEYS[3] idempotency record of this namespace
-- KEYS[4] the live reservation this key would create (dry_run shares reserve's namespace; for
-- decide the idempotency record again)  KEYS[5] scope -> units index  KEYS[6] event stream
-- KEYS[7..] one budget per derived scope, canonical order, in the request's unit
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] payload hash  ARGV[4] unit
-- ARGV[5] amount  ARGV[6] idempotency key  ARGV[7] record retention ms  ARGV[8] request context
-- json  ARGV[9] subject json  ARGV[10] action json
-- ARGV[11..] per budget key: "<scope>|<key code>" aligned with KEYS[7..]
local now, now_s = now_ms()
local denied, filter = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end
denied = filter and scope_guard(filter, request_scope(7, 11))
if denied then return denied end

local replayed = replay(KEYS[3], ARGV[3], '', now)
if replayed then return replayed end
local live = (KEYS[4] ~= KEYS[3]) and load_record(KEYS[4])
if live and live.ik == ARGV[6] then
  return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload (live reservation)')
end

local function decide(decision, reason, caps, e)
  local out = {decision, reason or '', caps or '', e and table.concat(e.codes) or ''}
  if e and decision ~= 'DENY' then snapshot(out, e.budgets) end
  local result = cjson.encode(out)
  local ctx = request_context(ARGV[8])
  if decision == 'DENY' and ctx then
    -- reservation.denied: the scope that denied (the deepest derived scope otherwise)
    local scope, remaining = e and e.denied_by and e.denied_by.scope, e and e.denied_by and e.denied_by.remaining
    scope = scope or string.match(ARGV[10 + #KEYS - 6], '^(.*)|')
    emit(KEYS[6], 'evt_' .. string.sub(redis.sha1hex(ctx.request_id .. '|denied'), 1, 16), 'reservation.denied',
      ctx.tenant, scope, ctx, 'cycles-server', '{"scope":' .. cjson.encode(scope) .. ',"unit":"' .. ARGV[4] ..
      '","reason_code":"' .. reason .. '","requested_amount":' .. ARGV[5] ..
      (remaining and (',"remaining":' .. remaining) or '') .. ',"action":' .. ARGV[10] .. ',"subject":' .. ARGV[9] .. '}', now)
  end
  redis.call('HSET', KEYS[3], 'payload_hash', ARGV[3], 'result', result)
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[7]))
  return {'OK', result, '', now_s}
end

local tenant = tenant_record(KEYS[1])
if tenant == 'MALFORMED' then return err('INTERNAL_ERROR', 'Tenant record is malformed; status cannot be determined') end
if tenant and tenant.status == 'CLOSED' then return decide('DENY', 'TENANT_CLOSED') end
if tenant and tenant.status == 'SUSPENDED' then return decide('DENY', 'TENANT_SUSPENDED') end

local e = evaluate(KEYS[5], 7, 11, ARGV[4], ARGV[5])
if e.unit_error then return e.unit_error end
if e.reason then return decide('DENY', e.reason, nil, e) end
return decide(e.caps and 'ALLOW_WITH_CAPS' or 'ALLOW', '', e.caps, e)
