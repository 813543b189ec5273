-- API keys and scopes: the key check inside every operation's script, a key's scope filter,
-- and scope paths.
-- needs: decimal, reply

-- An API key's secrets and the fields its check reads. The record keeps a packed copy of those
-- fields (KEY_AUTH.fields) in its `auth` field (joined by \31, '' for none; a scope filter is
-- JSON, where cjson escapes a \31): one short read instead of five fields, each distinct copy
-- decoded once per script VM (`memo`; shared, so never changed but for `admits`, the
-- permission answers it caches). Every script that writes one of the fields calls
-- `KEY_AUTH.refresh` after.
local KEY_AUTH = {fields = {'digest', 'status', 'expires_at_ms', 'permissions', 'scope_filter'},
  packed = '^([^\31]*)\31([^\31]*)\31([^\31]*)\31([^\31]*)\31(.*)$', memo = {known = {}, kept = 0, max = 1000}}

-- Writes the packed copy of a key record's checked fields (after a write of any of them).
function KEY_AUTH.refresh(key_record)
  local f = redis.call('HMGET', key_record, unpack(KEY_AUTH.fields))
  if not f[1] then redis.call('HDEL', key_record, 'auth') return end
  for i = 1, #KEY_AUTH.fields do f[i] = f[i] or '' end
  redis.call('HSET', key_record, 'auth', table.concat(f, '\31'))
end

-- What the check needs of a key, from its fields in KEY_AUTH.fields order ('' or nil for none).
function KEY_AUTH.of(f)
  return {digest = f[1], status = f[2], expires = tonumber(f[3] or ''), held = f[4] or '',
    filter = (f[5] ~= '') and f[5] or nil, admits = {}}
end

-- A key's checked fields (nil when the key does not exist). A record written before the packed
-- copy is read field by field, and given its copy unless the script is `read_only`.
function KEY_AUTH.read(key_record, read_only)
  local packed = redis.call('HGET', key_record, 'auth')
  if packed then
    return KEY_AUTH.memo.known[packed] or
      remember(KEY_AUTH.memo, packed, KEY_AUTH.of({string.match(packed, KEY_AUTH.packed)}))
  end
  local f = redis.call('HMGET', key_record, unpack(KEY_AUTH.fields))
  if not f[1] then return nil end
  if not read_only then KEY_AUTH.refresh(key_record) end
  return KEY_AUTH.of(f)
end

-- A rotated key's previous secret, until the end of the grace period its rotation gave it (read
-- only when the presented secret is not the current one).
function KEY_AUTH.rotated_from(key_record, digest, now)
  local p = redis.call('HMGET', key_record, 'previous_digest', 'previous_until_ms')
  return p[1] == digest and now < (tonumber(p[2]) or 0)
end

-- API-key check inside the operation's own script: digest, status, expiry, permission.
-- Every failure yields the same 401 message; the reason travels separately for logs. On
-- success the second value is the key's raw scope_filter (nil when it has none), for
-- `scope_guard`, the third what the check read of the key (`KEY_AUTH.read`). `read_only`: the
-- script may not write (a record without its packed copy is then read without giving it one).
local function authorize(key_record, digest, accepted, now, read_only)
  if digest == '' then return nil end -- admin-key call, authenticated by the handler
  local k = KEY_AUTH.read(key_record, read_only)
  local reason = nil
  if not k then reason = 'KEY_NOT_FOUND'
  elseif k.digest ~= digest and not KEY_AUTH.rotated_from(key_record, digest, now) then reason = 'INVALID_KEY'
  elseif k.status == 'EXPIRED' then reason = 'KEY_EXPIRED'
  elseif k.status ~= 'ACTIVE' then reason = 'KEY_REVOKED'
  elseif k.expires and k.expires <= now then reason = 'KEY_EXPIRED' end
  if reason then return err('UNAUTHORIZED', MSG.UNAUTHORIZED, reason) end
  if accepted == '' then return nil, k.filter, k end
  local admitted = k.admits[accepted]
  if admitted == nil then
    admitted = false
    for p in string.gmatch(accepted, '[^,]+') do
      if string.find(k.held, ',' .. p .. ',', 1, true) then admitted = true break end
    end
    k.admits[accepted] = admitted
  end
  if admitted then return nil, k.filter, k end
  return err('FORBIDDEN', MSG.PERMISSION_MISSING .. string.match(accepted, '[^,]+'))
end

-- A key's new secret (`r`: {digest, prefix, grace_ms}): the current one keeps working
-- `grace_ms` more (`KEY_AUTH.rotated_from`), a secret from an earlier rotation stops now.
-- (Operator keys rotate alike; an API key's caller refreshes its packed copy after.)
local function rotate_secret(key_record, r, now, now_s)
  local current = redis.call('HGET', key_record, 'digest')
  redis.call('HSET', key_record, 'digest', r.digest, 'key_prefix', r.prefix, 'previous_digest', current,
    'previous_until_ms', itoa(now + r.grace_ms), 'rotated_at_ms', now_s, 'updated_at_ms', now_s)
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

-- A key's scope_filter (JSON array of `kind:value` / `kind:*` segments, as `authorize`
-- returns it), decoded and lower-cased; nil when it admits every scope.
local function scope_filter(raw)
  if not raw then return nil end
  local decoded, filter = pcall(cjson.decode, raw)
  if not decoded or type(filter) ~= 'table' or #filter == 0 then return nil end
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
