-- Reads hash records of one tenant in one round trip (operator-plane listings).
-- KEYS[1..] records   Reply context: one JSON object per key ('{}' when absent).
local out = {'OK', '[]', '', tostring(now_ms())}
for _, key in ipairs(KEYS) do out[#out + 1] = record_json(key) end
return out
