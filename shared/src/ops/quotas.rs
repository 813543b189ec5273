//! v0.1.26 action-quota counters: written by the reserve script (`count_actions` in
//! `lua/lib/quotas.lua`), read and reset here for operators.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{lua_list, script};
use crate::domain::{format_rfc3339_ms, parse_rfc3339_ms};
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;

script! {
    /// listActionQuotaCounters (`lua/quota_list.lua`): a bounded walk of the counter index.
    pub struct ListCounters = quota_list -> CounterPage {
        keys: [index, due, counters],
        args: [after, scope, kind, window, run, include_zero, limit, examine],
    }
}

script! {
    /// resetActionQuotaCounter (`lua/quota_reset.lua`), with its event and audit row.
    pub struct ResetCounter = quota_reset -> CounterRow {
        keys: [counters, events, audit_log],
        args: [context, member, actor, reason],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct CounterPage {
    #[serde(deserialize_with = "lua_list")]
    pub rows: Vec<CounterRow>,
    /// The last index member the walk examined ('' when the index has no more).
    pub last: String,
}

/// One counter as the scripts give it.
#[derive(Debug, Clone, Deserialize)]
pub struct CounterRow {
    pub scope: String,
    /// The kind, or `__risk__:<class>`.
    pub label: String,
    pub window: String,
    pub bucket: String,
    pub used: String,
    #[serde(default)]
    pub limit: Option<String>,
    #[serde(default)]
    pub policy: Option<String>,
    #[serde(default)]
    pub last: Option<String>,
    /// Reset only: the value before.
    #[serde(default)]
    pub previous: Option<String>,
}

/// Which counters a walk of the index answers: after the member `after`, matching the filters
/// that are not empty, up to `limit` rows, examining at most `examine` members.
#[derive(Debug, Clone, Default)]
pub struct CounterFilter {
    pub after: String,
    pub scope: String,
    pub kind: String,
    pub window: String,
    pub run: String,
    pub include_zero: bool,
    pub limit: usize,
    pub examine: usize,
}

/// One page of a tenant's counters (`ListCounters`).
pub async fn page(store: &Store, tenant: &str, f: CounterFilter) -> ApiResult<CounterPage> {
    let keys = TenantKeys::new(tenant);
    let call = ListCounters {
        index: keys.quota_index(),
        due: keys.quota_due(),
        counters: keys.quota_counters(),
        after: f.after,
        scope: f.scope,
        kind: f.kind,
        window: f.window,
        run: f.run,
        include_zero: if f.include_zero { "1" } else { "0" }.to_string(),
        limit: f.limit.to_string(),
        examine: f.examine.to_string(),
    };
    Ok(store.run(call).await?.value)
}

/// Up to `examine` live non-zero counters of a tenant (the overview's quota health).
pub async fn live(store: &Store, tenant: &str, examine: usize) -> ApiResult<Vec<CounterRow>> {
    Ok(page(store, tenant, CounterFilter { limit: examine, examine, ..Default::default() }).await?.rows)
}

/// Sets counter `member` of `tenant` to 0, with its event and audit row: the counter as it was.
pub async fn reset(
    store: &Store,
    tenant: &str,
    member: String,
    context: String,
    reason: String,
) -> ApiResult<CounterRow> {
    let keys = TenantKeys::new(tenant);
    let call = ResetCounter {
        counters: keys.quota_counters(),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context,
        member,
        actor: "admin_api_key".into(),
        reason,
    };
    Ok(store.run(call).await?.value)
}

/// The index member of a counter (`lua/lib/quotas.lua` builds the same).
pub fn member(scope: &str, label: &str, window: &str, bucket: &str) -> String {
    format!("{scope}|{label}|{window}|{bucket}")
}

/// When a calendar bucket's window ends (None for per_run).
fn window_end_ms(window: &str, bucket: &str) -> Option<i64> {
    let (start, length) = match window {
        "per_minute_tumbling" => (format!("{bucket}:00Z"), 60_000),
        "per_hour_tumbling" => (format!("{bucket}:00:00Z"), 3_600_000),
        "per_day_tumbling" | "per_tenant_per_day" => (format!("{bucket}T00:00:00Z"), 86_400_000),
        _ => return None,
    };
    parse_rfc3339_ms(&start).map(|ms| ms + length)
}

impl CounterRow {
    /// The spec's `ActionQuotaState`.
    pub fn state(&self) -> Value {
        let int = |s: Option<&String>| s.and_then(|v| v.parse::<i64>().ok());
        let used = int(Some(&self.used)).unwrap_or(0).max(0);
        let limit = int(self.limit.as_ref()).unwrap_or(1).max(1);
        let risk = self.label.strip_prefix("__risk__:");
        let mut v = json!({
            "action_kind": if risk.is_some() { "__risk__" } else { self.label.as_str() },
            "scope": self.scope, "scope_path": self.scope, "window": self.window, "window_key": self.bucket,
            "used": used, "limit": limit, "remaining": (limit - used).max(0),
        });
        if let Some(r) = risk {
            v["risk_class"] = json!(r);
        }
        if let Some(p) = &self.policy {
            v["policy_id"] = json!(p);
        }
        if let Some(end) = window_end_ms(&self.window, &self.bucket) {
            v["expires_at"] = json!(format_rfc3339_ms(end));
        }
        if let Some(last) = int(self.last.as_ref()) {
            v["last_incremented_at"] = json!(format_rfc3339_ms(last));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calendar_windows_end_at_their_bucket_boundary() {
        let end = |w, b| window_end_ms(w, b).map(format_rfc3339_ms);
        assert_eq!(end("per_minute_tumbling", "2026-04-09T14:32").unwrap(), "2026-04-09T14:33:00.000Z");
        assert_eq!(end("per_hour_tumbling", "2026-04-09T23").unwrap(), "2026-04-10T00:00:00.000Z");
        assert_eq!(end("per_tenant_per_day", "2026-12-31").unwrap(), "2027-01-01T00:00:00.000Z");
        assert_eq!(end("per_run", "run-1"), None);
    }
}
