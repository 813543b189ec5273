-- Retention for one tenant: events older than the event retention leave the stream; finished
-- reservations whose retention has passed are deleted with everything that indexes them
-- (created index, listing index, metadata). Their keys also carry a TTL a week past the
-- retention, as a safety net: a created-index entry whose record is gone is dropped too. Live
-- reservations, and finished ones still within retention, stay. `K.candidates` holds per
-- candidate its record and its metadata key; `A.members` their created-index members.
local now, now_s = now_ms()
local events = redis.call('XTRIM', K.events, 'MINID', A.oldest_event_ms)
local retention = tonumber(A.retention_ms)
local removed = 0
for i, member in ipairs(A.members) do
  local record, meta = K.candidates[2 * i - 1], K.candidates[2 * i]
  local rec = load_record(record)
  local finished = rec and tonumber(rec.finished)
  if not rec then
    redis.call('ZREM', K.created_index, member)
    removed = removed + 1
  elseif rec.status ~= 'ACTIVE' and STATUS_MARK[rec.status] and finished and finished + retention <= now
      and rec.estimate and rec.expires then
    local token = string.sub(member, 14)
    for _, m in ipairs(list_members(token, rec.status, rec.subject, rec.estimate, rec.scope, rec.expires)) do
      redis.call('ZREM', K.listing_index, m)
    end
    redis.call('DEL', record, meta)
    redis.call('ZREM', K.created_index, member)
    removed = removed + 1
  end
end
return ok({removed = removed, events = events}, '', now_s)
