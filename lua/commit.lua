-- Commit: settle a reservation with its actual cost under the overage policy recorded at reserve.
-- KEYS[1] tenant record  KEYS[2] api key record  KEYS[3] reservation  KEYS[4] expiry index
-- KEYS[5] event stream  KEYS[6..] the reservation's budgets (decoded from its id)
-- ARGV[1] key digest  ARGV[2] accepted permissions  ARGV[3] reservation id  ARGV[4] idempotency key
-- ARGV[5] payload hash  ARGV[6] actual unit  ARGV[7] actual amount  ARGV[8] metrics json or ''
-- ARGV[9] metadata json or ''  ARGV[10] retention ms (terminal records)
local now = now_ms()
local denied = authorize(KEYS[2], ARGV[1], ARGV[2], now)
if denied then return denied end

local r = read_reservation(KEYS[3], ARGV[3])
if not r then return err('NOT_FOUND', 'Reservation not found') end
if r.status == 'COMMITTED' and r.rec.ck == ARGV[4] then
  if r.rec.ch ~= ARGV[5] then
    return err('IDEMPOTENCY_MISMATCH', 'idempotency_key was already used with a different request payload')
  end
  return {'REPLAY', cjson.encode(r.rec.cr), r.status, tostring(now), r.rec.subject, r.unit}
end

local guard = tenant_guard(tenant_record(KEYS[1]))
if guard then return guard end
local retention = tonumber(ARGV[10])
if r.corrupt then return err('INTERNAL_ERROR', 'Reservation record is corrupt') end
expire_if_overdue(KEYS[3], r, keys_from(6), KEYS[4], KEYS[5], now, retention)
if r.status == 'EXPIRED' then return err('RESERVATION_EXPIRED', 'Reservation has expired') end
if r.status ~= 'ACTIVE' then return err('RESERVATION_FINALIZED', 'Reservation is already ' .. r.status) end
if ARGV[6] ~= r.unit then
  return err('UNIT_MISMATCH', 'actual.unit ' .. ARGV[6] .. ' does not match the reservation unit ' .. r.unit,
    cjson.encode({scope = r.scope_path, requested_unit = ARGV[6], expected_units = {r.unit}}))
end

local budgets = read_budgets(KEYS, 6)
for _, b in ipairs(budgets) do
  if b.status == 'FROZEN' then return err('BUDGET_FROZEN', 'Budget is frozen for scope ' .. b.scope) end
  if b.status == 'CLOSED' then return err('BUDGET_CLOSED', 'Budget is closed for scope ' .. b.scope) end
end

local E, X = r.estimate, ARGV[7]
local delta = d_sub(X, E)
local charged, c = X, '0'
if d_pos(delta) then
  if r.policy == 'REJECT' then
    return err('BUDGET_EXCEEDED', 'Actual ' .. X .. ' exceeds the reserved ' .. E .. ' under overage policy REJECT')
  end
  c = delta
  for _, b in ipairs(budgets) do
    local zero_limit = not d_pos(b.overdraft_limit)
    if (r.policy == 'ALLOW_IF_AVAILABLE' or zero_limit) and d_cmp(b.remaining, delta) < 0 then
      c = d_min(c, d_max(b.remaining, '0'))
    end
  end
  if r.policy == 'ALLOW_WITH_OVERDRAFT' then
    for _, b in ipairs(budgets) do
      if d_pos(b.overdraft_limit) and d_cmp(b.remaining, c) < 0 then
        local shortfall = d_sub(c, d_max(b.remaining, '0'))
        if d_cmp(d_add(b.debt, shortfall), b.overdraft_limit) > 0 then
          return err('OVERDRAFT_LIMIT_EXCEEDED', 'Commit would exceed the overdraft limit of scope ' .. b.scope)
        end
      end
    end
  end
  charged = d_add(E, c)
end

local capped = d_cmp(c, delta) < 0
for _, b in ipairs(budgets) do
  local funded = c
  if d_pos(c) and d_cmp(b.remaining, c) < 0 then
    funded = d_max(b.remaining, '0')
    b.debt = d_add(b.debt, d_sub(c, funded))
    if d_pos(b.overdraft_limit) and d_cmp(b.debt, b.overdraft_limit) > 0 then b.over = true end
  end
  if capped and d_cmp(b.remaining, delta) < 0 and (r.policy == 'ALLOW_IF_AVAILABLE' or not d_pos(b.overdraft_limit)) then
    b.over = true
  end
  if d_pos(delta) then
    b.remaining = d_sub(b.remaining, c)
    b.spent = d_add(b.spent, d_add(funded, E))
  else
    b.remaining = d_add(b.remaining, d_sub(E, X))
    b.spent = d_add(b.spent, X)
  end
  b.reserved = d_sub(b.reserved, E)
end
local failed = write_budgets(budgets, now)
if failed then return failed end

local released = ''
if d_cmp(charged, E) < 0 then released = d_sub(E, charged) end
local result = snapshot({charged, released}, budgets)
local rec = r.rec
rec.status, rec.charged, rec.finalized, rec.ck, rec.ch, rec.cr = 'COMMITTED', charged, tostring(now), ARGV[4], ARGV[5], result
if ARGV[8] ~= '' then rec.metrics = ARGV[8] end
if ARGV[9] ~= '' then rec.cmeta = ARGV[9] end
save_record(KEYS[3], rec)
redis.call('PEXPIRE', KEYS[3], retention)
redis.call('ZREM', KEYS[4], r.rid)
return {'OK', cjson.encode(result), 'COMMITTED', tostring(now), rec.subject, rec.unit}
