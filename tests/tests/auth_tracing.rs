//! Authentication, tenancy, correlation headers, error shape and the closed-tenant guard.

use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;

#[tokio::test]
async fn every_answer_carries_request_and_trace_ids() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let ok = h.reserve(&t, 1, json!({})).await;
    let unauth = h.send("POST", "/v1/reservations", &[], Some("{}")).await;
    let unknown = h.send("GET", "/v1/nope", &[], None).await;
    let mut seen = std::collections::HashSet::new();
    // Every answer, success or error, carries a unique request id and a W3C trace id.
    for r in [&ok, &unauth, &unknown] {
        let rid = r.headers.get("x-request-id").expect("x-request-id");
        assert!(seen.insert(rid.clone()), "request ids are unique");
        let trace = r.headers.get("x-cycles-trace-id").expect("trace id");
        assert!(trace.len() == 32 && trace.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        assert_ne!(trace, &"0".repeat(32));
    }
    unauth.assert_error(401, "UNAUTHORIZED");
    unknown.assert_error(404, "NOT_FOUND");
    // X-Cycles-Tenant on tenant-key answers.
    assert_eq!(ok.headers.get("x-cycles-tenant"), Some(&t.id));
    // A client-supplied X-Request-Id is ignored.
    let r = h.send("GET", "/v1/nope", &[("x-request-id", "mine")], None).await;
    assert_ne!(r.headers["x-request-id"], "mine");
}

#[tokio::test]
async fn trace_id_precedence() {
    let h = Harness::start().await;
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let mine = "1234567890abcdef1234567890abcdef";
    let trace = |r: &Resp| r.headers["x-cycles-trace-id"].clone();
    // A valid traceparent wins over X-Cycles-Trace-Id and is echoed in the body.
    let r = h.send("GET", "/v1/x", &[("traceparent", tp), ("x-cycles-trace-id", mine)], None).await;
    assert_eq!(trace(&r), "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(r.body["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    // Without a traceparent, a valid X-Cycles-Trace-Id is kept.
    let r = h.send("GET", "/v1/x", &[("x-cycles-trace-id", mine)], None).await;
    assert_eq!(trace(&r), mine);
    // Malformed values fall through and are never rejected
    let bad_tp = "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01";
    let r = h.send("GET", "/v1/x", &[("traceparent", bad_tp), ("x-cycles-trace-id", mine)], None).await;
    assert_eq!(trace(&r), mine);
    let t = h.funded(10).await;
    let r = h
        .send(
            "POST",
            "/v1/reservations",
            &[("x-cycles-api-key", &t.key), ("traceparent", "garbage"), ("x-cycles-trace-id", &"0".repeat(32))],
            Some(
                &json!({"idempotency_key": "k", "subject": {"tenant": t.id},
        "action": {"kind": "k", "name": "n"}, "estimate": {"unit": "TOKENS", "amount": 1}})
                .to_string(),
            ),
        )
        .await;
    r.assert_ok();
    assert_ne!(trace(&r), "0".repeat(32));
}

#[tokio::test]
async fn missing_unknown_revoked_and_expired_keys_are_401() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let rid = h.reserve_ok(&t, 1, json!({})).await;
    let body = json!({"idempotency_key": "k", "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
        "estimate": {"unit": "TOKENS", "amount": 1}});
    let forged = format!("cyc_live_{}_not-the-secret", t.key_id);
    let unknown = "cyc_live_zzzzzzzzzzzzzzzz_whatever";
    // Every failure has the same 401 body (apart from ids).
    let mut messages = std::collections::HashSet::new();
    for key in [None, Some("garbage"), Some(unknown), Some(forged.as_str())] {
        let headers: Vec<(&str, &str)> = key.map(|k| vec![("x-cycles-api-key", k)]).unwrap_or_default();
        let r = h.send("POST", "/v1/reservations", &headers, Some(&body.to_string())).await;
        r.assert_error(401, "UNAUTHORIZED");
        messages.insert(r.body["message"].to_string());
        let r = h.send("GET", &format!("/v1/reservations/{rid}"), &headers, None).await;
        r.assert_error(401, "UNAUTHORIZED");
    }
    assert_eq!(messages.len(), 1, "uniform 401 bodies");
    // 401 precedes 400: a bad body with a bad key is still 401.
    h.send("POST", "/v1/reservations", &[("x-cycles-api-key", unknown)], Some("{"))
        .await
        .assert_error(401, "UNAUTHORIZED");
    // Revocation takes effect on the very next request (checked inside the script). The
    // fields are written by hand here, so the record's packed copy of them goes too (a record
    // without it is read field by field, as one written before it existed).
    let key_record = TenantKeys::new(&t.id).api_key(&t.key_id);
    let _: () = h.store.conn().hdel(&key_record, "auth").await.unwrap();
    let _: () = h.store.conn().hset(&key_record, "status", "REVOKED").await.unwrap();
    h.post(&t.key, "/v1/reservations", &body).await.assert_error(401, "UNAUTHORIZED");
    h.commit(&t, &rid, 1).await.assert_error(401, "UNAUTHORIZED");
    // Expired keys.
    let _: () =
        h.store.conn().hset_multiple(&key_record, &[("status", "ACTIVE"), ("expires_at_ms", "1")]).await.unwrap();
    let _: () = h.store.conn().hdel(&key_record, "auth").await.unwrap();
    h.post(&t.key, "/v1/reservations", &body).await.assert_error(401, "UNAUTHORIZED");
    assert_eq!(h.root(&t).await.reserved, 1);
}

#[tokio::test]
async fn permissions_are_enforced() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let read_only = h.key(&t.id, Some(vec!["reservations:list".into()])).await;
    let r = h
        .post(
            &read_only.secret,
            "/v1/reservations",
            &json!({"idempotency_key": "k", "subject": {"tenant": t.id},
        "action": {"kind": "k", "name": "n"}, "estimate": {"unit": "TOKENS", "amount": 1}}),
        )
        .await;
    r.assert_error(403, "FORBIDDEN");
    let rid = h.reserve_ok(&t, 1, json!({})).await;
    h.get(&read_only.secret, &format!("/v1/reservations/{rid}")).await.assert_ok();
    let c = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 1}});
    h.post(&read_only.secret, &format!("/v1/reservations/{rid}/commit"), &c).await.assert_error(403, "FORBIDDEN");
    let writer = h.key(&t.id, Some(vec!["admin:write".into()])).await;
    h.post(&writer.secret, &format!("/v1/reservations/{rid}/commit"), &c).await.assert_ok();
}

#[tokio::test]
async fn other_tenants_reservations_are_403_and_unknown_ones_404() {
    let h = Harness::start().await;
    let a = h.funded(100).await;
    let b = h.funded(100).await;
    let rid = h.reserve_ok(&a, 10, json!({})).await;
    // On every reservation route.
    h.get(&b.key, &format!("/v1/reservations/{rid}")).await.assert_error(403, "FORBIDDEN");
    h.commit(&b, &rid, 1).await.assert_error(403, "FORBIDDEN");
    h.release(&b, &rid).await.assert_error(403, "FORBIDDEN");
    h.extend(&b, &rid, 1).await.assert_error(403, "FORBIDDEN");
    // a well-formed id naming another tenant that has no such reservation: 404 (existence first)
    let ghost = format!("{}.AAAAAAAAAAAAAA.AAAAAAAA", a.id);
    h.commit(&b, &ghost, 1).await.assert_error(404, "NOT_FOUND");
    // an unauthenticated caller learns nothing about existence
    let forged = format!("cyc_live_{}_wrong", b.key_id);
    let r = h.send("GET", &format!("/v1/reservations/{rid}"), &[("x-cycles-api-key", &forged)], None).await;
    r.assert_error(401, "UNAUTHORIZED");
    let l = h.root(&a).await;
    assert_eq!((l.reserved, l.spent), (10, 0));
}

#[tokio::test]
async fn admin_key_works_only_on_get_and_release() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let admin = [("x-admin-api-key", ADMIN_KEY)];
    // The admin key may read a reservation of any tenant (no tenant header: it acts for none).
    let r = h.send("GET", &format!("/v1/reservations/{rid}"), &admin, None).await;
    assert_eq!(r.assert_ok()["reservation_id"], rid.as_str());
    assert!(!r.headers.contains_key("x-cycles-tenant"));
    // Ignored on commit/extend/reserve -> 401 without a tenant key.
    let c = json!({"idempotency_key": "c", "actual": {"unit": "TOKENS", "amount": 1}}).to_string();
    h.send("POST", &format!("/v1/reservations/{rid}/commit"), &admin, Some(&c)).await.assert_error(401, "UNAUTHORIZED");
    h.send("POST", "/v1/reservations", &admin, Some("{}")).await.assert_error(401, "UNAUTHORIZED");
    // wrong admin key: 401, no fallback to a tenant key
    let r = h
        .send(
            "GET",
            &format!("/v1/reservations/{rid}"),
            &[("x-admin-api-key", "nope"), ("x-cycles-api-key", &t.key)],
            None,
        )
        .await;
    r.assert_error(401, "UNAUTHORIZED");
    // Admin release writes an audit entry atomically.
    let body = json!({"idempotency_key": "admin-r", "reason": "[INCIDENT_FORCE_RELEASE] stuck"}).to_string();
    let r = h.send("POST", &format!("/v1/reservations/{rid}/release"), &admin, Some(&body)).await;
    r.assert_ok();
    let again = h.send("POST", &format!("/v1/reservations/{rid}/release"), &admin, Some(&body)).await;
    assert_eq!(again.raw, r.raw);
    let audit = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={}&resource_id={rid}", t.id), None).await;
    let audit = audit.assert_ok()["logs"].as_array().unwrap().clone();
    assert_eq!(audit.len(), 1, "replays write no second audit entry");
    let entry = &audit[0];
    assert_eq!(
        (entry["operation"].as_str(), entry["resource_type"].as_str()),
        (Some("releaseReservation"), Some("reservation"))
    );
    assert_eq!(entry["metadata"]["actor_type"], "admin_on_behalf_of");
    assert_eq!(entry["metadata"]["reason"], "[INCIDENT_FORCE_RELEASE] stuck");
    assert_eq!(entry["request_id"], r.headers["x-request-id"].as_str());
    assert_eq!(h.root(&t).await.reserved, 0);
}

#[tokio::test]
async fn closed_tenant_guard() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let open = h.reserve_ok(&t, 10, json!({})).await;
    let committed = h.reserve_ok(&t, 10, json!({})).await;
    let c = json!({"idempotency_key": "pre-close", "actual": {"unit": "TOKENS", "amount": 5}});
    let before = h.post(&t.key, &format!("/v1/reservations/{committed}/commit"), &c).await;
    before.assert_ok();
    let replay_reserve = json!({"idempotency_key": "pre-close-r"});
    let pre = h.reserve(&t, 1, replay_reserve.clone()).await;
    pre.assert_ok();
    let pre_decide = json!({"idempotency_key": "pre-d", "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
        "estimate": {"unit": "TOKENS", "amount": 1}});
    let decided = h.post(&t.key, "/v1/decide", &pre_decide).await;
    h.set_tenant(&t.id, &[("status", "CLOSED")]).await;
    // Fresh mutations -> 409 TENANT_CLOSED.
    h.reserve(&t, 1, json!({})).await.assert_error(409, "TENANT_CLOSED");
    h.commit(&t, &open, 1).await.assert_error(409, "TENANT_CLOSED");
    h.release(&t, &open).await.assert_error(409, "TENANT_CLOSED");
    h.extend(&t, &open, 1).await.assert_error(409, "TENANT_CLOSED");
    let admin = [("x-admin-api-key", ADMIN_KEY)];
    let body = json!({"idempotency_key": "adm"}).to_string();
    h.send("POST", &format!("/v1/reservations/{open}/release"), &admin, Some(&body))
        .await
        .assert_error(409, "TENANT_CLOSED");
    // Precedence over RESERVATION_FINALIZED.
    h.commit(&t, &committed, 1).await.assert_error(409, "TENANT_CLOSED");
    // Replays of pre-close successes still answer.
    let replay = h.post(&t.key, &format!("/v1/reservations/{committed}/commit"), &c).await;
    assert_eq!(replay.raw, before.raw);
    h.reserve(&t, 1, replay_reserve).await.assert_ok();
    assert_eq!(h.post(&t.key, "/v1/decide", &pre_decide).await.raw, decided.raw);
    // Evaluations DENY, never 409.
    let r = h.reserve(&t, 1, json!({"dry_run": true})).await;
    assert_eq!((r.body["decision"].as_str(), r.body["reason_code"].as_str()), (Some("DENY"), Some("TENANT_CLOSED")));
    // Reads keep working.
    h.get(&t.key, &format!("/v1/reservations/{open}")).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (11, 5));
}

#[tokio::test]
async fn malformed_tenant_records_fail_closed_and_missing_ones_are_unguarded() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    // Unknown status (even lower-case) -> 500 on both surfaces.
    for status in ["closed", "WEIRD"] {
        h.set_tenant(&t.id, &[("status", status)]).await;
        h.reserve(&t, 1, json!({})).await.assert_error(500, "INTERNAL_ERROR");
        h.reserve(&t, 1, json!({"dry_run": true})).await.assert_error(500, "INTERNAL_ERROR");
        h.commit(&t, &rid, 1).await.assert_error(500, "INTERNAL_ERROR");
    }
    let _: () = h.store.conn().hdel(TenantKeys::new(&t.id).tenant(), "status").await.unwrap();
    h.reserve(&t, 1, json!({})).await.assert_error(500, "INTERNAL_ERROR");
    // No tenant record at all -> not guarded.
    let _: () = h.store.conn().del(TenantKeys::new(&t.id).tenant()).await.unwrap();
    h.reserve(&t, 1, json!({})).await.assert_ok();
    assert_eq!(h.ledger(&t.id, &format!("tenant:{}", t.id), Unit::Tokens).await.reserved, 11);
}

#[tokio::test]
async fn suspended_tenants_settle_but_do_not_start_new_work() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.set_tenant(&t.id, &[("status", "SUSPENDED")]).await;
    // A suspended tenant: new reservations refused, evaluations DENY, existing work settles.
    h.reserve(&t, 1, json!({})).await.assert_error(403, "FORBIDDEN");
    assert_eq!(h.reserve(&t, 1, json!({"dry_run": true})).await.body["reason_code"], "TENANT_SUSPENDED");
    h.commit(&t, &rid, 10).await.assert_ok();
    assert_eq!(h.root(&t).await.spent, 10);
}

#[tokio::test]
async fn unknown_query_parameters_and_bodies_on_gets_are_ignored() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let rid = h.reserve_ok(&t, 1, json!({})).await;
    // Unknown query parameters are ignored.
    h.get(&t.key, &format!("/v1/reservations/{rid}?whatever=1&x")).await.assert_ok();
}

#[tokio::test]
async fn oversized_bodies_are_refused() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let big = format!("{{\"metadata\": \"{}\"}}", "x".repeat(2 << 20));
    let r = h.send("POST", "/v1/reservations", &[("x-cycles-api-key", &t.key)], Some(&big)).await;
    assert_eq!(r.status, 413);
    assert_error_shape(&r);
}

#[tokio::test]
async fn undeclared_methods_get_405_with_allow() {
    let h = Harness::start().await;
    let r = h.send("DELETE", "/v1/reservations", &[], None).await;
    r.assert_error(405, "INVALID_REQUEST");
    assert_eq!(r.headers.get("allow").map(String::as_str), Some("GET, POST"));
    h.send("PUT", "/v1/nothing-here", &[], None).await.assert_error(404, "NOT_FOUND");
}
