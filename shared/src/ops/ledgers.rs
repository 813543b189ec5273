//! Budget ledgers: listing a tenant's ledgers and reading their state (balances), creating,
//! updating (freeze, unfreeze) and funding them.

use std::collections::HashMap;

use redis::AsyncCommands;
use serde::Deserialize;

use super::records::{csv_list, field, int_field, read_records, Record, RecordAnswer};
use super::{lua_list, script, LedgerState};
use crate::error::{ApiError, ApiResult};
use crate::keys::TenantKeys;
use crate::model::Unit;
use crate::store::Store;

/// A budget ledger as stored (the hash `cy:{<tenant>}:b:<code>`). Amounts are int64; the
/// invariant `remaining = allocated - spent - reserved - debt` is kept by the scripts.
#[derive(Debug, Clone, PartialEq)]
pub struct Ledger {
    pub ledger_id: String,
    pub tenant_id: Option<String>,
    pub scope: String,
    pub unit: String,
    pub allocated: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub spent: i64,
    pub debt: i64,
    pub overdraft_limit: i64,
    pub is_over_limit: bool,
    pub status: String,
    pub rollover_policy: String,
    pub commit_overage_policy: Option<String>,
    pub period_start_ms: Option<i64>,
    pub period_end_ms: Option<i64>,
    /// How the period recurs (an extension: `domain::periods`); `None` when it does not.
    pub period_recurrence: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: Option<i64>,
}

/// The fields of a ledger's view (its `v` field, `lua/lib/ledger.lua`: what changes with every
/// charge, joined by \x1f in this order), and the fields of their own that ledgers written
/// before the view keep the same values in.
pub const VIEW_FIELDS: [&str; 15] = [
    "scope",
    "unit",
    "status",
    "allocated",
    "remaining",
    "reserved",
    "spent",
    "debt",
    "overdraft_limit",
    "is_over_limit",
    "updated_at_ms",
    "roll_at_ms",
    "commit_overage_policy",
    "caps",
    "burn",
];

/// A ledger record's fields with its view spread out under their own names (a record without
/// a view is returned as it is). `None` when the view is malformed.
pub fn with_view(r: &Record) -> Option<Record> {
    let Some(view) = r.get("v") else { return Some(r.clone()) };
    let values: Vec<&str> = view.split('\x1f').collect();
    if values.len() != VIEW_FIELDS.len() {
        return None;
    }
    let mut out = r.clone();
    out.remove("v");
    for (name, value) in VIEW_FIELDS.iter().zip(values) {
        let value = match *name {
            "is_over_limit" => {
                if value == "1" {
                    "true"
                } else {
                    "false"
                }
            }
            _ => value,
        };
        if !value.is_empty() {
            out.insert(name.to_string(), value.to_string());
        }
    }
    Some(out)
}

/// The view of a ledger record given field by field (`with_view` read back): what a test or a
/// tool writes to stage a ledger as the scripts would have.
pub fn view_of(r: &Record) -> String {
    VIEW_FIELDS
        .iter()
        .map(|name| match (*name, r.get(*name).map(String::as_str)) {
            ("is_over_limit", v) => {
                if v == Some("true") {
                    "1"
                } else {
                    ""
                }
            }
            (_, v) => v.unwrap_or_default(),
        })
        .collect::<Vec<_>>()
        .join("\x1f")
}

impl Ledger {
    /// The ledger of a stored hash; `None` when the hash is empty or its view malformed.
    pub fn from_record(r: &Record) -> Option<Ledger> {
        if r.is_empty() {
            return None;
        }
        let r = &with_view(r)?;
        let amount = |name: &str| int_field(r, name).unwrap_or(0);
        Some(Ledger {
            ledger_id: field(r, "ledger_id").unwrap_or_default().to_string(),
            tenant_id: field(r, "tenant_id").map(String::from),
            scope: field(r, "scope").unwrap_or_default().to_string(),
            unit: field(r, "unit").unwrap_or_default().to_string(),
            allocated: amount("allocated"),
            remaining: amount("remaining"),
            reserved: amount("reserved"),
            spent: amount("spent"),
            debt: amount("debt"),
            overdraft_limit: amount("overdraft_limit"),
            is_over_limit: field(r, "is_over_limit") == Some("true"),
            status: field(r, "status").unwrap_or("ACTIVE").to_string(),
            rollover_policy: field(r, "rollover_policy").unwrap_or("NONE").to_string(),
            commit_overage_policy: field(r, "commit_overage_policy").map(String::from),
            period_start_ms: int_field(r, "period_start_ms"),
            period_end_ms: int_field(r, "period_end_ms"),
            period_recurrence: field(r, "period_recurrence").map(String::from),
            created_at_ms: int_field(r, "created_at_ms").unwrap_or(0),
            updated_at_ms: int_field(r, "updated_at_ms"),
        })
    }

    /// A script's answer that is a ledger's record.
    pub fn decoded(answer: RecordAnswer) -> ApiResult<Ledger> {
        Ledger::from_record(&answer.0).ok_or_else(|| ApiError::fault("a budget script answered no record"))
    }

    /// spent / allocated (0 for an unallocated ledger).
    pub fn utilization(&self) -> f64 {
        if self.allocated <= 0 {
            0.0
        } else {
            self.spent as f64 / self.allocated as f64
        }
    }
}

/// One ledger by scope and unit (`None` when the tenant has no such ledger).
pub async fn read(store: &Store, tenant: &str, scope: &str, unit: Unit) -> ApiResult<Option<Ledger>> {
    let record: Record = store.conn().hgetall(TenantKeys::new(tenant).budget(scope, unit)).await?;
    Ok(Ledger::from_record(&record).filter(|l| l.scope == scope))
}

/// The keys of every ledger of a tenant (from its scope -> units index).
pub async fn ledger_keys(store: &Store, tenant: &str) -> ApiResult<Vec<String>> {
    let keys = TenantKeys::new(tenant);
    let scopes: HashMap<String, String> = store.conn().hgetall(keys.scope_units()).await?;
    Ok(scopes
        .iter()
        .flat_map(|(scope, units)| csv_list(units).into_iter().filter_map(|u| Unit::parse(&u)).map(move |u| (scope, u)))
        .map(|(scope, unit)| keys.budget(scope, unit))
        .collect())
}

/// Every ledger of a tenant (one script round trip per 500 ledgers).
pub async fn of_tenant(store: &Store, tenant: &str) -> ApiResult<Vec<Ledger>> {
    let records = read_records(store, &ledger_keys(store, tenant).await?).await?;
    Ok(records.iter().filter_map(Ledger::from_record).collect())
}

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

/// A key's view of its tenant's ledgers (checked inside the script, as every runtime read):
/// each scope with its units, comma-separated.
pub async fn listed(
    store: &Store,
    tenant: &str,
    key_id: &str,
    digest: &str,
    accepted: &str,
) -> ApiResult<Vec<(String, String)>> {
    let keys = TenantKeys::new(tenant);
    let call = ListLedgers {
        api_key: keys.api_key(key_id),
        scope_units: keys.scope_units(),
        digest: digest.to_string(),
        accepted: accepted.to_string(),
    };
    Ok(store.run(call).await?.value.ledgers)
}

/// The states of some ledgers of a tenant, in order (one read; none for none).
pub async fn states(store: &Store, tenant: &str, ledgers: &[(String, Unit)]) -> ApiResult<Vec<MaybeLedger>> {
    if ledgers.is_empty() {
        return Ok(Vec::new());
    }
    let keys = TenantKeys::new(tenant);
    let budgets = ledgers.iter().map(|(scope, unit)| keys.budget(scope, *unit)).collect();
    Ok(store.run(ReadLedgers { budgets }).await?.value.ledgers)
}

script! {
    /// createBudget (`lua/budget_create.lua`): `fields` is the ledger's record (JSON).
    pub struct CreateBudget = budget_create -> RecordAnswer {
        keys: [tenant, budget, scope_units, events, audit_log, due_index],
        args: [context, fields],
    }
}

script! {
    /// updateBudget, freezeBudget, unfreezeBudget (`lua/budget_update.lua`): `mode` is `update`
    /// (`change`: a JSON patch) or `freeze` / `unfreeze` (`change`: the reason).
    pub struct UpdateBudget = budget_update -> RecordAnswer {
        keys: [tenant, budget, events, audit_log, due_index],
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

impl CreateBudget {
    /// The call creating one ledger, its arguments to be set.
    pub fn on(tenant: &str, scope: &str, unit: Unit) -> CreateBudget {
        let keys = TenantKeys::new(tenant);
        CreateBudget {
            tenant: keys.tenant(),
            budget: keys.budget(scope, unit),
            scope_units: keys.scope_units(),
            events: keys.events(),
            audit_log: keys.audit_log(),
            due_index: keys.due_index(),
            ..Default::default()
        }
    }
}

impl UpdateBudget {
    /// The call changing one ledger, its other arguments to be set.
    pub fn on(tenant: &str, scope: &str, unit: Unit) -> UpdateBudget {
        let keys = TenantKeys::new(tenant);
        UpdateBudget {
            tenant: keys.tenant(),
            budget: keys.budget(scope, unit),
            events: keys.events(),
            audit_log: keys.audit_log(),
            due_index: keys.due_index(),
            scope: scope.to_string(),
            ..Default::default()
        }
    }
}

impl FundBudget {
    /// The call on one ledger, its other arguments to be set; with an `idempotency_key`, a
    /// retry answers the first result for 24 hours.
    pub fn on(tenant: &str, scope: &str, unit: Unit, idempotency_key: Option<&str>) -> FundBudget {
        let keys = TenantKeys::new(tenant);
        FundBudget {
            tenant: keys.tenant(),
            budget: keys.budget(scope, unit),
            record: match idempotency_key {
                Some(k) => keys.idempotency("fund", &[scope, unit.as_str(), k]),
                None => keys.tenant(),
            },
            events: keys.events(),
            audit_log: keys.audit_log(),
            scope: scope.to_string(),
            record_ttl_ms: crate::domain::rules::FUNDING_IDEMPOTENCY_MS.to_string(),
            ..Default::default()
        }
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
