-- Calendar arithmetic in UTC, proleptic Gregorian (Lua in Redis has no os.date).
-- needs: nothing

-- Calendar arithmetic in UTC, proleptic Gregorian (Lua in Redis has no os.date): the date of a
-- day number (days since 1970-01-01) and back.
local function civil_from_days(days)
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  return yoe + era * 400 + ((m <= 2) and 1 or 0), m, d
end

local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((m + 9) % 12) + 2) / 5) + d - 1
  return era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
end

-- RFC 3339 UTC with milliseconds, from epoch ms.
local function iso8601(ms)
  local secs, frac = math.floor(ms / 1000), ms % 1000
  local days, rem = math.floor(secs / 86400), secs % 86400
  local y, m, d = civil_from_days(days)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%03dZ', y, m, d, math.floor(rem / 3600),
    math.floor(rem % 3600 / 60), rem % 60, frac)
end

-- The end of the period after one ending at `end_ms`: `every` is its length in ms, or 'M'
-- (monthly: on day `day` of the next month, or its last day when it is shorter; without a
-- day, the day `end_ms` falls on).
local function next_period_end(end_ms, every, day)
  if every ~= 'M' then return end_ms + tonumber(every) end
  local days, rem = math.floor(end_ms / 86400000), end_ms % 86400000
  local y, m, d = civil_from_days(days)
  day = tonumber(day) or d
  if m == 12 then y, m = y + 1, 1 else m = m + 1 end
  local length = (m == 12) and (days_from_civil(y + 1, 1, 1) - days_from_civil(y, 12, 1))
    or (days_from_civil(y, m + 1, 1) - days_from_civil(y, m, 1))
  return days_from_civil(y, m, math.min(day, length)) * 86400000 + rem
end
