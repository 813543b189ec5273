-- updateTenant. KEYS[1] tenant record  KEYS[2] event stream  KEYS[3] audit log
-- ARGV[1] request context  ARGV[2] patch (JSON object of strings; `status` optional)
-- CLOSED is terminal: closing again is a no-op here (the caller re-drives the cascade), any
-- other change of a closed tenant is 409 TENANT_CLOSED.
local now = now_ms()
local ctx = request_context(ARGV[1])
local patch = cjson.decode(ARGV[2])
local cur = redis.call('HMGET', KEYS[1], 'tenant_id', 'status')
if not cur[1] then return err('TENANT_NOT_FOUND', 'Tenant not found') end
local tenant_id, from = cur[1], cur[2]
local to = patch.status or from
patch.status = nil
if from == 'CLOSED' then
  local other = next(patch)
  if to == 'CLOSED' and not other then return {'OK', '[]', 'CLOSED', tostring(now), record_json(KEYS[1])} end
  return err('TENANT_CLOSED', 'Tenant is closed; a closed tenant cannot be changed')
end

local SETTINGS = {default_commit_overage_policy = true, default_reservation_ttl_ms = true,
  max_reservation_ttl_ms = true, max_reservation_extensions = true}
local changed, settings = {}, false
for f, v in pairs(patch) do
  if (redis.call('HGET', KEYS[1], f) or '') ~= v then
    changed[#changed + 1] = f
    if SETTINGS[f] then settings = true end
  end
end
table.sort(changed)
local updates = {}
for _, f in ipairs(changed) do updates[f] = patch[f] end

local status_event = nil
if to ~= from then
  updates.status = to
  if to == 'SUSPENDED' then updates.suspended_at_ms = tostring(now); status_event = 'tenant.suspended'
  elseif to == 'ACTIVE' then updates.suspended_at_ms = ''; status_event = 'tenant.reactivated'
  else updates.closed_at_ms = tostring(now); status_event = 'tenant.closed' end
end
if #changed == 0 and not status_event then return {'OK', '[]', from, tostring(now), record_json(KEYS[1])} end
updates.updated_at_ms = tostring(now)
write_fields(KEYS[1], updates)

local fields_json = csv_json(',' .. table.concat(changed, ',') .. ',')
local tid = cjson.encode(tenant_id)
if status_event then
  emit(KEYS[2], admin_event_id(ctx, status_event, tenant_id), status_event, tenant_id, nil, ctx, 'cycles-admin',
    '{"tenant_id":' .. tid .. ',"previous_status":"' .. from .. '","new_status":"' .. to ..
    '","changed_fields":' .. fields_json .. '}', now)
end
if #changed > 0 then
  local kind = settings and 'tenant.settings_changed' or 'tenant.updated'
  emit(KEYS[2], admin_event_id(ctx, kind, tenant_id), kind, tenant_id, nil, ctx, 'cycles-admin',
    '{"tenant_id":' .. tid .. ',"changed_fields":' .. fields_json .. '}', now)
end
audit(KEYS[3], ctx, 'tenant.update', 'tenant', tenant_id, now,
  {previous_status = from, new_status = to, changed_fields = changed})
return {'OK', '[]', to, tostring(now), record_json(KEYS[1])}
