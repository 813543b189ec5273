//! Redis failures give a clear, fast 5xx in the spec's error shape — never a hang, a panic or
//! a partial ledger — and the service recovers by itself once Redis is back.

use std::time::{Duration, Instant};

use cycles_shared::local::EmbeddedRedis;
use cycles_tests::*;

#[tokio::test]
async fn a_dead_redis_is_a_fast_500_and_service_resumes_after_restart() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let port = redis.port;
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;

    // Stop Redis: every request fails fast with 500 INTERNAL_ERROR.
    let mut h = h;
    drop(h.embedded.take());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let r = h.commit(&t, &rid, 5).await;
    r.assert_error(500, "INTERNAL_ERROR");
    assert!(!r.body["message"].as_str().unwrap().contains("redis://"), "no store internals leak");
    h.reserve(&t, 1, json!({})).await.assert_error(500, "INTERNAL_ERROR");
    assert!(started.elapsed() < Duration::from_secs(15), "failures are fast: {:?}", started.elapsed());

    // Bring an empty Redis back on the same port: the same process serves again, no restart.
    let back = EmbeddedRedis::start_on_port(port, &[]).await.expect("restart redis-server");
    h.embedded = Some(back);
    let mut recovered = false;
    for _ in 0..50 {
        let r = h.reserve(&t, 1, json!({})).await;
        // The data is gone with the old process, so the key is unknown now: 401, not 500.
        if r.status == 401 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(recovered, "the gateway reconnected to Redis by itself");
}

#[tokio::test]
async fn liveness_ignores_redis_and_readiness_checks_it() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let mut h = Harness::start_on(redis.url(), Some(redis)).await;
    let live = h.send("GET", "/health/live", &[], None).await;
    assert_eq!((live.status, live.body["status"].as_str()), (200, Some("ok")));
    assert!(live.headers.contains_key("x-request-id") && live.headers.contains_key("x-cycles-trace-id"));
    assert_eq!(h.send("GET", "/health/ready", &[], None).await.status, 200);
    drop(h.embedded.take());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = h.send("GET", "/health/ready", &[], None).await;
    assert_eq!((ready.status, ready.body["status"].as_str()), (503, Some("unavailable")));
    assert_eq!(h.send("GET", "/health/live", &[], None).await.status, 200);
}

/// A Redis that hangs (SIGSTOP) beyond the client timeout: requests fail with a clear 500 in
/// bounded time, never hang; once it resumes, the same process serves again, and a retry with
/// the same idempotency key applies the operation exactly once (the paused request may have
/// reached Redis after all).
#[tokio::test]
async fn a_paused_redis_is_a_bounded_500_and_retries_apply_once() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let pid = redis.pid().expect("redis pid").to_string();
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1000).await;
    let body = json!({"idempotency_key": "paused-1", "subject": {"tenant": t.id},
        "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 25}});
    let signal = |s: &str| std::process::Command::new("kill").args([s, &pid]).status().expect("kill");
    assert!(signal("-STOP").success());
    let started = Instant::now();
    let r = h.post(&t.key, "/v1/reservations", &body).await;
    let waited = started.elapsed();
    assert!(signal("-CONT").success());
    r.assert_error(500, "INTERNAL_ERROR");
    assert!(waited < Duration::from_secs(12), "bounded by the client timeout: {waited:?}");
    let mut answered = None;
    for _ in 0..50 {
        let r = h.post(&t.key, "/v1/reservations", &body).await;
        if r.status == 200 {
            answered = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered.is_some(), "the service recovered without a restart");
    assert_eq!(h.root(&t).await.reserved, 25, "held exactly once");
}
