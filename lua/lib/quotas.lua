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
-- The counters are one hash per tenant (`KEY.quota_counters`): field the counter's member
-- "<scope>|<kind or __risk__:class>|<window>|<bucket>", value its text (`COUNTER.text`: count,
-- cleanup deadline, last increment, limit, policy, and whether its threshold was announced). The members
-- are indexed lexicographically in `<prefix>:quotas` (for listing) and by deadline in
-- `<prefix>:quotas:due` (each new counter prunes up to two past theirs, so the hash and the
-- indexes hold about the live counters only).

-- Each tumbling window: how long its counter outlives its start, how long it lasts, and the
-- length of the ISO 8601 prefix that names its bucket; the patterns of a counter's text
-- (`COUNTER.fields`) and of what a recount keeps of it (`COUNTER.recount`), the quota steps in
-- check order (rules, whether by risk class) and a quota rule's allowlists by the dimension of
-- the action's keys each lists.
local QUOTA = {windows = {
  per_minute_tumbling = {ttl_ms = 120000, span = 60000, bucket_len = 16},
  per_hour_tumbling = {ttl_ms = 3660000, span = 3600000, bucket_len = 13},
  per_day_tumbling = {ttl_ms = 90000000, span = 86400000, bucket_len = 10},
  per_tenant_per_day = {ttl_ms = 90000000, span = 86400000, bucket_len = 10},
}, fields = '^(%d+)\31(%d+)\31(%d*)\31(%d*)\31([^\31]*)(\31?!?)$', kept = '^%d+(\31%d+\31%d*\31%d*\31[^\31]*)',
  steps = {{'rq', true}, {'aq', false}}, allowlists = {h = 'host', d = 'recipient_domain', r = 'resource_type'}}

-- The counters' fields. A counter's text is "<n>\31<due>\31<last>\31<tail>" (`n` digits or a
-- count: counts stay at most max_calls, 100,000, which Lua writes as an integer),
-- and "\31!" after it once its threshold was announced (`al`): its count, its deadline (ms: from
-- then on it is gone, pruned or not), its last increment (ms), and "<limit>\31<policy>", the
-- rule and policy that counted it last. (The reserve reads only the count, the mark and a
-- per_run counter's deadline.)
local COUNTER = {}
function COUNTER.text(n, due, last, tail, al)
  return n .. '\31' .. due .. '\31' .. last .. '\31' .. tail .. (al and '\31!' or '')
end

-- A counter's text as fields (nil when there is none, or it is past its deadline `due`): n,
-- due, last, lim, pol (text; each of the last three nil when it was not stamped) and al
-- (whether its threshold was announced).
function COUNTER.fields(text, now)
  if not text then return nil end
  local n, due, last, lim, pol, al = string.match(text, QUOTA.fields)
  if not n or tonumber(due) <= now then return nil end
  return n, due, last ~= '' and last or nil, lim ~= '' and lim or nil, pol ~= '' and pol or nil, al ~= ''
end

-- A counter's text with count `n` and threshold mark `al` instead of its own, the rest kept.
function COUNTER.recount(text, n, al)
  return itoa(n) .. string.match(text, QUOTA.kept) .. (al and '\31!' or '')
end

-- A counter written before the counters shared one hash (a hash of its own, `KEY.quota_counter`,
-- that expires), moved into the hash where it is first read: its text, or false.
function COUNTER.moved(prefix, member, now)
  local key = KEY.quota_counter(prefix, member)
  local f = redis.call('HMGET', key, 'n', 'lim', 'pol', 'last', 'al')
  if not f[1] then return false end
  local due = itoa(now + math.max(redis.call('PTTL', key), 1))
  local text = COUNTER.text(f[1], due, f[4] or '', (f[2] or '') .. '\31' .. (f[3] or ''), f[5] ~= false)
  redis.call('HSET', KEY.quota_counters(prefix), member, text)
  redis.call('ZADD', KEY.quota_due(prefix), due, member)
  redis.call('DEL', key)
  return text
end

-- The text of counter `member` (false: none).
function COUNTER.read(prefix, member, now)
  return redis.call('HGET', KEY.quota_counters(prefix), member) or COUNTER.moved(prefix, member, now)
end

-- A per_run call given back (its reservation released or expired uncommitted): its counter one
-- less, while it lasts and is above 0.
function COUNTER.take_back(prefix, member, now)
  local text = COUNTER.read(prefix, member, now)
  local n, _, _, _, _, al = COUNTER.fields(text, now)
  if n and tonumber(n) > 0 then redis.call('HSET', KEY.quota_counters(prefix), member, COUNTER.recount(text, n - 1, al)) end
end

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

-- A per-kind quota applies when each of its non-empty allowlists lists the request's key of
-- that dimension; an absent key skips the rule (unknown routing is never denied by it).
local function keys_admit(q, keys)
  for list, dim in pairs(QUOTA.allowlists) do
    if q[list] and not contains(q[list], keys[dim]) then return false end
  end
  return true
end

-- Step 1 of the reservation evaluation order: the access lists of the policy that has them
-- (`rules.ac`, from `action_rules`). A DenyDetail, or nil.
local function access_denial(rules, G, scope_path)
  local ac = rules.ac
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

-- The counters the quota rules of action `G` (`rules`, from `action_rules`) apply to on
-- `scope_path`, in two steps in check order (the risk-class quotas of its class, then those
-- of its kind), each a list of counters {q (the rule), policy, scope, label, window, bucket,
-- risk, member, due (a calendar window's deadline; per_run: nil, counted from each
-- increment), tail (its text's "<limit>\31<policy>"), at (its place in `members`), th_at
-- (the count whose increment reaches the threshold: the least n with n / limit >= th)}, `list`
-- the two steps' counters in order, and `no_run` (the policy whose per_run quota applies
-- without a run id); `dups` when two rules count one
-- counter, `args` the counters' write (each member, then its text), the keys, and `ends`, when
-- its earliest window instance ends (`action_gate` makes it again then).
-- (Each counter also carries what the request that last checked it read, `used` and `al`,
-- for its count, and `written`, `wn` and `wal`: the text it wrote last, and the count and
-- mark in it.)
local function quota_plan(sc, rules, G, scope_path)
  local plan = {ends = math.huge, members = {}, args = {}, list = {}, counters = KEY.quota_counters(sc.prefix),
    due = KEY.quota_due(sc.prefix), index = KEY.quota_index(sc.prefix)}
  for i = 1, 2 do
    local setting, by_risk = rules[QUOTA.steps[i][1]], QUOTA.steps[i][2]
    local label, step = by_risk and G.risk_label or G.kind, {}
    for _, q in ipairs(setting and setting.value or {}) do
      if q.k == label and (by_risk or keys_admit(q, G.keys)) then
        if q.w == 'per_run' and G.run == '' then step.no_run = setting.id; break end
        local scope = (q.w == 'per_tenant_per_day') and ('tenant:' .. sc.name) or counted_scope(setting, sc, scope_path)
        local bucket, due = G.run, nil
        if q.w ~= 'per_run' then
          local w = QUOTA.windows[q.w]
          local starts = sc.now - sc.now % w.span
          bucket, due = string.sub(iso8601(sc.now), 1, w.bucket_len), itoa(starts + w.ttl_ms)
          plan.ends = math.min(plan.ends, starts + w.span)
        end
        local member, th_at = scope .. '|' .. label .. '|' .. q.w .. '|' .. bucket, math.max(0, math.floor(q.th * q.n) - 1)
        while th_at / q.n < q.th do th_at = th_at + 1 end
        for _, m in ipairs(plan.members) do plan.dups = plan.dups or m == member end
        plan.members[#plan.members + 1] = member
        plan.args[#plan.args + 1], plan.args[#plan.args + 2] = member, ''
        local c = {q = q, policy = setting.id, scope = scope, label = label, window = q.w, bucket = bucket,
          risk = by_risk and G.risk or nil, member = member, due = due, tail = itoa(q.n) .. '\31' .. setting.id,
          at = #plan.members, th_at = th_at}
        step[#step + 1], plan.list[#plan.list + 1] = c, c
      end
    end
    plan[i] = step
  end
  return plan
end

-- The v0.1.26 rules' gate of the request's action (its text `raw`, `A.governance`) under the
-- settings in force `pol` (on `scope_path`): {G (the action, false when it is unreadable),
-- rules (`action_rules`), access (the access lists' DenyDetail, or nil), plan (`quota_plan`,
-- when access admits it)}. Remembered beside the settings by the action's text (`pol.gates`,
-- up to 16 actions of up to 512 bytes), so a repeated action finds all this in one lookup;
-- the plan is made again once its earliest window ends.
local function action_gate(sc, pol, raw, scope_path)
  local gate = pol.gates.known[raw]
  if not gate or gate.prefix ~= sc.prefix then
    local G = governance(raw) or false
    local rules = G and action_rules(pol, G)
    gate = {G = G, prefix = sc.prefix, rules = rules, access = G and access_denial(rules, G, scope_path) or nil}
    if #raw <= 512 then remember(pol.gates, raw, gate) end
  end
  if gate.G and not gate.access and not (gate.plan and sc.now < gate.plan.ends) then
    gate.plan = quota_plan(sc, gate.rules, gate.G, scope_path)
  end
  return gate
end

-- Steps 2 and 3: the quotas of the plan (`quota_plan`), every counter read in one command.
-- Reads only (but for moving a counter of before into the hash). Returns a DenyDetail (the
-- first step with a violated quota: among them the one with the least headroom), or nil and
-- an error (400: a per_run quota applies and the run id is missing), or nil, nil when every
-- counter admits one more call (each then carries what was read of it: `used`, `al`).
local function quota_denial(sc, plan, G)
  local members, now = plan.members, sc.now
  local texts = #members > 0 and redis.call('HMGET', plan.counters, unpack(members))
  for i = 1, 2 do local step = plan[i]
    if step.no_run then
      return nil, err('INVALID_REQUEST', 'subject.dimensions.run_id is required: policy ' .. step.no_run ..
        ' has a per_run quota on ' .. (i == 1 and G.risk_label or G.kind))
    end
    local worst
    for j = 1, #step do local c = step[j]
      local text, used, al = texts[c.at] or COUNTER.moved(sc.prefix, c.member, now), 0, false
      -- (a calendar counter's member names its window instance: only a per_run one can be past
      -- its deadline; the text this plan wrote last, `written`, is not read again)
      if text and text == c.written then
        used, al = c.wn, c.wal
      elseif text and (c.due or tonumber(string.match(text, '^%d+\31(%d+)')) > now) then
        used, al = tonumber(string.match(text, '^%d+')), string.byte(text, -1) == 33
      end
      local q = c.q
      if used >= q.n then
        if not worst or q.n - used < worst.limit - worst.used then
          worst = {action_kind = G.kind, window = q.w, window_key = c.bucket, used = used, limit = q.n, scope = c.scope,
            policy_id = c.policy, risk_class = c.risk}
        end
      end
      c.used, c.al = used, al
    end
    if worst then
      return {reason_code = 'ACTION_QUOTA_EXCEEDED', quota_violation = worst, blocked_by_policy = worst.policy_id,
        blocked_by_scope = worst.scope, suggested_fix = 'Increase the ' .. (i == 1 and (G.risk .. ' risk-class') or
        G.kind) .. ' quota from ' .. worst.limit .. ' ' .. worst.window .. " in policy '" .. worst.policy_id ..
        "', or wait for the window to reset"}
    end
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

-- Step 5 for the quotas: each counter of the plan that admitted the hold +1 (the count read
-- at the check; a counter there twice, +2) in one write, with its deadline (a per_run
-- counter's refreshed), and quota.threshold_approaching once per window instance when it
-- reaches its threshold (`now`: the clock's text). Returns the per_run counters (the
-- reservation keeps them, to give the call back on release/expiry), or nil.
local function count_actions(sc, plan, now)
  local args, list, runs, fresh, counted = plan.args, plan.list, nil, false, plan.dups and {}
  for j = 1, #list do local c = list[j]
    local used, al = c.used, c.al
    local before = counted and counted[c.member]
    if before then used, al = before[1], before[2] end
    local n = used + 1
    if n == c.th_at and not al then
      al = true
      emit(sc.events, 'quota.threshold_approaching', sc.name, c.scope, correlated(sc, quota_correlation(sc.name, c)),
        'cycles-server', cjson.encode({scope = c.scope, action_kind = c.risk and '__risk__' or c.label,
        risk_class = c.risk, window = c.window, window_key = c.bucket, used = n, limit = c.q.n, threshold_pct = c.q.th,
        policy_id = c.policy, tenant_id = sc.name}), sc.now)
    end
    if counted then counted[c.member] = {n, al} end
    local due = c.due or itoa(sc.now + c.q.ttl)
    local text = COUNTER.text(n, due, now, c.tail, al)
    args[2 * c.at] = text
    -- (what a calendar counter's next check reads, if no one else wrote it: its count known)
    if c.due then c.written, c.wn, c.wal = text, n, al end
    if not c.due then
      runs = runs or {}
      runs[#runs + 1] = c.member
    end
    if n == 1 or not c.due then redis.call('ZADD', plan.due, due, c.member) end
    if n == 1 then
      redis.call('ZADD', plan.index, '0', c.member)
      fresh = true
    end
  end
  redis.call('HSET', plan.counters, unpack(args))
  if fresh then
    local dead = redis.call('ZRANGEBYSCORE', plan.due, '-inf', now, 'LIMIT', '0', '2')
    if #dead > 0 then
      redis.call('HDEL', plan.counters, unpack(dead))
      redis.call('ZREM', plan.due, unpack(dead))
      redis.call('ZREM', plan.index, unpack(dead))
    end
  end
  return runs
end
