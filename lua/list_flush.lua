-- Writes the listing members of the reservations created since the last flush, a bounded
-- batch per call (run by the sweep's visit, and before a listing walks the index): the entries
-- of the tenant's created stream after `K.listing_flushed` (the last entry id done; none yet:
-- from the stream's start, where a member already written is written again harmlessly), each
-- reservation's members as its record stands now. An ended reservation never changes again:
-- with `A.pack` set (compaction on) its members go straight into the compact chunks
-- (`CHUNKED`); an ACTIVE one's go into the index, where its ending moves its status member and
-- the sweep's compaction later packs them.
-- A record already gone (trimmed) indexes nothing. Answers whether more entries wait.
local prefix = KEY.prefix_of(K.listing_index)
local after = redis.call('GET', K.listing_flushed)
local batch = tonumber(A.batch)
local entries = redis.call('XRANGE', K.created_stream, after and ('(' .. after) or '-', '+', 'COUNT', batch + 1)
local n = math.min(#entries, batch)
local live, packed = {}, {}
for i = 1, n do
  local token = entries[i][2][2]
  local raw = redis.call('GET', KEY.reservation(prefix, token))
  local rec = raw and head_record(raw)
  if rec and STATUS_CODE[rec.status] and rec.estimate and rec.expires and rec.scope and rec.subject then
    local ended = A.pack ~= '' and rec.status ~= 'ACTIVE'
    for _, m in ipairs(list_members(token, rec.status, rec.subject, rec.estimate, rec.scope, rec.expires)) do
      if ended and #m <= CHUNKED.longest then packed[#packed + 1] = m else live[#live + 1] = m end
    end
  end
end
CHUNKED.sliced('ZADD', K.listing_index, live, 1, #live)
if #packed > 0 then CHUNKED.add(K.listing_chunks, packed) end
if n > 0 then redis.call('SET', K.listing_flushed, entries[n][1]) end
return ok({more = #entries > batch})
