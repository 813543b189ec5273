-- Int64 amounts as decimal strings: they never pass through Lua doubles except on the fast
-- path, where both operands have at most 15 characters and every result is exact.
-- needs: nothing

-- Shared helpers of every script (Lua has no imports): the library holds them once, and a
-- script run by EVALSHA carries the ones it uses. A generated header opens the library with
-- the rules and messages the Rust side owns (`RULES`, `MSG`; shared/src/domain.rs), and each
-- script body starts with its keys and arguments by name (`K`, `A`; its call in shared/src/ops).
-- Amounts are int64 decimal strings: they never pass through Lua doubles except on the
-- fast path, where both operands have at most 15 characters and every result is exact.

-- The digit-string path, for operands the fast path cannot take: magnitudes are non-negative
-- digit strings without leading zeros.
local digit_path = {INT64_MAX = '9223372036854775807', INT64_MIN_MAG = '9223372036854775808'}

function digit_path.cmp(a, b)
  if #a ~= #b then return (#a < #b) and -1 or 1 end
  if a == b then return 0 end
  return (a < b) and -1 or 1
end

function digit_path.strip(m)
  local s = string.gsub(m, '^0+', '')
  if s == '' then return '0' end
  return s
end

function digit_path.add(a, b)
  local out, carry = {}, 0
  local i, j = #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local x = (i > 0) and (string.byte(a, i) - 48) or 0
    local y = (j > 0) and (string.byte(b, j) - 48) or 0
    local s = x + y + carry
    out[#out + 1] = string.char(48 + s % 10)
    carry = math.floor(s / 10)
    i, j = i - 1, j - 1
  end
  return digit_path.strip(string.reverse(table.concat(out)))
end

-- a >= b
function digit_path.sub(a, b)
  local out, borrow = {}, 0
  local i, j = #a, #b
  while i > 0 do
    local x = string.byte(a, i) - 48 - borrow
    local y = (j > 0) and (string.byte(b, j) - 48) or 0
    if x < y then x = x + 10; borrow = 1 else borrow = 0 end
    out[#out + 1] = string.char(48 + x - y)
    i, j = i - 1, j - 1
  end
  return digit_path.strip(string.reverse(table.concat(out)))
end

-- Signed decimal strings as (negative, magnitude), -0 as 0.
function digit_path.parts(a)
  local neg = string.sub(a, 1, 1) == '-'
  local m = digit_path.strip(neg and string.sub(a, 2) or a)
  return neg and m ~= '0', m
end

-- Integers as strings, without a float format: '%d' costs half of '%.0f', and arithmetic on
-- digit strings (Lua coerces them) a third of tonumber().
local function itoa(n) return string.format('%d', n) end

-- d_cmp(a, b): -1, 0 or 1 for signed decimal strings
local function d_cmp(a, b)
  if #a <= 15 and #b <= 15 then
    local x, y = a + 0, b + 0
    if x < y then return -1 elseif x > y then return 1 else return 0 end
  end
  local na, ma = digit_path.parts(a)
  local nb, mb = digit_path.parts(b)
  if na ~= nb then return na and -1 or 1 end
  local c = digit_path.cmp(ma, mb)
  if na then return 0 - c end -- (never -0)
  return c
end

local function d_add(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a + b) end
  local na, ma = digit_path.parts(a)
  local nb, mb = digit_path.parts(b)
  local neg, mag
  if na == nb then
    neg, mag = na, digit_path.add(ma, mb)
  else
    local c = digit_path.cmp(ma, mb)
    if c == 0 then return '0' end
    if c > 0 then neg, mag = na, digit_path.sub(ma, mb) else neg, mag = nb, digit_path.sub(mb, ma) end
  end
  if mag == '0' then return '0' end
  if neg then return '-' .. mag end
  return mag
end

function digit_path.neg(a)
  if a == '0' then return '0' end
  if string.sub(a, 1, 1) == '-' then return string.sub(a, 2) end
  return '-' .. a
end

local function d_sub(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a - b) end
  return d_add(a, digit_path.neg(b))
end
local function d_min(a, b) if d_cmp(a, b) <= 0 then return a end return b end
local function d_max(a, b) if d_cmp(a, b) >= 0 then return a end return b end
local function d_pos(a)
  if #a <= 15 then return a + 0 > 0 end
  return d_cmp(a, '0') > 0
end

-- true when the value fits in int64 (checked before any write, so no script ever
-- fails half way through its mutations)
local function d_fits(a)
  if #a <= 18 then return true end -- 18 digits, or a sign and 17, always fit (the common case)
  local neg, m = digit_path.parts(a)
  return digit_path.cmp(m, neg and digit_path.INT64_MIN_MAG or digit_path.INT64_MAX) <= 0
end
