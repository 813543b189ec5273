-- Writes one system event (tenant `__system__`) into the system stream: the dispatcher's
-- system.webhook_delivery_failed, which follows its delivery's FAILED record (another slot).
-- KEYS[1] the `__system__` event stream  ARGV[1] event type  ARGV[2] data (JSON)  ARGV[3] context
local now = now_ms()
emit(KEYS[1], nil, ARGV[1], '__system__', nil, request_context(ARGV[3]), 'cycles-events', ARGV[2], now)
return {'OK', '[]', '', tostring(now)}
