-- A page of usage rollups (getUsage, getAdminUsage): the caller's key checked when one is
-- given (its scope filter then admits the groups shown), the usage log folded first (a
-- bounded batch: reports are current to the request), then the buckets `K.buckets` in order
-- until `A.max_fields` groups were read (at least one bucket). Answers each bucket read as
-- its groups and values, and the key's scope filter.
local now = now_ms()
local denied, filter = authorize(K.api_key, A.digest, A.accepted, now)
if denied then return denied end
fold_usage(K.usage_log, tonumber(A.max_groups), tonumber(A.retention_ms), tonumber(A.fold_limit))
local admitted = filter and scope_filter(filter)
local buckets, fields = {}, 0
for i, key in ipairs(K.buckets) do
  if i > 1 and fields >= tonumber(A.max_fields) then break end
  local all = redis.call('HGETALL', key)
  local rows = {}
  for j = 1, #all, 2 do
    local scope = string.match(all[j], '^([^\31]*)')
    if not admitted or admits(admitted, scope) then
      rows[#rows + 1] = all[j]
      rows[#rows + 1] = all[j + 1]
    end
  end
  fields = fields + #all / 2
  buckets[i] = rows
end
return ok({buckets = buckets, filter = filter or ''}, '', itoa(now))
