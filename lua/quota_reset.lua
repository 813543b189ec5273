-- resetActionQuotaCounter: the counter `K.counter` to 0 (its TTL kept; a per_run counter's
-- refreshed), its threshold announcement cleared, with quota.counter_reset (actor, previous
-- value, reason) and an audit row in the same step. 404 when no such counter exists.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local f = redis.call('HMGET', K.counter, 'n', 'lim', 'pol', 'ttl', 'last')
if not f[1] then return err('NOT_FOUND', 'No quota counter matches these key fields') end
local previous = tonumber(f[1])
redis.call('HSET', K.counter, 'n', 0)
redis.call('HDEL', K.counter, 'al')
if f[4] then redis.call('PEXPIRE', K.counter, tonumber(f[4])) end
local scope, label, window, bucket = string.match(A.member, '^([^|]*)|([^|]*)|([^|]*)|(.*)$')
local risk = string.match(label, '^__risk__:(.*)$')
local data = {scope = scope, action_kind = risk and '__risk__' or label, risk_class = risk, window = window,
  window_key = bucket, previous_used = previous, limit = tonumber(f[2]), actor_id = A.actor, policy_id = f[3],
  tenant_id = ctx.tenant}
if A.reason ~= '' then data.reason = A.reason end
ctx.correlation_id = redis.sha1hex(ctx.tenant .. '|' .. scope .. '|' .. (risk or label) .. '|' .. window .. '|' .. bucket)
emit(K.events, 'quota.counter_reset', ctx.tenant, scope, ctx, 'cycles-admin', cjson.encode(data), now)
audit(K.audit_log, ctx, 'quota.counter_reset', 'action_quota_counter', A.member, now,
  {previous_used = previous, reason = (A.reason ~= '') and A.reason or nil})
return ok({scope = scope, label = label, window = window, bucket = bucket, used = '0', limit = f[2], policy = f[3],
  last = f[5], previous = tostring(previous)}, '', now_s)
