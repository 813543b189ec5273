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

-- RFC 3339 UTC with milliseconds, from epoch ms. The text up to the second is remembered per
-- script VM (`ISO_SECOND`): every event of a second shares it, and working it out costs as
-- much as the rest of an event's text.
local ISO_SECOND = {}
local function iso8601(ms)
  local secs = math.floor(ms / 1000)
  if ISO_SECOND.secs ~= secs then
    local days, rem = math.floor(secs / 86400), secs % 86400
    local y, m, d = civil_from_days(days)
    ISO_SECOND.secs, ISO_SECOND.text = secs, string.format('%04d-%02d-%02dT%02d:%02d:%02d', y, m, d,
      math.floor(rem / 3600), math.floor(rem % 3600 / 60), rem % 60)
  end
  return string.format('%s.%03dZ', ISO_SECOND.text, ms % 1000)
end

-- The period current at `now` of a recurrence whose period ended at `end_ms` (<= now): its
-- start and end, and how many periods ended meanwhile, computed in one step however far behind.
-- `every` is the length in ms, or 'M' (monthly: on day `day` of each month, or its last day
-- when it is shorter; without a day, the day `end_ms` falls on).
local function current_period(end_ms, every, day, now)
  if every ~= 'M' then
    local len = tonumber(every)
    local n = math.floor((now - end_ms) / len) + 1
    return end_ms + (n - 1) * len, end_ms + n * len, n
  end
  local days, rem = math.floor(end_ms / 86400000), end_ms % 86400000
  local y, m, d = civil_from_days(days)
  day = tonumber(day) or d
  -- the end n months after the month of end_ms
  local function month_end(n)
    local k = m - 1 + n
    local yy, mm = y + math.floor(k / 12), k % 12 + 1
    local ny, nm = yy + math.floor(mm / 12), mm % 12 + 1
    local length = days_from_civil(ny, nm, 1) - days_from_civil(yy, mm, 1)
    return days_from_civil(yy, mm, math.min(day, length)) * 86400000 + rem
  end
  local ny, nm = civil_from_days(math.floor(now / 86400000))
  local n = math.max(1, (ny - y) * 12 + (nm - m))
  while n > 1 and month_end(n - 1) > now do n = n - 1 end
  while month_end(n) <= now do n = n + 1 end
  return (n == 1) and end_ms or month_end(n - 1), month_end(n), n
end
