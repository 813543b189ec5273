-- Action authority (protocol v0.1.26): allow/deny lists, risk-class and per-kind quotas.
-- needs: decimal, reply, calendar, events, policies

-- ---------------------------------------------------------------------------------------------
-- Action authority (protocol v0.1.26): allow/deny lists, risk-class and per-kind quotas,
-- DenyDetail and observe mode. `G` is the request's action as the handler resolved it
-- (`A.governance`): kind, risk (its risk class), risk_label ("__risk__:<class>"), keys (the
-- policy keys its kind declares), run (subject.dimensions.run_id or ''), observe (the
-- request's observe_mode or ''), sampled (whether an observed ALLOW is written), rate (the
-- sample rate when below 1).
--
-- Quota counters are hashes `<prefix>:q:<scope>|<kind or __risk__:class>|<window>|<bucket>`
-- (n: used, lim, pol, last: last increment ms, ttl: per_run TTL, al: threshold announced),
-- indexed by member in `<prefix>:quotas` (lexicographic, for listing) and by cleanup deadline
-- in `<prefix>:quotas:due` (each new counter prunes up to two dead ones, so the indexes hold
-- about the live counters only).

-- Each tumbling window: how long its counter outlives it, how long it lasts, and the length
-- of the ISO 8601 prefix that names its bucket. `counters`: each rule's last counter
-- (`quota_counter`).
local QUOTA = {windows = {
  per_minute_tumbling = {ttl_ms = 120000, span = 60000, bucket_len = 16},
  per_hour_tumbling = {ttl_ms = 3660000, span = 3600000, bucket_len = 13},
  per_day_tumbling = {ttl_ms = 90000000, span = 86400000, bucket_len = 10},
  per_tenant_per_day = {ttl_ms = 90000000, span = 86400000, bucket_len = 10},
}, counters = {known = {}, kept = 0, max = 1000}}

-- The request's action from its JSON (nil: none or unreadable), remembered per script VM by
-- its text (an agent repeats its actions: `RULES_DECODED.actions`); the decoded table is only
-- read.
local function governance(raw)
  raw = raw or ''
  local memo = RULES_DECODED.actions
  local G = memo.known[raw]
  if G == nil then
    local decoded
    decoded, G = pcall(cjson.decode, raw)
    if decoded and type(G) == 'table' and G.kind then
      G.risk_label = '__risk__:' .. G.risk
      G.pick = G.kind .. '\0' .. G.risk_label
      if type(G.keys) ~= 'table' then G.keys = {} end
    else
      G = false
    end
    if #raw <= memo.longest then remember(memo, raw, G) end
  end
  return G or nil
end

-- A counter's index member in parts: scope, label (the kind, or "__risk__:<class>"), window,
-- bucket, and `risk`, the class of a risk-class counter.
local function quota_member(member)
  local scope, label, window, bucket = string.match(member, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return {scope = scope, label = label, window = window, bucket = bucket, risk = string.match(label or '', '^__risk__:(.*)$')}
end

-- The correlation id of a counter's events (threshold, reset): a hash of the tenant, scope,
-- kind or class, window and window key.
local function quota_correlation(tenant, m)
  return redis.sha1hex(tenant .. '|' .. m.scope .. '|' .. (m.risk or m.label) .. '|' .. m.window .. '|' .. m.bucket)
end

-- The scene's request context (a copy) carrying `correlation_id`.
local function correlated(sc, correlation_id)
  local ctx = {}
  for k, v in pairs(sc.ctx or {}) do ctx[k] = v end
  ctx.correlation_id = correlation_id
  return ctx
end

local function contains(list, v)
  for _, x in ipairs(list or {}) do
    if x == v then return true end
  end
  return false
end

-- The counter of quota rule `q` (on `label`) for `scope` now: {bucket, member, key}, its
-- bucket the window instance (a UTC calendar bucket; per_run: the run id `run`). Each rule's
-- last counter is remembered per script VM (by the rule's decoded table) while its window
-- instance lasts, so its key is made once per instance rather than once per request.
local function quota_counter(sc, q, label, scope, run)
  local c, now = QUOTA.counters.known[q], sc.now
  local live = c and c.scope == scope and c.prefix == sc.prefix and now >= c.starts and now < c.ends
  if live and (run == nil or c.bucket == run) then return c end
  local bucket, starts, ends = run, 0, math.huge
  if q.w ~= 'per_run' then
    local w = QUOTA.windows[q.w]
    bucket, starts = string.sub(iso8601(now), 1, w.bucket_len), now - now % w.span
    ends = starts + w.span
  end
  local member = scope .. '|' .. label .. '|' .. q.w .. '|' .. bucket
  return remember(QUOTA.counters, q, {scope = scope, prefix = sc.prefix, starts = starts, ends = ends, bucket = bucket,
    member = member, key = KEY.quota_counter(sc.prefix, member)})
end

-- A per-kind quota applies when each of its non-empty allowlists lists the request's key of
-- that dimension; an absent key skips the rule (unknown routing is never denied by it).
local ALLOWLISTS = {h = 'host', d = 'recipient_domain', r = 'resource_type'}
local function keys_admit(q, keys)
  for list, dim in pairs(ALLOWLISTS) do
    if q[list] and not contains(q[list], keys[dim]) then return false end
  end
  return true
end

-- Step 1 of the reservation evaluation order: the access lists of the policy that has them
-- (`pol.ac`, from `policy_settings`). A DenyDetail, or nil.
local function access_denial(pol, G, scope_path)
  local ac = pol.ac
  if not ac then return nil end
  local p = ac.value
  if p.deny and contains(p.deny, G.kind) then
    return {reason_code = 'ACTION_KIND_DENIED', blocked_by_policy = ac.id, blocked_by_scope = scope_path,
      suggested_fix = "Remove '" .. G.kind .. "' from denied_action_kinds in policy '" .. ac.id .. "'"}
  end
  if p.allow and not contains(p.allow, G.kind) then
    return {reason_code = 'ACTION_KIND_NOT_ALLOWED', blocked_by_policy = ac.id, blocked_by_scope = scope_path,
      suggested_fix = "Add '" .. G.kind .. "' to allowed_action_kinds in policy '" .. ac.id .. "'"}
  end
  return nil
end

-- Steps 2 and 3: the quotas of one rule set (`setting`, a policy_settings entry: `pol.rq`, the
-- risk-class quotas of the action's class, or `pol.aq`, its kind's quotas) on `label` (the
-- risk label or the kind). Reads only. Returns a DenyDetail (among violated quotas the one
-- with the least headroom), or nil and an error (400: a per_run quota applies and the run id
-- is missing), or nil, nil after adding the counters a live reserve moves to `staged`.
local function quota_denial(sc, setting, label, by_risk, G, scope_path, staged)
  local worst
  for _, q in ipairs(setting and setting.value or {}) do
    if q.k == label and (by_risk or keys_admit(q, G.keys)) then
      if q.w == 'per_run' and G.run == '' then
        return nil, err('INVALID_REQUEST', 'subject.dimensions.run_id is required: policy ' .. setting.id ..
          ' has a per_run quota on ' .. label)
      end
      local scope = (q.w == 'per_tenant_per_day') and ('tenant:' .. sc.name) or counted_scope(setting, sc, scope_path)
      local c = quota_counter(sc, q, label, scope, q.w == 'per_run' and G.run or nil)
      local used = tonumber(redis.call('HGET', c.key, 'n') or '0')
      if used >= q.n then
        if not worst or q.n - used < worst.limit - worst.used then
          worst = {action_kind = G.kind, window = q.w, window_key = c.bucket, used = used, limit = q.n, scope = scope,
            policy_id = setting.id, risk_class = by_risk and G.risk or nil}
        end
      else
        staged[#staged + 1] = {key = c.key, member = c.member, q = q, used = used, policy = setting.id}
      end
    end
  end
  if worst then
    return {reason_code = 'ACTION_QUOTA_EXCEEDED', quota_violation = worst, blocked_by_policy = worst.policy_id,
      blocked_by_scope = worst.scope, suggested_fix = 'Increase the ' .. (by_risk and (G.risk .. ' risk-class') or
      G.kind) .. ' quota from ' .. worst.limit .. ' ' .. worst.window .. " in policy '" .. worst.policy_id ..
      "', or wait for the window to reset"}
  end
  return nil
end

-- The message of an access or quota denial `d` of `kind` (the 409's; the detail says more).
local function gate_message(d, kind)
  if d.reason_code == 'ACTION_KIND_DENIED' then
    return "Action kind '" .. kind .. "' is denied by policy " .. d.blocked_by_policy
  end
  if d.reason_code == 'ACTION_KIND_NOT_ALLOWED' then
    return "Action kind '" .. kind .. "' is not among the allowed kinds of policy " .. d.blocked_by_policy
  end
  local v = d.quota_violation
  return 'Action quota exceeded: ' .. (v.risk_class and (v.risk_class .. ' risk class') or v.action_kind) .. ' used ' ..
    v.used .. ' of ' .. v.limit .. ' (' .. v.window .. ' ' .. v.window_key .. ') on ' .. v.scope
end

-- Step 5 for the quotas: each staged counter +1 (its TTL set when new, refreshed for per_run),
-- quota.threshold_approaching once per window instance when it reaches its threshold. Returns
-- the per_run counters (the reservation keeps them, to give the call back on release/expiry).
local function count_actions(sc, staged)
  local runs, counted = {}, {}
  for _, s in ipairs(staged) do
    local q = s.q
    -- the count read at the check, +1 (and +1 more for each counter staged twice), in the
    -- one write that also stamps the limit, the policy and when (reading the stamps to spare
    -- their write costs more than writing them)
    local n = (counted[s.key] or s.used) + 1
    counted[s.key] = n
    redis.call('HSET', s.key, 'n', itoa(n), 'lim', itoa(q.n), 'pol', s.policy, 'last', itoa(sc.now))
    if q.w == 'per_run' then runs[#runs + 1] = s.member end
    if n == 1 or q.w == 'per_run' then
      local ttl = q.ttl or QUOTA.windows[q.w].ttl_ms
      redis.call('PEXPIRE', s.key, ttl)
      if q.ttl then redis.call('HSET', s.key, 'ttl', q.ttl) end
      local due = KEY.quota_due(sc.prefix)
      redis.call('ZADD', due, sc.now + ttl, s.member)
      if n == 1 then
        redis.call('ZADD', KEY.quota_index(sc.prefix), 0, s.member)
        for _, dead in ipairs(redis.call('ZRANGEBYSCORE', due, '-inf', sc.now, 'LIMIT', 0, 2)) do
          if redis.call('EXISTS', KEY.quota_counter(sc.prefix, dead)) == 0 then
            redis.call('ZREM', due, dead)
            redis.call('ZREM', KEY.quota_index(sc.prefix), dead)
          end
        end
      end
    end
    if n / q.n >= q.th and s.used / q.n < q.th and redis.call('HSETNX', s.key, 'al', '1') == 1 then
      local m = quota_member(s.member)
      emit(sc.events, 'quota.threshold_approaching', sc.name, m.scope, correlated(sc, quota_correlation(sc.name, m)),
        'cycles-server', cjson.encode({scope = m.scope, action_kind = m.risk and '__risk__' or m.label,
        risk_class = m.risk, window = m.window, window_key = m.bucket, used = n, limit = q.n, threshold_pct = q.th,
        policy_id = s.policy, tenant_id = sc.name}), sc.now)
    end
  end
  return runs
end
