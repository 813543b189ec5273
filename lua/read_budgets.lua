-- Balances, step 2: the current state of the given ledgers (one tenant, one slot), each as in
-- every answer's balances; a ledger that vanished meanwhile is `false`.
local out = {}
for i, key in ipairs(K.budgets) do
  local b = read_budget(key)
  out[i] = b and balances({b}) or false
end
return ok({ledgers = out})
