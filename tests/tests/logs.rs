//! No secret ever reaches a log line: API keys, the admin key and the key pepper, across
//! successes, auth failures and store failures, with logging at debug level.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cycles_shared::config::DEV_PEPPER;
use cycles_shared::local::EmbeddedRedis;
use cycles_tests::*;

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_never_reach_the_logs() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("debug"))
        .json()
        .with_writer(move || writer.clone())
        .init();

    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let mut h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.commit(&t, &rid, 5).await.assert_ok();
    let forged = format!("cyc_live_{}_wrong-secret-value", t.key_id);
    h.send("GET", &format!("/v1/reservations/{rid}"), &[("x-cycles-api-key", &forged)], None).await;
    h.send("GET", &format!("/v1/reservations/{rid}"), &[("x-admin-api-key", "not-the-admin-key")], None).await;
    h.send("GET", &format!("/v1/reservations/{rid}"), &[("x-admin-api-key", ADMIN_KEY)], None).await.assert_ok();
    // A store failure logs its error: still nothing secret.
    drop(h.embedded.take());
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.reserve(&t, 1, json!({})).await.assert_error(500, "INTERNAL_ERROR");

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(text.contains("api key rejected") && text.contains("request failed"), "the paths above did log: {text}");
    let secret_part = &t.key["cyc_live_".len() + 17..]; // after the key id and its underscore
    for secret in [t.key.as_str(), secret_part, "wrong-secret-value", ADMIN_KEY, "not-the-admin-key", DEV_PEPPER] {
        assert!(!text.contains(secret), "a secret reached the logs: {secret}");
    }
}
