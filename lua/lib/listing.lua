-- The listing index of a tenant's reservations.
-- needs: nothing

-- The listing index of a tenant (one sorted set, all scores 0, read BYLEX) holds, per
-- reservation, one status member "<S><T><token>" (S: A, C, E or R for ACTIVE, COMMITTED,
-- EXPIRED, RELEASED; T: 0 when its subject names a tenant, else 1) and three value members:
-- "r<estimate, 19 digits><token>", "p<scope path>\0<token>" and "x<expires_at_ms, 13
-- digits><token>", so every sort order of the listing is a walk of ranges of it (the created
-- index serves created_at).
local STATUS_MARK = {ACTIVE = 'A', COMMITTED = 'C', EXPIRED = 'E', RELEASED = 'R'}

local function padded(digits, width)
  return string.rep('0', width - #digits) .. digits
end

-- A reservation id's token: "<tenant>.<token>.<codes>", the token 14 characters, the codes 8
-- per budgeted scope.
local function token_of(rid)
  return string.match(rid, '^[^.]+%.([^.]+)%.')
end

-- '0' when a stored subject names a tenant, else '1'. Subjects are stored as the handler
-- serialized them, fields in canonical order, so a tenant is always the first field.
local function tenant_mark(subject_json)
  if string.sub(subject_json, 1, 10) == '{"tenant":' then return '0' end
  return '1'
end

-- The members of one reservation: `status`, `subject` (JSON), `estimate` (digits), `scope`
-- and `expires` (digits).
local function list_members(token, status, subject, estimate, scope, expires)
  return {STATUS_MARK[status] .. tenant_mark(subject) .. token, 'r' .. padded(estimate, 19) .. token,
    'p' .. scope .. '\0' .. token, 'x' .. padded(expires, 13) .. token}
end

-- A reservation's four members (`list_members`) into the index, in one command.
local function list_add(list_key, m)
  redis.call('ZADD', list_key, '0', m[1], '0', m[2], '0', m[3], '0', m[4])
end

-- A new reservation (`token`, its record `rec`) in the tenant's created stream (its entry id
-- its creation time, so time windows and both directions are ranges of ids; an id Redis refuses
-- because the clock stepped back takes the next free one) and in its listing index.
local function index_reservation(K, token, rec)
  local added = redis.pcall('XADD', K.created_stream, rec.created .. '-*', 't', token)
  if type(added) == 'table' and added.err then redis.call('XADD', K.created_stream, '*', 't', token) end
  list_add(K.listing_index, list_members(token, 'ACTIVE', rec.subject, rec.estimate, rec.scope, rec.expires))
end

-- A reservation's status member moves with its status (`r` as `read_reservation` returns it).
local function list_status(list_key, r, to)
  local token, t = token_of(r.rid), tenant_mark(r.rec.subject or '')
  redis.call('ZREM', list_key, STATUS_MARK[r.status] .. t .. token)
  redis.call('ZADD', list_key, '0', STATUS_MARK[to] .. t .. token)
end
