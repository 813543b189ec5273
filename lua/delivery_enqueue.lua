-- Creates PENDING deliveries in the subscription owner's slot, each at most once (delivery ids
-- are deterministic for live dispatch, so a re-run fan-out after a crash creates nothing twice).
-- KEYS[1] owner's due-subscription index  KEYS[2..] per delivery: the record, its subscription's
-- delivery index and its subscription's queue (triples)  ARGV[1] retention ms  ARGV[2..] per
-- delivery: fields (JSON object of strings: delivery_id, subscription_id, and `due`, the queue
-- score, from the event's stream position so a tenant's first attempts go out in event order)
local now = now_ms()
local created = 0
for i = 2, #ARGV do
  local record, index, queue = KEYS[3 * i - 4], KEYS[3 * i - 3], KEYS[3 * i - 2]
  if redis.call('EXISTS', record) == 0 then
    local f = cjson.decode(ARGV[i])
    local due = f.due
    f.due = nil
    f.status, f.attempts, f.attempted_at_ms = 'PENDING', '0', tostring(now)
    write_fields(record, f)
    redis.call('PEXPIRE', record, tonumber(ARGV[1]))
    redis.call('ZADD', queue, due, f.delivery_id)
    redis.call('ZADD', KEYS[1], 'LT', due, f.subscription_id)
    redis.call('ZADD', index, now, f.delivery_id)
    created = created + 1
  end
end
return {'OK', cjson.encode({tostring(created)}), '', tostring(now)}
