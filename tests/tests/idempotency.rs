//! Idempotency: replays, mismatches and key scopes.

use cycles_tests::*;

#[tokio::test]
async fn header_key_must_equal_body_key() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let body = json!({"idempotency_key": "a", "subject": {"tenant": t.id},
        "action": {"kind": "k", "name": "n"}, "estimate": {"unit": "TOKENS", "amount": 1}});
    // A header key that differs from the body's key is refused.
    let r = h
        .send(
            "POST",
            "/v1/reservations",
            &[("x-cycles-api-key", &t.key), ("x-idempotency-key", "A")],
            Some(&body.to_string()),
        )
        .await;
    r.assert_error(400, "INVALID_REQUEST");
    let r = h
        .send(
            "POST",
            "/v1/reservations",
            &[("x-cycles-api-key", &t.key), ("x-idempotency-key", "a")],
            Some(&body.to_string()),
        )
        .await;
    r.assert_ok();
    assert_eq!(h.root(&t).await.reserved, 1);
}

#[tokio::test]
async fn reserve_replay_is_identical_except_remaining_ttl() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let extra = json!({"idempotency_key": "same", "ttl_ms": 5000});
    let first = h.reserve(&t, 40, extra.clone()).await;
    first.assert_ok();
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    // Exhaust the budget so a fresh evaluation would fail: the replay must still succeed.
    h.set_budget(&t.id, &format!("tenant:{}", t.id), cycles_shared::model::Unit::Tokens, &[("is_over_limit", "true")])
        .await;
    let again = h.reserve(&t, 40, extra).await;
    // A retry answers the original response with a fresh remaining_ttl_ms and no second effect.
    let (mut a, mut b) = (first.body.clone(), again.assert_ok().clone());
    let (ta, tb) = (a["remaining_ttl_ms"].as_i64().unwrap(), b["remaining_ttl_ms"].as_i64().unwrap());
    assert!(tb < ta && tb > 0, "{ta} {tb}");
    a.as_object_mut().unwrap().remove("remaining_ttl_ms");
    b.as_object_mut().unwrap().remove("remaining_ttl_ms");
    assert_eq!(a, b);
    assert_eq!(h.root(&t).await.reserved, 40, "no second ledger effect");
    // Key order and whitespace do not matter; an explicit default grace equals the omitted one.
    let rid = a["reservation_id"].as_str().unwrap();
    let body = format!(
        r#"{{ "ttl_ms":5000, "grace_period_ms": 5000, "estimate":{{"amount":40,"unit":"TOKENS"}},
        "action":{{"name":"test-model","kind":"llm.completion"}}, "subject":{{"tenant":"{}"}},"idempotency_key":"same"}}"#,
        t.id
    );
    let r = h.send("POST", "/v1/reservations", &[("x-cycles-api-key", &t.key)], Some(&body)).await;
    assert_eq!(r.assert_ok()["reservation_id"], rid);
    // Once the reservation is finalized a replay reports remaining_ttl_ms 0.
    h.release(&t, rid).await.assert_ok();
    let r = h.send("POST", "/v1/reservations", &[("x-cycles-api-key", &t.key)], Some(&body)).await;
    assert_eq!(r.assert_ok()["remaining_ttl_ms"], 0);
}

#[tokio::test]
async fn same_key_different_payload_is_a_mismatch_everywhere() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    // On reserve
    h.reserve(&t, 1, json!({"idempotency_key": "k"})).await.assert_ok();
    h.reserve(&t, 2, json!({"idempotency_key": "k"})).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    // Flipping dry_run under the same key
    h.reserve(&t, 1, json!({"idempotency_key": "k", "dry_run": true})).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    // commit / release / extend
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let path = |op: &str| format!("/v1/reservations/{rid}/{op}");
    let c1 = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 5}});
    let c2 = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 6}});
    let e1 = json!({"idempotency_key": "e", "extend_by_ms": 10});
    let e2 = json!({"idempotency_key": "e", "extend_by_ms": 11});
    h.post(&t.key, &path("extend"), &e1).await.assert_ok();
    h.post(&t.key, &path("extend"), &e2).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    h.post(&t.key, &path("commit"), &c1).await.assert_ok();
    // A mismatch is detected before state errors.
    h.post(&t.key, &path("commit"), &c2).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    let rid2 = h.reserve_ok(&t, 10, json!({})).await;
    let p2 = format!("/v1/reservations/{rid2}/release");
    h.post(&t.key, &p2, &json!({"idempotency_key": "r", "reason": "a"})).await.assert_ok();
    h.post(&t.key, &p2, &json!({"idempotency_key": "r", "reason": "b"}))
        .await
        .assert_error(409, "IDEMPOTENCY_MISMATCH");
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (1, 5));
}

#[tokio::test]
async fn finalize_replays_return_the_original_200() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let c = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 4}});
    let path = format!("/v1/reservations/{rid}/commit");
    let first = h.post(&t.key, &path, &c).await;
    // Byte-identical replay, no second effect.
    let again = h.post(&t.key, &path, &c).await;
    assert_eq!((again.status, &again.raw), (200, &first.raw));
    assert_eq!(h.root(&t).await.spent, 4);
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let path = format!("/v1/reservations/{rid}/release");
    let r = json!({"idempotency_key": "r"});
    let first = h.post(&t.key, &path, &r).await;
    let again = h.post(&t.key, &path, &r).await;
    assert_eq!((again.status, &again.raw), (200, &first.raw));
    // extend replays recompute remaining_ttl_ms only
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let path = format!("/v1/reservations/{rid}/extend");
    let e = json!({"idempotency_key": "e", "extend_by_ms": 1000});
    let first = h.post(&t.key, &path, &e).await;
    let again = h.post(&t.key, &path, &e).await;
    assert_eq!(again.body["expires_at_ms"], first.body["expires_at_ms"]);
    assert_eq!(
        h.get(&t.key, &format!("/v1/reservations/{rid}")).await.body["expires_at_ms"],
        first.body["expires_at_ms"]
    );
}

#[tokio::test]
async fn failed_requests_are_not_cached() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    // A 409 retried with the same key after funding is evaluated afresh.
    h.reserve(&t, 20, json!({"idempotency_key": "retry"})).await.assert_error(409, "BUDGET_EXCEEDED");
    h.set_budget(
        &t.id,
        &format!("tenant:{}", t.id),
        cycles_shared::model::Unit::Tokens,
        &[("allocated", "100"), ("remaining", "100")],
    )
    .await;
    h.reserve(&t, 20, json!({"idempotency_key": "retry"})).await.assert_ok();
    // and a REJECT commit can be retried with the same key and a smaller amount
    let rid = h.reserve_ok(&t, 10, json!({"overage_policy": "REJECT"})).await;
    let path = format!("/v1/reservations/{rid}/commit");
    h.post(&t.key, &path, &json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 11}}))
        .await
        .assert_error(409, "BUDGET_EXCEEDED");
    h.post(&t.key, &path, &json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 9}}))
        .await
        .assert_ok();
}

#[tokio::test]
async fn keys_are_scoped_per_tenant_and_per_reservation() {
    let h = Harness::start().await;
    let a = h.funded(100).await;
    let b = h.funded(100).await;
    // Idempotency keys are per tenant and per reservation.
    let ra = h.reserve(&a, 5, json!({"idempotency_key": "shared", "subject": {"tenant": a.id}})).await;
    let rb = h.reserve(&b, 7, json!({"idempotency_key": "shared", "subject": {"tenant": b.id}})).await;
    assert_ne!(ra.assert_ok()["reservation_id"], rb.assert_ok()["reservation_id"]);
    assert_eq!((h.root(&a).await.reserved, h.root(&b).await.reserved), (5, 7));
    // the same commit key on two reservations is two independent commits
    let r1 = h.reserve_ok(&a, 10, json!({})).await;
    let r2 = h.reserve_ok(&a, 10, json!({})).await;
    let c = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 1}});
    h.post(&a.key, &format!("/v1/reservations/{r1}/commit"), &c).await.assert_ok();
    h.post(&a.key, &format!("/v1/reservations/{r2}/commit"), &c).await.assert_ok();
    assert_eq!(h.root(&a).await.spent, 2);
}

#[tokio::test]
async fn concurrent_same_key_requests_apply_once() {
    let h = std::sync::Arc::new(Harness::start().await);
    let t = h.funded(1000).await;
    // Concurrent first attempts with one key create exactly one reservation.
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (h, t) = (h.clone(), t.clone());
        tasks.push(tokio::spawn(async move { h.reserve(&t, 10, json!({"idempotency_key": "burst"})).await }));
    }
    let mut ids = std::collections::HashSet::new();
    for task in tasks {
        let r = task.await.unwrap();
        ids.insert(r.assert_ok()["reservation_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1);
    assert_eq!(h.root(&t).await.reserved, 10);
    let rid = ids.into_iter().next().unwrap();
    let mut tasks = Vec::new();
    for _ in 0..16 {
        let (h, t, rid) = (h.clone(), t.clone(), rid.clone());
        let c = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 3}});
        tasks.push(tokio::spawn(async move { h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &c).await }));
    }
    for task in tasks {
        task.await.unwrap().assert_ok();
    }
    assert_eq!(h.root(&t).await.spent, 3);
}
