-- Writes one system event (tenant `__system__`) into the system stream: the dispatcher's
-- system.webhook_delivery_failed, which follows its delivery's FAILED record (another slot).
local now, now_s = now_ms()
emit(K.events, A.event_type, '__system__', nil, request_context(A.context), 'cycles-events', A.data, now)
return ok({}, '', now_s)
