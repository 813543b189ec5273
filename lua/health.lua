-- Readiness: one write the store must accept (out of memory, a read-only replica or a failed
-- save refuse it), through the same path as every operation.
-- KEYS[1] the probe key
local _, now_s = now_ms()
redis.call('SET', KEYS[1], now_s, 'PX', 60000)
return {'OK', '[]', '', now_s}
