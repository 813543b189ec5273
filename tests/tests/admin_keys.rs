//! Operator plane: API keys (create, list, update, revoke), scope filters, introspection.

use cycles_shared::model::Unit;
use cycles_tests::*;

#[tokio::test]
async fn create_returns_the_secret_once_and_stores_only_a_digest() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let body = json!({"tenant_id": t.id, "name": "ci", "description": "for CI",
        "permissions": ["reservations:create", "balances:read"], "expires_at": "2099-01-01T00:00:00Z"});
    let r = h.admin("POST", "/v1/admin/api-keys", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert_no_nulls(&r.body, &r.raw);
    let secret = r.body["key_secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("cyc_live_"));
    assert_eq!(r.body["key_prefix"].as_str().unwrap(), &secret[..14]);
    assert_eq!(r.body["expires_at"], "2099-01-01T00:00:00.000Z");
    assert_eq!(r.body["permissions"], json!(["reservations:create", "balances:read"]));
    // listing never shows the secret or its digest
    let list = h.admin("GET", &format!("/v1/admin/api-keys?tenant_id={}", t.id), None).await;
    assert!(!list.raw.contains(&secret[14..]) && !list.raw.contains("digest"), "{}", list.raw);
    let keys = list.assert_ok()["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 2);
    let k = keys.iter().find(|k| k["key_id"] == r.body["key_id"]).unwrap();
    assert_eq!((k["status"].as_str(), k["description"].as_str()), (Some("ACTIVE"), Some("for CI")));
    // the new key works at once on the runtime plane, within its permissions
    let rt = h.get(&secret, &format!("/v1/balances?tenant={}", t.id)).await;
    rt.assert_ok();
    let created = h.admin("GET", &format!("/v1/admin/api-keys?tenant_id={}&status=REVOKED", t.id), None).await;
    assert_eq!(created.assert_ok()["keys"], json!([]));
    for bad in ["status=LOST", "limit=0", "sort_by=secret", "cursor=%%%"] {
        h.admin("GET", &format!("/v1/admin/api-keys?{bad}"), None).await.assert_error(400, "INVALID_REQUEST");
    }
    h.admin_as(&secret, "GET", "/v1/admin/api-keys", None).await.assert_error(401, "UNAUTHORIZED");
}

#[tokio::test]
async fn create_validates_and_checks_the_tenant() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let cases = [
        (json!({"tenant_id": t.id}), 400, "INVALID_REQUEST", "name"),
        (
            json!({"tenant_id": t.id, "name": "x", "permissions": ["budgets:fly"]}),
            400,
            "INVALID_REQUEST",
            "budgets:fly",
        ),
        (json!({"tenant_id": t.id, "name": "x", "expires_at": "yesterday"}), 400, "INVALID_REQUEST", "expires_at"),
        (
            json!({"tenant_id": t.id, "name": "x", "expires_at": "2001-01-01T00:00:00Z"}),
            400,
            "INVALID_REQUEST",
            "expires_at",
        ),
        (
            json!({"tenant_id": t.id, "name": "x", "scope_filter": ["galaxy:far"]}),
            400,
            "INVALID_REQUEST",
            "scope_filter",
        ),
        (json!({"tenant_id": t.id, "name": "x", "color": "red"}), 400, "INVALID_REQUEST", "color"),
        (json!({"tenant_id": "no-such-tenant", "name": "x"}), 400, "TENANT_NOT_FOUND", "Tenant"),
    ];
    for (body, status, code, word) in cases {
        let r = h.admin("POST", "/v1/admin/api-keys", Some(&body)).await;
        r.assert_error(status, code);
        assert!(r.body["message"].as_str().unwrap().contains(word), "{word}: {}", r.raw);
    }
    let r = h.admin_as(&t.key, "POST", "/v1/admin/api-keys", Some(&json!({"tenant_id": t.id, "name": "x"}))).await;
    r.assert_error(401, "UNAUTHORIZED");
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    let r = h.admin("POST", "/v1/admin/api-keys", Some(&json!({"tenant_id": t.id, "name": "x"}))).await;
    r.assert_error(400, "INVALID_REQUEST");
}

#[tokio::test]
async fn revocation_is_effective_on_the_next_request() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let path = format!("/v1/admin/api-keys/{}?reason=leaked", t.key_id);
    let r = h.admin("DELETE", &path, None).await;
    let body = r.assert_ok();
    assert_eq!((body["status"].as_str(), body["revoked_reason"].as_str()), (Some("REVOKED"), Some("leaked")));
    assert!(body["revoked_at"].is_string());
    h.reserve(&t, 1, json!({})).await.assert_error(401, "UNAUTHORIZED");
    h.commit(&t, &rid, 5).await.assert_error(401, "UNAUTHORIZED");
    h.admin("DELETE", &path, None).await.assert_error(409, "KEY_REVOKED");
    h.admin("DELETE", "/v1/admin/api-keys/aaaaaaaaaaaaaaaa", None).await.assert_error(404, "NOT_FOUND");
    // another key of the tenant can still settle the reservation (ownership is per tenant)
    let other = h.key(&t.id, None).await;
    let t2 = Tenant { key: other.secret, key_id: other.key_id, ..t.clone() };
    h.commit(&t2, &rid, 5).await.assert_ok();
    let events = h.all_events(&t.id).await;
    assert_eq!(events.iter().filter(|e| e["event_type"] == "api_key.revoked").count(), 1);
}

#[tokio::test]
async fn updates_replace_permissions_and_scope_filters() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let path = format!("/v1/admin/api-keys/{}", t.key_id);
    let r = h.admin("PATCH", &path, Some(&json!({"permissions": ["balances:read"], "name": "reader"}))).await;
    assert_eq!(r.assert_ok()["permissions"], json!(["balances:read"]));
    h.reserve(&t, 1, json!({})).await.assert_error(403, "FORBIDDEN");
    h.get(&t.key, &format!("/v1/balances?tenant={}", t.id)).await.assert_ok();
    let kinds: Vec<_> = h.all_events(&t.id).await.into_iter().map(|e| e["event_type"].clone()).collect();
    assert!(kinds.contains(&json!("api_key.permissions_changed")));
    h.admin("PATCH", &path, Some(&json!({"permissions": ["nope"]}))).await.assert_error(400, "INVALID_REQUEST");
    h.admin("PATCH", &path, Some(&json!({"key_id": "x"}))).await.assert_error(400, "INVALID_REQUEST");
    h.admin("PATCH", "/v1/admin/api-keys/bbbbbbbbbbbbbbbb", Some(&json!({"name": "x"})))
        .await
        .assert_error(404, "NOT_FOUND");
    // a scope filter limits what the key sees on the operator plane
    let body = json!({"scope_filter": ["agent:a"], "permissions": ["budgets:read", "balances:read"]});
    let r = h.admin("PATCH", &path, Some(&body)).await;
    assert_eq!(r.assert_ok()["scope_filter"], json!(["agent:a"]));
    h.budget(&t.id, &format!("tenant:{}/agent:a", t.id), Unit::Tokens, 10).await;
    let b = h.admin_as(&t.key, "GET", "/v1/balances", None).await;
    let scopes: Vec<_> = b.assert_ok()["balances"].as_array().unwrap().iter().map(|l| l["scope"].clone()).collect();
    assert_eq!(scopes, vec![json!(format!("tenant:{}/agent:a", t.id))]);
    let root = format!("/v1/admin/budgets/lookup?scope=tenant:{}&unit=TOKENS", t.id);
    h.admin_as(&t.key, "GET", &root, None).await.assert_error(403, "FORBIDDEN");
}

#[tokio::test]
async fn introspection_reports_capabilities() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let r = h.admin("GET", "/v1/auth/introspect", None).await;
    let admin = r.assert_ok();
    assert_eq!((admin["auth_type"].as_str(), admin["permissions"].clone()), (Some("admin"), json!(["*"])));
    assert!(admin["capabilities"].as_object().unwrap().values().all(|v| v == true));
    assert!(admin.get("tenant_id").is_none());
    let r = h.admin_as(&t.key, "GET", "/v1/auth/introspect", None).await;
    let tenant = r.assert_ok();
    assert_eq!((tenant["auth_type"].as_str(), tenant["tenant_id"].as_str()), (Some("tenant"), Some(t.id.as_str())));
    let caps = &tenant["capabilities"];
    assert_eq!((caps["view_reservations"].clone(), caps["manage_reservations"].clone()), (json!(true), json!(true)));
    for off in ["view_budgets", "view_tenants", "view_api_keys", "manage_tenants", "view_events", "view_overview"] {
        assert_eq!(caps[off], false, "{off}");
    }
    let key = h.key(&t.id, Some(vec!["admin:write".into(), "admin:read".into()])).await;
    let r = h.admin_as(&key.secret, "GET", "/v1/auth/introspect", None).await;
    let caps = &r.assert_ok()["capabilities"];
    assert_eq!((caps["manage_budgets"].clone(), caps["manage_tenants"].clone()), (json!(true), json!(false)));
    h.send_to(&h.admin_base, "GET", "/v1/auth/introspect", &[], None).await.assert_error(401, "UNAUTHORIZED");
    let forged = format!("cyc_live_{}_forged", t.key_id);
    h.admin_as(&forged, "GET", "/v1/auth/introspect", None).await.assert_error(401, "UNAUTHORIZED");
}

#[tokio::test]
async fn scope_filters_bind_the_runtime_plane_too() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let wide = h.reserve_ok(&t, 10, json!({"subject": {"tenant": t.id, "agent": "b"}})).await;
    let body = json!({"scope_filter": ["agent:a"]});
    h.admin("PATCH", &format!("/v1/admin/api-keys/{}", t.key_id), Some(&body)).await.assert_ok();
    let inside = json!({"subject": {"tenant": t.id, "agent": "A"}});
    let rid = h.reserve_ok(&t, 10, inside.clone()).await;
    h.commit(&t, &rid, 5).await.assert_ok();
    let outside = json!({"subject": {"tenant": t.id, "agent": "b"}});
    h.reserve(&t, 10, outside.clone()).await.assert_error(403, "FORBIDDEN");
    h.reserve(&t, 10, json!({})).await.assert_error(403, "FORBIDDEN");
    let mut dry = outside.clone();
    merge(&mut dry, json!({"dry_run": true}));
    h.reserve(&t, 10, dry).await.assert_error(403, "FORBIDDEN");
    h.commit(&t, &wide, 5).await.assert_error(403, "FORBIDDEN");
    h.release(&t, &wide).await.assert_error(403, "FORBIDDEN");
    let ev = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id, "agent": "b"},
        "action": {"kind": "tool", "name": "x"}, "actual": {"unit": "TOKENS", "amount": 1}});
    h.post(&t.key, "/v1/events", &ev).await.assert_error(403, "FORBIDDEN");
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (10, 5), "refused requests changed nothing");
}

/// A key's scope filter binds what it reads as strictly as what it writes, on both planes:
/// balances, one reservation, the reservation listing, ledgers, events and webhook deliveries
/// of scopes outside the filter are out of its sight.
#[tokio::test]
async fn scope_filters_bind_reads_on_both_planes() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let (eng, ops) = (format!("{root}/workspace:eng"), format!("{root}/workspace:ops"));
    for scope in [&root, &eng, &ops] {
        h.budget(&t.id, scope, Unit::Tokens, 1000).await;
    }
    let meta = json!({"metadata": {"secret": "ops-only"}});
    let mut ops_body = json!({"subject": {"tenant": t.id, "workspace": "ops"}});
    merge(&mut ops_body, meta.clone());
    let ops_rid = h.reserve_ok(&t, 10, ops_body).await;
    let eng_rid = h.reserve_ok(&t, 10, json!({"subject": {"tenant": t.id, "workspace": "eng"}})).await;
    let perms =
        ["reservations:list", "balances:read", "budgets:read", "events:read", "webhooks:read", "webhooks:write"];
    let k = h.key(&t.id, Some(perms.iter().map(|p| p.to_string()).collect())).await;
    let body = json!({"scope_filter": ["workspace:eng"]});
    h.admin("PATCH", &format!("/v1/admin/api-keys/{}", k.key_id), Some(&body)).await.assert_ok();
    let rx = cycles_tests::receiver::Receiver::start().await;
    let sub = json!({"url": rx.url, "event_types": ["budget.funded"]});
    let created = h.admin_as(&k.secret, "POST", "/v1/webhooks", Some(&sub)).await;
    assert_eq!(created.status, 201, "{}", created.raw);

    // runtime plane
    let scopes_of = |v: &serde_json::Value, list: &str, field: &str| -> Vec<String> {
        v[list].as_array().unwrap().iter().map(|b| b[field].as_str().unwrap().to_string()).collect()
    };
    let b = h.get(&k.secret, &format!("/v1/balances?tenant={}", t.id)).await;
    assert_eq!(scopes_of(b.assert_ok(), "balances", "scope_path"), vec![eng.clone()]);
    h.get(&k.secret, &format!("/v1/reservations/{ops_rid}")).await.assert_error(403, "FORBIDDEN");
    h.get(&k.secret, &format!("/v1/reservations/{eng_rid}")).await.assert_ok();
    for sort in ["", "&sort_by=reserved", "&sort_by=status&sort_dir=asc"] {
        let l = h.get(&k.secret, &format!("/v1/reservations?include=metadata{sort}")).await;
        assert_eq!(scopes_of(l.assert_ok(), "reservations", "scope_path"), vec![eng.clone()], "{sort}");
        assert!(!l.raw.contains("ops-only"));
    }
    // operator plane
    let b = h.admin_as(&k.secret, "GET", "/v1/balances", None).await;
    assert_eq!(scopes_of(b.assert_ok(), "balances", "scope"), vec![eng.clone()]);
    let b = h.admin_as(&k.secret, "GET", "/v1/admin/budgets", None).await;
    assert_eq!(scopes_of(b.assert_ok(), "ledgers", "scope"), vec![eng.clone()]);
    for scope in [&root, &eng, &ops] {
        let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}});
        let path = format!("/v1/admin/budgets/fund?scope={scope}&unit=TOKENS&tenant_id={}", t.id);
        h.admin("POST", &path, Some(&fund)).await.assert_ok();
    }
    let e = h.admin_as(&k.secret, "GET", "/v1/events?limit=100", None).await;
    let seen = e.assert_ok()["events"].as_array().unwrap().clone();
    assert!(!seen.is_empty() && seen.iter().all(|e| e["scope"] == json!(eng)), "{}", e.raw);
    h.deliver(&[&t.id]).await;
    let got = rx.received();
    assert_eq!(got.len(), 1, "only the admitted scope's event was delivered");
    assert_eq!(got[0].body["scope"], json!(eng));
}

#[tokio::test]
async fn validate_reports_usable_keys_and_why_others_are_not() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    let validate = |secret: String| {
        let h = &h;
        async move { h.admin("POST", "/v1/auth/validate", Some(&json!({"key_secret": secret}))).await }
    };
    let r = validate(t.key.clone()).await;
    let b = r.assert_ok();
    assert_eq!(
        (b["valid"].as_bool(), b["tenant_id"].as_str(), b["key_id"].as_str()),
        (Some(true), Some(t.id.as_str()), Some(t.key_id.as_str()))
    );
    assert!(b["permissions"].as_array().unwrap().iter().any(|p| p == "reservations:create"));
    assert!(b["expires_at"].is_string() && b.get("reason").is_none());
    // unknown keys, wrong secrets and malformed strings answer alike
    let wrong = format!("{}x", t.key);
    let unknown = "cyc_live_zzzzzzzzzzzzzzzz_secret".to_string();
    for bad in [wrong, unknown, "not-a-key".to_string()] {
        assert_eq!(validate(bad).await.assert_ok(), &json!({"valid": false, "tenant_id": "", "reason": "INVALID"}));
    }
    // a suspended tenant's key, then a revoked key: not usable, and why
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    let b = validate(t.key.clone()).await.assert_ok().clone();
    assert_eq!((b["valid"].as_bool(), b["reason"].as_str()), (Some(false), Some("TENANT_SUSPENDED")));
    h.admin("DELETE", &format!("/v1/admin/api-keys/{}", t.key_id), None).await.assert_ok();
    let b = validate(t.key.clone()).await.assert_ok().clone();
    assert_eq!(
        (b["valid"].as_bool(), b["reason"].as_str(), b["tenant_id"].as_str()),
        (Some(false), Some("REVOKED"), Some(t.id.as_str()))
    );
    // a key past its expiry
    let other = h.funded(1).await;
    let keys = cycles_shared::keys::TenantKeys::new(&other.id);
    let _: () = redis::AsyncCommands::hset(&mut h.store.conn(), keys.api_key(&other.key_id), "expires_at_ms", "1000")
        .await
        .unwrap();
    let b = validate(other.key.clone()).await.assert_ok().clone();
    assert_eq!((b["valid"].as_bool(), b["reason"].as_str()), (Some(false), Some("EXPIRED")));
    let _: () =
        redis::AsyncCommands::hset(&mut h.store.conn(), keys.api_key(&other.key_id), "expires_at_ms", "99999999999999")
            .await
            .unwrap();
    // admin key only; the body is required
    let r = h
        .send_to(
            &h.admin_base,
            "POST",
            "/v1/auth/validate",
            &[("x-cycles-api-key", &other.key)],
            Some(&json!({"key_secret": other.key}).to_string()),
        )
        .await;
    r.assert_error(401, "UNAUTHORIZED");
    h.admin("POST", "/v1/auth/validate", Some(&json!({}))).await.assert_error(400, "INVALID_REQUEST");
}

/// rotateApiKey (an extension): a new secret for the same key id, shown once; the previous one
/// keeps working for the grace period the caller chose (24 h by default) and then stops, on the
/// runtime plane and in validation alike; a second rotation ends the first one's grace at once.
#[tokio::test]
async fn a_rotated_key_keeps_its_previous_secret_for_the_grace_period_only() {
    let h = Harness::start().await;
    let t = h.funded(1_000).await;
    let works = |secret: String| {
        let (h, t) = (&h, &t);
        async move { h.get(&secret, &format!("/v1/balances?tenant={}", t.id)).await.status == 200 }
    };
    let valid = |secret: String| {
        let h = &h;
        async move {
            let r = h.admin("POST", "/v1/auth/validate", Some(&json!({"key_secret": secret}))).await;
            r.body["valid"] == true
        }
    };
    let rotate = |grace: Option<i64>| {
        let (h, id) = (&h, t.key_id.clone());
        async move {
            let body = grace.map(|g| json!({"grace_period_ms": g}));
            h.admin("POST", &format!("/v1/admin/api-keys/{id}/rotate"), body.as_ref()).await
        }
    };

    let r = rotate(None).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let first = r.body["key_secret"].as_str().unwrap().to_string();
    assert_eq!(r.body["key_id"], t.key_id.as_str());
    assert!(first.starts_with(&format!("cyc_live_{}_", t.key_id)) && first != t.key);
    assert_eq!(r.body["key_prefix"].as_str().unwrap(), &first[..14]);
    let until = r.body["previous_key_valid_until"].as_str().unwrap();
    let day = cycles_shared::domain::now_ms() + 86_400_000;
    let until_ms = cycles_shared::domain::parse_rfc3339_ms(until).unwrap();
    assert!((day - 5_000..=day).contains(&until_ms), "{until}: 24 h by default");
    assert!(works(t.key.clone()).await && works(first.clone()).await, "both secrets work during the grace");
    assert!(valid(t.key.clone()).await && valid(first.clone()).await);

    // a second rotation: the first rotation's previous secret (the original) stops at once
    let second = rotate(Some(1_500)).await.assert_ok()["key_secret"].as_str().unwrap().to_string();
    assert!(!works(t.key.clone()).await, "the original secret outlived a second rotation");
    assert!(works(first.clone()).await && works(second.clone()).await);
    tokio::time::sleep(std::time::Duration::from_millis(1_600)).await;
    assert!(!works(first.clone()).await && !valid(first.clone()).await, "the grace period ended");
    assert!(works(second.clone()).await && valid(second.clone()).await);
    // grace 0: the previous secret stops now; reserves go on with the new one
    let third = rotate(Some(0)).await.assert_ok()["key_secret"].as_str().unwrap().to_string();
    assert!(!works(second).await);
    let body = json!({"idempotency_key": "after-rotation", "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 5}});
    h.post(&third, "/v1/reservations", &body).await.assert_ok();

    // the secret is never stored, and the rotation is audited
    let stored: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(cycles_shared::keys::TenantKeys::new(&t.id).api_key(&t.key_id))
        .query_async(&mut h.store.conn())
        .await
        .unwrap();
    assert!(stored.values().all(|v| !v.contains(&third[14..])), "a secret was stored");
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={}&operation=rotateApiKey", t.id), None).await;
    assert_eq!(logs.assert_ok()["logs"].as_array().unwrap().len(), 3);

    // refusals: a grace out of range or an unknown field (400), an unknown key (404), a revoked
    // key (409), and a tenant key (401)
    rotate(Some(-1)).await.assert_error(400, "INVALID_REQUEST");
    rotate(Some(31 * 86_400_000)).await.assert_error(400, "INVALID_REQUEST");
    let path = format!("/v1/admin/api-keys/{}/rotate", t.key_id);
    h.admin("POST", &path, Some(&json!({"grace": 5}))).await.assert_error(400, "INVALID_REQUEST");
    h.admin("POST", "/v1/admin/api-keys/aaaaaaaaaaaaaaaa/rotate", None).await.assert_error(404, "NOT_FOUND");
    let tenant_key = h.send_to(&h.admin_base, "POST", &path, &[("x-cycles-api-key", &third)], None).await;
    assert_eq!(tenant_key.status, 401);
    h.admin("DELETE", &format!("/v1/admin/api-keys/{}", t.key_id), None).await.assert_ok();
    rotate(None).await.assert_error(409, "KEY_REVOKED");
    assert!(!works(third).await);
}

/// The key check inside every script reads one packed copy of the key's checked fields (its
/// `auth` field) instead of five fields: every write through the API keeps the copy equal to
/// them, and a record without it (written before the copy existed) is read field by field and
/// given its copy by the next request that may write (a read-only one never writes).
#[tokio::test]
async fn the_key_checks_packed_copy_follows_every_write() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let record = cycles_shared::keys::TenantKeys::new(&t.id).api_key(&t.key_id);
    let same = || h.key_check_copy_is_current(&t.id, &t.key_id);
    let created = same().await;
    assert!(created.contains("\u{1f}ACTIVE\u{1f}") && created.contains(",reservations:create,"), "{created}");

    // an update of the permissions and the scope filter: the next reserve is refused by them
    let path = format!("/v1/admin/api-keys/{}", t.key_id);
    let patch = json!({"permissions": ["balances:read"], "scope_filter": ["agent:a"]});
    h.admin("PATCH", &path, Some(&patch)).await.assert_ok();
    assert!(same().await.ends_with(",balances:read,\u{1f}[\"agent:a\"]"));
    h.reserve(&t, 1, json!({})).await.assert_error(403, "FORBIDDEN");
    let patch = json!({"permissions": ["reservations:create", "reservations:list"], "scope_filter": []});
    h.admin("PATCH", &path, Some(&patch)).await.assert_ok();
    same().await;
    let rid = h.reserve_ok(&t, 1, json!({})).await;

    // a record without its copy: a read answers from the fields and writes nothing; a reserve
    // answers too and gives the record its copy back
    let _: () = redis::cmd("HDEL").arg(&record).arg("auth").query_async(&mut h.store.conn()).await.unwrap();
    h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_ok();
    let copy: Option<String> =
        redis::cmd("HGET").arg(&record).arg("auth").query_async(&mut h.store.conn()).await.unwrap();
    assert_eq!(copy, None, "a read-only script wrote the copy");
    h.reserve_ok(&t, 1, json!({})).await;
    same().await;

    // a rotation: the new digest is checked at once
    let r =
        h.admin("POST", &format!("/v1/admin/api-keys/{}/rotate", t.key_id), Some(&json!({"grace_period_ms": 0}))).await;
    let secret = r.assert_ok()["key_secret"].as_str().unwrap().to_string();
    same().await;
    h.reserve(&t, 1, json!({})).await.assert_error(401, "UNAUTHORIZED");
    let rotated = Tenant { key: secret, ..t.clone() };
    h.reserve_ok(&rotated, 1, json!({})).await;

    // a revocation
    h.admin("DELETE", &path, None).await.assert_ok();
    assert!(same().await.contains("\u{1f}REVOKED\u{1f}"));
    h.reserve(&rotated, 1, json!({})).await.assert_error(401, "UNAUTHORIZED");
    assert_eq!(h.root(&t).await.reserved, 3);
}
