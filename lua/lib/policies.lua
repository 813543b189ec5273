-- Policies: scope patterns, the settings in force for a scope, per-minute rate limits.
-- needs: reply

-- Policies. A pattern is `/`-separated segments: `level:value` matches that segment,
-- `level:*` any value of the level, `*` one or more whole segments; a pattern that starts with
-- neither `tenant:` nor `*` is matched against the end of the path (`domain::policies` says
-- the same in Rust).
local function segments_match(pattern, path)
  local p, s = {}, {}
  for seg in string.gmatch(pattern, '[^/]+') do p[#p + 1] = seg end
  for seg in string.gmatch(path, '[^/]+') do s[#s + 1] = seg end
  if p[1] ~= '*' and string.sub(p[1] or '', 1, 7) ~= 'tenant:' then table.insert(p, 1, '*') end
  local function segment_ok(pat, seg)
    if pat == seg then return true end
    local level = string.match(pat, '^([a-z]+:)%*$')
    return level ~= nil and string.sub(seg, 1, #level) == level
  end
  local function walk(i, j)
    if i > #p then return j > #s end
    if p[i] == '*' then
      for k = j + 1, #s + 1 do
        if walk(i + 1, k) then return true end
      end
      return false
    end
    return j <= #s and segment_ok(p[i], s[j]) and walk(i + 1, j + 1)
  end
  return walk(1, 1)
end

-- Whether a pattern matches a scope path, remembered per pair in the script VM.
local MATCHES = {max = 4096, kept = 0, known = {}}
local function pattern_matches(pattern, path)
  local pair = pattern .. '\0' .. path
  local m = MATCHES.known[pair]
  if m == nil then m = remember(MATCHES, pair, segments_match(pattern, path)) end
  return m
end

-- Decoded policy rules by their stored text, so a rule is decoded once per script VM rather
-- than once per request. The text is the key, so a changed rule is another entry and nothing
-- can be stale; entries are only read, never changed. (`actions`: requests' actions, by text,
-- for `governance` in lua/lib/quotas.lua.)
local RULES_DECODED = {max = 512, kept = 0, known = {}, settings = {max = 1024, kept = 0, known = {}, longest = 4096},
  actions = {max = 1000, kept = 0, known = {}, longest = 512}, rows = {max = 256, kept = 0, known = {}}}
local function decoded_rule(row)
  return RULES_DECODED.known[row] or remember(RULES_DECODED, row, cjson.decode(row))
end

-- The policies in force for a tenant without any (shared: never changed).
local NO_POLICIES = {}

-- The policy settings in force for a scope path of the tenant of key prefix `prefix` (its rules
-- read only when no memo below knows them): each setting (caps, ov, ttl_d, ttl_m, ttl_x,
-- rl_r, rl_c, and the guards ma, sm, sh) from the highest-priority ACTIVE policy in effect now
-- that matches the path and sets it (equal priority: the later-created policy, whose id sorts
-- higher). Each entry is {value, id, at}. `tenant` (its record, already read) says how many
-- policies it has: none, and nothing more is read. `ruled`: the matching policies with
-- v0.1.26 rules (`action_rules` picks the action's); `tpls`: every ACTIVE policy in effect with
-- a budget template, whatever its pattern.
local POLICY_SETTINGS = {'caps', 'ov', 'ttl_d', 'ttl_m', 'ttl_x', 'rl_r', 'rl_c', 'ma', 'sm', 'sh'}
local function prefer(best, f, p)
  local b = best[f]
  if not b or p.pri > b.pri or (p.pri == b.pri and p.id > b.id) then best[f] = p end
end
-- The answers are remembered per script VM by the rules' digest (the tenant record keeps it:
-- `refresh_tenant`, so no rule is read) and the scope path (`RULES_DECODED.settings`), each
-- until the next time one of the rules starts or ends: changed rules have another digest, so
-- nothing is stale. The entry is only read. Only rules of at most `longest` bytes in all are
-- remembered, each entry with the gates of at most 16 actions (`gates`), so the memo never
-- holds more than a few MB.
local function policy_settings(prefix, scope_path, now, tenant)
  if type(tenant) == 'table' and tenant.policies == 0 then return NO_POLICIES end
  local memo, digest = RULES_DECODED.settings, type(tenant) == 'table' and tenant.rules_digest
  local key = digest and digest .. '\0' .. scope_path
  local known = key and memo.known[key]
  if not (known and now < known.fresh_until) then
    -- the rules, sorted so the lists below are the same whatever order the hash keeps; known by
    -- their digest too (`RULES_DECODED.rows`, as the settings, up to `longest` bytes), so a
    -- scope path seen first reads none
    local rows, size = digest and RULES_DECODED.rows.known[digest], #scope_path
    local read = not rows
    if read then rows = redis.call('HVALS', KEY.policy_rules(prefix)); table.sort(rows) end
    local best, tpls, ruled, fresh_until = {}, {}, {}, math.huge
    for _, row in ipairs(rows) do
      size = size + #row + 1
      local p = decoded_rule(row)
      if p.from and p.from > now then fresh_until = math.min(fresh_until, p.from) end
      if p['until'] and p['until'] > now then fresh_until = math.min(fresh_until, p['until']) end
      local live = p.st == 'ACTIVE' and (not p.from or now >= p.from) and (not p['until'] or now < p['until'])
      -- budget templates apply to each derived scope (`template_for` in lua/lib/guards.lua)
      if live and p.tpl then tpls[#tpls + 1] = p end
      if live and pattern_matches(p.pat, scope_path) then
        for _, f in ipairs(POLICY_SETTINGS) do
          if p[f] ~= nil then prefer(best, f, p) end
        end
        if p.allow or p.deny or p.rq or p.aq then ruled[#ruled + 1] = p end
      end
    end
    local out = {tpls = (#tpls > 0) and tpls or nil, ruled = (#ruled > 0) and ruled or nil}
    if out.ruled then out.gates = {known = {}, kept = 0, max = 16} end
    for f, p in pairs(best) do out[f] = {value = p[f], id = p.id, at = p.at} end
    known = {settings = out, fresh_until = fresh_until}
    if key and size <= memo.longest then
      remember(memo, key, known)
      if read then remember(RULES_DECODED.rows, digest, rows) end
    end
  end
  return known.settings
end

-- The v0.1.26 rules of an action ({kind, risk_label, ...}: `governance`)
-- under the settings `pol` (as `policy_settings` answered them): each from the highest-priority
-- policy that has one for it (rules are never merged across policies): `ac` the allow/deny
-- lists (value: the policy row), `rq` the risk-class quotas of the action's class, `aq` the
-- quotas of its kind (values: the policy's lists). Only read. (`action_gate` in
-- lua/lib/quotas.lua remembers them beside the settings.)
local function action_rules(pol, action)
  local function names_rule(quotas, label)
    for _, q in ipairs(quotas or {}) do if q.k == label then return true end end
    return false
  end
  local best, rules = {}, {}
  for _, p in ipairs(pol.ruled or {}) do
    if p.allow or p.deny then prefer(best, 'ac', p) end
    if names_rule(p.rq, action.risk_label) then prefer(best, 'rq', p) end
    if names_rule(p.aq, action.kind) then prefer(best, 'aq', p) end
  end
  for f, p in pairs(best) do rules[f] = {value = (f == 'ac') and p or p[f], id = p.id, at = p.at} end
  return rules
end

-- Where a setting's counts (quotas, rate limits) are kept for a request on `scope_path`: its
-- policy's anchor when the policy counts there (`at`; '' is the tenant's root), so invented
-- paths under a pattern share one count, else the scope path itself. The scene `sc` is asked
-- for the tenant's name only then (working it out costs).
local function counted_scope(setting, sc, scope_path)
  if not setting or setting.at == nil then return scope_path end
  if setting.at == '' then return 'tenant:' .. sc.name end
  return setting.at
end

-- A policy's per-minute rate limit on `kind` (reservations, commits) for one counted scope:
-- fixed calendar-minute windows counted in a hash per minute beside the rules (it expires
-- after two minutes; `prefix`: the tenant's key prefix). nil when within the limit (and
-- counted, unless `counted` is false), else 429 LIMIT_EXCEEDED with when to retry.
local function rate_check(prefix, setting, kind, scope_path, now, counted)
  if not setting then return nil end
  local minute = math.floor(now / 60000)
  local key = KEY.policy_rate(prefix, minute)
  local field = kind .. '|' .. setting.id .. '|' .. scope_path
  local n = tonumber(redis.call('HGET', key, field) or '0')
  if n >= setting.value then
    local reset_ms = (minute + 1) * 60000
    return err('LIMIT_EXCEEDED', 'Rate limit of policy ' .. setting.id .. ' reached: at most ' .. setting.value ..
      ' ' .. kind .. ' per minute on scope ' .. scope_path, cjson.encode({policy_id = setting.id, limit = setting.value,
      retry_after_seconds = math.ceil((reset_ms - now) / 1000), reset_at = reset_ms / 1000}))
  end
  if counted then
    redis.call('HINCRBY', key, field, 1)
    redis.call('PEXPIRE', key, 120000)
  end
  return nil
end
