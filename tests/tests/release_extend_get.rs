//! releaseReservation, extendReservation, getReservation and expiry.

use std::time::Duration;

use cycles_shared::model::Unit;
use cycles_shared::provision::NewTenant;
use cycles_tests::*;

#[tokio::test]
async fn release_returns_the_whole_hold() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 300, json!({})).await;
    let body = json!({"idempotency_key": "r1", "reason": "not needed"});
    let r = h.post(&t.key, &format!("/v1/reservations/{rid}/release"), &body).await;
    let b = r.assert_ok();
    // Release returns the whole hold.
    assert_eq!(b["status"], "RELEASED");
    assert_eq!(b["released"], json!({"unit": "TOKENS", "amount": 300}));
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.reserved, l.spent), (1000, 0, 0));
    // Releasing again under another key, releasing a committed one, unknown ids.
    h.release(&t, &rid).await.assert_error(409, "RESERVATION_FINALIZED");
    let committed = h.reserve_ok(&t, 5, json!({})).await;
    h.commit(&t, &committed, 5).await.assert_ok();
    h.release(&t, &committed).await.assert_error(409, "RESERVATION_FINALIZED");
    h.release(&t, &format!("{}.AAAAAAAAAAAAAA.AAAAAAAA", t.id)).await.assert_error(404, "NOT_FOUND");
    // Reason longer than 256.
    let long = json!({"idempotency_key": "r2", "reason": "x".repeat(257)});
    let rid = h.reserve_ok(&t, 5, json!({})).await;
    h.post(&t.key, &format!("/v1/reservations/{rid}/release"), &long).await.assert_error(400, "INVALID_REQUEST");
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (5, 5));
}

#[tokio::test]
async fn release_window_includes_grace() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let inside = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 3000})).await;
    let after = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(Duration::from_millis(1300)).await;
    // Release works inside the grace period and is 410 after it.
    h.release(&t, &inside).await.assert_ok();
    h.release(&t, &after).await.assert_error(410, "RESERVATION_EXPIRED");
    assert_eq!(h.root(&t).await.reserved, 0);
}

#[tokio::test]
async fn extend_moves_expiry_relative_to_the_current_one() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let request =
        json!({"idempotency_key": "ext-1", "subject": {"tenant": t.id, "agent": "a", "dimensions": {"team": "x"}}});
    let r = h.reserve(&t, 10, request.clone()).await;
    let created = r.assert_ok().clone();
    let rid = created["reservation_id"].as_str().unwrap();
    let before = h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_ok().clone();
    let key = cycles_shared::keys::TenantKeys::new(&t.id).reservation(rid.split('.').nth(1).unwrap());
    let stored = || async { redis::cmd("GET").arg(&key).query_async::<String>(&mut h.store.conn()).await.unwrap() };
    let mut unextended = record_fields(&stored().await);
    let e = h.extend(&t, rid, 5000).await;
    let b = e.assert_ok();
    // Extend moves the expiry from the current one and keeps the reservation active.
    assert_eq!(b["status"], "ACTIVE");
    let expires = b["expires_at_ms"].as_i64().unwrap();
    assert_eq!(expires, created["expires_at_ms"].as_i64().unwrap() + 5000);
    let ttl = b["remaining_ttl_ms"].as_i64().unwrap();
    assert!(ttl > 60_000 && ttl <= 65_000, "{ttl}");
    // Nothing else changes.
    let after = h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_ok().clone();
    assert_eq!(after["expires_at_ms"].as_i64(), Some(expires));
    for f in ["reserved", "subject", "action", "scope_path", "affected_scopes", "created_at_ms", "status"] {
        assert_eq!(after[f], before[f], "{f} changed");
    }
    // Dimensions are echoed unchanged.
    assert_eq!(after["subject"]["dimensions"], json!({"team": "x"}));
    assert_eq!(h.root(&t).await.reserved, 10);

    // The stored record changes in three fields only: the expiry, the extension count, and (set
    // by the first extend, kept by the next) the expiry the reserve answered.
    let mut once = record_fields(&stored().await);
    h.extend(&t, rid, 1000).await.assert_ok();
    let mut twice = record_fields(&stored().await);
    let first = created["expires_at_ms"].as_i64().unwrap().to_string();
    assert_eq!(twice.remove("expires"), Some((expires + 1000).to_string()));
    assert_eq!(twice.remove("ext").as_deref(), Some("2"));
    assert_eq!(twice.remove("first_expires"), Some(first.clone()));
    assert_eq!(once.remove("first_expires"), Some(first));
    for fields in [&mut unextended, &mut once] {
        fields.remove("expires");
        fields.remove("ext");
    }
    assert_eq!(unextended.remove("first_expires"), None);
    assert_eq!(once, twice, "an extend changed another field of the record");
    assert_eq!(unextended, once, "the first extend changed another field of the record");
    // and the reserve's replay still answers the expiry it was given
    let replay = h.reserve(&t, 10, request).await;
    assert_eq!(replay.body["reservation_id"], rid);
    assert_eq!(replay.body["expires_at_ms"], created["expires_at_ms"]);
}

#[tokio::test]
async fn extend_has_no_grace_and_refuses_finalized_reservations() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 5000})).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Past expires_at but inside grace -> 410; the reservation can still be committed.
    h.extend(&t, &rid, 1000).await.assert_error(410, "RESERVATION_EXPIRED");
    h.commit(&t, &rid, 10).await.assert_ok();
    // A finalized reservation cannot be extended; an unknown one is 404.
    h.extend(&t, &rid, 1000).await.assert_error(409, "RESERVATION_FINALIZED");
    h.extend(&t, &format!("{}.AAAAAAAAAAAAAA.AAAAAAAA", t.id), 1000).await.assert_error(404, "NOT_FOUND");
    // extend_by_ms must be 1 to 86,400,000.
    let rid = h.reserve_ok(&t, 1, json!({})).await;
    for by in [0, 86_400_001, -5] {
        let body = json!({"idempotency_key": unique("e"), "extend_by_ms": by});
        let r = h.post(&t.key, &format!("/v1/reservations/{rid}/extend"), &body).await;
        r.assert_error(400, "INVALID_REQUEST");
        assert!(r.body["message"].as_str().unwrap().contains("extend_by_ms"));
    }
}

#[tokio::test]
async fn extension_count_is_limited() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 1, json!({})).await;
    // Ten extensions pass, the eleventh is refused.
    for _ in 0..10 {
        h.extend(&t, &rid, 1).await.assert_ok();
    }
    h.extend(&t, &rid, 1).await.assert_error(409, "MAX_EXTENSIONS_EXCEEDED");
    // A tenant setting lowers the limit (captured at creation).
    let t = h.tenant_with(NewTenant { max_reservation_extensions: Some(1), ..Default::default() }).await;
    h.budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, 10).await;
    let rid = h.reserve_ok(&t, 1, json!({})).await;
    h.extend(&t, &rid, 1).await.assert_ok();
    h.extend(&t, &rid, 1).await.assert_error(409, "MAX_EXTENSIONS_EXCEEDED");
}

#[tokio::test]
async fn get_returns_the_detail_and_410_once_expired() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let r = h
        .reserve(
            &t,
            10,
            json!({"idempotency_key": "get-1", "ttl_ms": 1000, "grace_period_ms": 0,
        "metadata": {"k": "v"}}),
        )
        .await;
    let rid = r.assert_ok()["reservation_id"].as_str().unwrap().to_string();
    let d = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    let d = d.assert_ok();
    // Required fields, optional ones absent on ACTIVE.
    for f in [
        "reservation_id",
        "status",
        "subject",
        "action",
        "reserved",
        "created_at_ms",
        "expires_at_ms",
        "scope_path",
        "affected_scopes",
    ] {
        assert!(d.get(f).is_some(), "missing {f}");
    }
    assert_eq!(d["status"], "ACTIVE");
    assert_eq!(d["idempotency_key"], "get-1");
    assert_eq!(d["metadata"], json!({"k": "v"}));
    for f in ["finalized_at_ms", "committed", "committed_metadata"] {
        assert!(d.get(f).is_none(), "unexpected {f}");
    }
    assert_eq!(d["expires_at_ms"].as_i64().unwrap() - d["created_at_ms"].as_i64().unwrap(), 1000);
    // Once past expires_at + grace the reservation is EXPIRED (410) and its hold is back.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_error(410, "RESERVATION_EXPIRED");
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (0, 1000));
    // unknown and oversized ids
    h.get(&t.key, &format!("/v1/reservations/{}.AAAAAAAAAAAAAA.AAAAAAAA", t.id)).await.assert_error(404, "NOT_FOUND");
    h.get(&t.key, &format!("/v1/reservations/{}", "y".repeat(129))).await.assert_error(400, "INVALID_REQUEST");
}

#[tokio::test]
async fn released_detail_has_finalized_time_but_no_committed() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.release(&t, &rid).await.assert_ok();
    let d = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    let d = d.assert_ok();
    assert_eq!(d["status"], "RELEASED");
    assert!(d["finalized_at_ms"].is_i64());
    assert!(d.get("committed").is_none());
}
