-- Compacts the listing index (run by the sweep): the members of up to `A.batch` finished
-- reservations (their status member is COMMITTED, EXPIRED or RELEASED, so none of them changes
-- again) move from the index into its chunks (`CHUNKED` in lua/lib/listing.lua). A member
-- longer than a compact chunk admits stays in the index; a status member whose record is gone
-- indexes nothing and is dropped. Answers how many reservations it looked at.
local batch = tonumber(A.batch)
local prefix = KEY.prefix_of(K.listing_index)
local looked, moving, dropping = 0, {}, {}
for _, range in ipairs({{'[C', '(D'}, {'[E', '(F'}, {'[R', '(S'}}) do
  if looked >= batch then break end
  for _, s in ipairs(CHUNKED.lex(K.listing_index, range[1], range[2], false, batch - looked)) do
    looked = looked + 1
    local token = string.sub(s, 3)
    local raw = redis.call('GET', KEY.reservation(prefix, token))
    local rec = raw and head_record(raw)
    if rec and rec.estimate and rec.expires and rec.scope and rec.subject then
      local m = list_members(token, rec.status, rec.subject, rec.estimate, rec.scope, rec.expires)
      m[1] = s
      for _, member in ipairs(m) do
        if #member <= CHUNKED.longest then moving[#moving + 1] = member end
      end
    else
      dropping[#dropping + 1] = s
    end
  end
end
CHUNKED.sliced('ZREM', K.listing_index, moving, 1, #moving)
CHUNKED.sliced('ZREM', K.listing_index, dropping, 1, #dropping)
CHUNKED.add(K.listing_chunks, moving)
return ok({looked = looked, moved = #moving})
