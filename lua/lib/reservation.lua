-- Reservations: the record, its stored answers, expiry, and the opening every script on one
-- reservation shares.
-- needs: decimal, reply, calendar, access, tenant, events, ledger, alerts, periods, guards, usage, listing, record

-- Reads a reservation; nil when absent (or when the id does not match the record). A record
-- whose essential fields do not parse is returned with `corrupt` set (never acted on:
-- callers quarantine or fail).
local function read_reservation(key, rid)
  local raw = redis.call('GET', key)
  if not raw then return nil end
  -- the record's fields by name and, beside them, `rid`, `expires_at`, `grace_ms`,
  -- `extensions`, `max_extensions`, `created_at` and `scope_path`; `rec` is the record itself
  local r = head_record(raw, rid)
  -- The id names the ledgers whose keys the caller declared: it must be this record's id.
  if r.codes ~= nil and r.codes ~= string.match(rid, '^[^.]*%.[^.]*%.(.*)$') then return nil end
  if not r.head_only then
    -- (a record of the first layout, decoded whole)
    r.raw, r.rid, r.expires_at, r.grace_ms = raw, rid, tonumber(r.expires), tonumber(r.grace) or RULES.DEFAULT_GRACE_MS
    r.extensions, r.max_extensions = tonumber(r.ext) or 0, tonumber(r.max_ext) or RULES.MAX_EXTENSIONS
    r.created_at, r.scope_path = tonumber(r.created), r.scope
  end
  r.rec = r
  if not (r.codes and r.scope_path and r.expires_at and r.created_at and STATUS_CODE[r.status] and type(r.estimate) == 'string'
      and string.match(r.estimate, '^%d+$') and d_fits(r.estimate)) then
    r.corrupt = true
  end
  return r
end

-- Expires an ACTIVE reservation past expires_at + grace: its hold returns to every budgeted
-- scope exactly once. Used by every script that touches a reservation, and by the sweep.
-- `ix`: the reservation's keys, named as the scripts on one reservation name them (`reservation`,
-- `budgets`, and the tenant's `expiry_index`, `events`, `listing_index`, `due_index`
-- when the script has it); `r.sc` the scene when the caller has one; `retention_ms` digits.
local function expire_if_overdue(r, ix, now, retention_ms)
  if r.status ~= 'ACTIVE' or now <= r.expires_at + r.grace_ms then return false end
  local tenant = string.match(r.rid, '^([^.]+)%.')
  local sc = r.sc or scene(ix.events, nil, now, r.tenant, tenant)
  local budgets = read_budgets(ix.budgets, sc)
  for i = 1, #budgets do local b = budgets[i]
    b.reserved = d_sub(b.reserved, r.estimate)
    b.remaining = d_add(b.remaining, r.estimate)
  end
  local e = write_budgets(budgets, itoa(now))
  if e then error(e[3]) end
  give_back(sc, r.rec)
  record_ending(sc, ix.due_index, 'x', r)
  list_status(ix.listing_index, r, 'EXPIRED')
  finish_record(ix.reservation, r.rec, 'EXPIRED', {finished = itoa(now)}, retention_ms)
  r.status = 'EXPIRED'
  redis.call('ZREM', ix.expiry_index, r.rid)
  local data = '{"reservation_id":' .. cjson.encode(r.rid) .. ',"scope":' .. cjson.encode(r.scope_path) ..
    ',"unit":' .. cjson.encode(r.unit) .. ',"estimated_amount":' .. r.estimate .. ',"created_at":"' ..
    iso8601(r.created_at) .. '","expired_at":"' .. iso8601(now) .. '","ttl_ms":' ..
    string.format('%d', r.expires_at - r.created_at) .. ',"extensions_used":' .. string.format('%d', r.extensions) .. '}'
  emit(ix.events, 'reservation.expired', tenant, r.scope_path, nil, 'cycles-expiry', data, now)
  for i = 1, #budgets do hold_events(sc, budgets[i], r.unit) end
  count_and_check(sc, 'x')
  return true
end

-- The opening every script on one reservation (commit, release, extend) shares, in order: the
-- key check, the record (404), the key's scope filter, the answer to an earlier identical
-- request (`replay_of(r)` gives it, or nil), the tenant guard, and expiry on touch; then only
-- an ACTIVE reservation goes on. `K` and `A` are the script's keys and arguments, named alike
-- in the three. Returns the reservation, or nil and the answer to give.
local function open_reservation(K, A, now, replay_of)
  local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
  if denied then return nil, denied end
  local r = read_reservation(K.reservation, A.reservation_id)
  if not r then return nil, err('NOT_FOUND', MSG.RESERVATION_NOT_FOUND) end
  denied = filter and scope_guard(filter, r.scope_path)
  if denied then return nil, denied end
  local answer = replay_of(r)
  if answer then return nil, answer end
  r.tenant = tenant_record(K.tenant)
  local guard = tenant_guard(r.tenant)
  if guard then return nil, guard end
  if r.corrupt then return nil, err('INTERNAL_ERROR', MSG.RESERVATION_CORRUPT) end
  r.sc = scene(K.events, A.context, now, r.tenant)
  if A.digest ~= '' then RATES.count(r.sc, 'a') end
  expire_if_overdue(r, K, now, A.record_ttl_ms)
  if r.status == 'EXPIRED' then return nil, err('RESERVATION_EXPIRED', MSG.RESERVATION_EXPIRED) end
  if r.status ~= 'ACTIVE' then return nil, err('RESERVATION_FINALIZED', MSG.RESERVATION_FINALIZED .. r.status) end
  return r
end
