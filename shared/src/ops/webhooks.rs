//! Webhook subscriptions and deliveries: the subscription record and its invariants, writing a
//! subscription, queueing deliveries, claiming them, recording attempts, and the system events
//! the dispatcher writes.

use std::time::Duration;

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::events::{category_of, SYSTEM_TENANT, TENANT_CATEGORIES};
use super::records::{field, int_field, json_field, read_records, time_field, Record, RecordAnswer};
use super::{lua_list, script, Nothing};
use crate::domain::now_ms;
use crate::error::{ApiError, ApiResult};
use crate::keys::{self, TenantKeys};
use crate::store::Store;

script! {
    /// Create, update (compare-and-set; status CHANGED when it lost) or delete a subscription
    /// (`lua/webhook_write.lua`).
    pub struct WriteSubscription = webhook_write -> RecordAnswer {
        keys: [tenant, subscription, subscription_index, events, audit_log],
        args: [context, mode, fields, expected_updated_at_ms, owner, subscription_id, max_subscriptions],
    }
}

script! {
    /// Creates PENDING deliveries, each at most once (`lua/delivery_enqueue.lua`): `delivery_keys`
    /// holds per delivery its record, its subscription's delivery index and queue.
    pub struct Enqueue = delivery_enqueue -> Enqueued {
        keys: [due_subscriptions; delivery_keys],
        args: [retention_ms; deliveries],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Enqueued {
    pub created: u64,
}

script! {
    /// Claims due deliveries of one owner with a lease (`lua/delivery_claim.lua`):
    /// `subscriptions` holds per subscription its queue and in-flight set.
    pub struct Claim = delivery_claim -> Claimed {
        keys: [due_subscriptions, legacy_queue, owner_in_flight; subscriptions],
        args: [lease_ms, max, per_subscription, per_owner; subscription_ids],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Claimed {
    /// (delivery id, subscription id; '' from the legacy queue)
    #[serde(deserialize_with = "lua_list")]
    pub claimed: Vec<(String, String)>,
}

script! {
    /// Records one attempt (or a pre-check failure) and its effect on the subscription
    /// (`lua/delivery_record.lua`); the status is the delivery's new one.
    pub struct RecordAttempt = delivery_record -> Nothing {
        keys: [delivery, legacy_queue, owner_in_flight, subscription, events, queue, in_flight, due_subscriptions],
        args: [mode, http_status, response_ms, error, max_retries, retry_delay_ms, disable_after, delivery_id,
            subscription_id],
    }
}

script! {
    /// Writes one event into the system stream (`lua/system_event.lua`).
    pub struct SystemEvent = system_event -> Nothing {
        keys: [events],
        args: [event_type, data, context],
    }
}

script! {
    /// System alerts one container observed, written once per marker period
    /// (`lua/system_alert.lua`): `alerts` alternates event types and their data.
    pub struct SystemAlert = system_alert -> Nothing {
        keys: [events, marker],
        args: [marker_ttl_ms, context; alerts],
    }
}

/// Writes system alerts (`alerts`: event types and their data, alternating) to the deployment's
/// own stream, once per `marker` period of `ttl_ms` across containers.
pub async fn system_alert(
    store: &Store,
    marker: &str,
    ttl_ms: i64,
    context: String,
    alerts: Vec<String>,
) -> ApiResult<()> {
    let keys = TenantKeys::new(SYSTEM_TENANT);
    let call = SystemAlert {
        events: keys.events(),
        marker: keys.system_alert_marker(marker),
        marker_ttl_ms: ttl_ms.to_string(),
        context,
        alerts,
    };
    store.run(call).await.map(|_| ())
}

/// A tenant's subscriptions (or the system-wide ones), decoded.
pub async fn subscriptions(store: &Store, owner: &str) -> ApiResult<Vec<Subscription>> {
    let keys = TenantKeys::new(owner);
    let ids: Vec<String> = store.conn().smembers(keys.webhook_index()).await?;
    let record_keys: Vec<String> = ids.iter().map(|id| keys.webhook(id)).collect();
    Ok(read_records(store, &record_keys).await?.iter().filter_map(Subscription::from_record).collect())
}

/// Updates one subscription of `owner` (compare-and-set on `updated_at_ms`, see
/// `WriteSubscription`): its record after the write, or None when it lost to a concurrent one.
pub async fn update(
    store: &Store,
    context: String,
    owner: &str,
    id: &str,
    patch: Value,
    expected_updated_at_ms: &str,
) -> ApiResult<Option<Subscription>> {
    let reply = run_write(store, context, owner, id, Write::Update { patch, expected_updated_at_ms }).await?;
    if reply.status == "CHANGED" {
        return Ok(None);
    }
    let written = Subscription::from_record(&reply.value.0);
    written.map(Some).ok_or_else(|| ApiError::fault("a subscription write answered no record"))
}

/// Deletes one subscription of `owner`.
pub async fn delete(store: &Store, context: String, owner: &str, id: &str) -> ApiResult<()> {
    run_write(store, context, owner, id, Write::Delete).await.map(|_| ())
}

/// Creates one subscription of `owner`, unless it has `max_subscriptions` already (409
/// LIMIT_EXCEEDED).
pub async fn create(
    store: &Store,
    context: String,
    owner: &str,
    id: &str,
    fields: Value,
    max_subscriptions: usize,
) -> ApiResult<Subscription> {
    let reply = run_write(store, context, owner, id, Write::Create { fields, max_subscriptions }).await?;
    Subscription::from_record(&reply.value.0).ok_or_else(|| ApiError::fault("a subscription write answered no record"))
}

/// One write of a subscription, with what its mode needs.
enum Write<'a> {
    Create { fields: Value, max_subscriptions: usize },
    Update { patch: Value, expected_updated_at_ms: &'a str },
    Delete,
}

async fn run_write(
    store: &Store,
    context: String,
    owner: &str,
    id: &str,
    write: Write<'_>,
) -> ApiResult<crate::store::Reply<RecordAnswer>> {
    let (mode, fields, expected, max) = match write {
        Write::Create { fields, max_subscriptions } => ("create", fields, "", max_subscriptions),
        Write::Update { patch, expected_updated_at_ms } => ("update", patch, expected_updated_at_ms, 0),
        Write::Delete => ("delete", json!({}), "", 0),
    };
    let keys = TenantKeys::new(owner);
    let call = WriteSubscription {
        tenant: keys.tenant(),
        subscription: keys.webhook(id),
        subscription_index: keys.webhook_index(),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context,
        mode: mode.to_string(),
        fields: fields.to_string(),
        expected_updated_at_ms: expected.to_string(),
        owner: owner.to_string(),
        subscription_id: id.to_string(),
        max_subscriptions: max.to_string(),
    };
    store.run(call).await
}

/// The owner of a subscription id (a tenant, or the system), `None` when unknown.
pub async fn owner(store: &Store, id: &str) -> ApiResult<Option<String>> {
    Ok(store.conn().get(keys::webhook_lookup(id)).await?)
}

/// Publishes a subscription id's owner (before its record is written: an id whose record
/// never got written reads as not found).
pub async fn publish_owner(store: &Store, id: &str, owner: &str) -> ApiResult<()> {
    let key = keys::webhook_lookup(id);
    store.write(redis::cmd("SET").arg(&key).arg(owner).to_owned(), &key).await
}

/// One subscription of an owner, `None` when absent.
pub async fn read(store: &Store, owner: &str, id: &str) -> ApiResult<Option<Subscription>> {
    let record: Record = store.conn().hgetall(TenantKeys::new(owner).webhook(id)).await?;
    Ok(Subscription::from_record(&record))
}

/// The newest `limit` delivery ids of a subscription.
pub async fn delivery_ids(store: &Store, owner: &str, id: &str, limit: isize) -> ApiResult<Vec<String>> {
    Ok(store.conn().zrevrange(TenantKeys::new(owner).subscription_deliveries(id), 0, limit - 1).await?)
}

/// Takes the replay lock of a subscription for an hour under `token`; false when another
/// replay holds it.
pub async fn lock_replay(store: &Store, owner: &str, id: &str, token: &str) -> ApiResult<bool> {
    let lock = TenantKeys::new(owner).webhook_replay_lock(id);
    let set: Option<String> =
        redis::cmd("SET").arg(&lock).arg(token).arg("NX").arg("EX").arg(3600).query_async(&mut store.conn()).await?;
    Ok(set.is_some())
}

/// Releases the replay lock if `token` still holds it.
pub async fn unlock_replay(store: &Store, owner: &str, id: &str, token: &str) -> ApiResult<()> {
    let lock = TenantKeys::new(owner).webhook_replay_lock(id);
    let held: Option<String> = store.conn().get(&lock).await?;
    if held.as_deref() == Some(token) {
        let _: () = store.conn().del(&lock).await?;
    }
    Ok(())
}

/// Creates PENDING deliveries of `event` for `subs` (all of one owner). Live dispatch passes
/// deterministic ids so a repeated fan-out creates nothing twice; replay passes fresh ones.
pub async fn enqueue(
    store: &Store,
    owner: &str,
    event: &Value,
    flags: Option<&str>,
    subs: &[(&Subscription, String)],
) -> ApiResult<u64> {
    if subs.is_empty() {
        return Ok(0);
    }
    let keys = TenantKeys::new(owner);
    let mut call = Enqueue {
        due_subscriptions: keys.due_subscriptions(),
        retention_ms: DELIVERY_RETENTION.as_millis().to_string(),
        ..Default::default()
    };
    let body = event.to_string();
    // Due at the event's stream position (ms plus seq/1000): already due, and in event order.
    let due = event["event_id"]
        .as_str()
        .and_then(super::events::parse_event_id)
        .and_then(|(_, entry)| {
            let (ms, seq) = entry.split_once('-')?;
            Some(format!("{}.{:03}", ms.parse::<i64>().ok()?, seq.parse::<u64>().ok()?.min(999)))
        })
        .unwrap_or_else(|| now_ms().to_string());
    for (sub, delivery_id) in subs {
        call.delivery_keys.extend([
            keys.delivery(delivery_id),
            keys.subscription_deliveries(&sub.id),
            keys.subscription_queue(&sub.id),
        ]);
        let mut f = json!({
            "delivery_id": delivery_id,
            "subscription_id": sub.id,
            "event_id": event["event_id"],
            "event_type": event["event_type"],
            "event": body,
            "due": due,
        });
        if let Some(t) = event["trace_id"].as_str() {
            f["trace_id"] = json!(t);
        }
        f["traceparent_inbound_valid"] = json!(if flags.is_some() { "true" } else { "false" });
        if let Some(fl) = flags {
            f["trace_flags"] = json!(fl);
        }
        call.deliveries.push(f.to_string());
    }
    Ok(store.run(call).await?.value.created)
}

/// Reads one owner's delivery rows.
pub async fn read_deliveries(store: &Store, owner: &str, ids: &[String]) -> ApiResult<Vec<Record>> {
    let keys = TenantKeys::new(owner);
    read_records(store, &ids.iter().map(|id| keys.delivery(id)).collect::<Vec<_>>()).await
}

/// How long delivery rows are kept.
pub const DELIVERY_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);
/// A delivery older than this at pickup fails instead of arriving days late.
pub const MAX_DELIVERY_AGE_MS: i64 = 86_400_000;

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    #[serde(default = "RetryPolicy::default_max_retries")]
    pub max_retries: i64,
    #[serde(default = "RetryPolicy::default_initial_delay")]
    pub initial_delay_ms: i64,
    #[serde(default = "RetryPolicy::default_multiplier")]
    pub backoff_multiplier: f64,
    #[serde(default = "RetryPolicy::default_max_delay")]
    pub max_delay_ms: i64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { max_retries: 5, initial_delay_ms: 1000, backoff_multiplier: 2.0, max_delay_ms: 60_000 }
    }
}

impl RetryPolicy {
    fn default_max_retries() -> i64 {
        5
    }
    fn default_initial_delay() -> i64 {
        1000
    }
    fn default_multiplier() -> f64 {
        2.0
    }
    fn default_max_delay() -> i64 {
        60_000
    }

    pub fn validate(&self) -> ApiResult<()> {
        let bad = |m: &str| Err(ApiError::invalid(format!("retry_policy.{m}")));
        if !(0..=10).contains(&self.max_retries) {
            return bad("max_retries must be from 0 to 10");
        }
        if !(100..=60_000).contains(&self.initial_delay_ms) {
            return bad("initial_delay_ms must be from 100 to 60000");
        }
        if !(1.0..=10.0).contains(&self.backoff_multiplier) {
            return bad("backoff_multiplier must be from 1.0 to 10.0");
        }
        if !(1000..=3_600_000).contains(&self.max_delay_ms) {
            return bad("max_delay_ms must be from 1000 to 3600000");
        }
        Ok(())
    }

    /// The wait before the retry that follows attempt number `attempts` (1-based).
    pub fn delay_ms(&self, attempts: i64) -> i64 {
        let d = self.initial_delay_ms as f64 * self.backoff_multiplier.powi((attempts - 1).max(0) as i32);
        (d.min(self.max_delay_ms as f64)) as i64
    }
}

/// Invariant 1 (a selector exists) and invariant 2 (a tenant-owned subscription selects only
/// tenant-accessible events), checked on the resulting state of every write.
pub fn check_invariants(owner: &str, event_types: &[String], categories: &[String]) -> ApiResult<()> {
    if event_types.is_empty() && categories.is_empty() {
        return Err(ApiError::invalid("a subscription needs a non-empty event_types or event_categories"));
    }
    if owner != SYSTEM_TENANT {
        let bad = event_types
            .iter()
            .find(|t| !TENANT_CATEGORIES.contains(&category_of(t)))
            .or_else(|| categories.iter().find(|c| !TENANT_CATEGORIES.contains(&c.as_str())));
        if let Some(bad) = bad {
            return Err(ApiError::invalid(format!(
                "{bad} is not accessible to a tenant-owned subscription (budget, reservation and tenant events only)"
            )));
        }
    }
    Ok(())
}

/// A webhook subscription as stored (the hash `cy:{<owner>}:w:<id>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Subscription {
    pub id: String,
    pub owner: String,
    pub url: String,
    pub status: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub event_types: Vec<String>,
    pub event_categories: Vec<String>,
    pub scope_filter: Option<String>,
    /// The scope filter of the tenant key that wrote the subscription, if it had one: only
    /// events of admitted scopes are delivered.
    pub key_scope_filter: Vec<String>,
    pub thresholds: Option<Value>,
    pub metadata: Option<Value>,
    /// Custom headers, each value sealed (AES-256-GCM); only their names are ever shown.
    pub sealed_headers: serde_json::Map<String, Value>,
    /// The signing secret, sealed.
    pub sealed_secret: Option<String>,
    pub retry: RetryPolicy,
    pub disable_after: i64,
    pub consecutive_failures: i64,
    pub created_at_ms: i64,
    pub updated_at_ms: Option<i64>,
    pub last_triggered_at_ms: Option<i64>,
    pub last_success_at_ms: Option<i64>,
    pub last_failure_at_ms: Option<i64>,
}

impl Subscription {
    /// The subscription of a stored hash; `None` when the hash is empty.
    pub fn from_record(record: &Record) -> Option<Subscription> {
        if record.is_empty() {
            return None;
        }
        let list = |name: &str| -> Vec<String> {
            json_field(record, name).and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default()
        };
        let text = |name: &str| field(record, name).map(String::from);
        Some(Subscription {
            id: field(record, "subscription_id").unwrap_or_default().to_string(),
            owner: field(record, "tenant_id").unwrap_or(SYSTEM_TENANT).to_string(),
            url: field(record, "url").unwrap_or_default().to_string(),
            status: field(record, "status").unwrap_or("ACTIVE").to_string(),
            name: text("name"),
            description: text("description"),
            event_types: list("event_types"),
            event_categories: list("event_categories"),
            scope_filter: text("scope_filter"),
            key_scope_filter: list("key_scope_filter"),
            thresholds: json_field(record, "thresholds"),
            metadata: json_field(record, "metadata"),
            sealed_headers: match json_field(record, "headers") {
                Some(Value::Object(h)) => h,
                _ => Default::default(),
            },
            sealed_secret: text("secret"),
            retry: json_field(record, "retry_policy").and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default(),
            disable_after: int_field(record, "disable_after_failures").unwrap_or(10),
            consecutive_failures: int_field(record, "consecutive_failures").unwrap_or(0),
            created_at_ms: int_field(record, "created_at_ms").unwrap_or(0),
            updated_at_ms: int_field(record, "updated_at_ms"),
            last_triggered_at_ms: int_field(record, "last_triggered_at_ms"),
            last_success_at_ms: int_field(record, "last_success_at_ms"),
            last_failure_at_ms: int_field(record, "last_failure_at_ms"),
        })
    }

    /// The subscription's own selector, scope filter and ownership boundary (not its status).
    pub fn selects(&self, event: &Value) -> bool {
        let event_type = event["event_type"].as_str().unwrap_or_default();
        let category = event["category"].as_str().unwrap_or_default();
        let selected =
            self.event_types.iter().any(|t| t == event_type) || self.event_categories.iter().any(|c| c == category);
        let scope = event["scope"].as_str();
        let scoped = match self.scope_filter.as_deref().map(str::trim).filter(|f| !f.is_empty()) {
            None => true,
            Some("*") => scope.is_some(),
            Some(f) => match (f.strip_suffix('*'), scope) {
                (Some(prefix), Some(s)) => s.starts_with(prefix) && s.len() > prefix.len(),
                (None, Some(s)) => s == f,
                (_, None) => false,
            },
        };
        let admitted = self.key_scope_filter.is_empty()
            || scope.is_some_and(|s| crate::domain::scope_admitted(&self.key_scope_filter, s));
        selected && scoped && admitted && self.may_receive(event) && self.alerted_at(event)
    }

    /// An alert reaches a subscription only at its own `thresholds` (the spec's defaults where
    /// it sets none): a threshold crossing at one of its utilization thresholds, a burn-rate
    /// anomaly at or above its multiplier, a rate spike above its threshold for that rate. The
    /// scripts emit at the union of a tenant's subscriptions' settings (`alert_settings` in
    /// `lua/lib/alerts.lua`), so each subscription sees exactly its own alerts.
    pub fn alerted_at(&self, event: &Value) -> bool {
        use crate::domain::rules::alerts;
        let own = |name: &str| self.thresholds.as_ref().and_then(|t| t.get(name)).and_then(Value::as_f64);
        let data = &event["data"];
        let number = |name: &str| data[name].as_f64().unwrap_or(0.0);
        match event["event_type"].as_str().unwrap_or_default() {
            "budget.threshold_crossed" => {
                let listed: Option<Vec<f64>> = self
                    .thresholds
                    .as_ref()
                    .and_then(|t| t.get("budget_utilization"))
                    .and_then(Value::as_array)
                    .map(|a| a.iter().filter_map(Value::as_f64).collect());
                let at = number("threshold");
                listed.unwrap_or_else(|| alerts::UTILIZATION.to_vec()).iter().any(|t| (t - at).abs() < 1e-9)
            }
            "budget.burn_rate_anomaly" => {
                number("multiplier") >= own("burn_rate_multiplier").unwrap_or(alerts::BURN_MULTIPLIER) - 1e-9
            }
            spike @ ("reservation.denial_rate_spike"
            | "reservation.expiry_rate_spike"
            | "api_key.auth_failure_rate_spike") => {
                let (name, default) = match spike {
                    "reservation.denial_rate_spike" => ("denial_rate_threshold", alerts::DENIAL_RATE),
                    "reservation.expiry_rate_spike" => ("expiry_rate_threshold", alerts::EXPIRY_RATE),
                    _ => ("auth_failure_rate_threshold", alerts::AUTH_FAILURE_RATE),
                };
                number("current_rate") > own(name).unwrap_or(default)
            }
            _ => true,
        }
    }

    /// Invariant 2 at dispatch and replay: a tenant-owned subscription never receives an
    /// admin-only event.
    pub fn may_receive(&self, event: &Value) -> bool {
        let category = event["category"].as_str().unwrap_or_default();
        let type_category = category_of(event["event_type"].as_str().unwrap_or_default());
        self.owner == SYSTEM_TENANT
            || (TENANT_CATEGORIES.contains(&category) && TENANT_CATEGORIES.contains(&type_category))
    }
}

/// `del_` + 16 hex of sha256(event_id|subscription_id).
pub fn live_delivery_id(event_id: &str, subscription_id: &str) -> String {
    let h = Sha256::digest(format!("{event_id}|{subscription_id}"));
    format!("del_{}", &hex::encode(h)[..16])
}

/// The wire `WebhookDelivery` of a stored row.
pub fn delivery_json(r: &Record) -> Value {
    let mut d = json!({
        "delivery_id": field(r, "delivery_id").unwrap_or_default(),
        "subscription_id": field(r, "subscription_id").unwrap_or_default(),
        "event_id": field(r, "event_id").unwrap_or_default(),
        "status": field(r, "status").unwrap_or("PENDING"),
        "attempted_at": time_field(r, "attempted_at").unwrap_or_else(|| crate::domain::format_rfc3339_ms(0)),
        "attempts": int_field(r, "attempts").unwrap_or(0),
    });
    if let Some(v) = field(r, "traceparent_inbound_valid") {
        d["traceparent_inbound_valid"] = json!(v == "true");
    }
    for name in ["event_type", "error_message", "trace_id", "trace_flags"] {
        if let Some(v) = field(r, name) {
            d[name] = json!(v);
        }
    }
    for name in ["response_status", "response_time_ms"] {
        if let Some(v) = int_field(r, name) {
            d[name] = json!(v);
        }
    }
    for name in ["completed_at", "next_retry_at"] {
        if let Some(v) = time_field(r, name) {
            d[name] = json!(v);
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alerts_reach_a_subscription_at_its_own_thresholds() {
        let record = |thresholds: &str| -> Subscription {
            let mut r = Record::new();
            r.insert("subscription_id".into(), "s".into());
            if !thresholds.is_empty() {
                r.insert("thresholds".into(), thresholds.into());
            }
            Subscription::from_record(&r).unwrap()
        };
        let event = |t: &str, data: serde_json::Value| serde_json::json!({"event_type": t, "data": data});
        let (defaults, own) = (
            record(""),
            record(r#"{"budget_utilization":[0.5],"burn_rate_multiplier":5,"denial_rate_threshold":0.5}"#),
        );
        let crossed = |at: f64| event("budget.threshold_crossed", serde_json::json!({"threshold": at}));
        assert!(defaults.alerted_at(&crossed(0.95)) && !defaults.alerted_at(&crossed(0.5)));
        assert!(own.alerted_at(&crossed(0.5)) && !own.alerted_at(&crossed(0.8)));
        let burn = |m: f64| event("budget.burn_rate_anomaly", serde_json::json!({"multiplier": m}));
        assert!(defaults.alerted_at(&burn(3.0)) && !own.alerted_at(&burn(4.0)) && own.alerted_at(&burn(5.0)));
        let denials = |r: f64| event("reservation.denial_rate_spike", serde_json::json!({"current_rate": r}));
        assert!(defaults.alerted_at(&denials(0.2)) && !own.alerted_at(&denials(0.2)) && own.alerted_at(&denials(0.6)));
        assert!(own.alerted_at(&event("budget.funded", serde_json::json!({}))), "other events are not alerts");
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let p = RetryPolicy::default();
        assert_eq!([1, 2, 3, 4, 5, 20].map(|a| p.delay_ms(a)), [1000, 2000, 4000, 8000, 16000, 60000]);
    }

    #[test]
    fn invariants() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert!(check_invariants("acme", &[], &[]).is_err());
        assert!(check_invariants("acme", &s(&["budget.funded"]), &[]).is_ok());
        assert!(check_invariants("acme", &s(&["api_key.created"]), &[]).is_err());
        assert!(check_invariants("acme", &[], &s(&["webhook"])).is_err());
        assert!(check_invariants(SYSTEM_TENANT, &s(&["api_key.created"]), &[]).is_ok());
    }
}
