-- Claims due deliveries of one owner, subscription by subscription, at most `limit` in flight per
-- subscription (across every dispatcher), so a slow or dead endpoint holds only its own
-- deliveries back. A claim moves a delivery to its subscription's in-flight set with a lease:
-- a dispatcher that dies after sending but before recording leaves it due again when the lease
-- ends (at-least-once), and two dispatchers never claim the same delivery at once.
-- KEYS[1] owner's due-subscription index  KEYS[2] the owner's legacy queue (drained only)
-- KEYS[3..] per subscription: its queue and its in-flight set (pairs, aligned with ARGV[4..])
-- ARGV[1] lease ms  ARGV[2] max deliveries  ARGV[3] per-subscription limit  ARGV[4..] ids
-- Reply context: the claimed deliveries as pairs: id, subscription id ('' from the legacy queue).
local now = now_ms()
local lease, room, limit = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {'OK', '[]', '', tostring(now)}
for i = 4, #ARGV do
  local sub, queue, flight = ARGV[i], KEYS[2 * i - 5], KEYS[2 * i - 4]
  -- leases that ran out: due again now
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', flight, '-inf', now)) do
    redis.call('ZREM', flight, id)
    redis.call('ZADD', queue, now, id)
  end
  local free = math.min(limit - redis.call('ZCARD', flight), room)
  if free > 0 then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', queue, '-inf', now, 'LIMIT', 0, free)) do
      redis.call('ZREM', queue, id)
      redis.call('ZADD', flight, now + lease, id)
      out[#out + 1] = id
      out[#out + 1] = sub
      room = room - 1
    end
  end
  -- when to look at this subscription next: its first queued delivery while it has room, else
  -- the end of its earliest lease (a recorded attempt brings that forward); none: forget it
  local first = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')[2]
  local lease_end = redis.call('ZRANGE', flight, 0, 0, 'WITHSCORES')[2]
  local next_at = first
  if lease_end and (not first or redis.call('ZCARD', flight) >= limit) then next_at = lease_end end
  if next_at then redis.call('ZADD', KEYS[1], next_at, sub) else redis.call('ZREM', KEYS[1], sub) end
end
if room > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, room)) do
    redis.call('ZADD', KEYS[2], now + lease, id)
    out[#out + 1] = id
    out[#out + 1] = ''
  end
end
return out
