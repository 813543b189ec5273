-- The reservation record: one string per reservation, its own idempotency record too.
-- needs: decimal, access
--
-- A record is its fields joined by \31, in the order of RECORD.fields (the header has it from
-- `ops::reservations::RECORD_FIELDS`, which reads the same layout): no names, no nesting and
-- no escaping, so a finished reservation keeps a few hundred bytes. '' stands for none. The status is one character at a fixed place (the
-- third), and an ACTIVE reservation's record ends after `qrun`: finishing one changes that
-- character and appends the finishing fields, without decoding or re-encoding the rest.
-- Client text that could hold a \31 (idempotency keys, a release reason) is stored with `%`
-- and control characters percent-encoded (`stored_text`; the handlers send it so). Records
-- of the first layout (a JSON object with named fields, its stored answers nested) are read as
-- such and written in this layout by their next change.
local STATUS_CODE = {ACTIVE = 'A', COMMITTED = 'C', RELEASED = 'R', EXPIRED = 'E'}
local STATUS_OF = {A = 'ACTIVE', C = 'COMMITTED', R = 'RELEASED', E = 'EXPIRED'}

-- Client text as records keep it: `%` and control characters percent-encoded.
local function stored_text(s)
  return (string.gsub(s, '[%%%c]', function(c) return string.format('%%%02X', string.byte(c)) end))
end

-- The client text of a stored one.
local function client_text(s)
  return (string.gsub(s, '%%(%x%x)', function(h) return string.char(tonumber(h, 16)) end))
end

-- The balances answers carry, as text: per budget, in canonical scope order, its allocated,
-- remaining, reserved, spent, debt, overdraft_limit and '1'/'0' (over the limit), separated
-- by spaces; budgets separated by commas (`ops::LedgerState` reads it).
local function balances(budgets)
  local text = ''
  for i = 1, #budgets do local b = budgets[i]
    text = text .. (i > 1 and ',' or '') .. b.allocated .. ' ' .. b.remaining .. ' ' .. b.reserved .. ' ' .. b.spent ..
      ' ' .. b.debt .. ' ' .. b.overdraft_limit .. (b.over and ' 1' or ' 0')
  end
  return text
end

-- Records of the first layout (a JSON object with named fields, its stored answers nested),
-- read as records of today's (`FIRST_LAYOUT.record`). A plain tenant's reserve carries none of
-- this: it hands such a record to the governed reserve (`current_record`, `reserve_opening`).
local FIRST_LAYOUT = {}

-- Balances kept by records of the first layout: a list of 7-string lists, or (older still)
-- 7 strings per budget from `first` on in a flat list.
function FIRST_LAYOUT.balances(list, first)
  local out = {}
  if first then
    for i = first, #list, 7 do out[#out + 1] = table.concat({unpack(list, i, i + 6)}, ' ') end
  else
    for i, row in ipairs(list or {}) do out[i] = table.concat(row, ' ') end
  end
  return table.concat(out, ',')
end

-- A record of the first layout's text, as a record of today's; {} when it does not parse.
function FIRST_LAYOUT.record(raw)
  local decoded, old = pcall(cjson.decode, raw)
  if not decoded or type(old) ~= 'table' then return {} end
  local rec = {version = '2', status = old.status, codes = old.codes, estimate = old.estimate, unit = old.unit,
    policy = old.policy, created = old.created, expires = old.expires, grace = old.grace, ext = old.ext,
    max_ext = old.max_ext, scope = old.scope, m = old.m, ik = old.ik and stored_text(old.ik), ph = old.ph,
    subject = old.subject, action = old.action, qrun = old.qrun and cjson.encode(old.qrun) or nil,
    charged = old.charged, finished = old.finalized or old.expired, metrics = old.metrics,
    reason = old.reason and stored_text(old.reason), metadata = old.metadata, cmeta = old.cmeta}
  local r = old.result or {}
  if r[1] ~= nil then
    rec.decision, rec.first_expires, rec.caps, rec.balances = r[1], r[2], r[3], FIRST_LAYOUT.balances(r, 4)
  else
    rec.decision, rec.first_expires, rec.caps, rec.balances = r.decision, r.expires_at_ms, r.caps,
      FIRST_LAYOUT.balances(r.balances)
  end
  if rec.decision == 'ALLOW' then rec.decision = nil end
  if rec.first_expires == rec.expires then rec.first_expires = nil end
  local fkey, done = old.ck or old.rk, old.cr or old.rr or {}
  if fkey then
    rec.fkey, rec.fhash = stored_text(fkey), old.ck and old.ch or old.rh
    local first = (done[1] ~= nil) and (old.ck and 3 or 2) or nil
    rec.fbalances = first and FIRST_LAYOUT.balances(done, first) or FIRST_LAYOUT.balances(done.balances)
  end
  if not rec.scope and old.subject then
    local parsed, subject = pcall(cjson.decode, old.subject)
    if parsed and type(subject) == 'table' then rec.scope = scope_path_of(subject) end
  end
  for _, name in ipairs(RECORD.fields) do
    if rec[name] == '' then rec[name] = nil end
  end
  return rec
end

-- A record's text of today's layout, whole: its fields by name ('' fields absent); {} when it
-- does not parse, false when it is of the first layout.
local function current_record(raw)
  if string.sub(raw, 1, 2) ~= '2\31' then return false end
  local f = {string.match(raw, string.sub(raw, 3, 3) == 'A' and RECORD.active or RECORD.finished)}
  if #f == 0 then return {} end
  local rec = {version = '2'}
  for i = 1, #f do
    if f[i] ~= '' then rec[RECORD.fields[i + 1]] = f[i] end
  end
  rec.status = STATUS_OF[rec.status]
  return rec
end

-- A record's text of either layout, whole.
local function decoded_record(raw)
  return current_record(raw) or FIRST_LAYOUT.record(raw)
end

-- The record stored at `key` by field name, and its text as stored; nil when there is none,
-- {} when it does not parse.
local function load_record(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  return decoded_record(raw), raw
end

-- What a script on one reservation reads of it: the head fields (the rest, from `tail_at`,
-- read only when needed: `whole_record`), or the whole record of the first layout. With `rid`
-- (`read_reservation`), the reservation's numbers go in the same table: one table per request
-- where a record and a view of it were two. Fields that are empty ('') are absent; the optional
-- ones are set only when present, so the table is made once at the size it keeps.
local function head_record(raw, rid)
  local s, codes, estimate, unit, policy, created, expires, grace, ext, max_ext, scope, m, qrun, subject, tail_at =
    string.match(raw, RECORD.head)
  if not s then return decoded_record(raw) end
  local rec = {status = STATUS_OF[s], codes = codes ~= '' and codes or nil, estimate = estimate ~= '' and estimate or nil,
    unit = unit ~= '' and unit or nil, policy = policy ~= '' and policy or nil, created = created ~= '' and created or nil,
    expires = expires ~= '' and expires or nil, scope = scope ~= '' and scope or nil,
    subject = subject ~= '' and subject or nil, raw = raw, tail_at = tail_at, head_only = true,
    rid = rid, expires_at = rid and tonumber(expires), grace_ms = rid and (tonumber(grace) or RULES.DEFAULT_GRACE_MS),
    extensions = rid and (tonumber(ext) or 0), max_extensions = rid and (tonumber(max_ext) or RULES.MAX_EXTENSIONS),
    created_at = rid and tonumber(created), scope_path = rid and scope}
  if grace ~= '' then rec.grace = grace end
  if ext ~= '' then rec.ext = ext end
  if max_ext ~= '' then rec.max_ext = max_ext end
  if m ~= '' then rec.m = m end
  if qrun ~= '' then rec.qrun = qrun end
  return rec
end

-- The whole record of one read by `head_record`.
local function whole_record(rec)
  if not rec.head_only then return rec end
  local whole = current_record(rec.raw)
  whole.raw = rec.raw
  return whole
end

-- The first `n` fields of a record's text (n: RECORD.head_fields, active_fields or all): the
-- layout's version, the status, then by name (RECORD.text, generated from the layout).
local function record_fields(rec, n)
  return RECORD.text[n](rec, STATUS_CODE[rec.status])
end

-- The record's text (today's layout). Metadata the record carries (a new reservation's, or
-- what a record of the first layout held inline) goes to the metadata key beside record `key`,
-- and the record says it has some (`m`).
local function record_text(rec, key)
  if rec.metadata or rec.cmeta then
    local meta = RECORD.metadata_key(key)
    if rec.metadata then redis.call('HSET', meta, 'metadata', rec.metadata) end
    if rec.cmeta then redis.call('HSET', meta, 'cmeta', rec.cmeta) end
    rec.metadata, rec.cmeta, rec.m = nil, nil, '1'
  end
  return record_fields(rec, rec.status == 'ACTIVE' and RECORD.active_fields or #RECORD.fields)
end

local function save_record(key, rec)
  redis.call('SET', key, record_text(whole_record(rec), key), 'KEEPTTL')
end

-- Saves an ACTIVE record with a new expiry and extension count; the first extension keeps the
-- expiry the reserve gave as first_expires (its answer's). A record read by `head_record` is
-- spliced: its head written anew, the rest kept as stored (no whole decode and re-encode).
local function save_extension(key, rec, expires, ext)
  if not rec.head_only then
    rec.first_expires = rec.first_expires or rec.expires
    rec.expires, rec.ext = expires, ext
    return save_record(key, rec)
  end
  local lead, first, rest = string.match(string.sub(rec.raw, rec.tail_at), RECORD.before_first_expires)
  if first == '' then first = rec.expires end
  rec.expires, rec.ext = expires, ext
  redis.call('SET', key, record_fields(rec, RECORD.head_fields) .. '\31' .. lead .. first .. rest, 'KEEPTTL')
end

-- Finishes an ACTIVE reservation's record (read by `head_record`): its status becomes `status`
-- and the finishing fields (`fin`: fkey, fhash, fbalances, charged, finished, metrics, reason)
-- follow its fields. A record of the first layout is written whole in today's. The finished
-- record (and its metadata beside it) is kept `ttl` ms (digits), the retention of finished
-- records: set with the record's write, not by a command of its own.
local function finish_record(key, rec, status, fin, ttl)
  rec.status = status
  for name, v in pairs(fin) do rec[name] = v end
  local text
  if rec.head_only then
    text = '2\31' .. STATUS_CODE[status] .. string.sub(rec.raw, 4) .. '\31' .. (fin.fkey or '') .. '\31' ..
      (fin.fhash or '') .. '\31' .. (fin.fbalances or '') .. '\31' .. (fin.charged or '') .. '\31' .. (fin.finished or '') ..
      '\31' .. (fin.metrics or '') .. '\31' .. (fin.reason or '')
  else
    text = record_text(whole_record(rec), key)
  end
  redis.call('SET', key, text, 'PX', ttl)
  if rec.m then redis.call('PEXPIRE', RECORD.metadata_key(key), ttl) end
end

-- The answer of a reserve (JSON) from its record and id, written out (every reserve answers
-- it; cjson escapes the id and the caps, the texts a client or a policy chose).
local function reserve_answer(rec, rid)
  return '{"reservation_id":' .. cjson.encode(rid) .. ',"decision":"' .. (rec.decision or 'ALLOW') ..
    '","expires_at_ms":"' .. (rec.first_expires or rec.expires) .. '","balances":"' .. (rec.balances or '') .. '"' ..
    (rec.caps and (',"caps":' .. cjson.encode(rec.caps)) or '') .. '}'
end

-- The answer of a commit or a release from its record (JSON), with the reservation's subject
-- and unit (the handler derives the balances' scopes from them). Written out: the balances are
-- digits, spaces and commas, the amounts digits; cjson escapes the subject and the unit.
local function settle_answer(rec)
  local amounts
  if rec.status == 'COMMITTED' then
    amounts = ',"charged":"' .. rec.charged .. '"'
    if d_cmp(rec.charged, rec.estimate) < 0 then amounts = amounts .. ',"released":"' .. d_sub(rec.estimate, rec.charged) .. '"' end
  else
    amounts = ',"released":"' .. rec.estimate .. '"'
  end
  return '{"balances":"' .. (rec.fbalances or '') .. '","subject":' .. cjson.encode(rec.subject or '') .. ',"unit":' ..
    cjson.encode(rec.unit or '') .. amounts .. '}'
end
