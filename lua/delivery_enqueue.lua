-- Creates PENDING deliveries in the subscription owner's slot, each at most once (delivery ids
-- are deterministic for live dispatch, so a re-run fan-out after a crash creates nothing twice).
-- `K.delivery_keys` holds per delivery its record, its subscription's delivery index and its
-- subscription's queue (triples); `A.deliveries` per delivery its fields (a JSON object of
-- strings: delivery_id, subscription_id, and `due`, the queue score, from the event's stream
-- position so a tenant's first attempts go out in event order).
local now, now_s = now_ms()
local created = 0
for i, fields in ipairs(A.deliveries) do
  local record, index, queue = K.delivery_keys[3 * i - 2], K.delivery_keys[3 * i - 1], K.delivery_keys[3 * i]
  if redis.call('EXISTS', record) == 0 then
    local f = cjson.decode(fields)
    local due = f.due
    f.due = nil
    f.status, f.attempts, f.attempted_at_ms = 'PENDING', '0', now_s
    write_fields(record, f)
    redis.call('PEXPIRE', record, A.retention_ms)
    redis.call('ZADD', queue, due, f.delivery_id)
    redis.call('ZADD', K.due_subscriptions, 'LT', due, f.subscription_id)
    redis.call('ZADD', index, now, f.delivery_id)
    created = created + 1
  end
end
return ok({created = created}, '', now_s)
