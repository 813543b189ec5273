-- Claims due deliveries of one owner: each is pushed `lease` into the future, so a dispatcher
-- that dies after sending but before recording leaves it due again (at-least-once), and two
-- dispatchers never claim the same delivery at once.
-- KEYS[1] owner's delivery queue  ARGV[1] lease ms  ARGV[2] max deliveries
-- Reply context: the claimed delivery ids.
local now = now_ms()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
local out = {'OK', '[]', '', tostring(now)}
for _, id in ipairs(due) do
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
  out[#out + 1] = id
end
return out
