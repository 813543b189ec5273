-- The export cursor of one stream (`K.state`: `done`, the last entry id exported, and
-- `pending`, the last entry id of the batch being uploaded). `begin`: when nothing is pending and `done` is still `A.done`, the batch ending at `A.last`
-- becomes pending; answers the batch pending either way (an overlapping invocation's, to be
-- finished first). `finish`: when `A.last` is pending, it becomes done. So each entry lands in
-- exactly one object. `advance` (the alert bus, which keeps nothing pending): `done` becomes
-- `A.last` when it is still `A.done`.
local f = redis.call('HMGET', K.state, 'done', 'pending')
local done, pending = f[1] or '', f[2] or ''
if A.mode == 'begin' and pending == '' and done == A.done then
  redis.call('HSET', K.state, 'pending', A.last)
  pending = A.last
elseif A.mode == 'finish' and pending ~= '' and pending == A.last then
  redis.call('HSET', K.state, 'done', A.last)
  redis.call('HDEL', K.state, 'pending')
  done, pending = A.last, ''
elseif A.mode == 'advance' and done == A.done then
  redis.call('HSET', K.state, 'done', A.last)
  done = A.last
end
return ok({done = done, pending = pending})
