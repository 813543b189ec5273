-- Records one delivery attempt (or a pre-check failure) and its effect on the subscription:
-- SUCCESS resets consecutive_failures; a delivery whose retries are exhausted is FAILED, counts
-- one consecutive failure and, at disable_after_failures, disables the subscription with one
-- webhook.disabled event; otherwise the delivery is RETRYING at now + delay.
-- KEYS[1] delivery  KEYS[2] owner's legacy queue  KEYS[3] subscription  KEYS[4] owner's event
-- stream  KEYS[5] the subscription's queue  KEYS[6] its in-flight set  KEYS[7] owner's
-- due-subscription index
-- ARGV[1] 'sent' | 'precheck'  ARGV[2] HTTP status (0 = no HTTP answer)  ARGV[3] response ms
-- ARGV[4] error message  ARGV[5] max retries  ARGV[6] retry delay ms  ARGV[7] disable after
-- ARGV[8] delivery id  ARGV[9] subscription id
local now = now_ms()
local id, sub_id = ARGV[8], ARGV[9]
-- The claim ends: the subscription has room again, so it is looked at next pass.
redis.call('ZREM', KEYS[2], id)
if redis.call('ZREM', KEYS[6], id) == 1 then redis.call('ZADD', KEYS[7], 'LT', now, sub_id) end
local d = redis.call('HMGET', KEYS[1], 'status', 'attempts', 'subscription_id')
if not d[1] or (d[1] ~= 'PENDING' and d[1] ~= 'RETRYING') then
  redis.call('ZREM', KEYS[5], id)
  return {'OK', '[]', d[1] or 'GONE', tostring(now)}
end
local function finish(status)
  redis.call('HSET', KEYS[1], 'status', status, 'completed_at_ms', tostring(now))
  redis.call('HDEL', KEYS[1], 'next_retry_at_ms')
  redis.call('ZREM', KEYS[5], id)
end
if ARGV[1] == 'precheck' then
  redis.call('HSET', KEYS[1], 'error_message', ARGV[4])
  finish('FAILED')
  return {'OK', '[]', 'FAILED', tostring(now)}
end

local attempts = tonumber(d[2] or '0') + 1
local code = tonumber(ARGV[2])
if code > 0 then
  redis.call('HSET', KEYS[1], 'attempts', tostring(attempts), 'response_status', ARGV[2], 'response_time_ms', ARGV[3])
else -- no HTTP answer: no status and no timing are kept (they would tell the state of a port)
  redis.call('HSET', KEYS[1], 'attempts', tostring(attempts))
  redis.call('HDEL', KEYS[1], 'response_status', 'response_time_ms')
end
local sub_exists = redis.call('EXISTS', KEYS[3]) == 1
if code >= 200 and code < 300 then
  redis.call('HDEL', KEYS[1], 'error_message')
  finish('SUCCESS')
  if sub_exists then
    redis.call('HSET', KEYS[3], 'consecutive_failures', '0', 'last_triggered_at_ms', tostring(now), 'last_success_at_ms', tostring(now))
  end
  return {'OK', '[]', 'SUCCESS', tostring(now)}
end
redis.call('HSET', KEYS[1], 'error_message', ARGV[4])
if attempts <= tonumber(ARGV[5]) then
  local next_at = now + tonumber(ARGV[6])
  redis.call('HSET', KEYS[1], 'status', 'RETRYING', 'next_retry_at_ms', tostring(next_at))
  redis.call('ZADD', KEYS[5], next_at, id)
  redis.call('ZADD', KEYS[7], 'LT', next_at, sub_id)
  return {'OK', '[]', 'RETRYING', tostring(now)}
end
finish('FAILED')
if sub_exists then
  local failures = redis.call('HINCRBY', KEYS[3], 'consecutive_failures', 1)
  redis.call('HSET', KEYS[3], 'last_triggered_at_ms', tostring(now), 'last_failure_at_ms', tostring(now))
  local s = redis.call('HMGET', KEYS[3], 'status', 'tenant_id')
  if failures >= tonumber(ARGV[7]) and s[1] == 'ACTIVE' then
    redis.call('HSET', KEYS[3], 'status', 'DISABLED', 'updated_at_ms', tostring(now))
    local ctx = {actor = 'system', correlation_id = 'webhook_auto_disable:' .. d[3] .. ':' .. id}
    emit(KEYS[4], nil, 'webhook.disabled', s[2], nil, ctx, 'cycles-events', '{"subscription_id":' ..
      cjson.encode(d[3]) .. ',"tenant_id":' .. cjson.encode(s[2]) ..
      ',"previous_status":"ACTIVE","new_status":"DISABLED","changed_fields":[],' ..
      '"disable_reason":"consecutive_failures_exceeded_threshold"}', now)
  end
end
return {'OK', '[]', 'FAILED', tostring(now)}
