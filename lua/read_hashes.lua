-- Reads hash records of one tenant in one round trip (operator-plane listings): one JSON
-- object per key ('{}' when absent).
local out = {}
for i, key in ipairs(K.records) do out[i] = record_json(key) end
return ok({records = out})
