-- One more occurrence in the counter's minute (failed authentications of a key id or an address,
-- public requests of an address); the counter lives two minutes. The count decides a throttle.
local n = redis.call('INCR', K.counter)
if n == 1 then redis.call('PEXPIRE', K.counter, 120000) end
return ok({count = n})
