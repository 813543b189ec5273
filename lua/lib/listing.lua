-- The listing index of a tenant's reservations.
-- needs: record

-- The listing index of a tenant (one sorted set, all scores 0, read BYLEX) holds, per
-- reservation the flush has reached (`index_reservation`), one status member "<S><T><token>"
-- (S: the status's letter, as the record keeps it (`STATUS_CODE`); T: 0 when its subject names a
-- tenant, else 1) and three value members: "r<estimate, 19 digits><token>", "p<scope
-- path>\0<token>" and "x<expires_at_ms, 13 digits><token>", so every sort order of the listing
-- is a walk of ranges of it (the created stream serves created_at).

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
  return {STATUS_CODE[status] .. tenant_mark(subject) .. token, 'r' .. padded(estimate, 19) .. token,
    'p' .. scope .. '\0' .. token, 'x' .. padded(expires, 13) .. token}
end

-- A reservation's four members (`list_members`) into the index, in one command.
local function list_add(list_key, m)
  redis.call('ZADD', list_key, '0', m[1], '0', m[2], '0', m[3], '0', m[4])
end

-- A new reservation (`token`, its record `rec`) in the tenant's created stream (its entry id
-- its creation time, so time windows and both directions are ranges of ids; an id Redis refuses
-- because the clock stepped back takes the next free one). Its listing members are not written
-- here: `list_flush.lua` writes them from the stream later (each sweep visit, and first thing
-- in every listing that walks the index), as the record stands then, so a reserve inserts
-- nothing into the index's skiplist and a reservation that has ended by then goes straight
-- into the compact chunks.
local function index_reservation(K, token, rec)
  local added = redis.pcall('XADD', K.created_stream, rec.created .. '-*', 't', token)
  if type(added) == 'table' and added.err then redis.call('XADD', K.created_stream, '*', 't', token) end
end

-- A reservation's member `from` becomes `to` (its status member, or extend's expiry member)
-- when the reservation has its members in the index; one the flush has not reached has none
-- yet (the ZREM finds nothing, a dictionary miss) and is indexed as its record then stands.
local function list_move(list_key, from, to)
  if redis.call('ZREM', list_key, from) == 1 then redis.call('ZADD', list_key, '0', to) end
end

-- A reservation's status member moves with its status (`r` as `read_reservation` returns it).
local function list_status(list_key, r, to)
  local token, t = token_of(r.rid), tenant_mark(r.rec.subject or '')
  list_move(list_key, STATUS_CODE[r.status] .. t .. token, STATUS_CODE[to] .. t .. token)
end

-- The compacted part of the listing index. Finished reservations never change again, so the
-- sweep moves their members out of the index (a skiplist: ~120 B of pointers per member) into
-- chunks: small sorted sets of at most CHUNKED.max members, each kept in Redis's compact
-- listpack form (a few bytes per member; an insert scans its chunk, so chunks stay small). The
-- directory (`KEY.listing_chunks`, scores 0, read BYLEX) holds each chunk's lower bound: a
-- member, or a kind's first letter for its first chunk; a chunk holds the members from its
-- bound up to the next bound, under the key named by its bound's digest (80 bits of its SHA-1).
-- A member lives in the index or in a chunk, never both; reads merge the two
-- (`CHUNKED.range`), so every sort order still walks from a position, a page at a time.
local CHUNKED = {max = 32, piece = 16, longest = 64}

-- The directory and the chunk key of bound `b`, for the listing index `index`.
function CHUNKED.directory(index) return KEY.listing_chunks(KEY.prefix_of(index)) end
function CHUNKED.key(dir, b) return KEY.listing_chunk(KEY.prefix_of(dir), string.sub(redis.sha1hex(b), 1, 20)) end

-- Whether `a` sorts before `b` byte by byte (Lua's `<` follows the server's locale).
function CHUNKED.before(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- ZRANGE `key` `from` `to` BYLEX [REV] LIMIT 0 `n` (`to` the low bound when `rev`; numbers go
-- to Redis as digits: a Lua number costs a float formatting).
function CHUNKED.lex(key, from, to, rev, n)
  if type(n) == 'number' then n = string.format('%d', n) end
  if rev then return redis.call('ZRANGE', key, from, to, 'BYLEX', 'REV', 'LIMIT', '0', n) end
  return redis.call('ZRANGE', key, from, to, 'BYLEX', 'LIMIT', '0', n)
end

-- The bound of the chunk that holds (or would hold) member `m`: the greatest bound not after it.
function CHUNKED.bound_of(dir, m)
  return CHUNKED.lex(dir, '[' .. m, '-', true, '1')[1]
end

-- Members within ZRANGE BYLEX bounds `from`..`to` of the chunks (in reading order: `from` is
-- the high bound when `rev`), at most `n`, chunk after chunk from the one that holds `from`.
function CHUNKED.walk(dir, from, to, rev, n)
  local open, limit = from == '-' or from == '+', to ~= '-' and to ~= '+' and string.sub(to, 2) or nil
  local b = not open and CHUNKED.bound_of(dir, string.sub(from, 2)) or nil
  -- from the first chunk when `from` is open, or (ascending) below every bound
  if b == nil and (open or not rev) then b = CHUNKED.lex(dir, rev and '+' or '-', rev and '-' or '+', rev, '1')[1] end
  local out = {}
  while b and #out < n do
    -- ascending, a chunk whose bound is past `to` holds nothing in range, nor do those after it
    if not rev and limit and (CHUNKED.before(limit, b) or (limit == b and string.sub(to, 1, 1) == '(')) then break end
    for _, m in ipairs(CHUNKED.lex(CHUNKED.key(dir, b), from, to, rev, n - #out)) do out[#out + 1] = m end
    -- descending, the chunks before one whose bound is not past `to` hold nothing in range
    if rev and limit and not CHUNKED.before(limit, b) then break end
    b = CHUNKED.lex(dir, '(' .. b, rev and '-' or '+', rev, '1')[1]
  end
  return out
end

-- CHUNKED.lex on the listing index `index` and on the chunks of directory `dir` together
-- (nil: there are none), merged in the reading order (a member found in both, as a repeated
-- backfill can leave, once).
function CHUNKED.range(index, dir, from, to, rev, n)
  local live = CHUNKED.lex(index, from, to, rev, n)
  if not dir then return live end
  local packed = CHUNKED.walk(dir, from, to, rev, n)
  local out, i, j = {}, 1, 1
  while #out < n and (live[i] or packed[j]) do
    local a, b = live[i], packed[j]
    if a == b then j = j + 1 end
    if b == nil or a == b or (a and CHUNKED.before(a, b) ~= rev) then
      out[#out + 1] = a; i = i + 1
    else
      out[#out + 1] = b; j = j + 1
    end
  end
  return out
end

-- ZADD (each scored 0) or ZREM of `members[from..to]` on `key`, a slice at a time (Lua's
-- unpack is bounded).
function CHUNKED.sliced(command, key, members, from, to)
  for i = from, to, 200 do
    local args = {}
    for k = i, math.min(i + 199, to) do
      if command == 'ZADD' then args[#args + 1] = '0' end
      args[#args + 1] = members[k]
    end
    redis.call(command, key, unpack(args))
  end
end

-- Moves `members` (none of them in the index any more) into the chunks: each to the chunk that
-- holds its place; a chunk that would grow past CHUNKED.max is written again as pieces of
-- CHUNKED.piece members, each a new chunk after the first (made whole at once, so each is
-- compact). The members are sorted first (by Redis, in a staging set), so the directory is
-- asked once per chunk they fall into rather than once per member (a finished batch lands in
-- a few), and a chunk that splits is merged with them there rather than grown member by member.
function CHUNKED.add(dir, members)
  if #members == 0 then return end
  local staged = KEY.listing_staged(KEY.prefix_of(dir))
  CHUNKED.sliced('ZADD', staged, members, 1, #members)
  local from = '-'
  while true do
    local first = CHUNKED.lex(staged, from, '+', false, '1')[1]
    if not first then break end
    local b = CHUNKED.bound_of(dir, first)
    if b == nil or string.byte(b) ~= string.byte(first) then
      -- a kind's first chunk starts at its letter
      b = string.sub(first, 1, 1)
      redis.call('ZADD', dir, '0', b)
    end
    -- the chunk of bound `b` holds the members up to the next bound, and never another kind's
    local after = CHUNKED.lex(dir, '(' .. b, '+', false, '1')[1]
    local kind = string.byte(first)
    if not after or string.byte(after) ~= kind then after = string.char(kind + 1) end
    local group = CHUNKED.lex(staged, '[' .. first, '(' .. after, false, '-1')
    local key = CHUNKED.key(dir, b)
    local held = redis.call('ZCARD', key)
    if held + #group <= CHUNKED.max then
      CHUNKED.sliced('ZADD', key, group, 1, #group)
    else
      if held > 0 then
        CHUNKED.sliced('ZADD', staged, redis.call('ZRANGE', key, '0', '-1'), 1, held)
        redis.call('DEL', key)
      end
      local all = CHUNKED.lex(staged, '[' .. b, '(' .. after, false, '-1')
      for i = 1, #all, CHUNKED.piece do
        local bound = i == 1 and b or all[i]
        if i > 1 then redis.call('ZADD', dir, '0', bound) end
        CHUNKED.sliced('ZADD', CHUNKED.key(dir, bound), all, i, math.min(i + CHUNKED.piece - 1, #all))
      end
    end
    from = '[' .. after
  end
  redis.call('DEL', staged)
end

-- Removes `members` from the listing index `index` and from its chunks (a chunk left empty
-- leaves the directory).
function CHUNKED.remove(index, members)
  redis.call('ZREM', index, unpack(members))
  local dir = CHUNKED.directory(index)
  if redis.call('EXISTS', dir) == 0 then return end
  for _, m in ipairs(members) do
    local b = CHUNKED.bound_of(dir, m)
    local key = b and CHUNKED.key(dir, b)
    if key and redis.call('ZREM', key, m) == 1 and redis.call('EXISTS', key) == 0 then redis.call('ZREM', dir, b) end
  end
end
