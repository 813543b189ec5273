//! Webhooks: subscription records and their invariants, secrets at rest (AES-256-GCM), the
//! SSRF check of endpoint URLs, signing, and sending an event to an endpoint (`Sender`). The
//! dispatcher that sends deliveries is a job (`jobs::dispatch`).

use std::sync::Arc;
use std::time::Instant;

use aes_gcm::aead::{Aead, KeyInit};
use aes_gcm::{Aes256Gcm, Nonce};
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, Mac};
use rand::RngCore;
use serde_json::Value;
use sha2::Sha256;

use crate::config::WebhookConfig;
use crate::egress::{EgressRules, GuardedResolver, SharedRules};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::ops::webhooks::Subscription;

/// The write-time SSRF check of a subscription URL (`crate::egress`) under the rules in force:
/// 400 WEBHOOK_URL_INVALID naming what is wrong.
pub async fn check_url(rules: &EgressRules, url: &str) -> ApiResult<()> {
    rules.check_url(url).await.map_err(|r| ApiError::new(ErrorCode::WebhookUrlInvalid, r.to_string()))
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

/// Sends events to endpoints: an HTTP client whose connections go only to addresses the egress
/// guard resolved and checked (no proxy, no redirects: either would connect somewhere
/// unchecked), and the spec's headers and signature.
pub struct Sender {
    client: reqwest::Client,
    encryption_key: [u8; 32],
    rules: SharedRules,
}

impl Sender {
    /// A sender under `rules` (the rules in force: the environment's, or the stored ones).
    pub fn new(config: &WebhookConfig, rules: EgressRules) -> Sender {
        let rules: SharedRules = Arc::new(std::sync::RwLock::new(Arc::new(rules)));
        let resolver = GuardedResolver { rules: rules.clone() };
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout())
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .dns_resolver(Arc::new(resolver))
            .build()
            .expect("HTTP client");
        Sender { client, encryption_key: config.encryption_key, rules }
    }

    /// Puts new rules in force for the next send (an operator changed the stored configuration).
    pub fn set_rules(&self, rules: EgressRules) {
        let mut current = self.rules.write().expect("rules lock");
        if **current != rules {
            *current = Arc::new(rules);
        }
    }

    /// POSTs an event with the spec's headers and signature, through the egress guard (the URL
    /// is checked again as it is now, and names resolve only to checked addresses).
    /// `flags`: the inbound traceparent flags of the request that caused the event (else 01).
    pub async fn post(&self, url: &str, event: &Value, flags: Option<&str>, sub: &Subscription) -> Attempt {
        let rules = self.rules.read().expect("rules lock").clone();
        if let Err(refusal) = rules.check_static(url) {
            tracing::warn!(url, reason = %refusal, "webhook endpoint refused by the egress guard");
            return Attempt::unreachable();
        }
        let body = serde_json::to_vec(event).expect("events serialize");
        let secret = sub.sealed_secret.as_deref().and_then(|s| decrypt(&self.encryption_key, s)).unwrap_or_default();
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
        for (name, v) in &sub.sealed_headers {
            if let Some(v) = v.as_str().and_then(|v| decrypt(&self.encryption_key, v)) {
                req = req.header(name, v);
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
    fn signature_is_hmac_of_the_raw_body() {
        assert_eq!(
            signature("key", b"The quick brown fox jumps over the lazy dog"),
            "sha256=f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
        );
    }
}
