-- Records one delivery attempt (or a pre-check failure) and its effect on the subscription:
-- SUCCESS resets consecutive_failures; a delivery whose retries are exhausted is FAILED, counts
-- one consecutive failure and, at disable_after_failures, disables the subscription with one
-- webhook.disabled event; otherwise the delivery is RETRYING at now + delay.
-- `A.mode`: 'sent' (an attempt: `A.http_status`, 0 when no HTTP answer came back, and
-- `A.response_ms`) or 'precheck' (refused before sending). The answer's status is the
-- delivery's new status.
local now, now_s = now_ms()
local id, sub_id = A.delivery_id, A.subscription_id
-- The claim ends: the subscription has room again, so it is looked at next pass.
redis.call('ZREM', K.legacy_queue, id)
redis.call('ZREM', K.owner_in_flight, id)
if redis.call('ZREM', K.in_flight, id) == 1 then redis.call('ZADD', K.due_subscriptions, 'LT', now, sub_id) end
local d = redis.call('HMGET', K.delivery, 'status', 'attempts', 'subscription_id')
if not d[1] or (d[1] ~= 'PENDING' and d[1] ~= 'RETRYING') then
  redis.call('ZREM', K.queue, id)
  return ok({}, d[1] or 'GONE', now_s)
end
local function finish(status)
  redis.call('HSET', K.delivery, 'status', status, 'completed_at_ms', now_s)
  redis.call('HDEL', K.delivery, 'next_retry_at_ms')
  redis.call('ZREM', K.queue, id)
end
if A.mode == 'precheck' then
  redis.call('HSET', K.delivery, 'error_message', A.error)
  finish('FAILED')
  return ok({}, 'FAILED', now_s)
end

local attempts = tonumber(d[2] or '0') + 1
local code = tonumber(A.http_status)
if code > 0 then
  redis.call('HSET', K.delivery, 'attempts', tostring(attempts), 'response_status', A.http_status, 'response_time_ms', A.response_ms)
else -- no HTTP answer: no status and no timing are kept (they would tell the state of a port)
  redis.call('HSET', K.delivery, 'attempts', tostring(attempts))
  redis.call('HDEL', K.delivery, 'response_status', 'response_time_ms')
end
local sub_exists = redis.call('EXISTS', K.subscription) == 1
if code >= 200 and code < 300 then
  redis.call('HDEL', K.delivery, 'error_message')
  finish('SUCCESS')
  if sub_exists then
    redis.call('HSET', K.subscription, 'consecutive_failures', '0', 'last_triggered_at_ms', now_s, 'last_success_at_ms', now_s)
  end
  return ok({}, 'SUCCESS', now_s)
end
redis.call('HSET', K.delivery, 'error_message', A.error)
-- a subscription paused, disabled or deleted meanwhile has no queue to retry in
local sub_status = sub_exists and redis.call('HGET', K.subscription, 'status') or 'DELETED'
if attempts <= tonumber(A.max_retries) and sub_status == 'ACTIVE' then
  local next_at = now + tonumber(A.retry_delay_ms)
  redis.call('HSET', K.delivery, 'status', 'RETRYING', 'next_retry_at_ms', tostring(next_at))
  redis.call('ZADD', K.queue, next_at, id)
  redis.call('ZADD', K.due_subscriptions, 'LT', next_at, sub_id)
  return ok({}, 'RETRYING', now_s)
end
finish('FAILED')
if sub_exists then
  local failures = redis.call('HINCRBY', K.subscription, 'consecutive_failures', 1)
  redis.call('HSET', K.subscription, 'last_triggered_at_ms', now_s, 'last_failure_at_ms', now_s)
  local s = redis.call('HMGET', K.subscription, 'status', 'tenant_id')
  if failures >= tonumber(A.disable_after) and s[1] == 'ACTIVE' then
    redis.call('HSET', K.subscription, 'status', 'DISABLED', 'updated_at_ms', now_s)
    drop_deliveries(KEY.prefix_of(K.subscription), d[3], 'dropped: subscription disabled', now_s)
    local ctx = {actor = 'system', correlation_id = 'webhook_auto_disable:' .. d[3] .. ':' .. id}
    emit(K.events, 'webhook.disabled', s[2], nil, ctx, 'cycles-events', '{"subscription_id":' ..
      cjson.encode(d[3]) .. ',"tenant_id":' .. cjson.encode(s[2]) ..
      ',"previous_status":"ACTIVE","new_status":"DISABLED","changed_fields":[],' ..
      '"disable_reason":"consecutive_failures_exceeded_threshold"}', now)
  end
end
return ok({}, 'FAILED', now_s)
