-- updateTenant, with its events and audit row. `A.patch` is a JSON object of strings (`status`
-- optional). CLOSED is terminal: closing again is a no-op here (the caller re-drives the
-- cascade), any other change of a closed tenant is 409 TENANT_CLOSED. The answer is the
-- tenant's record.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local patch = cjson.decode(A.patch)
local cur = redis.call('HMGET', K.tenant, 'tenant_id', 'status')
if not cur[1] then return err('TENANT_NOT_FOUND', MSG.TENANT_NOT_FOUND) end
local tenant_id, from = cur[1], cur[2]
local to = patch.status or from
patch.status = nil
if from == 'CLOSED' then
  local other = next(patch)
  if to == 'CLOSED' and not other then return ok(record_json(K.tenant), 'CLOSED', now_s) end
  return err('TENANT_CLOSED', MSG.TENANT_CLOSED_UNCHANGEABLE)
end

local SETTINGS = {default_commit_overage_policy = true, default_reservation_ttl_ms = true,
  max_reservation_ttl_ms = true, max_reservation_extensions = true, observe_mode = true,
  evidence_enabled = true}
local changed, settings = {}, false
for f, v in pairs(patch) do
  if (redis.call('HGET', K.tenant, f) or '') ~= v then
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
  if to == 'SUSPENDED' then updates.suspended_at_ms = now_s; status_event = 'tenant.suspended'
  elseif to == 'ACTIVE' then updates.suspended_at_ms = ''; status_event = 'tenant.reactivated'
  else updates.closed_at_ms = now_s; status_event = 'tenant.closed' end
end
if #changed == 0 and not status_event then return ok(record_json(K.tenant), from, now_s) end
updates.updated_at_ms = now_s
write_fields(K.tenant, updates)
refresh_tenant(K.tenant)

local fields_json = csv_json(',' .. table.concat(changed, ',') .. ',')
local tid = cjson.encode(tenant_id)
if status_event then
  emit(K.events, status_event, tenant_id, nil, ctx, 'cycles-admin',
    '{"tenant_id":' .. tid .. ',"previous_status":"' .. from .. '","new_status":"' .. to ..
    '","changed_fields":' .. fields_json .. '}', now)
end
if #changed > 0 then
  local kind = settings and 'tenant.settings_changed' or 'tenant.updated'
  emit(K.events, kind, tenant_id, nil, ctx, 'cycles-admin',
    '{"tenant_id":' .. tid .. ',"changed_fields":' .. fields_json .. '}', now)
end
audit(K.audit_log, ctx, 'tenant.update', 'tenant', tenant_id, now,
  {previous_status = from, new_status = to, changed_fields = changed})
return ok(record_json(K.tenant), to, now_s)
