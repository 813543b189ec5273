-- Webhook subscription writes: create, update (compare-and-set on updated_at_ms: the handler
-- validated both invariants on the merged state it read; a subscription changed meanwhile
-- answers status CHANGED, and the handler starts over), delete. One lifecycle event and one
-- audit row each. `A.fields` is a JSON object of strings (the record, or the patch). The
-- answer is the subscription's record.
local now, now_s = now_ms()
local ctx = request_context(A.context) or {}
local mode, owner, id = A.mode, A.owner, A.subscription_id
if owner ~= '__system__' then
  local _, e = owner_guard(K.tenant, err('TENANT_NOT_FOUND', MSG.TENANT_NOT_FOUND))
  if e then return e end
end

-- The tenant's alert settings (its record's `alerts`, read by every script that may raise an
-- alert): over its subscriptions, each at the spec's defaults where it sets nothing, the union
-- of their utilization thresholds and the lowest of each other setting; none (the defaults)
-- when it has no subscription. Kept by every write of a tenant's subscriptions.
local SETTINGS = {burn_rate_multiplier = 'bm', burn_rate_window_seconds = 'bw', denial_rate_threshold = 'dr',
  expiry_rate_threshold = 'er', auth_failure_rate_threshold = 'ar', rate_window_seconds = 'rw'}
local function keep_alert_settings()
  if owner == '__system__' then return end
  local prefix = KEY.prefix_of(K.subscription)
  local union, seen, cfg = {}, {}, nil
  for _, sid in ipairs(redis.call('SMEMBERS', K.subscription_index)) do
    local ok_, own = pcall(cjson.decode, redis.call('HGET', KEY.webhook(prefix, sid), 'thresholds') or '')
    if not ok_ or type(own) ~= 'table' then own = {} end
    cfg = cfg or {}
    for _, t in ipairs(own.budget_utilization or RULES.ALERTS.th) do
      if not seen[t] then seen[t] = true; union[#union + 1] = t end
    end
    for name, short in pairs(SETTINGS) do
      local v = tonumber(own[name]) or RULES.ALERTS[short]
      if not cfg[short] or v < cfg[short] then cfg[short] = v end
    end
  end
  if not cfg then
    redis.call('HDEL', K.tenant, 'alerts')
    refresh_tenant(K.tenant)
    return
  end
  table.sort(union)
  cfg.th = union
  redis.call('HSET', K.tenant, 'alerts', cjson.encode(cfg))
  refresh_tenant(K.tenant)
end

local function lifecycle(kind, previous, new, changed)
  emit(K.events, kind, owner, nil, ctx, 'cycles-admin', '{"subscription_id":' .. cjson.encode(id) ..
    ',"tenant_id":' .. cjson.encode(owner) .. (previous and (',"previous_status":"' .. previous .. '"') or '') ..
    (new and (',"new_status":"' .. new .. '"') or '') .. ',"changed_fields":' .. changed .. '}', now)
end

if mode == 'create' then
  local max = tonumber(A.max_subscriptions)
  if redis.call('SCARD', K.subscription_index) >= max then
    return err('LIMIT_EXCEEDED', 'An owner may have at most ' .. max .. ' webhook subscriptions; delete one first',
      cjson.encode({max_subscriptions = max}), 409)
  end
  local f = cjson.decode(A.fields)
  f.status, f.consecutive_failures, f.created_at_ms, f.updated_at_ms = 'ACTIVE', '0', now_s, now_s
  write_fields(K.subscription, f)
  redis.call('SADD', K.subscription_index, id)
  ctx.correlation_id = ctx.correlation_id or ('webhook_create:' .. id)
  lifecycle('webhook.created', nil, 'ACTIVE', '[]')
  audit(K.audit_log, ctx, 'webhook.create', 'webhook', id, now)
  keep_alert_settings()
  return ok(record_json(K.subscription), 'ACTIVE', now_s)
end

local cur = redis.call('HMGET', K.subscription, 'subscription_id', 'status', 'updated_at_ms')
if not cur[1] then return err('WEBHOOK_NOT_FOUND', MSG.WEBHOOK_NOT_FOUND) end
if mode == 'delete' then
  redis.call('DEL', K.subscription)
  redis.call('SREM', K.subscription_index, id)
  drop_deliveries(KEY.prefix_of(K.subscription), id, 'dropped: subscription deleted', now_s)
  ctx.correlation_id = ctx.correlation_id or ('webhook_delete:' .. id)
  lifecycle('webhook.deleted', cur[2], nil, '[]')
  audit(K.audit_log, ctx, 'webhook.delete', 'webhook', id, now)
  keep_alert_settings()
  return ok('{}', 'DELETED', now_s)
end

if cur[3] ~= A.expected_updated_at_ms then return ok('{}', 'CHANGED', now_s) end
local patch = cjson.decode(A.fields)
local from = cur[2]
local to = patch.status or from
patch.status = nil
local changed = {}
for f, v in pairs(patch) do
  if f == 'secret' or (redis.call('HGET', K.subscription, f) or '') ~= v then
    changed[#changed + 1] = (f == 'secret') and 'signing_secret' or f
  end
end
table.sort(changed)
if #changed == 0 and to == from then return ok(record_json(K.subscription), from, now_s) end
patch.updated_at_ms = now_s
if to ~= from then
  patch.status = to
  if to == 'ACTIVE' then patch.consecutive_failures = '0'
  else drop_deliveries(KEY.prefix_of(K.subscription), id, 'dropped: subscription ' .. string.lower(to), now_s) end
end
write_fields(K.subscription, patch)
local fields = csv_json(',' .. table.concat(changed, ',') .. ',')
-- (a bulk action's rows keep the invocation's correlation id)
ctx.correlation_id = ctx.correlation_id or ('webhook_update:' .. id .. ':' .. (ctx.request_id or ''))
if to == from then lifecycle('webhook.updated', from, to, fields)
elseif to == 'PAUSED' then lifecycle('webhook.paused', from, to, fields)
else lifecycle('webhook.resumed', from, to, fields) end
audit(K.audit_log, ctx, 'webhook.update', 'webhook', id, now, {previous_status = from, new_status = to, changed_fields = changed})
keep_alert_settings()
return ok(record_json(K.subscription), to, now_s)
