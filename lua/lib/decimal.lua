-- Int64 amounts as decimal strings: they never pass through Lua doubles except on the fast
-- path, where both operands have at most 15 characters and every result is exact.
-- needs: nothing

-- Shared helpers of every script (Lua has no imports): the library holds them once, and a
-- script run by EVALSHA carries the ones it uses. A generated header opens the library with
-- the rules and messages the Rust side owns (`RULES`, `MSG`; shared/src/domain.rs), and each
-- script body starts with its keys and arguments by name (`K`, `A`; its call in shared/src/ops).
-- Amounts are int64 decimal strings: they never pass through Lua doubles except on the
-- fast path, where both operands have at most 15 characters and every result is exact.

local INT64_MAX = '9223372036854775807'
local INT64_MIN_MAG = '9223372036854775808'

local function split_sign(s)
  if string.sub(s, 1, 1) == '-' then return true, string.sub(s, 2) end
  return false, s
end

-- compares two non-negative digit strings without leading zeros
local function mag_cmp(a, b)
  if #a ~= #b then return (#a < #b) and -1 or 1 end
  if a == b then return 0 end
  return (a < b) and -1 or 1
end

local function strip(m)
  local s = string.gsub(m, '^0+', '')
  if s == '' then return '0' end
  return s
end

local function mag_add(a, b)
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
  return strip(string.reverse(table.concat(out)))
end

-- a >= b
local function mag_sub(a, b)
  local out, borrow = {}, 0
  local i, j = #a, #b
  while i > 0 do
    local x = string.byte(a, i) - 48 - borrow
    local y = (j > 0) and (string.byte(b, j) - 48) or 0
    if x < y then x = x + 10; borrow = 1 else borrow = 0 end
    out[#out + 1] = string.char(48 + x - y)
    i, j = i - 1, j - 1
  end
  return strip(string.reverse(table.concat(out)))
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
  local na, ma = split_sign(a)
  local nb, mb = split_sign(b)
  ma, mb = strip(ma), strip(mb)
  if ma == '0' then na = false end
  if mb == '0' then nb = false end
  if na ~= nb then return na and -1 or 1 end
  local c = mag_cmp(ma, mb)
  if na then return 0 - c end -- (never -0)
  return c
end

local function d_add(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a + b) end
  local na, ma = split_sign(a)
  local nb, mb = split_sign(b)
  ma, mb = strip(ma), strip(mb)
  local neg, mag
  if na == nb then
    neg, mag = na, mag_add(ma, mb)
  else
    local c = mag_cmp(ma, mb)
    if c == 0 then return '0' end
    if c > 0 then neg, mag = na, mag_sub(ma, mb) else neg, mag = nb, mag_sub(mb, ma) end
  end
  if mag == '0' then return '0' end
  if neg then return '-' .. mag end
  return mag
end

local function d_neg(a)
  if a == '0' then return '0' end
  if string.sub(a, 1, 1) == '-' then return string.sub(a, 2) end
  return '-' .. a
end

local function d_sub(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a - b) end
  return d_add(a, d_neg(b))
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
  local neg, m = split_sign(a)
  m = strip(m)
  if neg then return mag_cmp(m, INT64_MIN_MAG) <= 0 end
  return mag_cmp(m, INT64_MAX) <= 0
end
