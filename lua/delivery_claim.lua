-- Claims due deliveries of one owner, subscription by subscription, at most `limit` in flight per
-- subscription and `A.per_owner` in flight for the owner (across every dispatcher), so a slow or
-- dead endpoint holds only its own deliveries back, and one tenant's endpoints hold at most
-- `per_owner` sends of any dispatcher's pool. A claim moves a delivery to its subscription's in-flight set with a lease:
-- a dispatcher that dies after sending but before recording leaves it due again when the lease
-- ends (at-least-once), and two dispatchers never claim the same delivery at once.
-- `K.subscriptions` holds per subscription its queue and its in-flight set (pairs, aligned with
-- `A.subscription_ids`); the owner's legacy queue is drained last. The answer lists the claimed
-- deliveries as [id, subscription id ('' from the legacy queue)].
local now, now_s = now_ms()
local lease, room, limit = tonumber(A.lease_ms), tonumber(A.max), tonumber(A.per_subscription)
-- the owner's claims whose lease ended are due again below (per subscription, or the legacy queue)
redis.call('ZREMRANGEBYSCORE', K.owner_in_flight, '-inf', now)
room = math.max(0, math.min(room, tonumber(A.per_owner) - redis.call('ZCARD', K.owner_in_flight)))
local claimed = {}
local function claim(id, sub)
  redis.call('ZADD', K.owner_in_flight, now + lease, id)
  claimed[#claimed + 1] = {id, sub}
  room = room - 1
end
for i, sub in ipairs(A.subscription_ids) do
  local queue, flight = K.subscriptions[2 * i - 1], K.subscriptions[2 * i]
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
      claim(id, sub)
    end
  end
  -- when to look at this subscription next: its first queued delivery while it has room, else
  -- the end of its earliest lease (a recorded attempt brings that forward); none: forget it
  local first = redis.call('ZRANGE', queue, 0, 0, 'WITHSCORES')[2]
  local lease_end = redis.call('ZRANGE', flight, 0, 0, 'WITHSCORES')[2]
  local next_at = first
  if lease_end and (not first or redis.call('ZCARD', flight) >= limit) then next_at = lease_end end
  if next_at then redis.call('ZADD', K.due_subscriptions, next_at, sub) else redis.call('ZREM', K.due_subscriptions, sub) end
end
if room > 0 then
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', K.legacy_queue, '-inf', now, 'LIMIT', 0, room)) do
    redis.call('ZADD', K.legacy_queue, now + lease, id)
    claim(id, '')
  end
end
return ok({claimed = claimed}, '', now_s)
