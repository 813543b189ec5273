-- Spend analytics: every charge and every ending of a reservation appends one entry to the
-- tenant's usage log (one XADD on the hot path); `fold_usage` (the sweep, and every usage
-- read) folds the log into hour, day and month rollups and deletes what it folded, atomically,
-- so each entry counts exactly once.
-- needs: decimal, calendar
--
-- An entry: `k` what happened (c commit, e event, r release, x expiry), `s` the scope path,
-- `u` the unit, `a` the action (JSON as the request gave it), `x` the amount charged, `e` the
-- reservation's estimate ('' for an event); its id is when (Redis time).
-- A rollup bucket (`KEY.usage_bucket`: "h<epoch hour>", "d<epoch day>", "m<year*12+month-1>")
-- is a hash: group "<scope>\31<unit>\31<action kind>\31<action name>" -> "<spent> <estimated>
-- <charges> <reservations> <released>".

-- Appends one usage entry of the tenant of `sc` (its prefix, name and now). The first entry
-- after a fold makes the log and puts the tenant in its slot's due index (`due_index`, when
-- the script has it), so the sweep folds it.
local function record_usage(sc, due_index, kind, scope, unit, action, spent, estimate)
  local log = KEY.usage_log(sc.prefix)
  action, estimate = action or '', estimate or ''
  if redis.call('XADD', log, 'NOMKSTREAM', '*', 'k', kind, 's', scope, 'u', unit, 'a', action, 'x', spent, 'e', estimate) then
    return
  end
  redis.call('XADD', log, '*', 'k', kind, 's', scope, 'u', unit, 'a', action, 'x', spent, 'e', estimate)
  if due_index then
    redis.call('ZADD', due_index, 'LT', string.format('%d', sc.now), sc.name)
  end
end

-- The usage entry of a reservation `r` (`read_reservation`) that ended (`kind` c, r or x); its
-- action from its record (read by `head_record` or whole: an ACTIVE record's last field).
local function record_ending(sc, due_index, kind, r, charged)
  local rec = r.rec or {}
  local action = rec.action or (rec.raw and string.match(rec.raw, '^.*\31([^\31]*)$'))
  record_usage(sc, due_index, kind, r.scope_path, r.unit, action, charged or '0', r.estimate)
end

-- The action's kind and name, from its JSON ('' when absent or unreadable).
local function action_parts(json)
  if json == '' then return '', '' end
  local decoded, a = pcall(cjson.decode, json)
  if not decoded or type(a) ~= 'table' then return '', '' end
  local function text(v) return type(v) == 'string' and v or '' end
  return text(a.kind), text(a.name)
end

-- The rollup buckets of an instant (ms): hour, day and month, and when each ends.
local function usage_buckets(ms)
  local hour, day = math.floor(ms / 3600000), math.floor(ms / 86400000)
  local y, m = civil_from_days(day)
  local ny, nm = y + math.floor(m / 12), m % 12 + 1
  local month_end = days_from_civil(ny, nm, 1) * 86400000
  return {{'h' .. hour, (hour + 1) * 3600000}, {'d' .. day, (day + 1) * 86400000},
    {'m' .. (y * 12 + m - 1), month_end}}
end

-- A rollup value (nil or false: none yet) with the sums `sum` of some entries added (spent and
-- estimated amounts as digits, charges, reservations and released as numbers).
local function add_usage(value, sum)
  local f, i = {'0', '0', '0', '0', '0'}, 1
  for v in string.gmatch(value or '', '%S+') do f[i] = v; i = i + 1 end
  f[1], f[2] = d_add(f[1], sum.spent), d_add(f[2], sum.estimated)
  f[3], f[4], f[5] = d_add(f[3], itoa(sum.charges)), d_add(f[4], itoa(sum.reservations)), d_add(f[5], itoa(sum.released))
  return table.concat(f, ' ')
end

-- The field an entry's `group` adds to in the bucket `key` (`t`: what this fold read and
-- wrote of it): the group itself, or past `max_groups` the unit's `other` group. Each field's
-- value is read once per fold.
local function usage_field(t, key, group, unit, max_groups)
  local g = t.route[group]
  if g then return g end
  g = group
  if t.values[g] == nil then
    local held = redis.call('HGET', key, g)
    if not held then
      t.n = t.n or redis.call('HLEN', key)
      if t.n >= max_groups then g = table.concat({'other', unit, 'other', 'other'}, '\31') else t.n = t.n + 1 end
    end
    if t.values[g] == nil then t.values[g] = (g == group and held) or redis.call('HGET', key, g) or false end
  end
  t.route[group] = g
  return g
end

-- Folds up to `limit` entries of the usage log into the rollups (each bucket at most
-- `max_groups` groups, the rest in the unit's `other` group; each kept `retention_ms` after
-- it ends) and deletes them. Returns how many were folded, and whether the log has more.
-- The entries are summed per hour and group first (a batch is mostly one hour, and its
-- actions repeat), and each sum added to its hour's, day's and month's rollup once.
local function fold_usage(log, max_groups, retention_ms, limit)
  local entries = redis.call('XRANGE', log, '-', '+', 'COUNT', limit)
  if #entries == 0 then return 0, false end
  local prefix = KEY.prefix_of(log)
  local hours, sums, actions = {}, {}, {}
  for _, e in ipairs(entries) do
    local f = {}
    for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
    local a = f.a or ''
    local action = actions[a]
    if not action then
      local kind, name = action_parts(a)
      action = kind .. '\31' .. name
      actions[a] = action
    end
    local group = (f.s or '') .. '\31' .. (f.u or '') .. '\31' .. action
    local hour = math.floor(tonumber(string.match(e[1], '^(%d+)')) / 3600000)
    local in_hour = sums[hour]
    if not in_hour then
      in_hour = {order = {}}
      sums[hour], hours[#hours + 1] = in_hour, hour
    end
    local sum = in_hour[group]
    if not sum then
      sum = {unit = f.u or '', spent = '0', estimated = '0', charges = 0, reservations = 0, released = 0}
      in_hour[group], in_hour.order[#in_hour.order + 1] = sum, group
    end
    local kind = f.k or 'e'
    sum.spent = d_add(sum.spent, f.x or '0')
    if kind == 'c' or kind == 'e' then sum.charges = sum.charges + 1 end
    if kind ~= 'e' then sum.estimated, sum.reservations = d_add(sum.estimated, f.e or ''), sum.reservations + 1 end
    if kind == 'r' or kind == 'x' then sum.released = sum.released + 1 end
  end
  local touched, order = {}, {}
  for _, hour in ipairs(hours) do
    local in_hour = sums[hour]
    for _, b in ipairs(usage_buckets(hour * 3600000)) do
      local key = KEY.usage_bucket(prefix, b[1])
      local t = touched[key]
      if not t then
        t = {ends = b[2], values = {}, route = {}}
        touched[key] = t
        order[#order + 1] = key
      end
      for _, group in ipairs(in_hour.order) do
        local sum = in_hour[group]
        local g = usage_field(t, key, group, sum.unit, max_groups)
        t.values[g] = add_usage(t.values[g], sum)
      end
    end
  end
  for _, key in ipairs(order) do
    local t, set = touched[key], {}
    for g, v in pairs(t.values) do set[#set + 1] = g; set[#set + 1] = v end
    redis.call('HSET', key, unpack(set))
    redis.call('PEXPIREAT', key, string.format('%d', t.ends + retention_ms))
  end
  local more = #entries == limit
  if more then
    local ms, seq = string.match(entries[#entries][1], '^(%d+)-(%d+)$')
    redis.call('XTRIM', log, 'MINID', ms .. '-' .. string.format('%d', tonumber(seq) + 1))
  else
    -- (a charge since cannot be lost: this script is atomic with every charge of the slot)
    redis.call('DEL', log)
  end
  return #entries, more
end
