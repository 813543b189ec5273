-- resetActionQuotaCounter: the counter `A.member` of `K.counters` to 0 (its deadline kept), its
-- threshold announcement cleared, with quota.counter_reset (actor, previous value, reason) and
-- an audit row in the same step. 404 when no such counter exists.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local text = COUNTER.read(KEY.prefix_of(K.counters), A.member, now)
local n, _, last, lim, pol = COUNTER.fields(text, now)
if not n then return err('NOT_FOUND', 'No quota counter matches these key fields') end
local previous = tonumber(n)
redis.call('HSET', K.counters, A.member, COUNTER.recount(text, 0, false))
local m = quota_member(A.member)
local data = {scope = m.scope, action_kind = m.risk and '__risk__' or m.label, risk_class = m.risk, window = m.window,
  window_key = m.bucket, previous_used = previous, limit = tonumber(lim), actor_id = A.actor, policy_id = pol,
  tenant_id = ctx.tenant}
if A.reason ~= '' then data.reason = A.reason end
ctx.correlation_id = quota_correlation(ctx.tenant, m)
emit(K.events, 'quota.counter_reset', ctx.tenant, m.scope, ctx, 'cycles-admin', cjson.encode(data), now)
audit(K.audit_log, ctx, 'quota.counter_reset', 'action_quota_counter', A.member, now,
  {previous_used = previous, reason = (A.reason ~= '') and A.reason or nil})
return ok({scope = m.scope, label = m.label, window = m.window, bucket = m.bucket, used = '0', limit = lim, policy = pol,
  last = last, previous = tostring(previous)}, '', now_s)
