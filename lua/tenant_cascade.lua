-- One bounded step of a closed tenant's cascade (Mode B: the CLOSED flip came first, and every
-- mutating script already refuses the tenant). Idempotent: terminal children are skipped, so a
-- re-driven cascade never writes an event or audit row twice.
-- KEYS[1] tenant record  KEYS[2] event stream  KEYS[3] audit log  KEYS[4] expiry index
-- KEYS[5] listing index  KEYS[6..5+2n] this batch's reservations (record, metadata), then
-- ARGV[3] budgets, then ARGV[5] API keys, then the tenant's webhook subscriptions
-- ARGV[1] request context (with correlation_id)  ARGV[2] n reservations  ARGV[3] budget count
-- ARGV[4] how long finished records are kept (ms)  ARGV[5] API key count  ARGV[6..5+n] the
-- reservation ids
-- 1. open reservations become RELEASED (reason tenant_closed) without touching budgets;
-- 2. once none is open, budgets close, their whole `reserved` drained back to `remaining`
--    (so a reservation's hold is returned exactly once, here);
-- 3. API keys are revoked, webhook subscriptions disabled.
local now = now_ms()
local ctx = request_context(ARGV[1])
local t = tenant_record(KEYS[1])
if t == 'MALFORMED' or not t or t.status ~= 'CLOSED' then return err('INVALID_REQUEST', 'Tenant is not closed') end
local tenant = redis.call('HGET', KEYS[1], 'tenant_id')
local n, nb, retention, nk = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

for i = 1, n do
  local key, meta, rid = KEYS[4 + 2 * i], KEYS[5 + 2 * i], ARGV[5 + i]
  local r = read_reservation(key, rid)
  if r and not r.corrupt and r.status == 'ACTIVE' then
    list_status(KEYS[5], r, 'RELEASED')
    r.rec.status, r.rec.finalized, r.rec.reason = 'RELEASED', tostring(now), 'tenant_closed'
    save_record(key, r.rec)
    keep_finished(key, meta, r.rec, retention)
  end
  if not (r and r.corrupt) then redis.call('ZREM', KEYS[4], rid) end
end
local open = redis.call('ZCARD', KEYS[4])

local function cascade_event(kind, resource, body)
  emit(KEYS[2], 'evt_' .. string.sub(redis.sha1hex(tenant .. '|' .. resource .. '|' .. kind), 1, 24), kind, tenant,
    nil, ctx, 'cycles-admin', '{' .. body .. ',"cascade_reason":"tenant_closed"}', now)
end

if open == 0 then
  for i = 6 + 2 * n, 5 + 2 * n + nb do
    local b = read_budget(KEYS[i])
    if b and b.status ~= 'CLOSED' then
      local prior, released = b.status, b.reserved
      local ledger_id = redis.call('HGET', b.key, 'ledger_id') or ''
      b.remaining, b.reserved, b.status = d_add(b.remaining, b.reserved), '0', 'CLOSED'
      save_ledger(b, now)
      redis.call('HSET', b.key, 'closed_at_ms', tostring(now))
      local ids = '"ledger_id":' .. cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '"'
      cascade_event('budget.closed_via_tenant_cascade', b.key, ids .. ',"prior_status":"' .. prior .. '","new_status":"CLOSED"')
      if d_pos(released) then
        cascade_event('reservation.released_via_tenant_cascade', b.key, ids .. ',"released_amount":' .. released)
      end
      audit(KEYS[3], ctx, 'budget.close', 'budget', ledger_id, now, {reason = 'tenant_closed', released = released})
    end
  end
end

for i = 6 + 2 * n + nb, 5 + 2 * n + nb + nk do
  local k = redis.call('HMGET', KEYS[i], 'key_id', 'status', 'name')
  if k[1] and k[2] == 'ACTIVE' then
    redis.call('HSET', KEYS[i], 'status', 'REVOKED', 'revoked_at_ms', tostring(now), 'revoked_reason', 'tenant_closed')
    cascade_event('api_key.revoked_via_tenant_cascade', KEYS[i], '"key_id":' .. cjson.encode(k[1]) ..
      (k[3] and (',"name":' .. cjson.encode(k[3])) or '') .. ',"prior_status":"ACTIVE","new_status":"REVOKED"')
    audit(KEYS[3], ctx, 'api_key.revoke', 'api_key', k[1], now, {reason = 'tenant_closed'})
  end
end
for i = 6 + 2 * n + nb + nk, #KEYS do
  local w = redis.call('HMGET', KEYS[i], 'subscription_id', 'status', 'name')
  if w[1] and (w[2] == 'ACTIVE' or w[2] == 'PAUSED') then
    redis.call('HSET', KEYS[i], 'status', 'DISABLED', 'updated_at_ms', tostring(now))
    cascade_event('webhook.disabled_via_tenant_cascade', KEYS[i], '"subscription_id":' .. cjson.encode(w[1]) ..
      (w[3] and (',"name":' .. cjson.encode(w[3])) or '') .. ',"prior_status":"' .. w[2] .. '","new_status":"DISABLED"')
    audit(KEYS[3], ctx, 'webhook.disable', 'webhook', w[1], now, {reason = 'tenant_closed'})
  end
end
return {'OK', '[]', open == 0 and 'DONE' or 'MORE', tostring(now)}
