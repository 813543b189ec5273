-- Live reservation: key check, idempotency, then the decision (`decide`: tenant, budgets, caps)
-- and the hold on every budgeted scope with the record, in one atomic step. The record is its
-- own idempotency record (its key derives from the idempotency key). A reserve that would fail
-- for want of budget while the tenant has overdue holds answers `reclaim` with their ids
-- instead: the caller expires them and calls once more with `reclaimed` set.
-- This is a plain tenant's reserve: a tenant with policies or observing is handed, before
-- anything is written, to lua/reserve_governed.lua (same keys and arguments; the store runs it,
-- and calls it directly for that tenant from then on). This script reads today's layouts only:
-- what is older, or due to change, goes to the governed reserve for one call ('once'), which
-- reads it and brings what it writes up to date: a tenant record without its packed copy, a
-- record of the first layout (`reserve_opening`), a ledger of before the view or whose period
-- has ended (`scoped_budgets`). A tenant without a record goes there from now on.
local tenant = TENANT.current(K.tenant)
if not tenant and redis.call('EXISTS', K.tenant) == 1 then return {'HANDOVER', 'reserve_governed', 'once'} end
if type(tenant) ~= 'table' or tenant.policies ~= 0 or observing(A, tenant) then
  return {'HANDOVER', 'reserve_governed'}
end
local now, now_s = now_ms()
local scope_path = string.sub(A.scopes[#A.scopes], 1, -10)
local answered = reserve_opening(K, A, now, now_s, scope_path)
if answered then return answered end
if redis.call('EXISTS', K.dry_run_record) == 1 then return err('IDEMPOTENCY_MISMATCH', MSG.IDEMPOTENCY_MISMATCH_DRY_RUN) end

local ask = ask_of('hold', K, A, now, tenant, scope_path)
local verdict = decide(ask)
if verdict then return refused(ask, verdict, now_s) end
return (hold(ask, now_s))
