-- Readiness: one write the store must accept (out of memory, a read-only replica or a failed
-- save refuse it), through the same path as every operation.
local _, now_s = now_ms()
redis.call('SET', K.probe, now_s, 'PX', 60000)
return ok({}, '', now_s)
