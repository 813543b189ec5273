-- The tenant record: its status and reservation settings, and the guards of each surface.
-- needs: reply

-- The fields of a tenant record every runtime request reads, and the packed copy of them the
-- record keeps in its `runtime` field (joined by \31, '' for none; cjson escapes a \31 in
-- `alerts`): one field crosses into the script instead of nine, and each distinct copy is
-- decoded once per script VM (`memo`; the decoded record is shared, so never changed). Every
-- script that writes one of the fields calls `refresh_tenant` after. `policy_digest`, the
-- SHA-1 of the tenant's policy rules, lives in the copy only (`refresh_tenant` makes it from
-- the rules each time; no field of that name is stored).
local TENANT = {fields = {'status', 'default_reservation_ttl_ms', 'max_reservation_ttl_ms', 'max_reservation_extensions',
  'default_commit_overage_policy', 'policies', 'alerts', 'observe_mode', 'policy_digest'},
  packed = '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)$',
  memo = {known = {}, kept = 0, max = 1000}}

-- A tenant record from its fields in TENANT.fields order (nil or false where absent), or
-- 'MALFORMED' when its status is none of the three.
function TENANT.of(f)
  if f[1] ~= 'ACTIVE' and f[1] ~= 'SUSPENDED' and f[1] ~= 'CLOSED' then return 'MALFORMED' end
  return { status = f[1], default_ttl = tonumber(f[2]) or RULES.DEFAULT_TTL_MS, max_ttl = tonumber(f[3]) or RULES.MAX_TTL_MS,
    max_extensions = tonumber(f[4]) or RULES.MAX_EXTENSIONS, default_policy = f[5] or RULES.DEFAULT_OVERAGE_POLICY,
    policies = tonumber(f[6]) or 0, alerts = f[7], observe = f[8], rules_digest = f[9] }
end

-- A tenant record from its packed copy; nil when it has none (absent, written before the copy,
-- or a copy of another layout: `tenant_record` reads those).
function TENANT.current(key)
  local packed = redis.call('HGET', key, 'runtime')
  if not packed then return nil end
  local known = TENANT.memo.known[packed]
  if known then return known end
  local f = {string.match(packed, TENANT.packed)}
  if #f == 0 then return nil end
  for i = 1, #TENANT.fields do if f[i] == '' then f[i] = false end end
  return remember(TENANT.memo, packed, TENANT.of(f))
end

-- Writes the packed copy of a tenant record's runtime fields (after a write of any of them, or
-- of the tenant's policy rules): the rules are counted again and their digest kept (SHA-1 of
-- the texts sorted, so equal rules give equal digests), by which `policy_settings` knows them
-- without reading them.
local function refresh_tenant(key)
  local f = redis.call('HMGET', key, unpack(TENANT.fields))
  -- no status, no copy: such a record reads as today (absent, or malformed)
  if not f[1] then redis.call('HDEL', key, 'runtime') return end
  local rules = redis.call('HVALS', KEY.policy_rules(KEY.prefix_of(key)))
  table.sort(rules)
  f[6], f[9] = tostring(#rules), #rules > 0 and redis.sha1hex(table.concat(rules, '\0')) or ''
  for i = 1, #TENANT.fields do f[i] = f[i] or '' end
  redis.call('HSET', key, 'policies', f[6], 'runtime', table.concat(f, '\31'))
  return f[9], #rules
end

-- Tenant record: nil when absent (not governed), else its status and reservation settings
-- (each at its default where the record has none); 'MALFORMED' when the status cannot be
-- determined (fail closed with 500). A record written before the packed copy is read field by
-- field, and given its copy unless the script is `read_only`.
local function tenant_record(key, read_only)
  local current = TENANT.current(key)
  if current then return current end
  local f = redis.call('HMGET', key, unpack(TENANT.fields))
  if not f[1] then
    if redis.call('EXISTS', key) == 1 then return 'MALFORMED' end
    return nil
  end
  local t = TENANT.of(f)
  -- (a record read by fields may have been edited by hand: its rules are known as counted now,
  -- by the digest made now; a read-only script knows them by none)
  if t ~= 'MALFORMED' then
    local digest = false
    if not read_only then digest, t.policies = refresh_tenant(key) end
    t.rules_digest = digest ~= '' and digest
  end
  return t
end

-- The settings a reservation takes from its tenant (the defaults for a tenant without a record).
local function reservation_settings(tenant)
  if tenant then return tenant end
  return { default_ttl = RULES.DEFAULT_TTL_MS, max_ttl = RULES.MAX_TTL_MS, max_extensions = RULES.MAX_EXTENSIONS,
    default_policy = RULES.DEFAULT_OVERAGE_POLICY }
end

-- The closed-tenant guard of the persisting surface (mutations).
local function tenant_guard(t)
  if t == 'MALFORMED' then return err('INTERNAL_ERROR', MSG.TENANT_MALFORMED) end
  if t and t.status == 'CLOSED' then return err('TENANT_CLOSED', MSG.TENANT_CLOSED) end
  return nil
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

-- Every key of a tenant (`prefix`, e.g. "cy:{acme}:"), listed inside the script that uses them
-- so the list and the reads are one point in time: on a cluster (`slot` given) the slot's own
-- keys, other tenants sharing the slot left out; on a standalone server the whole keyspace is
-- walked (the script blocks the server for as long). Sorted.
local function keys_of_tenant(prefix, slot)
  local found = {}
  if slot ~= '' then
    local n = redis.call('CLUSTER', 'COUNTKEYSINSLOT', tonumber(slot))
    for _, key in ipairs(redis.call('CLUSTER', 'GETKEYSINSLOT', tonumber(slot), math.max(n, 1))) do
      if string.sub(key, 1, #prefix) == prefix then found[#found + 1] = key end
    end
  else
    local cursor = '0'
    repeat
      local page = redis.call('SCAN', cursor, 'MATCH', prefix .. '*', 'COUNT', 1000)
      cursor = page[1]
      for _, key in ipairs(page[2]) do found[#found + 1] = key end
    until cursor == '0'
  end
  table.sort(found)
  return found
end
