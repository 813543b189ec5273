//! Isolation matrix: tenant A's key against every endpoint that names tenant B's objects gets
//! 403 or 404, never B's data, and B's ledgers do not move.

use cycles_shared::model::Unit;
use cycles_tests::*;

#[tokio::test]
async fn another_tenants_objects_are_out_of_reach() {
    let h = Harness::start().await;
    let a = h.funded(1000).await;
    let b = h.funded(1000).await;
    let b_root = format!("tenant:{}", b.id);
    let rid = h.reserve_ok(&b, 10, json!({})).await;
    // A's key with every permission a tenant key can hold
    let all: Vec<String> = cycles_shared::domain::Permission::ALL.iter().map(|p| p.as_str().to_string()).collect();
    let strong = h.key(&a.id, Some(all)).await;
    let wh = h
        .admin(
            "POST",
            &format!("/v1/admin/webhooks?tenant_id={}", b.id),
            Some(&json!({"url": "http://127.0.0.1:9/h", "event_types": ["budget.funded"]})),
        )
        .await;
    let sub = wh.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
    let before = h.root(&b).await;
    let subject_b = json!({"tenant": b.id});
    let action = json!({"kind": "llm", "name": "m"});
    let runtime: Vec<(&str, String, Option<serde_json::Value>)> = vec![
        ("GET", format!("/v1/reservations/{rid}"), None),
        (
            "POST",
            format!("/v1/reservations/{rid}/commit"),
            Some(json!({"idempotency_key": "i1", "actual": {"unit": "TOKENS", "amount": 1}})),
        ),
        ("POST", format!("/v1/reservations/{rid}/release"), Some(json!({"idempotency_key": "i2"}))),
        (
            "POST",
            format!("/v1/reservations/{rid}/extend"),
            Some(json!({"idempotency_key": "i3", "extend_by_ms": 1000})),
        ),
        (
            "POST",
            "/v1/reservations".into(),
            Some(
                json!({"idempotency_key": "i4", "subject": subject_b, "action": action, "estimate": {"unit": "TOKENS", "amount": 1}}),
            ),
        ),
        (
            "POST",
            "/v1/decide".into(),
            Some(
                json!({"idempotency_key": "i5", "subject": subject_b, "action": action, "estimate": {"unit": "TOKENS", "amount": 1}}),
            ),
        ),
        (
            "POST",
            "/v1/events".into(),
            Some(
                json!({"idempotency_key": "i6", "subject": subject_b, "action": action, "actual": {"unit": "TOKENS", "amount": 1}}),
            ),
        ),
        ("GET", format!("/v1/balances?tenant={}", b.id), None),
        ("GET", format!("/v1/reservations?tenant={}", b.id), None),
    ];
    for (method, path, body) in &runtime {
        let body = body.as_ref().map(|b| b.to_string());
        let r = h.send(method, path, &[("x-cycles-api-key", &strong.secret)], body.as_deref()).await;
        assert!([403, 404].contains(&r.status), "{method} {path}: {}", r.raw);
        assert_error_shape(&r);
        assert!(!r.raw.contains(&format!("\"{b_root}\"")), "{method} {path} leaked B's data: {}", r.raw);
    }
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}});
    let admin: Vec<(&str, String, Option<serde_json::Value>)> = vec![
        ("GET", format!("/v1/admin/budgets/lookup?scope={b_root}&unit=TOKENS"), None),
        ("POST", format!("/v1/admin/budgets/fund?scope={b_root}&unit=TOKENS"), Some(fund)),
        ("GET", format!("/v1/balances?tenant_id={}", b.id), None),
        ("GET", format!("/v1/webhooks/{sub}"), None),
        ("PATCH", format!("/v1/webhooks/{sub}"), Some(json!({"name": "x"}))),
        ("DELETE", format!("/v1/webhooks/{sub}"), None),
        ("POST", format!("/v1/webhooks/{sub}/test"), None),
        ("GET", format!("/v1/webhooks/{sub}/deliveries"), None),
        ("GET", format!("/v1/webhooks?tenant={}", b.id), None),
        // admin-only routes refuse tenant keys outright
        ("GET", format!("/v1/admin/tenants/{}", b.id), None),
        ("GET", format!("/v1/admin/events?tenant_id={}", b.id), None),
        ("DELETE", format!("/v1/admin/api-keys/{}", b.key_id), None),
    ];
    for (method, path, body) in &admin {
        let r = h.admin_as(&strong.secret, method, path, body.as_ref()).await;
        assert!([401, 403, 404].contains(&r.status), "{method} {path}: {}", r.raw);
        assert_error_shape(&r);
        assert!(!r.raw.contains(&format!("\"{b_root}\"")), "{method} {path} leaked B's data: {}", r.raw);
    }
    // A's own listings never show B's objects
    let mine = h.admin_as(&strong.secret, "GET", "/v1/admin/budgets", None).await;
    assert!(!mine.assert_ok().to_string().contains(&b.id));
    let events = h.admin_as(&strong.secret, "GET", "/v1/events?limit=100", None).await;
    assert!(!events.assert_ok().to_string().contains(&b.id));
    assert_eq!(h.root(&b).await, before, "B's ledger did not move");
    assert_eq!(h.ledger(&b.id, &b_root, Unit::Tokens).await.reserved, 10);
    let w = h.admin("GET", &format!("/v1/admin/webhooks/{sub}"), None).await;
    assert_eq!(w.assert_ok()["name"], serde_json::Value::Null, "B's subscription unchanged");
}
