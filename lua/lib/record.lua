-- The reservation record: one string per reservation, its own idempotency record too.
-- needs: decimal, access
--
-- Since version 2 a record is a JSON array of strings, in the order of RECORD (its positions
-- are named there): no field names and no nesting, so a finished reservation keeps its few
-- hundred bytes and a script decodes it into one array. '' stands for none; a record of an
-- ACTIVE reservation ends after `qrun`, a finished one carries the finishing fields after it.
-- `ops::reservations::ReservationRecord` reads the same layout. Records written before (a JSON
-- object with named fields, its stored answers nested) are read as such and written back in
-- the new layout by their next change.
local RECORD = {'version', 'status', 'codes', 'estimate', 'unit', 'policy', 'created', 'expires', 'grace', 'ext',
  'max_ext', 'scope', 'm', 'ik', 'ph', 'decision', 'caps', 'first_expires', 'balances', 'subject', 'action', 'qrun',
  'fkey', 'fhash', 'fbalances', 'charged', 'finished', 'metrics', 'reason'}
local RECORD_ACTIVE_FIELDS = 22

-- The balances answers carry, as text: per budget, in canonical scope order, its allocated,
-- remaining, reserved, spent, debt, overdraft_limit and '1'/'0' (over the limit), separated
-- by spaces; budgets separated by commas (`ops::LedgerState` reads it).
local function balances(budgets)
  local out = {}
  for i, b in ipairs(budgets) do
    out[i] = b.allocated .. ' ' .. b.remaining .. ' ' .. b.reserved .. ' ' .. b.spent .. ' ' .. b.debt .. ' ' ..
      b.overdraft_limit .. (b.over and ' 1' or ' 0')
  end
  return table.concat(out, ',')
end

-- Balances kept by records of the first layout: a list of 7-string lists, or (older still)
-- 7 strings per budget from `first` on in a flat list.
local function legacy_balances(list, first)
  local out = {}
  if first then
    for i = first, #list, 7 do out[#out + 1] = table.concat({unpack(list, i, i + 6)}, ' ') end
  else
    for i, row in ipairs(list or {}) do out[i] = table.concat(row, ' ') end
  end
  return table.concat(out, ',')
end

-- A record of the first layout, as a record of today's.
local function upgraded(old)
  local rec = {version = '2', status = old.status, codes = old.codes, estimate = old.estimate, unit = old.unit,
    policy = old.policy, created = old.created, expires = old.expires, grace = old.grace, ext = old.ext,
    max_ext = old.max_ext, scope = old.scope, m = old.m, ik = old.ik, ph = old.ph, subject = old.subject,
    action = old.action, qrun = old.qrun and cjson.encode(old.qrun) or nil, charged = old.charged,
    finished = old.finalized or old.expired, metrics = old.metrics, reason = old.reason, metadata = old.metadata,
    cmeta = old.cmeta}
  local r = old.result or {}
  if r[1] ~= nil then
    rec.decision, rec.first_expires, rec.caps, rec.balances = r[1], r[2], r[3], legacy_balances(r, 4)
  else
    rec.decision, rec.first_expires, rec.caps, rec.balances = r.decision, r.expires_at_ms, r.caps,
      legacy_balances(r.balances)
  end
  if rec.decision == 'ALLOW' then rec.decision = nil end
  if rec.first_expires == rec.expires then rec.first_expires = nil end
  if old.ck then
    local c = old.cr or {}
    rec.fkey, rec.fhash = old.ck, old.ch
    rec.fbalances = (c[1] ~= nil) and legacy_balances(c, 3) or legacy_balances(c.balances)
  elseif old.rk then
    local c = old.rr or {}
    rec.fkey, rec.fhash = old.rk, old.rh
    rec.fbalances = (c[1] ~= nil) and legacy_balances(c, 2) or legacy_balances(c.balances)
  end
  if not rec.scope and old.subject then
    local decoded, subject = pcall(cjson.decode, old.subject)
    if decoded and type(subject) == 'table' then rec.scope = scope_path_of(subject) end
  end
  for _, name in ipairs(RECORD) do
    if rec[name] == '' then rec[name] = nil end
  end
  return rec
end

-- The record stored at `key`, by field name ('' fields absent), and its text as stored; nil
-- when there is none, {} when it does not decode.
local function load_record(key)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  local decoded, stored = pcall(cjson.decode, raw)
  if not decoded or type(stored) ~= 'table' then return {}, raw end
  if stored[1] == nil then return upgraded(stored), raw end
  local rec = {}
  for i, name in ipairs(RECORD) do
    local v = stored[i]
    if v and v ~= '' then rec[name] = v end
  end
  return rec, raw
end

-- The record's text (today's layout). A record of the first layout that held its metadata
-- inline gives it up here: `meta_key` receives it.
local function record_text(rec, meta_key)
  if rec.metadata or rec.cmeta then
    local moved = {}
    if rec.metadata then moved[#moved + 1] = 'metadata'; moved[#moved + 1] = rec.metadata end
    if rec.cmeta then moved[#moved + 1] = 'cmeta'; moved[#moved + 1] = rec.cmeta end
    redis.call('HSET', meta_key, unpack(moved))
    rec.metadata, rec.cmeta, rec.m = nil, nil, '1'
  end
  local n = rec.status == 'ACTIVE' and RECORD_ACTIVE_FIELDS or #RECORD
  local out = {}
  for i = 1, n do out[i] = rec[RECORD[i]] or '' end
  out[1] = '2'
  return cjson.encode(out)
end

local function save_record(key, rec, meta_key)
  redis.call('SET', key, record_text(rec, meta_key), 'KEEPTTL')
end

-- The answer of a reserve from its record (the caller adds the id).
local function reserve_answer(rec)
  return {decision = rec.decision or 'ALLOW', expires_at_ms = rec.first_expires or rec.expires, caps = rec.caps,
    balances = rec.balances or ''}
end

-- The answer of a commit or a release from its record, with the reservation's subject and
-- unit (the handler derives the balances' scopes from them).
local function settle_answer(rec)
  local out = {balances = rec.fbalances or '', subject = rec.subject, unit = rec.unit}
  if rec.status == 'COMMITTED' then
    out.charged = rec.charged
    if d_cmp(rec.charged, rec.estimate) < 0 then out.released = d_sub(rec.estimate, rec.charged) end
  else
    out.released = rec.estimate
  end
  return out
end
