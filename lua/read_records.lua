-- Listing: the raw records of one tenant's reservations ('' where a record is gone), without
-- their metadata (records of the first layout that still carry it inline have it cut out
-- here, so a listing never ships it).
local out = {}
for i, key in ipairs(K.records) do
  local raw = redis.call('GET', key) or ''
  if string.sub(raw, 1, 1) == '{' and (string.find(raw, '"metadata"', 1, true) or string.find(raw, '"cmeta"', 1, true)) then
    local decoded, rec = pcall(cjson.decode, raw)
    if decoded and type(rec) == 'table' then
      rec.metadata, rec.cmeta = nil, nil
      raw = cjson.encode(rec)
    end
  end
  out[i] = raw
end
return ok({records = out})
