-- listActionQuotaCounters: a walk of the tenant's counter index (lexicographic by
-- "<scope>|<kind>|<window>|<bucket>") from `A.after` (exclusive; '' from the start), within the
-- scope prefix `A.scope`, keeping counters that match the filters (`A.kind`: a kind or
-- "__risk__"; `A.window`; `A.run`: per_run counters of that run; `A.include_zero`) until
-- `A.limit` + 1 are found or RULES-bounded `A.examine` members were looked at. Members whose
-- counter is gone (past its deadline) leave the counters and the indexes. Answers the rows and
-- the last member examined.
local now = now_ms()
local limit, examine = tonumber(A.limit), tonumber(A.examine)
local lo = (A.after ~= '') and ('(' .. A.after) or ((A.scope ~= '') and ('[' .. A.scope) or '-')
local hi = (A.scope ~= '') and ('[' .. A.scope .. '\255') or '+'
local prefix = KEY.prefix_of(K.index)
local rows, last, seen = {}, '', 0
while #rows <= limit and seen < examine do
  local batch = redis.call('ZRANGE', K.index, lo, hi, 'BYLEX', 'LIMIT', 0, math.min(200, examine - seen))
  if #batch == 0 then last = ''; break end
  local texts = redis.call('HMGET', K.counters, unpack(batch))
  for i, member in ipairs(batch) do
    seen = seen + 1
    last = member
    local m = quota_member(member)
    local n, _, at, lim, pol = COUNTER.fields(texts[i] or COUNTER.moved(prefix, member, now), now)
    if not n then
      redis.call('HDEL', K.counters, member)
      redis.call('ZREM', K.index, member)
      redis.call('ZREM', K.due, member)
    elseif (A.kind == '' or A.kind == m.label or (A.kind == '__risk__' and m.risk))
        and (A.window == '' or A.window == m.window) and (A.run == '' or (m.window == 'per_run' and m.bucket == A.run))
        and (A.include_zero == '1' or tonumber(n) > 0) then
      rows[#rows + 1] = {scope = m.scope, label = m.label, window = m.window, bucket = m.bucket, used = n,
        limit = lim, policy = pol, last = at}
      if #rows > limit then break end
    end
    if seen >= examine then break end
  end
  lo = '(' .. last
end
return ok({rows = rows, last = last}, '', itoa(now))
