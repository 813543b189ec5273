-- Listing, one chunk: authenticate, then read up to `count` members of each given range of one
-- lexicographic index, in sort order, after a position. Members are "<value><token>" (the token
-- is their last 14 characters). Orders: 'asc' (value, then token, ascending); 'desc' (plain
-- reverse, for ranges whose members differ in the token only); 'desc-ties-asc' (values
-- descending, equal values by token ascending, the spec's tie-break in both directions: group by
-- group, one more read per group). The reply context carries the key's scope filter (JSON
-- array or ''): the handler leaves out rows outside it.
-- `A.ranges` holds per range: its low bound, its high bound (ZRANGE BYLEX syntax) and a position
-- ('' = from the start; else the last member served). The answer holds per range its members.
local now, now_s = now_ms()
local denied, filter = authorize(K.auth, A.digest, A.accepted, now)
if denied then return denied end
local order, count = A.order, tonumber(A.count)
local index = K.index

local function range(lo, hi, pos)
  if order == 'asc' then
    return redis.call('ZRANGE', index, pos ~= '' and ('(' .. pos) or lo, hi, 'BYLEX', 'LIMIT', 0, count)
  end
  if order == 'desc' then
    return redis.call('ZRANGE', index, pos ~= '' and ('(' .. pos) or hi, lo, 'BYLEX', 'REV', 'LIMIT', 0, count)
  end
  -- desc-ties-asc: first the rest of the position's group, then groups highest first, each
  -- with its tokens ascending: a batch read in reverse holds whole groups (put back in token
  -- order) except maybe its last, which is read again whole
  local out, upper = {}, hi
  if pos ~= '' then
    local value = string.sub(pos, 1, -15)
    for _, m in ipairs(redis.call('ZRANGE', index, '(' .. pos, '[' .. value .. '\255', 'BYLEX', 'LIMIT', 0, count)) do
      out[#out + 1] = m
    end
    upper = '(' .. value
  end
  while #out < count do
    local batch = redis.call('ZRANGE', index, upper, lo, 'BYLEX', 'REV', 'LIMIT', 0, count - #out + 1)
    if #batch == 0 then break end
    local i = 1
    while i <= #batch and #out < count do
      local value = string.sub(batch[i], 1, -15)
      local j = i
      while j < #batch and string.sub(batch[j + 1], 1, -15) == value do j = j + 1 end
      if j == #batch then
        local group = redis.call('ZRANGE', index, '[' .. value, '[' .. value .. '\255', 'BYLEX', 'LIMIT', 0, count - #out)
        for _, m in ipairs(group) do out[#out + 1] = m end
      else
        for k = j, i, -1 do
          if #out < count then out[#out + 1] = batch[k] end
        end
      end
      upper = '(' .. value
      i = j + 1
    end
  end
  return out
end

local ranges = {}
for i = 1, #A.ranges, 3 do
  ranges[#ranges + 1] = range(A.ranges[i], A.ranges[i + 1], A.ranges[i + 2])
end
return ok({ranges = ranges, scope_filter = filter}, '', now_s)
