-- Puts a tenant in its slot's due index at the time its earliest reservation may expire (or
-- takes it out when it has none). Atomic with the reserves of the same slot, which only ever
-- lower a tenant's due time, so a due time is never later than the truth.
-- KEYS[1] the slot's due index  KEYS[2] the tenant's expiry index
-- ARGV[1] tenant id  ARGV[2] 'reset' (after its due work was swept) | 'ensure' (keep any
-- earlier time; the retention crawl's check that nothing was missed)
if ARGV[2] == 'reset' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')[2]
if first then redis.call('ZADD', KEYS[1], 'LT', first, ARGV[1]) end
return {'OK', '[]', '', '0'}
