-- The sweep's reclaim of ledgers made by budget templates (`lua/lib/guards.lua`) over a batch
-- of one tenant's (`K.budgets`, from its template index, with their budget codes in
-- `A.codes`): one untouched for `A.idle_ms`, with nothing held and nothing owed, is deleted
-- (budget.closed naming the reclaim, an audit row, its policy's count given back), so the
-- scope's next request makes a fresh one; one touched since is looked at again when it may
-- have become idle (one holding or owing, an idle period later); one that is gone, or no longer a template's, leaves the index.
local now, now_s = now_ms()
local idle = tonumber(A.idle_ms)
local reclaimed = 0
for i, key in ipairs(K.budgets) do
  local code = A.codes[i]
  local b = read_budget(key)
  local f = b and redis.call('HMGET', key, 'template_policy', 'ledger_id', 'created_at_ms', 'v')
  if not (b and f[1]) then
    redis.call('ZREM', K.template_ledgers, code)
  else
    -- when it last changed: its view's update time (the ledger table leaves it out)
    local touched = tonumber(({string.match(f[4] or '', LEDGER_VIEW.pattern)})[11] or f[3]) or now
    if touched + idle > now then
      redis.call('ZADD', K.template_ledgers, touched, code)
    elseif b.reserved ~= '0' or b.debt ~= '0' then
      redis.call('ZADD', K.template_ledgers, now, code)
    else
      redis.call('DEL', key)
      local units = string.gsub(redis.call('HGET', K.scope_units, b.scope) or ',', ',' .. b.unit .. ',', ',')
      if units == ',' then redis.call('HDEL', K.scope_units, b.scope) else redis.call('HSET', K.scope_units, b.scope, units) end
      redis.call('ZREM', K.periods, key)
      redis.call('ZREM', K.template_ledgers, code)
      if redis.call('HINCRBY', K.template_counts, f[1], -1) <= 0 then redis.call('HDEL', K.template_counts, f[1]) end
      emit(K.events, 'budget.closed', A.tenant, b.scope, nil, 'cycles-sweep', '{"ledger_id":' .. cjson.encode(f[2]) ..
        ',"scope":' .. cjson.encode(b.scope) .. ',"unit":"' .. b.unit .. '","operation":"RECLAIM","policy_id":' ..
        cjson.encode(f[1]) .. ',"reason":"made by a budget template and idle since ' .. iso8601(touched) ..
        '","previous_state":' .. ledger_state(b, true) .. '}', now)
      audit(K.audit_log, {tenant = A.tenant, operation = 'reclaimTemplateBudget', actor = 'system', status = 200},
        'budget.reclaim', 'budget', f[2], now, {policy_id = f[1], scope = b.scope, idle_since = iso8601(touched)})
      reclaimed = reclaimed + 1
    end
  end
end
return ok({reclaimed = reclaimed}, '', now_s)
