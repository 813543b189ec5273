-- Retention for one tenant: events older than the event retention leave the stream; finished
-- reservations whose retention has passed are deleted with everything that indexes them (their
-- created entry, listing index members, metadata). Their keys also carry a TTL a week past the
-- retention, as a safety net: a created entry whose record is gone is dropped too. Live
-- reservations, and finished ones still within retention, stay. `K.candidates` holds per
-- candidate its record and its metadata key; `A.entries` per candidate its created entry (an
-- id of the created stream, or with `A.source` 'index' a member of the created index of
-- before the stream) and its token.
local now, now_s = now_ms()
local events = redis.call('XTRIM', K.events, 'MINID', A.oldest_event_ms)
local retention = tonumber(A.retention_ms)
local removed = 0
local function drop(entry)
  if A.source == 'index' then redis.call('ZREM', K.created_index, entry) else redis.call('XDEL', K.created_stream, entry) end
end
for i = 1, #A.entries, 2 do
  local entry, token = A.entries[i], A.entries[i + 1]
  local record, meta = K.candidates[i], K.candidates[i + 1]
  local rec = load_record(record)
  local finished = rec and tonumber(rec.finished)
  if not rec then
    drop(entry)
    removed = removed + 1
  elseif rec.status ~= 'ACTIVE' and STATUS_CODE[rec.status] and finished and finished + retention <= now
      and rec.estimate and rec.expires then
    CHUNKED.remove(K.listing_index, list_members(token, rec.status, rec.subject, rec.estimate, rec.scope, rec.expires))
    redis.call('DEL', record, meta)
    drop(entry)
    removed = removed + 1
  end
end
return ok({removed = removed, events = events}, '', now_s)
