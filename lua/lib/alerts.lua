-- Alerts: the scene a script works in, utilization thresholds, burn-rate windows, windowed
-- rate counters and their spikes, and the budget events of a write.
-- needs: decimal, reply, access, events

-- ---------------------------------------------------------------------------------------------
-- Alerts and budget periods. A script that changes ledgers carries a scene: its tenant's event
-- stream and key prefix, the tenant's name (tenant ids need no escaping in keys) and record, the
-- request context (nil for system work) and Redis's clock. Every key below shares the tenant's
-- prefix, so its slot. A context given as its JSON text is decoded only when an event needs it.

-- The scene's request context and tenant name are worked out when first needed (most requests
-- write no event: `SCENE.lazy`); each events key's prefix is matched once per script VM
-- (`SCENE.prefixes`).
local SCENE = {prefixes = {known = {}, kept = 0, max = 1000}, lazy = {__index = function(sc, field)
  local v
  if field == 'ctx' then v = request_context(sc.raw_ctx) or false
  elseif field == 'name' then v = KEY.tag_of(sc.prefix)
  else return nil end
  rawset(sc, field, v)
  return v
end}}

local function scene(events_key, ctx, now, tenant, name)
  local prefix = SCENE.prefixes.known[events_key] or remember(SCENE.prefixes, events_key, KEY.prefix_of(events_key))
  local sc = {events = events_key, prefix = prefix, now = now, tenant = tenant, name = name}
  if type(ctx) == 'string' then sc.raw_ctx = ctx else sc.ctx = ctx or false end
  return setmetatable(sc, SCENE.lazy)
end

-- The alert settings in force for the scene's tenant: its record's `alerts` (the union of its
-- webhook subscriptions' thresholds, kept by the webhook writes), over the spec's defaults.
-- Each distinct text is decoded once per script VM (`ALERT_MEMOS.settings`; shared, so never
-- changed); a tenant without its own ('' or none) has the defaults without a decode.
local ALERT_MEMOS = {settings = {known = {}, kept = 0, max = 1000}, windows = {known = {}, kept = 0, max = 1000}}
local function alert_settings(sc)
  if sc.cfg then return sc.cfg end
  local raw = (type(sc.tenant) == 'table') and sc.tenant.alerts
  if raw == nil then raw = redis.call('HGET', KEY.tenant(sc.prefix), 'alerts') end
  local cfg = RULES.ALERTS
  if raw and raw ~= '' then
    cfg = ALERT_MEMOS.settings.known[raw]
    if not cfg then
      local ok_, own = pcall(cjson.decode, raw)
      cfg = RULES.ALERTS
      if ok_ and type(own) == 'table' then
        for k, v in pairs(RULES.ALERTS) do if own[k] == nil then own[k] = v end end
        cfg = own
      end
      remember(ALERT_MEMOS.settings, raw, cfg)
    end
  end
  sc.cfg = cfg
  return cfg
end

-- budget.threshold_crossed for each threshold the ledger's utilization, (spent + reserved) /
-- allocated, crossed since `from` (a state with allocated, spent and reserved): rising from
-- below to at-or-above, falling the other way. A change that leaves the utilization on one
-- side of a threshold emits nothing, so each crossing is announced once per direction. A
-- ledger without an allocation has no utilization. (Each amount is read as a number once:
-- reading digits costs more than the division.)
local function threshold_events(sc, b, from)
  local same_spent = from.spent == b.spent
  if same_spent and from.reserved == b.reserved and from.allocated == b.allocated then return end
  if b.allocated == '0' or from.allocated == '0' then return end
  local a1 = b.allocated + 0
  local a0 = from.allocated == b.allocated and a1 or from.allocated + 0
  if a0 <= 0 or a1 <= 0 then return end
  local s1 = b.spent + 0
  local u0, u1 = ((same_spent and s1 or from.spent + 0) + from.reserved) / a0, (s1 + b.reserved) / a1
  if u0 == u1 then return end
  local th = alert_settings(sc).th
  for i = 1, #th do
    local t, dir = th[i], nil
    if u0 < t and u1 >= t then dir = 'rising' elseif u0 >= t and u1 < t then dir = 'falling' end
    if dir then
      emit(sc.events, 'budget.threshold_crossed', sc.name, b.scope, sc.ctx, 'cycles-server',
        '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","threshold":' .. t ..
        ',"utilization":' .. string.format('%.4f', u1) .. ',"allocated":' .. b.allocated .. ',"remaining":' ..
        b.remaining .. ',"spent":' .. b.spent .. ',"reserved":' .. b.reserved .. ',"direction":"' .. dir .. '"}', sc.now)
    end
  end
end

-- A ledger's burn window, kept in its `burn` field as "<window start>:<spend>:<baseline>:
-- <closed windows>:<alerted>": tumbling windows of burn_rate_window_seconds, and a baseline that
-- is the exponential average of the closed windows' spend (weight 1/12, empty windows
-- included). When this window's spend reaches burn_rate_multiplier x the baseline (after
-- RULES.ALERTS.min_burn_windows windows of history), `b.anomaly` is set for
-- budget.burn_rate_anomaly, once per window.
local BURN = {weight = 1 / 12, memo = {known = {}, texts = {}, kept = 0, max = 2000}}
local function track_burn(sc, b, delta)
  local cfg = alert_settings(sc)
  local w, now = cfg.bw * 1000, sc.now
  local ws, spend, base, n, alerted, base_text, head, tail
  local known = recall(BURN.memo, b.key, b.burn)
  if known then
    ws, spend, base, n, alerted, base_text, head, tail = unpack(known)
  else
    ws, spend, base_text, n, alerted = string.match(b.burn or '', '^(%d+):([^:]+):([^:]+):(%d+):(%d)$')
    ws, spend, base, n = tonumber(ws), tonumber(spend), tonumber(base_text), tonumber(n)
  end
  if not (ws and spend and base and n) then ws, spend, base, n, alerted, base_text = now - now % w, 0, 0, 0, '0', nil end
  if now >= ws + w then
    local k = math.floor((now - ws) / w)
    if n == 0 then base = spend else base = base + BURN.weight * (spend - base) end
    base = base * (1 - BURN.weight) ^ (k - 1)
    ws, spend, n, alerted, base_text, head = ws + k * w, 0, n + k, '0', nil, nil
  end
  spend = spend + tonumber(delta)
  if alerted == '0' and n >= RULES.ALERTS.min_burn_windows and base >= 1 and spend >= cfg.bm * base then
    alerted, head = '1', nil
    local minutes = w / 60000
    local rate = spend / minutes
    b.anomaly = '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","current_rate":' ..
      string.format('%.4f', rate) .. ',"baseline_rate":' .. string.format('%.4f', base / minutes) ..
      ',"multiplier":' .. string.format('%.4f', spend / base) .. ',"window_seconds":' .. itoa(cfg.bw) ..
      ',"projected_exhaustion_minutes":' .. string.format('%.4f', math.max(tonumber(b.remaining), 0) / rate) .. '}'
  end
  -- (%.17g gives every double back exactly, so the remembered numbers are the text's; a whole
  -- spend reads back alike as %d, and the baseline's text is kept while it stands: each %.17g
  -- costs half of the whole text. The text around the spend is made once per window and
  -- alert, so a charge formats its spend only.)
  base_text = base_text or string.format('%.17g', base)
  if not head then head, tail = itoa(ws) .. ':', ':' .. base_text .. ':' .. itoa(n) .. ':' .. alerted end
  local whole = spend % 1 == 0 and math.abs(spend) < 1e15
  b.burn = head .. (whole and itoa(spend) or string.format('%.17g', spend)) .. tail
  -- the ledger's window as this VM last wrote it
  -- (the remembered numbers are this VM's own table, so they are updated where they are)
  if known then
    known[1], known[2], known[3], known[4], known[5], known[6], known[7], known[8] = ws, spend, base, n, alerted, base_text, head, tail
  else
    known = {ws, spend, base, n, alerted, base_text, head, tail}
  end
  remember(BURN.memo, b.key, known, b.burn)
end

-- Before a write that charges: each ledger whose spent grew (`b.grew`, as `settle` left it)
-- moves its burn window.
local function track_spend(sc, budgets)
  for i = 1, #budgets do local b = budgets[i]
    if b.grew and b.grew ~= '0' then track_burn(sc, b, b.grew) end
  end
end

-- Windowed counters of a tenant for the rate spikes: per tenth of its rate window one hash of
-- counts (n: reservation attempts that made none, i.e. live denials and evaluations; d: their
-- denials, x: expiries, a: other API-key writes, f: authentication failures) that expires
-- after eleven tenths, so a tenant's counters take at most eleven small hashes whatever its
-- traffic. The reservations made are not counted on the way: each tenth's hash keeps, as `s`,
-- how many entries the tenant's created stream had had added (XINFO's entries-added, which
-- trims never lower) before the tenth's first reserve, so those made over the window are the
-- stream's count now less the oldest such mark in it (the hot reserve writes nothing for it).
-- Each tenant's current window key is remembered per script VM (`ALERT_MEMOS.windows`, by key
-- prefix), so a count formats its digits once per tenth, not once per request.
local RATES = {spikes = {
  d = {metric = 'denial_rate', event = 'reservation.denial_rate_spike', setting = 'dr'},
  x = {metric = 'expiry_rate', event = 'reservation.expiry_rate_spike', setting = 'er'},
  f = {metric = 'auth_failure_rate', event = 'api_key.auth_failure_rate_spike', setting = 'ar'},
}}

-- The tenant's current window; `mark`: before a reserve that may make a reservation, so the
-- window's mark (`s`) is written, once per tenth.
function RATES.window(sc, mark)
  local size = alert_settings(sc).rw * 100
  local tenth = math.floor(sc.now / size)
  local w = ALERT_MEMOS.windows.known[sc.prefix]
  if not w or w.tenth ~= tenth or w.size ~= size then
    w = remember(ALERT_MEMOS.windows, sc.prefix, {tenth = tenth, size = size,
      key = KEY.alert_window(sc.prefix, itoa(size), itoa(tenth))})
  end
  if mark and not w.marked then
    if redis.call('HSETNX', w.key, 's', itoa(RATES.made(sc.prefix))) == 1 then
      redis.call('PEXPIRE', w.key, itoa(w.size * 11))
    end
    w.marked = true
  end
  return w
end

-- Counts one `field` in the tenant's current window; its count there now.
function RATES.count(sc, field)
  local w = RATES.window(sc)
  local n = redis.call('HINCRBY', w.key, field, '1')
  if n == 1 then redis.call('PEXPIRE', w.key, itoa(w.size * 11)) end
  return n
end

-- How many reservations the tenant's created stream has had added (0 before its first).
function RATES.made(prefix)
  return LAST_ENTRY.info(KEY.created_stream(prefix), 'entries-added') or 0
end

-- After a count of `field` (d, x or f): the share over the last window (ten tenths) of
-- denials among reservation attempts, of expiries among reservations made, or of failures
-- among authentications; above its threshold, with at least RULES.ALERTS.min_samples in the
-- window, the spike event, at most once per window.
local function spike_check(sc, field)
  local cfg, s = alert_settings(sc), RATES.spikes[field]
  local window = cfg.rw * 1000
  local alerted = KEY.alerted(sc.prefix)
  if sc.now < tonumber(redis.call('HGET', alerted, s.metric) or '0') + window then return end
  local size = cfg.rw * 100
  local last = math.floor(sc.now / size)
  local t, mark = {0, 0, 0, 0, 0}, nil
  for i = last - 9, last do
    local v = redis.call('HMGET', KEY.alert_window(sc.prefix, size, i), 'n', 'd', 'x', 'a', 'f', 's')
    for j = 1, 5 do t[j] = t[j] + (tonumber(v[j]) or 0) end
    mark = mark or tonumber(v[6])
  end
  -- (a window without a mark saw no reserve, so none made)
  local made = mark and math.max(RATES.made(sc.prefix) - mark, 0) or 0
  local hits, total
  if field == 'd' then hits, total = t[2], made + t[1]
  elseif field == 'x' then hits, total = t[3], math.max(made, t[3])
  else hits, total = t[5], made + t[1] + t[4] + t[5] end
  if total < RULES.ALERTS.min_samples or hits / total <= cfg[s.setting] then return end
  redis.call('HSET', alerted, s.metric, itoa(sc.now))
  redis.call('PEXPIRE', alerted, 2 * 86400000)
  emit(sc.events, s.event, sc.name, nil, nil, 'cycles-server', '{"metric":"' .. s.metric .. '","current_rate":' ..
    string.format('%.4f', hits / total) .. ',"threshold_rate":' .. cfg[s.setting] .. ',"window_seconds":' ..
    itoa(cfg.rw) .. ',"sample_count":' .. itoa(total) .. '}', sc.now)
end

-- A counted occurrence that may make a spike (d, x, f). The window is looked at for each of
-- the first occurrences of a tenth, then for every tenth one, so a burst (a sweep expiring
-- thousands) pays about one look per ten.
local function count_and_check(sc, field)
  local n = RATES.count(sc, field)
  if n <= RULES.ALERTS.min_samples or n % 10 == 0 then spike_check(sc, field) end
end

-- An ACTIVE key (`k`: its key_id, name, status, expires_at_ms) past its expiry becomes
-- EXPIRED, with api_key.expired and an audit row.
local function expire_key(sc, key, k)
  redis.call('HSET', key, 'status', 'EXPIRED')
  KEY_AUTH.refresh(key)
  emit(sc.events, 'api_key.expired', sc.name, nil, nil, 'cycles-server', '{"key_id":' .. cjson.encode(k[1]) ..
    ',"key_name":' .. cjson.encode(k[2] or '') .. ',"previous_status":"ACTIVE","new_status":"EXPIRED"}', sc.now)
  audit(KEY.audit_log(sc.prefix), {tenant = sc.name, operation = 'expireApiKey', actor = 'system', status = 200},
    'api_key.expire', 'api_key', k[1], sc.now)
end

-- The events of a change to a ledger's holds (a reserve, a release, an expiry: reserved and
-- remaining move; nothing is spent, owed or over the limit): a utilization threshold crossed
-- (budget.threshold_crossed), remaining reaching 0 (budget.exhausted).
local function hold_events(sc, b, unit)
  threshold_events(sc, b, b.before)
  if b.remaining == '0' and d_pos(b.before.remaining) then
    local used = d_add(b.spent, b.reserved)
    emit(sc.events, 'budget.exhausted', sc.name, b.scope, sc.ctx, 'cycles-server',
      '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. unit .. '","threshold":1.0,"utilization":' .. ratio(used, b.allocated) ..
      ',"allocated":' .. b.allocated .. ',"remaining":' .. b.remaining .. ',"spent":' .. b.spent ..
      ',"reserved":' .. b.reserved .. ',"direction":"rising"}', sc.now)
  end
end

-- Budget events on real transitions of the budgets a charge just wrote: `hold_events`, then a
-- burn-rate anomaly (`track_burn`), is_over_limit turned on (budget.over_limit_entered; the
-- runtime never turns it off), debt grew (budget.debt_incurred, with `reservation_id` when a
-- commit caused it). They are written only by the script that makes the change, never on a
-- replay, so a request never writes one twice.
local function budget_events(sc, budgets, unit, reservation_id, policy)
  local events_key, now = sc.events, sc.now
  for i = 1, #budgets do local b = budgets[i]
    hold_events(sc, b, unit)
    if b.anomaly then
      emit(events_key, 'budget.burn_rate_anomaly', sc.name, b.scope, sc.ctx, 'cycles-server', b.anomaly, now)
    end
    if b.over ~= b.before.over then over_limit_events(events_key, sc.ctx, b, sc.name, now, 'cycles-server') end
    if b.debt ~= b.before.debt and d_cmp(b.debt, b.before.debt) > 0 then
      emit(events_key, 'budget.debt_incurred', sc.name, b.scope, sc.ctx, 'cycles-server',
        '{"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. unit .. '"' ..
        (reservation_id and (',"reservation_id":' .. cjson.encode(reservation_id)) or '') ..
        ',"debt_incurred":' .. d_sub(b.debt, b.before.debt) .. ',"total_debt":' .. b.debt ..
        ',"overdraft_limit":' .. b.overdraft_limit .. ',"overage_policy":"' .. policy .. '"}', now)
    end
  end
end
