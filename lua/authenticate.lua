-- Verifies an API key without doing anything else (used only on rare error paths, e.g.
-- before telling a caller that a reservation belongs to another tenant).
-- KEYS[1] api key record  ARGV[1] key digest  ARGV[2] accepted permissions
local now = now_ms()
local denied = authorize(KEYS[1], ARGV[1], ARGV[2], now)
if denied then return denied end
return {'OK', '[]', '', tostring(now)}
