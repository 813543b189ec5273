-- One bounded step of a closed tenant's cascade (the CLOSED flip came first, so every
-- mutating script already refuses the tenant). Idempotent: terminal children are skipped, so a
-- re-driven cascade never writes an event or audit row twice.
-- `K.children` holds this batch's reservation records (`A.reservations` of them), then
-- the tenant's budgets (`A.budgets` of them), API keys (`A.api_keys`) and webhook
-- subscriptions (the rest); `A.reservation_ids` are the batch's reservation ids.
-- 1. open reservations become RELEASED (reason tenant_closed) without touching budgets;
-- 2. once none is open, budgets close, their whole `reserved` drained back to `remaining`
--    (so a reservation's hold is returned exactly once, here);
-- 3. API keys are revoked, webhook subscriptions disabled.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local t = tenant_record(K.tenant)
if t == 'MALFORMED' or not t or t.status ~= 'CLOSED' then return err('INVALID_REQUEST', MSG.TENANT_NOT_CLOSED) end
local tenant = redis.call('HGET', K.tenant, 'tenant_id')
local n, nb, nk = tonumber(A.reservations), tonumber(A.budgets), tonumber(A.api_keys)
local C = K.children

for i = 1, n do
  local key, rid = C[i], A.reservation_ids[i]
  local r = read_reservation(key, rid)
  if r and not r.corrupt and r.status == 'ACTIVE' then
    list_status(K.listing_index, r, 'RELEASED')
    local sc = {prefix = KEY.prefix_of(K.tenant), name = tenant, now = now}
    give_back(sc, r.rec)
    record_ending(sc, nil, 'r', r)
    finish_record(key, r.rec, 'RELEASED', {finished = now_s, reason = 'tenant_closed'}, A.record_ttl_ms)
  end
  if not (r and r.corrupt) then redis.call('ZREM', K.expiry_index, rid) end
end
local open = redis.call('ZCARD', K.expiry_index)

local function cascade_event(kind, body)
  emit(K.events, kind, tenant, nil, ctx, 'cycles-admin', '{' .. body .. ',"cascade_reason":"tenant_closed"}', now)
end

if open == 0 then
  for i = n + 1, n + nb do
    local b = read_budget(C[i])
    if b and b.status ~= 'CLOSED' then
      local prior, released = b.status, b.reserved
      local ledger_id = redis.call('HGET', b.key, 'ledger_id') or ''
      b.remaining, b.reserved, b.status = d_add(b.remaining, b.reserved), '0', 'CLOSED'
      save_ledger(b, now)
      redis.call('HSET', b.key, 'closed_at_ms', now_s)
      local ids = '"ledger_id":' .. cjson.encode(ledger_id) .. ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '"'
      cascade_event('budget.closed_via_tenant_cascade', ids .. ',"prior_status":"' .. prior .. '","new_status":"CLOSED"')
      if d_pos(released) then
        cascade_event('reservation.released_via_tenant_cascade', ids .. ',"released_amount":' .. released)
      end
      audit(K.audit_log, ctx, 'budget.close', 'budget', ledger_id, now, {reason = 'tenant_closed', released = released})
    end
  end
end

for i = n + nb + 1, n + nb + nk do
  local k = redis.call('HMGET', C[i], 'key_id', 'status', 'name')
  if k[1] and k[2] == 'ACTIVE' then
    redis.call('HSET', C[i], 'status', 'REVOKED', 'revoked_at_ms', now_s, 'revoked_reason', 'tenant_closed')
    KEY_AUTH.refresh(C[i])
    cascade_event('api_key.revoked_via_tenant_cascade', '"key_id":' .. cjson.encode(k[1]) ..
      (k[3] and (',"name":' .. cjson.encode(k[3])) or '') .. ',"prior_status":"ACTIVE","new_status":"REVOKED"')
    audit(K.audit_log, ctx, 'api_key.revoke', 'api_key', k[1], now, {reason = 'tenant_closed'})
  end
end
for i = n + nb + nk + 1, #C do
  local w = redis.call('HMGET', C[i], 'subscription_id', 'status', 'name')
  if w[1] and (w[2] == 'ACTIVE' or w[2] == 'PAUSED') then
    redis.call('HSET', C[i], 'status', 'DISABLED', 'updated_at_ms', now_s)
    cascade_event('webhook.disabled_via_tenant_cascade', '"subscription_id":' .. cjson.encode(w[1]) ..
      (w[3] and (',"name":' .. cjson.encode(w[3])) or '') .. ',"prior_status":"' .. w[2] .. '","new_status":"DISABLED"')
    audit(K.audit_log, ctx, 'webhook.disable', 'webhook', w[1], now, {reason = 'tenant_closed'})
  end
end
return ok({}, open == 0 and 'DONE' or 'MORE', now_s)
