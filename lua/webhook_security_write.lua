-- updateWebhookSecurityConfig: replaces the stored webhook security configuration (JSON,
-- validated by the caller), with its audit row naming the configuration before and after.
local now, now_s = now_ms()
local ctx = request_context(A.context)
local before = redis.call('GET', K.config)
redis.call('SET', K.config, A.settings)
audit(K.audit_log, ctx, 'webhook_security.updated', 'config', 'webhook-security', now,
  {previous = before and cjson.decode(before) or 'defaults', current = cjson.decode(A.settings)})
return ok(A.settings, 'UPDATED', now_s)
