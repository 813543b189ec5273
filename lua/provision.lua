-- Provisioning writes, one tenant slot each. ARGV[1] selects the record kind.
-- tenant: KEYS[1] tenant record; ARGV[2..] field/value pairs. Fails if it exists.
-- api_key: KEYS[1] key record; ARGV[2..] field/value pairs. Fails if it exists.
-- budget: KEYS[1] budget, KEYS[2] scope -> units index; ARGV[2] scope, ARGV[3] unit, ARGV[4..] pairs.
local kind = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 1 then return err('DUPLICATE', kind .. ' already exists') end
local first = 2
if kind == 'budget' then
  first = 4
  local units = redis.call('HGET', KEYS[2], ARGV[2]) or ','
  if not string.find(units, ',' .. ARGV[3] .. ',', 1, true) then
    redis.call('HSET', KEYS[2], ARGV[2], units .. ARGV[3] .. ',')
  end
end
local pairs_ = {}
for i = first, #ARGV do pairs_[#pairs_ + 1] = ARGV[i] end
redis.call('HSET', KEYS[1], unpack(pairs_))
return {'OK', '[]', '', '0'}
