-- System alerts one container observed (the end of a store outage it saw, an operation's slow
-- minute), written once however many containers observed the same condition: the first to
-- arrive sets `K.marker` for `A.marker_ttl_ms`, the others write nothing. `A.alerts` alternates
-- event types and their data (JSON).
local now, now_s = now_ms()
if not redis.call('SET', K.marker, now_s, 'NX', 'PX', A.marker_ttl_ms) then return ok({written = false}) end
local ctx = request_context(A.context)
for i = 1, #A.alerts, 2 do
  emit(K.events, A.alerts[i], '__system__', nil, ctx, 'cycles-server', A.alerts[i + 1], now)
end
return ok({written = true}, '', now_s)
