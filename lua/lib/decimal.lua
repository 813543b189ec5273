-- Int64 amounts as decimal strings, exact over the whole range: short ones as Lua numbers, long
-- ones in two exact parts.
-- needs: nothing

-- Shared helpers of every script (Lua has no imports): the library holds them once, and a
-- script run by EVALSHA carries the ones it uses. A generated header opens the library with
-- the rules and messages the Rust side owns (`RULES`, `MSG`; shared/src/domain.rs), and each
-- script body starts with its keys and arguments by name (`K`, `A`; its call in shared/src/ops).
-- Amounts are int64 decimal strings. Operands of at most 15 characters are exact Lua numbers
-- (the fast path); longer ones are split into a high part and their last nine digits, each an
-- exact double with the value's sign, and carried in base 1e9: exact for every int64 and for the
-- sum or difference of two.
local long_amount = {}

function long_amount.split(a)
  local neg = string.sub(a, 1, 1) == '-'
  local digits = neg and string.sub(a, 2) or a
  local hi, lo = tonumber(string.sub(digits, 1, -10)) or 0, tonumber(string.sub(digits, -9))
  if neg then return -hi, -lo end
  return hi, lo
end

-- The decimal string of hi * 1e9 + lo (|lo| < 2e9, any signs).
function long_amount.joined(hi, lo)
  hi, lo = hi + math.floor(lo / 1e9), lo % 1e9
  if hi >= 0 then
    if hi == 0 then return string.format('%d', lo) end
    return string.format('%d%09d', hi, lo)
  end
  if lo > 0 then hi, lo = hi + 1, 1e9 - lo end -- now the value is -(-hi * 1e9 + lo)
  if hi == 0 then return string.format('-%d', lo) end
  return string.format('-%d%09d', -hi, lo)
end

-- Integers as strings, without a float format: '%d' costs half of '%.0f', and arithmetic on
-- digit strings (Lua coerces them) a third of tonumber().
local function itoa(n) return string.format('%d', n) end

-- d_cmp(a, b): -1, 0 or 1 for signed decimal strings (split parts order by the high part first)
local function d_cmp(a, b)
  local x, y
  if #a <= 15 and #b <= 15 then
    x, y = a + 0, b + 0
  else
    local ah, al = long_amount.split(a)
    local bh, bl = long_amount.split(b)
    if ah ~= bh then x, y = ah, bh else x, y = al, bl end
  end
  if x < y then return -1 elseif x > y then return 1 else return 0 end
end

local function d_add(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a + b) end
  local ah, al = long_amount.split(a)
  local bh, bl = long_amount.split(b)
  return long_amount.joined(ah + bh, al + bl)
end

local function d_sub(a, b)
  if #a <= 15 and #b <= 15 then return itoa(a - b) end
  local ah, al = long_amount.split(a)
  local bh, bl = long_amount.split(b)
  return long_amount.joined(ah - bh, al - bl)
end
local function d_min(a, b) if d_cmp(a, b) <= 0 then return a end return b end
local function d_max(a, b) if d_cmp(a, b) >= 0 then return a end return b end
local function d_pos(a)
  if #a <= 15 then return a + 0 > 0 end
  return d_cmp(a, '0') > 0
end

-- true when the value fits in int64, -9223372036854775808..9223372036854775807 (checked before
-- any write, so no script ever fails half way through its mutations)
local function d_fits(a)
  if #a <= 18 then return true end -- 18 digits, or a sign and 17, always fit (the common case)
  local hi, lo = long_amount.split(a)
  if hi < 0 then return hi > -9223372036 or (hi == -9223372036 and lo >= -854775808) end
  return hi < 9223372036 or (hi == 9223372036 and lo <= 854775807)
end
