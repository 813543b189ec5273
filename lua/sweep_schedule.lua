-- Puts a tenant in its slot's due index at the time its earliest reservation may expire or its
-- earliest recurring budget period ends, or now when it has usage to fold (or takes it out when
-- it has none of these). Atomic with the
-- reserves and budget writes of the same slot, which only ever lower a tenant's due time, so a
-- due time is never later than the truth. `A.mode`: 'reset' after its due work was swept;
-- 'ensure' keeps any earlier time (the retention crawl's check that nothing was missed).
if A.mode == 'reset' then redis.call('ZREM', K.due_index, A.tenant) end
local first = redis.call('ZRANGE', K.expiry_index, 0, 0, 'WITHSCORES')[2]
local period = redis.call('ZRANGE', K.periods, 0, 0, 'WITHSCORES')[2]
if period and (not first or tonumber(period) < tonumber(first)) then first = period end
-- a usage log not yet folded (`lua/lib/usage.lua`) is due now
if redis.call('EXISTS', K.usage_log) == 1 then
  local now = now_ms()
  if not first or now < tonumber(first) then first = itoa(now) end
end
if first then redis.call('ZADD', K.due_index, 'LT', first, A.tenant) end
return ok({})
