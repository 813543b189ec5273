-- Events and audit entries, written in the same script as the change they record.
-- needs: decimal, reply, calendar

-- The entry id each event stream last took from this script VM, so an event's id is known
-- without reading the stream. A guess the stream refuses (an entry written from elsewhere, or
-- nothing remembered yet) is corrected from the stream's last id (`LAST_ENTRY.info`), which
-- its trimmed or deleted entries keep: its newest entry may be older.
local LAST_ENTRY = {max = 1024, kept = 0, known = {}}

-- A field of a stream's XINFO (`last-generated-id`, `entries-added`); nil for a stream that
-- does not exist (its error is a table without entries).
function LAST_ENTRY.info(key, field)
  local info = redis.pcall('XINFO', 'STREAM', key)
  for i = 1, #info - 1, 2 do
    if info[i] == field then return info[i + 1] end
  end
  return nil
end

-- The entry id after `last` ("<ms>-<seq>", or nil): `now`-0, or the next after the last when
-- that is at or past `now` (so ids stay monotonic even if TIME steps back).
local function next_entry(last, now)
  local ms, seq = string.match(last or '0-0', '^(%d+)-(%d+)$')
  if tonumber(ms) < now then return string.format('%d-0', now) end
  return ms .. '-' .. (seq + 1)
end

-- XADDs an event at `entry`, which its id (evt_<entry>.<tenant>, so getEvent finds it with one
-- read) and its JSON (`body`: what follows the id) carry. The JSON, and the error when the
-- stream refuses the id. (The inbound traceparent flags travel beside the closed Event.)
local function add_event(events_key, entry, event_type, tenant, body, flags)
  local json = '{"event_id":"evt_' .. entry .. '.' .. tenant .. '"' .. body
  local added
  if flags and flags ~= '' then
    added = redis.pcall('XADD', events_key, entry, 'type', event_type, 'event', json, 'flags', flags)
  else
    added = redis.pcall('XADD', events_key, entry, 'type', event_type, 'event', json)
  end
  return json, type(added) == 'table' and added.err
end

-- Appends an event (the spec's `Event` JSON) to the tenant's event stream, in the same script
-- as the state change that causes it. `data_json` is pre-built JSON (amounts as raw digits).
-- `ctx` carries the causing request (request_id, trace_id, actor, key_id, tenant); nil for
-- system work such as the expiry sweep.
local function emit(events_key, event_type, tenant, scope, ctx, source, data_json, now)
  -- quota.* (v0.1.26) and policy.limit_reached belong to the reservation path that causes
  -- them (EventCategory has no `quota`; `ops::events::category_of` says the same)
  local category = string.match(event_type, '^([^.]+)')
  if category == 'quota' or event_type == 'policy.limit_reached' then category = 'reservation' end
  -- (event types, categories, sources, actor types and tenant ids are words of ours, [a-z0-9_.-]:
  -- quoted as they are; what a client may have written goes through cjson)
  local actor = '{"type":"' .. ((ctx and ctx.actor) or 'system') .. '"'
  if ctx and ctx.key_id and ctx.key_id ~= '' then actor = actor .. ',"key_id":' .. cjson.encode(ctx.key_id) end
  local body = ',"event_type":"' .. event_type .. '","category":"' .. category .. '","timestamp":"' .. iso8601(now) ..
    '","tenant_id":"' .. tenant .. '"' .. (scope and (',"scope":' .. cjson.encode(scope)) or '') ..
    ',"actor":' .. actor .. '},"source":"' .. source .. '","data":' .. data_json
  if ctx then
    if ctx.request_id and ctx.request_id ~= '' then body = body .. ',"request_id":' .. cjson.encode(ctx.request_id) end
    if ctx.trace_id and ctx.trace_id ~= '' then body = body .. ',"trace_id":' .. cjson.encode(ctx.trace_id) end
    if ctx.correlation_id then body = body .. ',"correlation_id":' .. cjson.encode(ctx.correlation_id) end
  end
  body = body .. '}'
  local flags = ctx and ctx.trace_flags
  local entry = next_entry(LAST_ENTRY.known[events_key], now)
  local json, taken = add_event(events_key, entry, event_type, tenant, body, flags)
  if taken then
    entry = next_entry(LAST_ENTRY.info(events_key, 'last-generated-id'), now)
    json, taken = add_event(events_key, entry, event_type, tenant, body, flags)
    if taken then error(taken) end
  end
  remember(LAST_ENTRY, events_key, entry)
  -- The overview's counters (`ops::overview`), kept with the event so that it never reads the
  -- stream: per hour, "<minute>|<category>" and "<minute>|denied|<reason>" counts (the hash
  -- lives two hours), and the ten latest denials and expiries.
  -- (numbers go to Redis and into names as digits: a Lua number is formatted as a float)
  local m = math.floor(tonumber(string.match(entry, '^%d+')) / 60000)
  local minute, prefix = itoa(m), KEY.prefix_of(events_key)
  local stats = KEY.event_stats(prefix, itoa(math.floor(m / 60)))
  -- (a new hash's first count is 1: only then may it lack its lifetime)
  local fresh = redis.call('HINCRBY', stats, minute .. '|' .. category, '1') == 1
  if event_type == 'reservation.denied' or event_type == 'reservation.expired' then
    if event_type == 'reservation.denied' then
      local reason = string.match(data_json, '"reason_code":"([A-Z_]+)"') or 'UNKNOWN'
      redis.call('HINCRBY', stats, minute .. '|denied|' .. reason, '1')
    end
    local recent = KEY.event_recent(prefix, event_type)
    redis.call('LPUSH', recent, json)
    redis.call('LTRIM', recent, '0', '9')
  end
  if fresh then redis.call('EXPIRE', stats, '7200', 'NX') end
end

-- The request context scripts receive as one JSON argument (strings only).
local function request_context(json)
  local decoded, ctx = pcall(cjson.decode, json)
  if decoded and type(ctx) == 'table' then return ctx end
  return nil
end

local function ratio(a, b)
  local x, y = tonumber(a), tonumber(b)
  if not y or y == 0 then return '0' end
  return string.format('%.4f', x / y)
end

-- Appends an audit entry to its owner's audit stream (in the tenant's slot) in the same step as
-- the change it records. `ctx` (the request context) names the operation, its caller and the
-- status the request answers; `action` says what this entry changed (a cascade writes several).
local function audit(key, ctx, action, resource_type, resource_id, now, details)
  -- a bulk action's rows: the invocation's one entry is written apart, with every row's outcome
  if ctx and ctx.bulk then return end
  ctx = ctx or {}
  local entry = { timestamp_ms = now, tenant_id = ctx.tenant or '', operation = ctx.operation or action,
    status = tonumber(ctx.status) or 200, resource_type = resource_type, resource_id = resource_id,
    key_id = ctx.key_id or '', request_id = ctx.request_id or '', trace_id = ctx.trace_id or '',
    user_agent = ctx.user_agent, source_ip = ctx.source_ip, actor_type = ctx.actor or 'system', action = action,
    correlation_id = ctx.correlation_id, details = details }
  redis.call('XADD', key, '*', 'entry', cjson.encode(entry))
end

-- Ledger state as EventDataBudgetLifecycle's previous_state/new_state (amounts as raw digits).
local function ledger_state(b, with_reserved)
  return '{"allocated":' .. b.allocated .. ',"remaining":' .. b.remaining .. ',"debt":' .. b.debt ..
    ',"spent":' .. b.spent .. (with_reserved and (',"reserved":' .. b.reserved) or '') ..
    ',"status":"' .. b.status .. '"}'
end

-- budget.over_limit_entered / budget.over_limit_exited when a write flips the flag: a runtime
-- change, an admin write or a period roll (`source`, else 'cycles-admin').
local function over_limit_events(events_key, ctx, b, tenant, now, source)
  if b.over == b.before.over then return end
  local kind = b.over and 'budget.over_limit_entered' or 'budget.over_limit_exited'
  emit(events_key, kind, tenant, b.scope, ctx, source or 'cycles-admin',
    '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","debt":' .. b.debt ..
    ',"overdraft_limit":' .. b.overdraft_limit .. ',"is_over_limit":' .. tostring(b.over) ..
    ',"debt_utilization":' .. ratio(b.debt, b.overdraft_limit) .. '}', now)
end

-- reservation.denied for a denied evaluation `e` (live reserve, dry_run, decide; `A` its
-- arguments): the scope that denied, else the deepest derived scope; and the denial counted
-- for the denial-rate alert.
-- JSON of a table holding a DenyDetail: budget_remaining (kept as digits) becomes a number.
local function detail_json(t)
  return (string.gsub(cjson.encode(t), '"budget_remaining":"(%-?%d+)"', '"budget_remaining":%1'))
end
