-- Listing: the raw records of one tenant's reservations ('' where a record is gone), without
-- their metadata (records written before metadata moved beside them still carry it inline: it
-- is cut out here, so a listing never ships it).
-- KEYS[1..] reservation records
local out = {}
for i = 1, #KEYS do
  local raw = redis.call('GET', KEYS[i]) or ''
  if string.find(raw, '"metadata"', 1, true) or string.find(raw, '"cmeta"', 1, true) then
    local ok, rec = pcall(cjson.decode, raw)
    if ok and type(rec) == 'table' then
      rec.metadata, rec.cmeta = nil, nil
      raw = cjson.encode(rec)
    end
  end
  out[i] = raw
end
if #out == 0 then return {'OK', '[]', '', '0'} end
return {'OK', cjson.encode(out), '', '0'}
