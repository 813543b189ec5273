-- Retention trimming for one tenant: events older than the event retention leave the stream,
-- and created-index entries whose reservation record has expired (records carry their own
-- TTL once finished) are removed, so indexes do not grow with history. Live records stay.
-- KEYS[1] created index  KEYS[2] event stream  KEYS[3..] candidate reservation records
-- ARGV[1] oldest event time to keep (ms)  ARGV[2..] candidate index members aligned with KEYS[3..]
local events = redis.call('XTRIM', KEYS[2], 'MINID', ARGV[1])
local removed = 0
for i = 3, #KEYS do
  local member = ARGV[i - 1]
  if redis.call('EXISTS', KEYS[i]) == 0 then
    redis.call('ZREM', KEYS[1], member)
    removed = removed + 1
  end
end
return {'OK', cjson.encode({tostring(removed), tostring(events)}), '', '0'}
