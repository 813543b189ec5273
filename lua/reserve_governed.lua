-- Live reservation of a tenant with policies, or observing (a plain tenant's reserve,
-- lua/reserve.lua, hands such calls here; same keys and arguments): the opening, then the
-- decision with the policies' checks (`GOVERNED`) and the hold with the counts they move, in
-- one atomic step. In observe mode (the request's, else the tenant's) the reserve is an
-- evaluation (status OBSERVED, nothing held).
local now, now_s = now_ms()
local scope_path = string.sub(A.scopes[#A.scopes], 1, -10)
local answered = reserve_opening(K, A, now, now_s, scope_path, GOVERNED)
if answered then return answered end
local tenant = tenant_record(K.tenant)
if tenant ~= 'MALFORMED' and observing(A, tenant) then
  return evaluation({tenant = K.tenant, record = K.dry_run_record, live = K.reservation, events = K.events,
    budgets = K.budgets}, A, now, now_s, 'OBSERVED', tenant)
end
if redis.call('EXISTS', K.dry_run_record) == 1 then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH_DRY_RUN) end

local ask = ask_of('hold', K, A, now, tenant, scope_path)
local verdict = decide(ask, GOVERNED)
if verdict then return refused(ask, verdict, now_s) end
-- (the quota and guard counts the checks found to move, if any)
local answer, unwritten = hold(ask, now_s, (ask.counted or ask.guarded) and GOVERNED.moves)
-- (an active-hold slot the guards took goes back when nothing was held)
if unwritten then GOVERNED.release_slots(ask) end
return answer
