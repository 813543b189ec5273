-- Listing with `include`: the metadata and commit metadata of the page's reservations, from
-- beside each record, else (records written before metadata moved there) from the record.
-- KEYS[1..] per reservation: its metadata, its record (pairs)
-- Reply result: per reservation, metadata then commit metadata ('' when absent).
local out = {}
for i = 1, #KEYS, 2 do
  local m = redis.call('HMGET', KEYS[i], 'metadata', 'cmeta')
  if not m[1] and not m[2] then
    local rec = load_record(KEYS[i + 1]) or {}
    m = {rec.metadata, rec.cmeta}
  end
  out[#out + 1] = m[1] or ''
  out[#out + 1] = m[2] or ''
end
if #out == 0 then return {'OK', '[]', '', '0'} end
return {'OK', cjson.encode(out), '', '0'}
