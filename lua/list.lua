-- Listing, one chunk: authenticate, then read up to `count` members of each given range of one
-- lexicographic index, in sort order, after a position. Members are "<value><token>" (the token
-- is their last 14 characters). Orders: 'asc' (value, then token, ascending); 'desc' (plain
-- reverse, for ranges whose members differ in the token only); 'desc-ties-asc' (values
-- descending, equal values by token ascending, the spec's tie-break in both directions: group by
-- group, one more read per group). The reply context carries the key's scope filter (JSON
-- array or ''): the handler leaves out rows outside it.
-- `A.ranges` holds per range: its low bound, its high bound (ZRANGE BYLEX syntax) and a position
-- ('' = from the start; else the last member served). The answer holds per range its members.
-- The creation-time walk (`A.walk` = 'created') reads the created stream, its members made
-- "<13-digit created ms><token>" alike, merged with those of the created index written before
-- the stream (`K.index`).
local now, now_s = now_ms()
local denied, filter = authorize(K.auth, A.digest, A.accepted, now, true)
if denied then return denied end
local order, count = A.order, tonumber(A.count)
local index = K.index

-- The listing index is read with its compact chunks (when it has any); the created index alone.
local chunks = A.walk == 'lex' and CHUNKED.directory(index) or nil
if chunks and redis.call('EXISTS', chunks) == 0 then chunks = nil end
local function lex(from, to, rev, n)
  return CHUNKED.range(index, chunks, from, to, rev, n)
end

local function range(lo, hi, pos)
  if order == 'asc' then
    return lex(pos ~= '' and ('(' .. pos) or lo, hi, false, count)
  end
  if order == 'desc' then
    return lex(pos ~= '' and ('(' .. pos) or hi, lo, true, count)
  end
  -- desc-ties-asc: first the rest of the position's group, then groups highest first, each
  -- with its tokens ascending: a batch read in reverse holds whole groups (put back in token
  -- order) except maybe its last, which is read again whole
  local out, upper = {}, hi
  if pos ~= '' then
    local value = string.sub(pos, 1, -15)
    for _, m in ipairs(lex('(' .. pos, '[' .. value .. '\255', false, count)) do
      out[#out + 1] = m
    end
    upper = '(' .. value
  end
  while #out < count do
    local batch = lex(upper, lo, true, count - #out + 1)
    if #batch == 0 then break end
    local i = 1
    while i <= #batch and #out < count do
      local value = string.sub(batch[i], 1, -15)
      local j = i
      while j < #batch and string.sub(batch[j + 1], 1, -15) == value do j = j + 1 end
      if j == #batch then
        local group = lex('[' .. value, '[' .. value .. '\255', false, count - #out)
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

-- Members of the created stream from the id bound `from` (inclusive) in the walk's direction,
-- whole milliseconds at a time (a batch cut inside one millisecond is read again whole), each
-- millisecond's tokens ascending: up to `count` after `pos`, within `lo`..`hi`.
local function member_of(entry)
  local id = entry[1]
  return padded(string.sub(id, 1, string.find(id, '-', 1, true) - 1), 13) .. entry[2][2]
end

local function stream_range(lo, hi, pos)
  local rev = order ~= 'asc'
  -- ms bounds of the member bounds ('[<13 digits>' inclusive, '(<13 digits>' exclusive)
  local function bound(b, low)
    if b == '-' or b == '+' then return nil end
    local ms = tonumber(string.sub(b, 2, 14))
    if string.sub(b, 1, 1) == '(' then ms = low and ms + 1 or ms - 1 end
    return ms
  end
  local lo_ms, hi_ms = bound(lo, true), bound(hi, false)
  local out = {}
  local from = lo_ms
  if rev then from = hi_ms end
  if pos ~= '' then
    local at = tonumber(string.sub(pos, 1, 13))
    if not from or (rev and at < from) or (not rev and at > from) then from = at end
  end
  while #out < count do
    local edge = rev and (lo_ms and itoa(lo_ms) or '-') or (hi_ms and itoa(hi_ms) or '+')
    local start = from and itoa(from) or (rev and '+' or '-')
    local batch = rev and redis.call('XREVRANGE', K.stream, start, edge, 'COUNT', itoa(count + 1)) or
      redis.call('XRANGE', K.stream, start, edge, 'COUNT', itoa(count + 1))
    if #batch == 0 then break end
    local members = {}
    for i, e in ipairs(batch) do members[i] = member_of(e) end
    local last = string.sub(members[#members], 1, 13)
    if #batch == count + 1 then
      if string.sub(members[1], 1, 13) == last then
        -- one millisecond holds more than the batch: read it whole
        members = {}
        for i, e in ipairs(redis.call('XRANGE', K.stream, last .. '-0', last .. '-18446744073709551615')) do
          members[i] = member_of(e)
        end
      else
        while string.sub(members[#members], 1, 13) == last do members[#members] = nil end
        last = string.sub(members[#members], 1, 13)
      end
    end
    -- entries come in id order: only the tokens of one millisecond are put in order (ascending,
    -- in both directions), a group at a time
    local i = 1
    while i <= #members do
      local ms, j = string.sub(members[i], 1, 13), i
      while j < #members and string.sub(members[j + 1], 1, 13) == ms do j = j + 1 end
      if j > i then
        local group = {unpack(members, i, j)}
        table.sort(group)
        for k = i, j do members[k] = group[k - i + 1] end
      end
      i = j + 1
    end
    local pos_ms = string.sub(pos, 1, 13)
    for _, m in ipairs(members) do
      local after = pos == ''
      if not after and rev then
        local ms = string.sub(m, 1, 13)
        after = ms < pos_ms or (ms == pos_ms and m > pos)
      elseif not after then
        after = m > pos
      end
      if after and #out < count then out[#out + 1] = m end
    end
    local next_ms = tonumber(last) + (rev and -1 or 1)
    if #batch < count + 1 or next_ms < 0 then break end
    from = next_ms
  end
  return out
end

-- The created walk: the stream's members and the index's, merged in the walk's order.
local function created_range(lo, hi, pos)
  local a, b = stream_range(lo, hi, pos), range(lo, hi, pos)
  if #b == 0 then return a end
  local rev = order ~= 'asc'
  local function before(x, y)
    local mx, my = string.sub(x, 1, 13), string.sub(y, 1, 13)
    if mx ~= my then if rev then return mx > my end return mx < my end
    return x < y
  end
  local out, i, j = {}, 1, 1
  while #out < count and (a[i] or b[j]) do
    if b[j] == nil or (a[i] and before(a[i], b[j])) then out[#out + 1] = a[i]; i = i + 1
    else out[#out + 1] = b[j]; j = j + 1 end
  end
  return out
end

local ranges = {}
for i = 1, #A.ranges, 3 do
  local walk = (A.walk == 'created') and created_range or range
  ranges[#ranges + 1] = walk(A.ranges[i], A.ranges[i + 1], A.ranges[i + 2])
end
return ok({ranges = ranges, scope_filter = filter}, '', now_s)
