//! Operator plane: tenants (create, get, list, update, status machine) and the close cascade.

use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;

fn admin_event_types(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["source"] == "cycles-admin")
        .map(|e| e["event_type"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test]
async fn create_get_and_idempotent_retry() {
    let h = Harness::start().await;
    let id = unique("acme");
    let body = json!({"tenant_id": id, "name": "Acme", "metadata": {"tier": "gold"}, "max_reservation_extensions": 3});
    let r = h.admin("POST", "/v1/admin/tenants", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert_no_nulls(&r.body, &r.raw);
    assert_eq!(r.body["status"], "ACTIVE");
    assert_eq!(r.body["default_commit_overage_policy"], "ALLOW_IF_AVAILABLE");
    assert_eq!(r.body["default_reservation_ttl_ms"], 60000);
    assert_eq!(r.body["max_reservation_extensions"], 3);
    assert_eq!(r.body["metadata"]["tier"], "gold");
    assert!(r.body["created_at"].as_str().unwrap().ends_with('Z'));
    // same id and name: 200 with the stored tenant, no second event
    let again = h.admin("POST", "/v1/admin/tenants", Some(&body)).await;
    assert_eq!(again.status, 200, "{}", again.raw);
    assert_eq!(again.body["created_at"], r.body["created_at"]);
    assert_eq!(admin_event_types(&h.all_events(&id).await), ["tenant.created"]);
    // same id, other name: 409
    let other = json!({"tenant_id": id, "name": "Other"});
    h.admin("POST", "/v1/admin/tenants", Some(&other)).await.assert_error(409, "DUPLICATE_RESOURCE");
    let got = h.admin("GET", &format!("/v1/admin/tenants/{id}"), None).await;
    assert_eq!(got.assert_ok()["name"], "Acme");
    h.admin("GET", "/v1/admin/tenants/no-such-tenant", None).await.assert_error(404, "TENANT_NOT_FOUND");
}

#[tokio::test]
async fn create_validates_every_field_and_writes_nothing_on_error() {
    let h = Harness::start().await;
    let cases = [
        (json!({"name": "x"}), "tenant_id"),
        (json!({"tenant_id": "Bad_Id", "name": "x"}), "tenant_id"),
        (json!({"tenant_id": "ab", "name": "x"}), "tenant_id"),
        (json!({"tenant_id": "bulk-action", "name": "x"}), "reserved"),
        (json!({"tenant_id": "okay-id", "name": ""}), "name"),
        (json!({"tenant_id": "okay-id", "name": "x", "default_reservation_ttl_ms": 999}), "default_reservation_ttl_ms"),
        (json!({"tenant_id": "okay-id", "name": "x", "max_reservation_ttl_ms": 86400001}), "max_reservation_ttl_ms"),
        (json!({"tenant_id": "okay-id", "name": "x", "max_reservation_extensions": -1}), "max_reservation_extensions"),
        (
            json!({"tenant_id": "okay-id", "name": "x", "reservation_expiry_policy": "NEVER"}),
            "reservation_expiry_policy",
        ),
        (json!({"tenant_id": "okay-id", "name": "x", "surprise": 1}), "surprise"),
    ];
    for (body, field) in cases {
        let r = h.admin("POST", "/v1/admin/tenants", Some(&body)).await;
        r.assert_error(400, "INVALID_REQUEST");
        assert!(r.body["message"].as_str().unwrap().contains(field), "{field}: {}", r.raw);
    }
    let exists: bool = h.store.conn().exists(TenantKeys::new("okay-id").tenant()).await.unwrap();
    assert!(!exists, "a refused create leaves no record");
}

#[tokio::test]
async fn only_the_admin_key_reaches_tenant_routes() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let body = json!({"tenant_id": unique("x"), "name": "x"}).to_string();
    let path = "/v1/admin/tenants";
    h.send_to(&h.admin_base, "POST", path, &[], Some(&body)).await.assert_error(401, "UNAUTHORIZED");
    h.send_to(&h.admin_base, "POST", path, &[("x-admin-api-key", "wrong")], Some(&body))
        .await
        .assert_error(401, "UNAUTHORIZED");
    h.admin_as(&t.key, "GET", path, None).await.assert_error(401, "UNAUTHORIZED");
    // the runtime port does not serve the operator plane
    h.send("GET", path, &[("x-admin-api-key", ADMIN_KEY)], None).await.assert_error(404, "NOT_FOUND");
}

#[tokio::test]
async fn list_filters_sorts_and_pages() {
    let h = Harness::start().await;
    let tag = unique("ls");
    for i in 0..5 {
        let body = json!({"tenant_id": format!("{tag}-{i}"), "name": format!("{tag} name {i}")});
        assert_eq!(h.admin("POST", "/v1/admin/tenants", Some(&body)).await.status, 201);
    }
    let patch = json!({"status": "SUSPENDED"});
    h.admin("PATCH", &format!("/v1/admin/tenants/{tag}-3"), Some(&patch)).await.assert_ok();
    let mut seen = vec![];
    let mut path = format!("/v1/admin/tenants?search={tag}&sort_by=tenant_id&sort_dir=asc&limit=2");
    loop {
        let r = h.admin("GET", &path, None).await;
        let body = r.assert_ok().clone();
        seen.extend(body["tenants"].as_array().unwrap().iter().map(|t| t["tenant_id"].as_str().unwrap().to_string()));
        match body["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(body["has_more"], true);
                path = format!("/v1/admin/tenants?search={tag}&sort_by=tenant_id&sort_dir=asc&limit=2&cursor={c}");
            }
            None => break,
        }
    }
    assert_eq!(seen, (0..5).map(|i| format!("{tag}-{i}")).collect::<Vec<_>>());
    let r = h.admin("GET", &format!("/v1/admin/tenants?search={tag}&status=SUSPENDED"), None).await;
    let only: Vec<_> = r.assert_ok()["tenants"].as_array().unwrap().iter().map(|t| t["tenant_id"].clone()).collect();
    assert_eq!(only, vec![json!(format!("{tag}-3"))]);
    for bad in ["limit=0", "limit=-1", "limit=x", "sort_by=color", "sort_dir=up", "status=GONE", "cursor=%%%"] {
        h.admin("GET", &format!("/v1/admin/tenants?{bad}"), None).await.assert_error(400, "INVALID_REQUEST");
    }
    // a limit above the maximum is clamped to it (100), as consoles expect
    let r = h.admin("GET", &format!("/v1/admin/tenants?search={tag}&limit=100000"), None).await;
    assert_eq!(r.assert_ok()["tenants"].as_array().unwrap().len(), 5);
}

#[tokio::test]
async fn status_machine_and_settings_events() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let path = format!("/v1/admin/tenants/{}", t.id);
    let r = h.admin("PATCH", &path, Some(&json!({"status": "SUSPENDED"}))).await;
    assert!(r.assert_ok()["suspended_at"].is_string());
    // suspended: new work refused, the runtime guard reads the same record
    h.reserve(&t, 1, json!({})).await.assert_error(403, "FORBIDDEN");
    h.admin("PATCH", &path, Some(&json!({"status": "ACTIVE"}))).await.assert_ok();
    h.reserve_ok(&t, 1, json!({})).await;
    let r = h.admin("PATCH", &path, Some(&json!({"name": "Renamed", "max_reservation_extensions": 2}))).await;
    assert_eq!(r.assert_ok()["name"], "Renamed");
    assert_eq!(r.body["max_reservation_extensions"], 2);
    let events = h.all_events(&t.id).await;
    let kinds = admin_event_types(&events);
    assert!(kinds.ends_with(&[
        "tenant.suspended".into(),
        "tenant.reactivated".into(),
        "tenant.settings_changed".into()
    ]));
    let settings = events.iter().find(|e| e["event_type"] == "tenant.settings_changed").unwrap();
    assert_eq!(settings["data"]["changed_fields"], json!(["max_reservation_extensions", "name"]));
    // a PATCH that changes nothing writes no event
    let before = h.all_events(&t.id).await.len();
    h.admin("PATCH", &path, Some(&json!({"name": "Renamed"}))).await.assert_ok();
    assert_eq!(h.all_events(&t.id).await.len(), before);
    for (body, code) in [(json!({"status": "GONE"}), 400), (json!({"tenant_id": "x"}), 400), (json!({"name": ""}), 400)]
    {
        h.admin("PATCH", &path, Some(&body)).await.assert_error(code, "INVALID_REQUEST");
    }
    h.admin("PATCH", "/v1/admin/tenants/nobody-here", Some(&json!({"name": "x"})))
        .await
        .assert_error(404, "TENANT_NOT_FOUND");
}

#[tokio::test]
async fn closing_cascades_once_and_guards_every_mutation() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.budget(&t.id, &root, Unit::Tokens, 1000).await;
    h.budget(&t.id, &agent, Unit::Tokens, 500).await;
    let sub = json!({"subject": {"tenant": t.id, "agent": "a"}});
    let open = h.reserve_ok(&t, 100, sub.clone()).await;
    let done = h.reserve_ok(&t, 50, sub.clone()).await;
    let commit_body = json!({"idempotency_key": "before-close", "actual": {"unit": "TOKENS", "amount": 40}});
    let committed = h.post(&t.key, &format!("/v1/reservations/{done}/commit"), &commit_body).await;
    committed.assert_ok();

    let path = format!("/v1/admin/tenants/{}", t.id);
    let r = h.admin("PATCH", &path, Some(&json!({"status": "CLOSED"}))).await;
    assert_eq!(r.assert_ok()["status"], "CLOSED");
    assert!(r.body["closed_at"].is_string());

    // the hold of the open reservation returned exactly once; spend stays for audit
    for scope in [&root, &agent] {
        let l = h.ledger(&t.id, scope, Unit::Tokens).await;
        assert_eq!((l.reserved, l.spent), (0, 40), "{scope}");
        let b = h.admin("GET", &format!("/v1/admin/budgets/lookup?scope={scope}&unit=TOKENS"), None).await;
        assert_eq!(b.assert_ok()["status"], "CLOSED");
    }
    let record: String =
        h.store.conn().get(TenantKeys::new(&t.id).reservation(open.split('.').nth(1).unwrap())).await.unwrap();
    let record = record_fields(&record);
    assert_eq!((record["status"].as_str(), record["reason"].as_str()), ("RELEASED", "tenant_closed"));
    let exp: i64 = h.store.conn().zcard(TenantKeys::new(&t.id).expiry_index()).await.unwrap();
    assert_eq!(exp, 0);

    // keys are revoked: the runtime answers 401 from the very next request
    h.reserve(&t, 1, json!({})).await.assert_error(401, "UNAUTHORIZED");
    // mutations on owned objects: 409 TENANT_CLOSED; reads stay open
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}});
    h.admin("POST", &format!("/v1/admin/budgets/fund?scope={root}&unit=TOKENS&tenant_id={}", t.id), Some(&fund))
        .await
        .assert_error(409, "TENANT_CLOSED");
    let key = json!({"tenant_id": t.id, "name": "late"});
    h.admin("POST", "/v1/admin/api-keys", Some(&key)).await.assert_error(409, "TENANT_CLOSED");
    h.admin("PATCH", &path, Some(&json!({"status": "ACTIVE"}))).await.assert_error(409, "TENANT_CLOSED");
    h.admin("PATCH", &path, Some(&json!({"name": "zombie"}))).await.assert_error(409, "TENANT_CLOSED");
    h.admin("GET", &path, None).await.assert_ok();
    // admin-on-behalf-of release: the guard wins over RESERVATION_FINALIZED
    let rel = json!({"idempotency_key": "late-release"}).to_string();
    h.send("POST", &format!("/v1/reservations/{done}/release"), &[("x-admin-api-key", ADMIN_KEY)], Some(&rel))
        .await
        .assert_error(409, "TENANT_CLOSED");

    // cascade events once each; closing again is a no-op that writes nothing
    let kinds = admin_event_types(&h.all_events(&t.id).await);
    let count = |k: &str| kinds.iter().filter(|x| *x == k).count();
    assert_eq!(count("tenant.closed"), 1);
    assert_eq!(count("budget.closed_via_tenant_cascade"), 2);
    assert_eq!(count("reservation.released_via_tenant_cascade"), 2);
    assert_eq!(count("api_key.revoked_via_tenant_cascade"), 1);
    assert!(h.key_check_copy_is_current(&t.id, &t.key_id).await.contains("\u{1f}REVOKED\u{1f}"));
    let before = h.all_events(&t.id).await.len();
    h.admin("PATCH", &path, Some(&json!({"status": "CLOSED"}))).await.assert_ok();
    assert_eq!(h.all_events(&t.id).await.len(), before);
    let l = h.ledger(&t.id, &root, Unit::Tokens).await;
    assert_eq!((l.remaining, l.reserved, l.spent), (960, 0, 40));
}

#[tokio::test]
async fn an_interrupted_close_is_converged_by_the_sweep() {
    use cycles_shared::ops::tenants::{redrive_closes, CLOSING};
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    h.reserve_ok(&t, 100, json!({})).await;
    // simulate a crash right after the flip: CLOSED stored, cascade never ran
    let _: () = h.store.conn().zadd(CLOSING, &t.id, 0).await.unwrap();
    h.set_tenant(&t.id, &[("status", "CLOSED")]).await;
    assert_eq!(h.root(&t).await.reserved, 100);
    // what every maintenance sweep runs first
    let converged = redrive_closes(&h.store, std::time::Duration::from_secs(3600)).await.unwrap();
    assert!(converged >= 1);
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (0, 1000));
    let pending: Vec<String> = h.store.conn().zrange(CLOSING, 0, -1).await.unwrap();
    assert!(!pending.contains(&t.id));
}

/// The packed copy of a tenant's runtime fields (`runtime`, read by every runtime script
/// instead of the eight fields and its rules' digest) as the fields and rules say it should be.
async fn runtime_copy(h: &Harness, tenant: &str) -> (Option<String>, String) {
    const FIELDS: [&str; 8] = [
        "status",
        "default_reservation_ttl_ms",
        "max_reservation_ttl_ms",
        "max_reservation_extensions",
        "default_commit_overage_policy",
        "policies",
        "alerts",
        "observe_mode",
    ];
    let key = TenantKeys::new(tenant).tenant();
    let stored: Option<String> = h.store.conn().hget(&key, "runtime").await.unwrap();
    let fields: Vec<Option<String>> =
        redis::cmd("HMGET").arg(&key).arg(&FIELDS[..]).query_async(&mut h.store.conn()).await.unwrap();
    let mut expected = fields.into_iter().map(Option::unwrap_or_default).collect::<Vec<_>>();
    expected.push(h.rules_digest_is_current(tenant).await);
    (stored, expected.join("\u{1f}"))
}

#[tokio::test]
async fn every_write_of_a_tenants_runtime_fields_refreshes_its_packed_copy() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let check = |step: &'static str| {
        let (h, id) = (&h, t.id.clone());
        async move {
            let (stored, expected) = runtime_copy(h, &id).await;
            assert_eq!(stored.as_deref(), Some(expected.as_str()), "after {step}");
        }
    };
    check("create").await;
    let patch = json!({"default_reservation_ttl_ms": 120000, "max_reservation_extensions": 3,
        "default_commit_overage_policy": "REJECT"});
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&patch)).await.assert_ok();
    check("a settings update").await;
    let body = json!({"tenant_id": t.id, "name": "cap", "scope_pattern": format!("tenant:{}", t.id),
        "rate_limits": {"max_active_reservations": 5}});
    assert_eq!(h.admin("POST", "/v1/admin/policies", Some(&body)).await.status, 201);
    check("a policy").await;
    let sub = json!({"url": "http://127.0.0.1:9/x", "event_types": ["budget.threshold_crossed"],
        "thresholds": {"budget_utilization": [0.5]}});
    let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&sub)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    check("a subscription with thresholds").await;
    let id = r.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
    h.admin("DELETE", &format!("/v1/admin/webhooks/{id}"), None).await;
    check("the subscription's deletion").await;
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    check("a suspension").await;
    // and the runtime reads the copy: a suspended tenant starts no new work
    h.reserve(&t, 1, json!({})).await.assert_error(403, "FORBIDDEN");
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "ACTIVE"}))).await.assert_ok();
    check("a reactivation").await;
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"observe_mode": "OBSERVE"})))
        .await
        .assert_ok();
    check("observe mode").await;
    // observing, a denial is answered as an evaluation
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    assert_eq!(h.reserve(&t, 1, json!({})).await.assert_ok()["decision"], "DENY");
}

#[tokio::test]
async fn a_tenant_record_without_its_packed_copy_is_read_by_fields_and_given_one() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    // a record as written before the copy existed
    let key = TenantKeys::new(&t.id).tenant();
    let _: () = h.store.conn().hdel(&key, "runtime").await.unwrap();
    h.set_tenant(&t.id, &[("max_reservation_ttl_ms", "1000")]).await;
    let r = h.reserve(&t, 1, json!({"ttl_ms": 5000})).await;
    let body = r.assert_ok();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let ttl = body["expires_at_ms"].as_i64().unwrap() - now;
    assert!(ttl <= 1000, "the field as written caps the TTL (ttl {ttl})");
    let (stored, expected) = runtime_copy(&h, &t.id).await;
    assert_eq!(stored.as_deref(), Some(expected.as_str()), "the reserve folded the fields into the copy");
}

/// A runtime copy of the layout before the rules' digest (eight fields, no digest) is
/// read like a record without a copy, and made anew with the digest by the next write.
#[tokio::test]
async fn a_runtime_copy_without_the_rules_digest_is_read_by_fields_and_made_anew() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let body = json!({"tenant_id": t.id, "name": "cap", "scope_pattern": format!("tenant:{}", t.id),
        "caps": {"max_tokens": 7}});
    assert_eq!(h.admin("POST", "/v1/admin/policies", Some(&body)).await.status, 201);
    let key = TenantKeys::new(&t.id).tenant();
    let (stored, _) = runtime_copy(&h, &t.id).await;
    let old = stored.unwrap().rsplit_once('\u{1f}').unwrap().0.to_string();
    let _: () = h.store.conn().hset(&key, "runtime", &old).await.unwrap();
    let r = h.reserve(&t, 1, json!({})).await;
    assert_eq!(r.assert_ok()["caps"]["max_tokens"], 7, "the policy applies");
    h.rules_digest_is_current(&t.id).await;
    let (stored, expected) = runtime_copy(&h, &t.id).await;
    assert_eq!(stored.as_deref(), Some(expected.as_str()), "the reserve made the copy anew");
}
