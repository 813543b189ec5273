//! The event catalogue and the per-tenant event streams: events are written by the scripts
//! whose changes cause them (`emit` in `lua/lib/events.lua`) and read here. An event id names its
//! tenant and stream entry (`evt_<ms>-<seq>.<tenant>`).

use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use serde_json::Value;

use crate::error::ApiResult;
use crate::keys::{self, TenantKeys};
use crate::store::Store;

/// The owner of system events (and of system-wide webhook subscriptions).
pub const SYSTEM_TENANT: &str = "__system__";

/// Every `EventType` of the spec, and `policy.limit_reached` (an extension: a runaway-agent
/// guard first refused a reserve in its window, `lua/lib/guards.lua`).
pub const EVENT_TYPES: [&str; 56] = [
    "budget.created",
    "budget.updated",
    "budget.funded",
    "budget.debited",
    "budget.reset",
    "budget.reset_spent",
    "budget.debt_repaid",
    "budget.frozen",
    "budget.unfrozen",
    "budget.closed",
    "budget.closed_via_tenant_cascade",
    "budget.threshold_crossed",
    "budget.exhausted",
    "budget.over_limit_entered",
    "budget.over_limit_exited",
    "budget.debt_incurred",
    "budget.burn_rate_anomaly",
    "reservation.denied",
    "reservation.denial_rate_spike",
    "reservation.expired",
    "reservation.expiry_rate_spike",
    "reservation.commit_overage",
    "reservation.released_via_tenant_cascade",
    "reservation.observed_denied",
    "reservation.observed_allowed",
    "quota.threshold_approaching",
    "quota.counter_reset",
    "tenant.created",
    "tenant.updated",
    "tenant.suspended",
    "tenant.reactivated",
    "tenant.closed",
    "tenant.settings_changed",
    "webhook.created",
    "webhook.updated",
    "webhook.paused",
    "webhook.resumed",
    "webhook.disabled",
    "webhook.deleted",
    "webhook.disabled_via_tenant_cascade",
    "api_key.created",
    "api_key.revoked",
    "api_key.revoked_via_tenant_cascade",
    "api_key.expired",
    "api_key.permissions_changed",
    "api_key.auth_failed",
    "api_key.auth_failure_rate_spike",
    "policy.created",
    "policy.updated",
    "policy.deleted",
    "policy.limit_reached",
    "system.store_connection_lost",
    "system.store_connection_restored",
    "system.high_latency",
    "system.webhook_delivery_failed",
    "system.webhook_test",
];

pub const CATEGORIES: [&str; 7] = ["budget", "tenant", "api_key", "policy", "reservation", "system", "webhook"];

/// Categories a tenant may see and subscribe to (invariant 2).
pub const TENANT_CATEGORIES: [&str; 3] = ["budget", "reservation", "tenant"];

/// An event type's `EventCategory`: its prefix, except that the v0.1.26 quota.* events (the
/// category enum has no `quota`) and policy.limit_reached belong to the reservation path that
/// causes them (so a tenant may subscribe to them).
pub fn category_of(event_type: &str) -> &str {
    match event_type.split('.').next().unwrap_or_default() {
        "quota" => "reservation",
        _ if event_type == "policy.limit_reached" => "reservation",
        c => c,
    }
}

/// At most this many stream entries are read per tenant for one query.
const SCAN_LIMIT: usize = 20_000;

/// `evt_<ms>-<seq>.<tenant>` -> (tenant, stream entry id).
pub fn parse_event_id(id: &str) -> Option<(&str, &str)> {
    let (entry, tenant) = id.strip_prefix("evt_")?.split_once('.')?;
    let (ms, seq) = entry.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(ms) && digits(seq) && !tenant.is_empty()).then_some((tenant, entry))
}

fn decode(reply: StreamRangeReply) -> Vec<(String, Value)> {
    reply
        .ids
        .into_iter()
        .filter_map(|e| {
            let json: String = e.get("event")?;
            Some((e.id, serde_json::from_str(&json).ok()?))
        })
        .collect()
}

/// One event by id (None when unknown or past retention).
pub async fn load_event(store: &Store, event_id: &str) -> ApiResult<Option<Value>> {
    let Some((tenant, entry)) = parse_event_id(event_id) else { return Ok(None) };
    let reply: StreamRangeReply = store.conn().xrange(TenantKeys::new(tenant).events(), entry, entry).await?;
    Ok(decode(reply).into_iter().map(|(_, v)| v).find(|v| v["event_id"] == event_id))
}

/// A tenant's events, newest first, that pass `keep`, reading at most `SCAN_LIMIT` entries.
pub async fn tenant_events(
    store: &Store,
    tenant: &str,
    keep: &(dyn Fn(&Value) -> bool + Sync),
) -> ApiResult<Vec<Value>> {
    let key = TenantKeys::new(tenant).events();
    let mut out = vec![];
    let mut end = "+".to_string();
    let mut read = 0;
    while read < SCAN_LIMIT {
        let reply: StreamRangeReply = store.conn().xrevrange_count(&key, &end, "-", 500).await?;
        let batch = decode(reply);
        let Some((last, _)) = batch.last() else { break };
        end = format!("({last}");
        read += batch.len();
        let full = batch.len() == 500;
        out.extend(batch.into_iter().map(|(_, v)| v).filter(|v| keep(v)));
        if !full {
            break;
        }
    }
    Ok(out)
}

/// Every owner of events: each registered tenant, and the system.
pub async fn owners(store: &Store) -> ApiResult<Vec<String>> {
    let mut all: Vec<String> = store.conn().smembers(keys::TENANT_REGISTRY).await?;
    all.push(SYSTEM_TENANT.to_string());
    Ok(all)
}
