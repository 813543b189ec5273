//! Webhooks: subscription records and their invariants, secrets at rest (AES-256-GCM), the
//! SSRF check of endpoint URLs, signing, and sending an event to an endpoint (`Sender`). The
//! dispatcher that sends deliveries is a job (`jobs::dispatch`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::config::WebhookConfig;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::ops::events::{category_of, SYSTEM_TENANT, TENANT_CATEGORIES};
use crate::ops::records::{field, int_field, json_field, time_field, Record};

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

/// `del_` + 16 hex of sha256(event_id|subscription_id).
pub fn live_delivery_id(event_id: &str, subscription_id: &str) -> String {
    use sha2::Digest;
    let h = Sha256::digest(format!("{event_id}|{subscription_id}"));
    format!("del_{}", &hex::encode(h)[..16])
}

/// Sends events to endpoints: an HTTP client whose connections go only to addresses the egress
/// guard resolved and checked (no proxy, no redirects: either would connect somewhere
/// unchecked), and the spec's headers and signature.
pub struct Sender {
    client: reqwest::Client,
    encryption_key: [u8; 32],
    egress: crate::egress::EgressRules,
}

impl Sender {
    pub fn new(config: &WebhookConfig) -> Sender {
        let resolver = crate::egress::GuardedResolver { rules: Arc::new(config.egress.clone()) };
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout())
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(resolver))
            .build()
            .expect("HTTP client");
        Sender { client, encryption_key: config.encryption_key, egress: config.egress.clone() }
    }

    /// POSTs an event with the spec's headers and signature, through the egress guard (the URL
    /// is checked again as it is now, and names resolve only to checked addresses).
    /// `flags`: the inbound traceparent flags of the request that caused the event (else 01).
    pub async fn post(&self, url: &str, event: &Value, flags: Option<&str>, sub: &Record) -> Attempt {
        if let Err(refusal) = self.egress.check_static(url) {
            tracing::warn!(url, reason = %refusal, "webhook endpoint refused by the egress guard");
            return Attempt::unreachable();
        }
        let body = serde_json::to_vec(event).expect("events serialize");
        let secret = field(sub, "secret").and_then(|s| decrypt(&self.encryption_key, s)).unwrap_or_default();
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
                if let Some(v) = v.as_str().and_then(|v| decrypt(&self.encryption_key, v)) {
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
    pub fn unreachable() -> Attempt {
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
