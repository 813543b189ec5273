-- Listing with `include`: the metadata and commit metadata of the page's reservations, from
-- beside each record, else (records written before metadata moved there) from the record.
-- `K.pairs` holds per reservation its metadata key, then its record key.
local out = {}
for i = 1, #K.pairs, 2 do
  local m = redis.call('HMGET', K.pairs[i], 'metadata', 'cmeta')
  if not m[1] and not m[2] then
    local rec = load_record(K.pairs[i + 1]) or {}
    m = {rec.metadata, rec.cmeta}
  end
  out[#out + 1] = {metadata = m[1] or nil, committed_metadata = m[2] or nil}
end
return ok({rows = out})
