-- Expiry sweep over a batch of one tenant's due reservations: each ACTIVE reservation past
-- expires_at + grace becomes EXPIRED exactly once, its hold returns to every budgeted scope
-- and one reservation.expired event is written. Finalized or vanished entries leave the index;
-- corrupt records are quarantined, never refunded. Safe to run concurrently with itself.
-- KEYS[1] expiry index  KEYS[2] event stream  KEYS[3] quarantine (hash: id -> reason)
-- KEYS[4] listing index  KEYS[5..] per reservation: its record, its metadata, then its budget keys
-- ARGV[1] how long finished records are kept (ms)  ARGV[2] n  ARGV[3..] per reservation: id,
-- number of budget keys
local now = now_ms()
local retention = tonumber(ARGV[1])
local expired, dropped, quarantined = 0, 0, 0
local k = 5
for i = 1, tonumber(ARGV[2]) do
  local rid, nb = ARGV[1 + 2 * i], tonumber(ARGV[2 + 2 * i])
  local res_key = KEYS[k]
  local ix = {record = res_key, meta = KEYS[k + 1], expiry = KEYS[1], events = KEYS[2], list = KEYS[4]}
  local budget_keys = {}
  for j = 1, nb do budget_keys[j] = KEYS[k + 1 + j] end
  k = k + 2 + nb
  local r = read_reservation(res_key, rid)
  if not r or (r.status ~= 'ACTIVE' and not r.corrupt) then
    redis.call('ZREM', KEYS[1], rid)
    dropped = dropped + 1
  elseif r.corrupt then
    redis.call('ZREM', KEYS[1], rid)
    redis.call('HSET', KEYS[3], rid, 'unreadable status, amount or times at ' .. now)
    quarantined = quarantined + 1
  elseif expire_if_overdue(r, budget_keys, ix, now, retention) then
    expired = expired + 1
  end
end
return {'OK', cjson.encode({tostring(expired), tostring(dropped), tostring(quarantined)}), '', tostring(now)}
