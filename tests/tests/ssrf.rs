//! The webhook SSRF guard with the deployed rules: every spelling of an unsafe address is refused
//! on every write path, a delivery connects only to addresses checked at connect time (a name
//! that turned private after the subscription was written reaches nothing), and the test
//! endpoint answers alike whatever the state of the port behind a URL.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cycles_shared::egress::EgressRules;
use cycles_shared::jobs::dispatch::Dispatcher;
use cycles_shared::keys::TenantKeys;
use cycles_shared::webhooks::UNREACHABLE;
use cycles_tests::*;
use redis::AsyncCommands;

const ATTACKS: [&str; 14] = [
    "https://[::ffff:127.0.0.1]:1/h",
    "https://[::ffff:7f00:1]/h",
    "https://[::ffff:169.254.169.254]/h",
    "https://[::ffff:10.0.0.1]/h",
    "https://[::ffff:192.168.1.1]/h",
    "https://0.0.0.0/h",
    "https://0/h",
    "https://[::]/h",
    "https://[fe80::1]/h",
    "https://[64:ff9b::a9fe:a9fe]/h",
    "https://100.100.100.200/h",
    "https://[2002:a9fe:a9fe::]/h",
    "https://2130706433/h",
    "https://localhost:9/h",
];

/// A harness whose server runs with the rules a deployment has.
async fn deployed() -> Harness {
    Harness::start_configured(|c| c.webhooks.egress = EgressRules::default()).await
}

#[tokio::test]
async fn unsafe_urls_are_refused_on_every_write_path() {
    let h = deployed().await;
    let t = h.tenant().await;
    let k = h.key(&t.id, Some(vec!["webhooks:write".into(), "webhooks:read".into()])).await;
    let ok = h
        .admin(
            "POST",
            &format!("/v1/admin/webhooks?tenant_id={}", t.id),
            Some(&json!({"url": "https://93.184.216.34/h", "event_types": ["budget.funded"]})),
        )
        .await;
    assert_eq!(ok.status, 201, "a public address is accepted: {}", ok.raw);
    let id = ok.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
    for url in ATTACKS {
        let body = json!({"url": url, "event_types": ["budget.funded"]});
        let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body)).await;
        r.assert_error(400, "WEBHOOK_URL_INVALID");
        h.admin_as(&k.secret, "POST", "/v1/webhooks", Some(&body)).await.assert_error(400, "WEBHOOK_URL_INVALID");
        let patch = json!({"url": url});
        h.admin("PATCH", &format!("/v1/admin/webhooks/{id}"), Some(&patch))
            .await
            .assert_error(400, "WEBHOOK_URL_INVALID");
        h.admin_as(&k.secret, "PATCH", &format!("/v1/webhooks/{id}"), Some(&patch))
            .await
            .assert_error(400, "WEBHOOK_URL_INVALID");
    }
    // plain http is refused too by default
    let body = json!({"url": "http://93.184.216.34/h", "event_types": ["budget.funded"]});
    h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body))
        .await
        .assert_error(400, "WEBHOOK_URL_INVALID");
    let sub = h.admin("GET", &format!("/v1/admin/webhooks/{id}"), None).await;
    assert_eq!(sub.assert_ok()["url"], "https://93.184.216.34/h", "no refused PATCH changed the URL");
}

/// A TCP listener on loopback that counts the connections it accepts (and closes them).
async fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            seen.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, count)
}

#[tokio::test]
async fn deliveries_connect_only_to_checked_addresses() {
    // The subscriptions are written under development rules (as if the name resolved to a
    // public address then); the dispatcher runs with the deployed rules.
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let (port, connections) = counting_listener().await;
    let mut ids = vec![];
    for url in [format!("http://localhost:{port}/h"), format!("http://[::ffff:127.0.0.1]:{port}/h")] {
        let body = json!({"url": url, "event_types": ["budget.funded"], "retry_policy": {"max_retries": 0}});
        let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body)).await;
        assert_eq!(r.status, 201, "{}", r.raw);
        ids.push(r.body["subscription"]["subscription_id"].as_str().unwrap().to_string());
    }
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5}});
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
    h.admin("POST", &path, Some(&fund)).await.assert_ok();
    let mut config = cycles_shared::config::Config::from_env(None).webhooks;
    config.egress = EgressRules { allow_http: true, ..EgressRules::default() };
    config.timeout = Duration::from_secs(2);
    let deployed = Arc::new(Dispatcher::new(h.store.clone(), config));
    let report = deployed.pass_tenants(std::slice::from_ref(&t.id)).await.unwrap();
    assert_eq!((report.deliveries_created, report.failed), (2, 2), "{report:?}");
    assert_eq!(connections.load(Ordering::SeqCst), 0, "no connection reached the blocked address");
    for id in &ids {
        let d = h.admin("GET", &format!("/v1/admin/webhooks/{id}/deliveries"), None).await;
        let row = &d.assert_ok()["deliveries"][0];
        assert_eq!((row["status"].as_str(), row["error_message"].as_str()), (Some("FAILED"), Some(UNREACHABLE)));
        assert!(row.get("response_status").is_none() && row.get("response_time_ms").is_none(), "{row}");
    }
    // the same subscriptions under development rules do connect (the guard made the difference)
    let replay = h.admin("POST", &format!("/v1/admin/webhooks/{}/replay", ids[0]), Some(&json!({}))).await;
    assert_eq!(replay.status, 202, "{}", replay.raw);
    h.deliver(&[&t.id]).await;
    assert!(connections.load(Ordering::SeqCst) >= 1);
}

#[tokio::test]
async fn the_test_endpoint_is_no_port_scanner() {
    let h = deployed().await;
    let t = h.tenant().await;
    let body = json!({"url": "https://93.184.216.34/h", "event_types": ["budget.funded"]});
    let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body)).await;
    let id = r.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
    let (open, _) = counting_listener().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let record = TenantKeys::new(&t.id).webhook(&id);
    let mut answers = vec![];
    for url in [
        format!("https://127.0.0.1:{open}/h"),
        format!("https://127.0.0.1:{closed}/h"),
        format!("https://[::ffff:127.0.0.1]:{open}/h"),
        format!("https://localhost:{closed}/h"),
    ] {
        // stage the URL as if it had been accepted before the rules tightened
        let _: () = h.store.conn().hset(&record, "url", &url).await.unwrap();
        let r = h.admin("POST", &format!("/v1/admin/webhooks/{id}/test"), None).await;
        let mut body = r.assert_ok().clone();
        assert!(body["event_id"].as_str().unwrap().starts_with("evt_test_"));
        body.as_object_mut().unwrap().remove("event_id");
        answers.push(body);
    }
    for a in &answers {
        assert_eq!(*a, json!({"success": false, "error_message": UNREACHABLE}), "{answers:?}");
    }
}

#[tokio::test]
async fn unreachable_targets_answer_alike_whatever_the_port_state() {
    // Development rules: the connection is attempted. A port that accepts and hangs up and a
    // closed port give one answer, with no timing.
    let h = Harness::start().await;
    let t = h.tenant().await;
    let (open, connections) = counting_listener().await;
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut answers = vec![];
    for port in [open, closed] {
        let body = json!({"url": format!("http://127.0.0.1:{port}/h"), "event_types": ["budget.funded"]});
        let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body)).await;
        let id = r.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
        let mut body = h.admin("POST", &format!("/v1/admin/webhooks/{id}/test"), None).await.assert_ok().clone();
        body.as_object_mut().unwrap().remove("event_id");
        answers.push(body);
    }
    assert!(connections.load(Ordering::SeqCst) >= 1, "the open port was reached");
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0], json!({"success": false, "error_message": UNREACHABLE}));
}

/// Issue 27 (10): every `/test` answer without an HTTP response takes one fixed time (the
/// connect timeout, 5 s), whatever the target does: a closed port, a non-HTTP banner, and an
/// endpoint that accepts and never answers (it took the whole 8 s delivery timeout before).
#[tokio::test]
async fn the_test_endpoint_answers_no_http_response_in_one_fixed_time() {
    let h = Harness::start_configured(|c| c.webhooks.timeout = std::time::Duration::from_secs(8)).await;
    let t = h.tenant().await;
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (banner, pit) = (listener.local_addr().unwrap().port(), {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = vec![];
            while let Ok((s, _)) = l.accept().await {
                held.push(s); // accepts and never answers
            }
        });
        port
    });
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").await;
        }
    });
    let mut times = vec![];
    for port in [closed, banner, pit] {
        let body = json!({"url": format!("http://127.0.0.1:{port}/h"), "event_types": ["budget.funded"]});
        let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body)).await;
        let id = r.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
        let started = std::time::Instant::now();
        let mut body = h.admin("POST", &format!("/v1/admin/webhooks/{id}/test"), None).await.assert_ok().clone();
        times.push(started.elapsed().as_millis() as i64);
        body.as_object_mut().unwrap().remove("event_id");
        assert_eq!(body, json!({"success": false, "error_message": UNREACHABLE}), "port {port}");
    }
    eprintln!("closed, banner, tar pit: {times:?} ms");
    for ms in &times {
        assert!((5_000..6_000).contains(ms), "one fixed time (5 s) for every answer without HTTP: {times:?}");
    }
}
