//! Policies: stored per tenant (`TenantKeys::policies`), each with a runtime projection
//! (`TenantKeys::policy_rules`) that the reserve, evaluate, commit and event scripts read in
//! their one round trip. Writes go through one script with the event and audit row.

use std::collections::HashMap;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::script;
use crate::domain::format_rfc3339_ms;
use crate::error::{ApiError, ApiResult};
use crate::keys::{self, TenantKeys};
use crate::model::{Amount, Unit};
use crate::store::Store;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtlOverride {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_ttl_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ttl_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_extensions: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_reservations_per_minute: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_commits_per_minute: Option<i64>,
    /// At most this many ACTIVE reservations per matched scope at once (an extension).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_active_reservations: Option<i64>,
    /// At most this much spent per calendar minute / hour per matched scope, in its unit (an
    /// extension): reserves count their estimate, commits correct it to the actual, releases
    /// and expiries give it back, events add what they charge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_amount_per_minute: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_amount_per_hour: Option<Amount>,
}

/// The ledgers a policy gives matching scopes that have none in its unit (an extension): made
/// inside the request's script at the scope's first reserve, decide or event (`lua/lib/guards.lua`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetTemplate {
    pub unit: Unit,
    pub allocated: Amount,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overdraft_limit: Option<Amount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_overage_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_recurrence: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollover_policy: Option<String>,
    /// At most this many ledgers made by this policy at once (`DEFAULT_MAX_INSTANCES` unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<i64>,
}

/// How many ledgers one policy's template may make when it says nothing.
pub const DEFAULT_MAX_INSTANCES: i64 = 10_000;

impl BudgetTemplate {
    /// What the scripts read: the unit, the bound, and the ledger's fields (strings, as
    /// createBudget stores them; `period_every` when it recurs).
    fn runtime(&self) -> Value {
        let mut f = json!({
            "allocated": self.allocated.amount.to_string(),
            "overdraft_limit": self.overdraft_limit.as_ref().map_or(0, |o| o.amount).to_string(),
            "rollover_policy": self.rollover_policy.as_deref().unwrap_or("NONE"),
        });
        if let Some(p) = &self.commit_overage_policy {
            f["commit_overage_policy"] = json!(p);
        }
        if let Some(text) = self.period_recurrence.as_deref().filter(|t| *t != "NONE") {
            if let Ok(every) = crate::domain::periods::Recurrence::parse(text) {
                f["period_recurrence"] = json!(text);
                f["period_every"] = json!(every.code());
            }
        }
        json!({"u": self.unit.as_str(), "n": self.max_instances.unwrap_or(DEFAULT_MAX_INSTANCES), "f": f})
    }
}

/// Soft-landing constraints (the protocol's `Caps`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Caps {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_steps_remaining: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_allowlist: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_denylist: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_ms: Option<u64>,
}

/// The quota windows of v0.1.26 (`ActionQuotaWindow`).
pub const QUOTA_WINDOWS: [&str; 5] =
    ["per_run", "per_minute_tumbling", "per_hour_tumbling", "per_day_tumbling", "per_tenant_per_day"];

/// The per_run counter TTL when a quota gives none (24 h).
pub const DEFAULT_RUN_TTL_MS: i64 = 86_400_000;
/// The share of max_calls at which quota.threshold_approaching is written by default.
pub const DEFAULT_THRESHOLD_PCT: f64 = 0.80;

/// A per-kind action quota (v0.1.26 `ActionQuota`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionQuota {
    pub action_kind: String,
    pub max_calls: i64,
    pub window: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_allowlist: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_domain_allowlist: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_type_allowlist: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_run_counter_ttl_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_pct: Option<f64>,
}

/// A risk-class quota (v0.1.26 `RiskClassQuota`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RiskClassQuota {
    pub risk_class: String,
    pub max_calls: i64,
    pub window: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_run_counter_ttl_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold_pct: Option<f64>,
}

/// A quota as the scripts read it: `k` the kind (or `__risk__:<class>`), `n` max_calls, `w`
/// the window, `ttl` the per_run TTL, `th` the threshold share, `h`/`d`/`r` the allowlists.
fn quota_rule(
    label: String,
    max: i64,
    window: &str,
    ttl: Option<i64>,
    th: Option<f64>,
    lists: [&Option<Vec<String>>; 3],
) -> Value {
    let mut v = json!({"k": label, "n": max, "w": window, "th": th.unwrap_or(DEFAULT_THRESHOLD_PCT)});
    if window == "per_run" {
        v["ttl"] = json!(ttl.unwrap_or(DEFAULT_RUN_TTL_MS));
    }
    for (name, list) in ["h", "d", "r"].into_iter().zip(lists) {
        if let Some(l) = list.as_ref().filter(|l| !l.is_empty()) {
            v[name] = json!(l);
        }
    }
    v
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// A policy as stored. The write script adds `updated_at_ms` (and `created_at_ms` to a new
/// one) from Redis's clock, so both are left out when zero.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    pub policy_id: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    pub scope_pattern: String,
    #[serde(default)]
    pub priority: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub caps: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit_overage_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation_ttl_override: Option<TtlOverride>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limits: Option<RateLimits>,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_from_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_until_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub action_quotas: Vec<ActionQuota>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub risk_class_quotas: Vec<RiskClassQuota>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_action_kinds: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub denied_action_kinds: Vec<String>,
    /// Where quotas and rate limits count (an extension): `anchor` (every matching scope path
    /// together, at the pattern's fixed prefix) or `scope_path` (each path apart); unset: the
    /// anchor for a pattern ending in `*`, else the scope path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counting: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_template: Option<BudgetTemplate>,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub created_at_ms: i64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub updated_at_ms: i64,
}

impl Policy {
    /// The wire `Policy`.
    pub fn wire(&self) -> Value {
        let mut v = json!({
            "policy_id": self.policy_id, "name": self.name, "scope_pattern": self.scope_pattern,
            "priority": self.priority, "status": self.status,
            // v0.1.26: always present, empty lists when unset
            "action_quotas": self.action_quotas, "risk_class_quotas": self.risk_class_quotas,
            "allowed_action_kinds": self.allowed_action_kinds, "denied_action_kinds": self.denied_action_kinds,
            "created_at": format_rfc3339_ms(self.created_at_ms),
            "updated_at": format_rfc3339_ms(self.updated_at_ms),
            "counting": if self.counts_at_anchor() { "anchor" } else { "scope_path" },
        });
        let optional = [
            ("description", self.description.as_ref().map(|d| json!(d))),
            ("caps", self.caps.clone()),
            ("commit_overage_policy", self.commit_overage_policy.as_ref().map(|p| json!(p))),
            ("reservation_ttl_override", self.reservation_ttl_override.as_ref().map(|t| json!(t))),
            ("rate_limits", self.rate_limits.as_ref().map(|r| json!(r))),
            ("budget_template", self.budget_template.as_ref().map(|t| json!(t))),
            ("effective_from", self.effective_from_ms.map(|ms| json!(format_rfc3339_ms(ms)))),
            ("effective_until", self.effective_until_ms.map(|ms| json!(format_rfc3339_ms(ms)))),
        ];
        for (name, value) in optional {
            if let Some(x) = value {
                v[name] = x;
            }
        }
        v
    }

    /// Whether quotas and rate limits count at the pattern's anchor (see `counting`).
    pub fn counts_at_anchor(&self) -> bool {
        match self.counting.as_deref() {
            Some(c) => c == "anchor",
            None => self.scope_pattern.ends_with('*'),
        }
    }

    /// Whether the policy's quotas or allow/deny lists name a kind (listPolicies'
    /// `references_action_kind`).
    pub fn references_kind(&self, kind: &str) -> bool {
        self.action_quotas.iter().any(|q| q.action_kind == kind)
            || self.allowed_action_kinds.iter().any(|k| k == kind)
            || self.denied_action_kinds.iter().any(|k| k == kind)
    }

    /// What the runtime scripts read (`policy_settings` in `lua/lib/policies.lua`): the matching inputs
    /// and each setting that changes runtime behaviour, flat; caps as their JSON text, so the
    /// answer carries them exactly as written.
    pub fn runtime_rule(&self) -> String {
        let ttl = self.reservation_ttl_override.clone().unwrap_or_default();
        let rate = self.rate_limits.clone().unwrap_or_default();
        let mut v = json!({"id": self.policy_id, "pat": self.scope_pattern.to_ascii_lowercase(),
            "pri": self.priority, "st": self.status});
        if self.counts_at_anchor() {
            // where its quotas and rate limits count: the anchor ('': the tenant's root)
            v["at"] = json!(crate::domain::policies::anchor(&self.scope_pattern).unwrap_or_default());
        }
        let fields = [
            ("from", self.effective_from_ms.map(|x| json!(x))),
            ("until", self.effective_until_ms.map(|x| json!(x))),
            ("caps", self.caps.as_ref().map(|c| json!(c.to_string()))),
            ("ov", self.commit_overage_policy.as_ref().map(|p| json!(p))),
            ("ttl_d", ttl.default_ttl_ms.map(|x| json!(x))),
            ("ttl_m", ttl.max_ttl_ms.map(|x| json!(x))),
            ("ttl_x", ttl.max_extensions.map(|x| json!(x))),
            ("rl_r", rate.max_reservations_per_minute.map(|x| json!(x))),
            ("rl_c", rate.max_commits_per_minute.map(|x| json!(x))),
            // the runaway-agent guards (`lua/lib/guards.lua`)
            ("ma", rate.max_active_reservations.map(|x| json!(x))),
            ("sm", rate.max_amount_per_minute.map(|a| json!({"u": a.unit.as_str(), "n": a.amount.to_string()}))),
            ("sh", rate.max_amount_per_hour.map(|a| json!({"u": a.unit.as_str(), "n": a.amount.to_string()}))),
            ("tpl", self.budget_template.as_ref().map(BudgetTemplate::runtime)),
        ];
        for (name, value) in fields {
            if let Some(x) = value {
                v[name] = x;
            }
        }
        // v0.1.26 action governance: allow/deny lists and quotas (`action_gate` in lua/lib/quotas.lua)
        for (name, list) in [("allow", &self.allowed_action_kinds), ("deny", &self.denied_action_kinds)] {
            if !list.is_empty() {
                v[name] = json!(list);
            }
        }
        let aq: Vec<Value> = self
            .action_quotas
            .iter()
            .map(|q| {
                let lists = [&q.host_allowlist, &q.recipient_domain_allowlist, &q.resource_type_allowlist];
                quota_rule(
                    q.action_kind.clone(),
                    q.max_calls,
                    &q.window,
                    q.per_run_counter_ttl_ms,
                    q.threshold_pct,
                    lists,
                )
            })
            .collect();
        let rq: Vec<Value> = self
            .risk_class_quotas
            .iter()
            .map(|q| {
                let label = format!("__risk__:{}", q.risk_class);
                quota_rule(
                    label,
                    q.max_calls,
                    &q.window,
                    q.per_run_counter_ttl_ms,
                    q.threshold_pct,
                    [&None, &None, &None],
                )
            })
            .collect();
        if !aq.is_empty() {
            v["aq"] = json!(aq);
        }
        if !rq.is_empty() {
            v["rq"] = json!(rq);
        }
        v.to_string()
    }
}

script! {
    /// createPolicy / updatePolicy (`lua/policy_write.lua`): `record` is the stored policy
    /// without its times, `rule` its runtime projection, `expected` the `updated_at_ms` the
    /// update read ('' for a create). Status CREATED, UPDATED, or CONFLICT (read again).
    pub struct WritePolicy = policy_write -> Policy {
        keys: [tenant, policies, rules, names, events, audit_log],
        args: [context, policy_id, name_key, record, rule, expected, changed],
    }
}

/// Creates (`expected` '') or updates (`expected`: the `updated_at_ms` the update read) policy
/// `p` of `tenant` with its event and audit row (`changed`: the fields an update changed): the
/// stored policy and the status (CREATED, UPDATED, or CONFLICT: read again).
pub async fn write(
    store: &Store,
    tenant: &str,
    context: String,
    p: &Policy,
    expected: &str,
    changed: &[&str],
) -> ApiResult<(Policy, String)> {
    let keys = TenantKeys::new(tenant);
    // the script stamps both times (a create's from now, an update's creation from the record)
    let record = Policy { created_at_ms: 0, updated_at_ms: 0, ..p.clone() };
    let call = WritePolicy {
        tenant: keys.tenant(),
        policies: keys.policies(),
        rules: keys.policy_rules(),
        names: keys.policy_names(),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context,
        policy_id: p.policy_id.clone(),
        name_key: p.name.trim().to_ascii_lowercase(), // as the script lowers the stored name
        record: serde_json::to_string(&record).expect("policies serialize"),
        rule: p.runtime_rule(),
        expected: expected.to_string(),
        changed: serde_json::json!(changed).to_string(),
    };
    let reply = store.run(call).await?;
    Ok((reply.value, reply.status))
}

/// The tenant owning a policy id, if the id exists.
pub async fn owner(store: &Store, id: &str) -> ApiResult<Option<String>> {
    Ok(store.conn().get(keys::policy_lookup(id)).await?)
}

/// Publishes a new policy id's owner (before its record is written: an id whose record never
/// got written reads as not found).
pub async fn publish_owner(store: &Store, id: &str, tenant: &str) -> ApiResult<()> {
    let key = keys::policy_lookup(id);
    store.write(redis::cmd("SET").arg(&key).arg(tenant).to_owned(), &key).await
}

fn decode(raw: &str) -> ApiResult<Policy> {
    serde_json::from_str(raw).map_err(|e| ApiError::fault(format!("a stored policy is malformed: {e}")))
}

/// One policy of a tenant.
pub async fn read(store: &Store, tenant: &str, id: &str) -> ApiResult<Option<Policy>> {
    let raw: Option<String> = store.conn().hget(TenantKeys::new(tenant).policies(), id).await?;
    raw.as_deref().map(decode).transpose()
}

/// Every policy of a tenant (at most `rules::MAX_POLICIES`).
pub async fn all(store: &Store, tenant: &str) -> ApiResult<Vec<Policy>> {
    let raw: HashMap<String, String> = store.conn().hgetall(TenantKeys::new(tenant).policies()).await?;
    raw.values().map(|r| decode(r)).collect()
}
