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
if f[4] then redis.call('PEXPIRE', K.counter, f[4]) end
local m = quota_member(A.member)
local data = {scope = m.scope, action_kind = m.risk and '__risk__' or m.label, risk_class = m.risk, window = m.window,
  window_key = m.bucket, previous_used = previous, limit = tonumber(f[2]), actor_id = A.actor, policy_id = f[3],
  tenant_id = ctx.tenant}
if A.reason ~= '' then data.reason = A.reason end
ctx.correlation_id = quota_correlation(ctx.tenant, m)
emit(K.events, 'quota.counter_reset', ctx.tenant, m.scope, ctx, 'cycles-admin', cjson.encode(data), now)
audit(K.audit_log, ctx, 'quota.counter_reset', 'action_quota_counter', A.member, now,
  {previous_used = previous, reason = (A.reason ~= '') and A.reason or nil})
return ok({scope = m.scope, label = m.label, window = m.window, bucket = m.bucket, used = '0', limit = f[2],
  policy = f[3], last = f[5], previous = tostring(previous)}, '', now_s)
