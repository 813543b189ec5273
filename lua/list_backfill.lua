-- Puts reservations written before the listing index existed into it (run by the retention
-- crawl a bounded batch at a time; ZADD makes a repeat harmless). `A.members` are the
-- reservations' created-index members, aligned with `K.records`.
local added = 0
for i, key in ipairs(K.records) do
  local rec = load_record(key)
  if rec and STATUS_CODE[rec.status] and rec.estimate and rec.expires and rec.subject and rec.scope then
    list_add(K.listing_index, list_members(string.sub(A.members[i], 14), rec.status, rec.subject, rec.estimate,
      rec.scope, rec.expires))
    added = added + 1
  end
end
return ok({added = added})
