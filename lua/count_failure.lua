-- One failed authentication of a key id or a source address in the counter's minute (the
-- counter lives two minutes). The count answers whether its failures are now throttled.
local n = redis.call('INCR', K.counter)
if n == 1 then redis.call('PEXPIRE', K.counter, 120000) end
return ok({count = n})
