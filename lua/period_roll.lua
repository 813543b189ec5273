-- The sweep's period rolls over a batch of one tenant's due ledgers (`K.budgets`, from its
-- periods index): each rolls into its current period exactly once (`roll_period` re-checks
-- the period's end inside this script, so overlapping sweeps and lazy rolls never roll one
-- twice); a ledger that is gone or no longer recurs leaves the index.
local now, now_s = now_ms()
local sc = scene(K.events, nil, now, nil, A.tenant)
local rolled = 0
for _, key in ipairs(K.budgets) do
  local b = read_budget(key)
  if b and b.roll_at and tonumber(b.roll_at) <= now then
    roll_period(sc, b)
    rolled = rolled + 1
  elseif not (b and b.roll_at) then
    redis.call('ZREM', K.periods, key)
  end
end
return ok({rolled = rolled}, '', now_s)
