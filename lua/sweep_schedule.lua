-- Puts a tenant in its slot's due index at the time its earliest reservation may expire or its
-- earliest recurring budget period ends (or takes it out when it has neither). Atomic with the
-- reserves and budget writes of the same slot, which only ever lower a tenant's due time, so a
-- due time is never later than the truth. `A.mode`: 'reset' after its due work was swept;
-- 'ensure' keeps any earlier time (the retention crawl's check that nothing was missed).
if A.mode == 'reset' then redis.call('ZREM', K.due_index, A.tenant) end
local first = redis.call('ZRANGE', K.expiry_index, 0, 0, 'WITHSCORES')[2]
local period = redis.call('ZRANGE', K.periods, 0, 0, 'WITHSCORES')[2]
if period and (not first or tonumber(period) < tonumber(first)) then first = period end
if first then redis.call('ZADD', K.due_index, 'LT', first, A.tenant) end
return ok({})
