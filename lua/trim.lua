-- Retention for one tenant: events older than the event retention leave the stream; finished
-- reservations whose retention has passed are deleted with everything that indexes them
-- (created index, listing index, metadata). Their keys also carry a TTL a week past the
-- retention, as a safety net: a created-index entry whose record is gone is dropped too. Live
-- reservations, and finished ones still within retention, stay.
-- KEYS[1] created index  KEYS[2] event stream  KEYS[3] listing index
-- KEYS[4..] per candidate: its record, its metadata (pairs)
-- ARGV[1] oldest event time to keep (ms)  ARGV[2] retention of finished reservations (ms)
-- ARGV[3..] the candidates' created-index members, aligned with the pairs
local now = now_ms()
local events = redis.call('XTRIM', KEYS[2], 'MINID', ARGV[1])
local retention = tonumber(ARGV[2])
local removed = 0
for i = 3, #ARGV do
  local member = ARGV[i]
  local record, meta = KEYS[2 * i - 2], KEYS[2 * i - 1]
  local rec = load_record(record)
  local finished = rec and tonumber(rec.finalized or rec.expired)
  if not rec then
    redis.call('ZREM', KEYS[1], member)
    removed = removed + 1
  elseif rec.status ~= 'ACTIVE' and STATUS_MARK[rec.status] and finished and finished + retention <= now
      and rec.estimate and rec.expires then
    local token = string.sub(member, 14)
    local scope = rec.scope or scope_path_of(cjson.decode(rec.subject))
    for _, m in ipairs(list_members(token, rec.status, rec.subject, rec.estimate, scope, rec.expires)) do
      redis.call('ZREM', KEYS[3], m)
    end
    redis.call('DEL', record, meta)
    redis.call('ZREM', KEYS[1], member)
    removed = removed + 1
  end
end
return {'OK', cjson.encode({tostring(removed), tostring(events)}), '', tostring(now)}
