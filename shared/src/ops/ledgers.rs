//! Budget ledgers: listing a tenant's ledgers and reading their state (balances), creating,
//! updating (freeze, unfreeze) and funding them.

use serde::Deserialize;

use super::records::RecordAnswer;
use super::{lua_list, script, LedgerState};

script! {
    /// The ledgers of a tenant that the key's scope filter admits (`lua/balances.lua`).
    pub struct ListLedgers = balances read_only -> LedgerList {
        keys: [api_key, scope_units],
        args: [digest, accepted],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct LedgerList {
    /// (scope, ",UNIT,UNIT,") pairs.
    #[serde(deserialize_with = "lua_list")]
    pub ledgers: Vec<(String, String)>,
}

script! {
    /// The current state of ledgers of one tenant (`lua/read_budgets.lua`); `None` for one that
    /// vanished meanwhile.
    pub struct ReadLedgers = read_budgets read_only -> LedgerStates {
        keys: [; budgets],
        args: [],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct LedgerStates {
    #[serde(deserialize_with = "lua_list")]
    pub ledgers: Vec<MaybeLedger>,
}

/// A ledger's state, or `false` where it vanished.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum MaybeLedger {
    Present(LedgerState),
    Gone(bool),
}

script! {
    /// createBudget (`lua/budget_create.lua`): `fields` is the ledger's record (JSON).
    pub struct CreateBudget = budget_create -> RecordAnswer {
        keys: [tenant, budget, scope_units, events, audit_log],
        args: [context, fields],
    }
}

script! {
    /// updateBudget, freezeBudget, unfreezeBudget (`lua/budget_update.lua`): `mode` is `update`
    /// (`change`: a JSON patch) or `freeze` / `unfreeze` (`change`: the reason).
    pub struct UpdateBudget = budget_update -> RecordAnswer {
        keys: [tenant, budget, events, audit_log],
        args: [context, mode, scope, change],
    }
}

script! {
    /// fundBudget (`lua/budget_fund.lua`): `record` is the idempotency record, or the tenant
    /// record again when the request has no idempotency key.
    pub struct FundBudget = budget_fund -> Funded {
        keys: [tenant, budget, record, events, audit_log],
        args: [context, scope, operation, amount, spent, reason, payload_hash, record_ttl_ms],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Funded {
    pub operation: String,
    pub previous_allocated: String,
    pub new_allocated: String,
    pub previous_remaining: String,
    pub new_remaining: String,
    pub previous_debt: String,
    pub new_debt: String,
    pub previous_spent: String,
    pub new_spent: String,
    pub timestamp_ms: String,
}
