//! Lost responses: for every idempotent endpoint the first answer is thrown away and the client
//! retries with the same key. The retry returns the identical body (reserve: identical except
//! the live `remaining_ttl_ms`), and the ledger and the event stream changed exactly once.

use cycles_tests::*;
use serde_json::Value;

/// Sends `body` twice to `path`; returns the second answer after checking it equals the first.
async fn twice(h: &Harness, t: &Tenant, path: &str, body: &Value) -> Resp {
    let first = h.post(&t.key, path, body).await;
    assert!(first.status < 300, "{path}: {}", first.raw);
    let ledger_after_first = h.root(t).await;
    let events_after_first = h.all_events(&t.id).await.len();
    let retry = h.post(&t.key, path, body).await;
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(o) = v.as_object_mut() {
            o.remove("remaining_ttl_ms");
        }
        v
    };
    assert_eq!(retry.status, first.status, "{path}");
    assert_eq!(strip(&retry.body), strip(&first.body), "{path}: the retry must answer the stored response");
    assert_eq!(h.root(t).await, ledger_after_first, "{path}: the retry changed the ledger");
    assert_eq!(h.all_events(&t.id).await.len(), events_after_first, "{path}: the retry wrote events");
    retry
}

#[tokio::test]
async fn every_idempotent_endpoint_survives_a_lost_response() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let subject = json!({"tenant": t.id});
    let action = json!({"kind": "llm", "name": "m"});
    let before = h.root(&t).await;

    let reserve = json!({"idempotency_key": "lost-r", "subject": subject, "action": action,
        "estimate": {"unit": "TOKENS", "amount": 100}});
    let r = twice(&h, &t, "/v1/reservations", &reserve).await;
    let rid = r.body["reservation_id"].as_str().unwrap().to_string();
    assert_eq!(h.root(&t).await.reserved, before.reserved + 100, "held once");

    let extend = json!({"idempotency_key": "lost-x", "extend_by_ms": 5000});
    let e = twice(&h, &t, &format!("/v1/reservations/{rid}/extend"), &extend).await;
    assert!(e.body["expires_at_ms"].is_i64());

    let commit = json!({"idempotency_key": "lost-c", "actual": {"unit": "TOKENS", "amount": 150}});
    twice(&h, &t, &format!("/v1/reservations/{rid}/commit"), &commit).await;
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (before.reserved, 150), "committed once, overage once");

    let rid2 = h.reserve_ok(&t, 30, json!({})).await;
    let release = json!({"idempotency_key": "lost-l"});
    twice(&h, &t, &format!("/v1/reservations/{rid2}/release"), &release).await;
    assert_eq!(h.root(&t).await.reserved, before.reserved);

    let event = json!({"idempotency_key": "lost-e", "subject": subject, "action": action,
        "actual": {"unit": "TOKENS", "amount": 40}});
    twice(&h, &t, "/v1/events", &event).await;
    assert_eq!(h.root(&t).await.spent, 190, "debited once");

    let decide = json!({"idempotency_key": "lost-d", "subject": subject, "action": action,
        "estimate": {"unit": "TOKENS", "amount": 5000}});
    let d = twice(&h, &t, "/v1/decide", &decide).await;
    assert_eq!(d.body["decision"], "DENY");
    let denied = h.events(&t.id).await.iter().filter(|e| e["event_type"] == "reservation.denied").count();
    assert_eq!(denied, 1, "one denial event for one decision");

    let dry = json!({"idempotency_key": "lost-dry", "subject": subject, "action": action,
        "estimate": {"unit": "TOKENS", "amount": 5}, "dry_run": true});
    twice(&h, &t, "/v1/reservations", &dry).await;

    // the operator plane's idempotent write: funding
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 7}, "idempotency_key": "lost-f"});
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
    let first = h.admin("POST", &path, Some(&fund)).await;
    let retry = h.admin("POST", &path, Some(&fund)).await;
    assert_eq!(retry.raw, first.raw);
    assert_eq!(h.root(&t).await.allocated, 1007, "funded once");
}
