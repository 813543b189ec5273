-- Webhook delivery queues.
-- needs: nothing

-- Drops the queued deliveries of a subscription that stopped (deleted, paused, disabled), so a
-- dispatcher never works through them: each record still kept says why (FAILED, `why`). Claimed
-- ones finish the send in progress. Bounded by the subscription's queue, which only an ACTIVE
-- subscription grows.
local function drop_deliveries(prefix, sub_id, why, now_s)
  local queue = KEY.subscription_queue(prefix, sub_id)
  for _, id in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    local record = KEY.delivery(prefix, id)
    if redis.call('EXISTS', record) == 1 then
      redis.call('HSET', record, 'status', 'FAILED', 'error_message', why, 'completed_at_ms', now_s)
      redis.call('HDEL', record, 'next_retry_at_ms')
    end
  end
  redis.call('DEL', queue)
  redis.call('ZREM', KEY.due_subscriptions(prefix), sub_id)
end
