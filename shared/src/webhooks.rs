//! Webhooks: subscription records and their invariants, secrets at rest (AES-256-GCM), the
//! SSRF guard, signing, and the dispatcher (fan-out of each tenant's event stream into
//! per-owner delivery queues, then claim -> send -> record, at least once).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::api::admin::{field, int_field, json_field, read_records, Record};
use crate::api::events::{category_of, SYSTEM_TENANT, TENANT_CATEGORIES};
use crate::config::WebhookConfig;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::keys::{self, TenantKeys};
use crate::maintenance::now_ms;
use crate::store::{scripts, Store};

/// How long delivery rows are kept.
pub const DELIVERY_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);
/// A delivery older than this at pickup fails instead of arriving days late.
const MAX_DELIVERY_AGE_MS: i64 = 86_400_000;

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

/// INVARIANT 1 (a selector exists) and INVARIANT 2 (a tenant-owned subscription selects only
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

/// The write-time SSRF check of a subscription URL (`crate::egress`): 400 WEBHOOK_URL_INVALID
/// naming what is wrong.
pub async fn check_url(config: &WebhookConfig, url: &str) -> ApiResult<()> {
    config.egress.check_url(url).await.map_err(|r| ApiError::new(ErrorCode::WebhookUrlInvalid, r.to_string()))
}

/// What a delivery or a test records when no HTTP answer came back, whatever the reason
/// (blocked, unresolvable, refused, timed out, TLS): one message, no timing, so the service
/// cannot be used to tell the state of a port. The reason goes to the server log.
pub const UNREACHABLE: &str = "The endpoint could not be reached (no HTTP response)";

/// `enc:` + base64(nonce ‖ ciphertext ‖ tag).
pub fn encrypt(key: &[u8; 32], plain: &str) -> String {
    let cipher = Aes256Gcm::new(key.into());
    let mut nonce = [0u8; 12];
    rand::thread_rng().fill_bytes(&mut nonce);
    let sealed = cipher.encrypt(Nonce::from_slice(&nonce), plain.as_bytes()).expect("AES-GCM encryption");
    format!("enc:{}", STANDARD.encode([nonce.as_slice(), &sealed].concat()))
}

pub fn decrypt(key: &[u8; 32], stored: &str) -> Option<String> {
    let raw = STANDARD.decode(stored.strip_prefix("enc:")?).ok()?;
    if raw.len() < 12 {
        return None;
    }
    let cipher = Aes256Gcm::new(key.into());
    let plain = cipher.decrypt(Nonce::from_slice(&raw[..12]), &raw[12..]).ok()?;
    String::from_utf8(plain).ok()
}

/// `sha256=` + hex HMAC-SHA256 of the raw body, keyed with the secret string as is.
pub fn signature(secret: &str, body: &[u8]) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// A stored subscription, decoded.
#[derive(Debug, Clone)]
pub struct Subscription {
    pub record: Record,
    pub id: String,
    pub owner: String,
    pub url: String,
    pub status: String,
    pub event_types: Vec<String>,
    pub event_categories: Vec<String>,
    pub scope_filter: Option<String>,
    /// The scope filter of the tenant key that wrote the subscription, if it had one: only
    /// events of admitted scopes are delivered.
    pub key_scope_filter: Vec<String>,
    pub retry: RetryPolicy,
    pub disable_after: i64,
    pub created_at_ms: i64,
}

impl Subscription {
    pub fn from_record(record: Record) -> Subscription {
        let list = |name: &str| -> Vec<String> {
            json_field(&record, name).and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default()
        };
        Subscription {
            id: field(&record, "subscription_id").unwrap_or_default().to_string(),
            owner: field(&record, "tenant_id").unwrap_or(SYSTEM_TENANT).to_string(),
            url: field(&record, "url").unwrap_or_default().to_string(),
            status: field(&record, "status").unwrap_or("ACTIVE").to_string(),
            event_types: list("event_types"),
            event_categories: list("event_categories"),
            scope_filter: field(&record, "scope_filter").map(String::from),
            key_scope_filter: list("key_scope_filter"),
            retry: json_field(&record, "retry_policy").and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default(),
            disable_after: int_field(&record, "disable_after_failures").unwrap_or(10),
            created_at_ms: int_field(&record, "created_at_ms").unwrap_or(0),
            record,
        }
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
        selected && scoped && admitted && self.may_receive(event)
    }

    /// INVARIANT 2 at dispatch and replay: a tenant-owned subscription never receives an
    /// admin-only event.
    pub fn may_receive(&self, event: &Value) -> bool {
        let category = event["category"].as_str().unwrap_or_default();
        let type_category = category_of(event["event_type"].as_str().unwrap_or_default());
        self.owner == SYSTEM_TENANT
            || (TENANT_CATEGORIES.contains(&category) && TENANT_CATEGORIES.contains(&type_category))
    }
}

/// A tenant's subscriptions (or the system-wide ones), decoded.
pub async fn subscriptions(store: &Store, owner: &str) -> ApiResult<Vec<Subscription>> {
    let keys = TenantKeys::new(owner);
    let ids: Vec<String> = store.conn().smembers(keys.webhook_index()).await?;
    let record_keys: Vec<String> = ids.iter().map(|id| keys.webhook(id)).collect();
    Ok(read_records(store, &record_keys).await?.into_iter().map(Subscription::from_record).collect())
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
    let mut script_keys = vec![keys.due_subscriptions()];
    let mut args = vec![DELIVERY_RETENTION.as_millis().to_string()];
    let body = event.to_string();
    // Due at the event's stream position (ms plus seq/1000): already due, and in event order.
    let due = event["event_id"]
        .as_str()
        .and_then(crate::api::events::parse_event_id)
        .and_then(|(_, entry)| {
            let (ms, seq) = entry.split_once('-')?;
            Some(format!("{}.{:03}", ms.parse::<i64>().ok()?, seq.parse::<u64>().ok()?.min(999)))
        })
        .unwrap_or_else(|| now_ms().to_string());
    for (sub, delivery_id) in subs {
        script_keys.push(keys.delivery(delivery_id));
        script_keys.push(keys.subscription_deliveries(&sub.id));
        script_keys.push(keys.subscription_queue(&sub.id));
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
        args.push(f.to_string());
    }
    let reply = store.run(&scripts::DELIVERY_ENQUEUE, &script_keys, &args).await?;
    Ok(reply.result.first().and_then(|c| c.parse().ok()).unwrap_or(0))
}

/// `del_` + 16 hex of sha256(event_id|subscription_id).
pub fn live_delivery_id(event_id: &str, subscription_id: &str) -> String {
    use sha2::Digest;
    let h = Sha256::digest(format!("{event_id}|{subscription_id}"));
    format!("del_{}", &hex::encode(h)[..16])
}

/// What one dispatcher pass did.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct DeliveryReport {
    pub events_matched: u64,
    pub deliveries_created: u64,
    pub delivered: u64,
    pub retrying: u64,
    pub failed: u64,
}

impl DeliveryReport {
    /// One structured log line with every counter.
    pub fn log(&self, message: &str) {
        tracing::info!(
            created = self.deliveries_created,
            delivered = self.delivered,
            retrying = self.retrying,
            failed = self.failed,
            "{message}"
        );
    }

    fn add(&mut self, o: &DeliveryReport) {
        self.events_matched += o.events_matched;
        self.deliveries_created += o.deliveries_created;
        self.delivered += o.delivered;
        self.retrying += o.retrying;
        self.failed += o.failed;
    }
}

/// The dispatcher: safe to run concurrently with itself (claims are leased, enqueues idempotent).
/// Sends run concurrently, at most `config.concurrency` in this process and at most
/// `config.per_subscription` per subscription across all dispatchers, so a slow or dead
/// endpoint holds back only its own deliveries.
pub struct Dispatcher {
    pub store: Store,
    pub config: WebhookConfig,
    client: reqwest::Client,
}

/// A claimed delivery, ready to send.
pub struct Claimed {
    pub owner: String,
    pub delivery: Record,
    pub subscription: Option<Subscription>,
}

impl Dispatcher {
    pub fn new(store: Store, config: WebhookConfig) -> Dispatcher {
        // Connections go only to addresses the guard resolved and checked (no proxy, no
        // redirects: either would connect somewhere unchecked).
        let resolver = crate::egress::GuardedResolver { rules: Arc::new(config.egress.clone()) };
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout())
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(resolver))
            .build()
            .expect("HTTP client");
        Dispatcher { store, config, client }
    }

    /// One pass over every registered tenant, waiting for its sends.
    pub async fn pass(self: &Arc<Self>) -> ApiResult<DeliveryReport> {
        let tenants: Vec<String> = self.store.conn().smembers(keys::TENANT_REGISTRY).await?;
        self.pass_tenants(&tenants).await
    }

    /// One pass over the given tenants (and the system-wide owner): match their new events,
    /// then claim and send what is due, concurrently, and wait for every send.
    pub async fn pass_tenants(self: &Arc<Self>, tenants: &[String]) -> ApiResult<DeliveryReport> {
        let mut report = self.fan_out_all(tenants).await?;
        let mut sends = tokio::task::JoinSet::new();
        self.claim_and_spawn(tenants, self.config.concurrency, &mut sends).await?;
        while let Some(done) = sends.join_next().await {
            report.add(&done.unwrap_or_default());
        }
        Ok(report)
    }

    /// Fan-out of the given tenants' new events (and the system-wide owner's).
    async fn fan_out_all(&self, tenants: &[String]) -> ApiResult<DeliveryReport> {
        let system = subscriptions(&self.store, SYSTEM_TENANT).await?;
        let mut report = DeliveryReport::default();
        for tenant in tenants.iter().map(String::as_str).chain([SYSTEM_TENANT]) {
            report.add(&self.fan_out(tenant, &system).await?);
        }
        Ok(report)
    }

    /// Claims up to `room` due deliveries across the owners and starts a task sending each.
    async fn claim_and_spawn(
        self: &Arc<Self>,
        tenants: &[String],
        mut room: usize,
        sends: &mut tokio::task::JoinSet<DeliveryReport>,
    ) -> ApiResult<()> {
        for owner in tenants.iter().map(String::as_str).chain([SYSTEM_TENANT]) {
            if room == 0 {
                break;
            }
            for claimed in self.claim(owner, room).await? {
                room -= 1;
                let this = self.clone();
                sends.spawn(async move { this.deliver(claimed).await });
            }
        }
        Ok(())
    }

    /// Sends one claimed delivery and records the outcome.
    pub async fn deliver(&self, c: Claimed) -> DeliveryReport {
        let mut report = DeliveryReport::default();
        match self.send_and_record(&c.owner, &c.delivery, c.subscription.as_ref()).await {
            Ok(status) => match status.as_str() {
                "SUCCESS" => report.delivered += 1,
                "RETRYING" => report.retrying += 1,
                _ => report.failed += 1,
            },
            // Not recorded: the claim's lease ends and the delivery is sent again.
            Err(e) => tracing::error!(error = %e.message, owner = %c.owner, "could not record a delivery attempt"),
        }
        report
    }

    /// Matches a tenant's events past its cursor against its own and the system-wide ACTIVE
    /// subscriptions; the cursor moves only after every delivery row exists.
    pub async fn fan_out(&self, tenant: &str, system: &[Subscription]) -> ApiResult<DeliveryReport> {
        let keys = TenantKeys::new(tenant);
        let mut conn = self.store.conn();
        let mut report = DeliveryReport::default();
        let own = subscriptions(&self.store, tenant).await?;
        let system: &[Subscription] = if tenant == SYSTEM_TENANT { &[] } else { system };
        loop {
            let cursor: Option<String> = conn.get(keys.dispatch_cursor()).await?;
            let start = cursor.map(|c| format!("({c}")).unwrap_or_else(|| "-".to_string());
            let reply: StreamRangeReply = conn.xrange_count(keys.events(), &start, "+", 200).await?;
            let Some(last) = reply.ids.last().map(|e| e.id.clone()) else { return Ok(report) };
            let full = reply.ids.len() == 200;
            for entry in &reply.ids {
                let Some(event) = entry.get::<String>("event").and_then(|j| serde_json::from_str::<Value>(&j).ok())
                else {
                    continue;
                };
                let ts = entry.id.split('-').next().and_then(|m| m.parse::<i64>().ok()).unwrap_or(0);
                let live = |s: &&Subscription| s.status == "ACTIVE" && s.created_at_ms <= ts && s.selects(&event);
                let event_id = event["event_id"].as_str().unwrap_or_default();
                let flags: Option<String> = entry.get("flags");
                for (owner, subs) in [
                    (tenant, own.iter().filter(live).collect::<Vec<_>>()),
                    (SYSTEM_TENANT, system.iter().filter(live).collect()),
                ] {
                    if subs.is_empty() {
                        continue;
                    }
                    report.events_matched += 1;
                    let with_ids: Vec<_> = subs.into_iter().map(|s| (s, live_delivery_id(event_id, &s.id))).collect();
                    report.deliveries_created +=
                        enqueue(&self.store, owner, &event, flags.as_deref(), &with_ids).await?;
                }
            }
            let _: () = conn.set(keys.dispatch_cursor(), &last).await?;
            if !full {
                return Ok(report);
            }
        }
    }

    /// Claims up to `max` due deliveries of one owner (leased), with their subscriptions: the
    /// subscriptions due now, each up to its in-flight limit, then the legacy queue.
    pub async fn claim(&self, owner: &str, max: usize) -> ApiResult<Vec<Claimed>> {
        let keys = TenantKeys::new(owner);
        let due: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.due_subscriptions())
            .arg("-inf")
            .arg(now_ms())
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(100)
            .query_async(&mut self.store.conn())
            .await?;
        let mut script_keys = vec![keys.due_subscriptions(), keys.legacy_delivery_queue()];
        for id in &due {
            script_keys.extend([keys.subscription_queue(id), keys.subscription_in_flight(id)]);
        }
        let mut args =
            vec![self.config.lease.as_millis().to_string(), max.to_string(), self.config.per_subscription.to_string()];
        args.extend(due);
        let reply = self.store.run(&scripts::DELIVERY_CLAIM, &script_keys, &args).await?;
        if reply.context.is_empty() {
            return Ok(vec![]);
        }
        let claimed: Vec<(&String, &String)> = reply.context.chunks(2).map(|p| (&p[0], &p[1])).collect();
        let record_keys: Vec<String> = claimed.iter().map(|(id, _)| keys.delivery(id)).collect();
        let records = read_records(&self.store, &record_keys).await?;
        let subs: HashMap<String, Subscription> =
            subscriptions(&self.store, owner).await?.into_iter().map(|s| (s.id.clone(), s)).collect();
        let mut out = vec![];
        for ((id, sub_id), delivery) in claimed.into_iter().zip(records) {
            if field(&delivery, "delivery_id").is_none() {
                // the row is gone (retention): its claim ends here
                let _: () = self.store.conn().zrem(keys.legacy_delivery_queue(), id).await?;
                let _: () = self.store.conn().zrem(keys.subscription_in_flight(sub_id), id).await?;
                continue;
            }
            let subscription = field(&delivery, "subscription_id").and_then(|id| subs.get(id)).cloned();
            out.push(Claimed { owner: owner.to_string(), delivery, subscription });
        }
        Ok(out)
    }

    /// Pre-checks, sends one attempt, records it. Returns the delivery's new status.
    pub async fn send_and_record(
        &self,
        owner: &str,
        delivery: &Record,
        sub: Option<&Subscription>,
    ) -> ApiResult<String> {
        let outcome = self.send(delivery, sub).await;
        self.record(owner, delivery, sub, outcome).await
    }

    /// The attempt itself (no store writes): Err(message) for a pre-check failure.
    pub async fn send(&self, delivery: &Record, sub: Option<&Subscription>) -> Result<Attempt, String> {
        let event: Value =
            field(delivery, "event").and_then(|e| serde_json::from_str(e).ok()).ok_or("event not found")?;
        let sub = sub.ok_or("subscription not found")?;
        if sub.status != "ACTIVE" {
            return Err(format!("subscription is {}", sub.status));
        }
        if now_ms() - int_field(delivery, "attempted_at_ms").unwrap_or(0) > MAX_DELIVERY_AGE_MS {
            return Err("expired: older than the maximum delivery age".into());
        }
        if !sub.may_receive(&event) {
            return Err("event is not accessible to a tenant-owned subscription".into());
        }
        Ok(self.post(&sub.url, &event, field(delivery, "trace_flags"), &sub.record).await)
    }

    /// POSTs an event with the spec's headers and signature, through the egress guard (the URL
    /// is checked again as it is now, and names resolve only to checked addresses).
    /// `flags`: the inbound traceparent flags of the request that caused the event (else 01).
    pub async fn post(&self, url: &str, event: &Value, flags: Option<&str>, sub: &Record) -> Attempt {
        if let Err(refusal) = self.config.egress.check_static(url) {
            tracing::warn!(url, reason = %refusal, "webhook endpoint refused by the egress guard");
            return Attempt::unreachable();
        }
        let body = serde_json::to_vec(event).expect("events serialize");
        let secret = field(sub, "secret").and_then(|s| decrypt(&self.config.encryption_key, s)).unwrap_or_default();
        let trace_id = event["trace_id"].as_str().map(String::from).unwrap_or_else(crate::ids::new_trace_id);
        let mut span = [0u8; 8];
        rand::thread_rng().fill_bytes(&mut span);
        let flags = flags.unwrap_or("01");
        let mut req = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("user-agent", concat!("cycles-serverless/", env!("CARGO_PKG_VERSION")))
            .header("x-cycles-event-id", event["event_id"].as_str().unwrap_or_default())
            .header("x-cycles-event-type", event["event_type"].as_str().unwrap_or_default())
            .header("x-cycles-signature", signature(&secret, &body))
            .header("x-cycles-trace-id", &trace_id)
            .header("traceparent", format!("00-{trace_id}-{}-{flags}", hex::encode(span)));
        if let Some(r) = event["request_id"].as_str() {
            req = req.header("x-request-id", r);
        }
        if let Some(Value::Object(headers)) = json_field(sub, "headers") {
            for (name, v) in headers {
                if let Some(v) = v.as_str().and_then(|v| decrypt(&self.config.encryption_key, v)) {
                    req = req.header(name, v);
                }
            }
        }
        let started = Instant::now();
        let result = req.body(body).send().await;
        let ms = started.elapsed().as_millis() as i64;
        match result {
            Ok(res) => {
                let status = res.status().as_u16();
                let error = (!res.status().is_success()).then(|| format!("endpoint answered HTTP {status}"));
                Attempt { status, ms, error }
            }
            Err(e) => {
                tracing::warn!(url, error = %error_chain(&e), "webhook endpoint unreachable");
                Attempt::unreachable()
            }
        }
    }

    /// Writes an attempt's outcome (or a pre-check failure) and its effect on the subscription.
    pub async fn record(
        &self,
        owner: &str,
        delivery: &Record,
        sub: Option<&Subscription>,
        outcome: Result<Attempt, String>,
    ) -> ApiResult<String> {
        let keys = TenantKeys::new(owner);
        let id = field(delivery, "delivery_id").unwrap_or_default();
        let sub_id = field(delivery, "subscription_id").unwrap_or_default();
        let script_keys = [
            keys.delivery(id),
            keys.legacy_delivery_queue(),
            keys.webhook(sub_id),
            keys.events(),
            keys.subscription_queue(sub_id),
            keys.subscription_in_flight(sub_id),
            keys.due_subscriptions(),
        ];
        let retry = sub.map(|s| s.retry).unwrap_or_default();
        let attempts = int_field(delivery, "attempts").unwrap_or(0) + 1;
        let (mode, status, ms, error) = match outcome {
            Ok(a) => ("sent", a.status, a.ms, a.error.unwrap_or_default()),
            Err(e) => ("precheck", 0, 0, e),
        };
        let failure = json!({"component": "webhook_dispatcher", "severity": "warning",
            "message": format!("webhook delivery failed after {attempts} attempts: {error}"),
            "details": {"delivery_id": id, "subscription_id": sub_id, "owner": owner,
                "event_id": field(delivery, "event_id").unwrap_or_default(), "response_status": status}});
        let args = [
            mode.to_string(),
            status.to_string(),
            ms.to_string(),
            error,
            retry.max_retries.to_string(),
            retry.delay_ms(attempts).to_string(),
            sub.map(|s| s.disable_after).unwrap_or(10).to_string(),
            id.to_string(),
            sub_id.to_string(),
        ];
        let outcome = self.store.run(&scripts::DELIVERY_RECORD, &script_keys, &args).await?.status;
        if outcome == "FAILED" && mode == "sent" {
            // A separate step (the system stream is another slot): a lost one only costs the alert.
            let system = TenantKeys::new(SYSTEM_TENANT).events();
            let args = [
                "system.webhook_delivery_failed".to_string(),
                failure.to_string(),
                json!({"actor": "system"}).to_string(),
            ];
            if let Err(e) = self.store.run(&scripts::SYSTEM_EVENT, &[system], &args).await {
                tracing::error!(error = %e.message, delivery_id = id, "could not write system.webhook_delivery_failed");
            }
        }
        Ok(outcome)
    }

    /// Runs until `deadline` (a Lambda invocation) or forever (local gateway): every `interval`
    /// it matches new events and claims what is due, up to the free room of the send pool, and
    /// starts the sends without waiting for them, so a slow endpoint never holds a pass. It
    /// claims nothing it could not send before the deadline, and returns once the last send
    /// has been recorded.
    pub async fn run_loop(self: Arc<Self>, interval: Duration, deadline: Option<Instant>) -> DeliveryReport {
        let mut total = DeliveryReport::default();
        let mut sends = tokio::task::JoinSet::new();
        loop {
            while let Some(done) = sends.try_join_next() {
                total.add(&done.unwrap_or_default());
            }
            let claiming = deadline.is_none_or(|d| Instant::now() + self.config.timeout + interval < d);
            if claiming {
                if let Err(e) = self.tick(&mut sends).await {
                    tracing::error!(error = %e.message, "webhook dispatch pass failed");
                }
            } else if sends.is_empty() {
                return total;
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// One step of the loop: fan-out of every tenant, then claims for the pool's free room.
    async fn tick(self: &Arc<Self>, sends: &mut tokio::task::JoinSet<DeliveryReport>) -> ApiResult<()> {
        let tenants: Vec<String> = self.store.conn().smembers(keys::TENANT_REGISTRY).await?;
        let report = self.fan_out_all(&tenants).await?;
        if report.deliveries_created > 0 {
            report.log("webhook fan-out");
        }
        let room = self.config.concurrency.saturating_sub(sends.len());
        self.claim_and_spawn(&tenants, room, sends).await
    }
}

/// One HTTP attempt's outcome.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The HTTP status; 0 when no answer came back.
    pub status: u16,
    /// Time to the answer; 0 when no answer came back.
    pub ms: i64,
    pub error: Option<String>,
}

impl Attempt {
    fn unreachable() -> Attempt {
        Attempt { status: 0, ms: 0, error: Some(UNREACHABLE.to_string()) }
    }
}

/// An error with its causes, for the log (reqwest keeps the interesting part in the sources).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The wire `WebhookDelivery` of a stored row.
pub fn delivery_json(r: &Record) -> Value {
    use crate::api::admin::time_field;
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

/// Reads one owner's delivery rows.
pub async fn read_deliveries(app: &crate::api::App, owner: &str, ids: &[String]) -> ApiResult<Vec<Record>> {
    let keys = TenantKeys::new(owner);
    read_records(&app.store, &ids.iter().map(|id| keys.delivery(id)).collect::<Vec<_>>()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_round_trip_and_never_appear_in_clear() {
        let key = [7u8; 32];
        let sealed = encrypt(&key, "whsec_abc");
        assert!(sealed.starts_with("enc:") && !sealed.contains("whsec_abc"));
        assert_eq!(decrypt(&key, &sealed).as_deref(), Some("whsec_abc"));
        assert_eq!(decrypt(&[8u8; 32], &sealed), None);
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

    #[test]
    fn signature_is_hmac_of_the_raw_body() {
        assert_eq!(
            signature("key", b"The quick brown fox jumps over the lazy dog"),
            "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }
}
