-- createPolicy / updatePolicy, with the policy.* event and the audit row. `A.record` is the
-- stored policy without its times (this script adds them from Redis's clock), `A.rule` its
-- runtime projection, `A.name_key` its lower-case name (unique per tenant), `A.expected` the
-- `updated_at_ms` an update read ('' for a create: CONFLICT when another write came between),
-- `A.changed` the JSON list of changed fields.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local _, guard = owner_guard(K.tenant, err('TENANT_NOT_FOUND', MSG.TENANT_NOT_FOUND, nil, A.expected == '' and 400 or nil))
if guard then return guard end
local current = redis.call('HGET', K.policies, A.policy_id)
local created_at, old_name = now_s, nil
if A.expected == '' then
  if current then return err('INTERNAL_ERROR', 'policy id collision') end
  if redis.call('HLEN', K.policies) >= RULES.MAX_POLICIES then
    return err('INVALID_REQUEST', 'A tenant may hold at most ' .. RULES.MAX_POLICIES .. ' policies')
  end
else
  if not current then return err('NOT_FOUND', 'Policy not found') end
  local cur = cjson.decode(current)
  if string.format('%d', cur.updated_at_ms) ~= A.expected then return ok(current, 'CONFLICT', now_s) end
  created_at, old_name = string.format('%d', cur.created_at_ms), string.lower(cur.name)
end
local holder = redis.call('HGET', K.names, A.name_key)
if holder and holder ~= A.policy_id then
  return err('DUPLICATE_RESOURCE', 'A policy named ' .. cjson.encode(A.name_key) .. ' already exists (' .. holder .. ')')
end
if old_name and old_name ~= A.name_key then redis.call('HDEL', K.names, old_name) end
local record = string.sub(A.record, 1, -2) .. ',"created_at_ms":' .. created_at .. ',"updated_at_ms":' .. now_s .. '}'
redis.call('HSET', K.policies, A.policy_id, record)
redis.call('HSET', K.rules, A.policy_id, A.rule)
redis.call('HSET', K.names, A.name_key, A.policy_id)
-- the runtime scripts read the rules only when the tenant record says there are some, and
-- know them by their digest (both kept by `refresh_tenant`)
refresh_tenant(K.tenant)

local p = cjson.decode(record)
local kind = (A.expected == '') and 'policy.created' or 'policy.updated'
local data = '{"policy_id":' .. cjson.encode(A.policy_id) .. ',"name":' .. cjson.encode(p.name) ..
  ',"scope_pattern":' .. cjson.encode(p.scope_pattern) .. ',"changed_fields":' .. A.changed .. '}'
emit(K.events, kind, ctx.tenant, p.scope_pattern, ctx, 'cycles-admin', data, now)
audit(K.audit_log, ctx, kind, 'policy', A.policy_id, now, {changed_fields = cjson.decode(A.changed)})
return ok(record, (A.expected == '') and 'CREATED' or 'UPDATED', now_s)
