//! Operator identity (issue 29): named operator keys with roles, every route admitting exactly
//! the roles it names, rotation and revocation reaching every container within
//! `CYCLES_AUTH_CACHE_MS`, the operator named in every audit entry and event it causes, failed
//! operator keys throttled and audited, tenant patterns, the bootstrap switch, IAM principals.

use std::time::Duration;

use cycles_shared::api::{self, ApiRequest, App, Plane, ROUTES};
use cycles_shared::domain::roles::{Access, Role};
use cycles_shared::local::EmbeddedRedis;
use cycles_tests::*;
use serde_json::{json, Value};

fn concrete(template: &str) -> String {
    template.split('/').map(|s| if s.starts_with('{') { "matrix-missing" } else { s }).collect::<Vec<_>>().join("/")
}

#[tokio::test]
async fn every_route_admits_exactly_the_roles_it_names() {
    let h = Harness::start().await;
    let mut keys = vec![];
    for role in Role::ALL {
        keys.push((role, h.operator_key(role.as_str(), None).await.1));
    }
    let owner = keys[2].1.clone();
    for route in ROUTES {
        let base = if route.plane == Plane::Admin { &h.admin_base } else { &h.base };
        let path = concrete(route.template);
        // a malformed body: whatever passes authentication stops at the parser, changing nothing
        let body = (route.method != http::Method::GET).then_some("{");
        let send = |key: String| {
            let (http, path, method) = (&h.http, path.clone(), route.method.as_str());
            async move { send_with(http, base, method, &path, &[("x-admin-api-key", &key)], body).await }
        };
        match route.access.role() {
            Some(need) => {
                for (role, key) in &keys {
                    let r = send(key.clone()).await;
                    if *role < need {
                        r.assert_error(403, "INSUFFICIENT_PERMISSIONS");
                        let message = r.body["message"].as_str().unwrap();
                        assert!(message.contains(&format!("needs the {} role", need.as_str())), "{route:?}: {message}");
                    } else {
                        assert!(![401, 403].contains(&r.status), "{route:?} refused the {role:?} role: {}", r.raw);
                    }
                }
            }
            // operator credentials are not honoured where tenant keys alone are
            None if route.access == Access::Tenant => send(owner.clone()).await.assert_error(401, "UNAUTHORIZED"),
            None => assert_eq!(route.access, Access::Open),
        }
    }
}

/// Our extensions of the governance spec are written down in its style: every operation of the
/// operator-identity extension is in `docs/openapi/operator-identity.yaml`, and nothing else.
#[test]
fn the_extension_document_lists_exactly_its_operations() {
    let doc = include_str!("../../docs/openapi/operator-identity.yaml");
    let documented: std::collections::BTreeSet<&str> =
        doc.lines().filter_map(|l| l.trim().strip_prefix("operationId: ")).collect();
    let ours: std::collections::BTreeSet<&str> = ROUTES
        .iter()
        .filter(|r| r.template.starts_with("/v1/admin/operator-keys") || r.template.ends_with("/rotate"))
        .map(|r| r.operation)
        .collect();
    assert_eq!(documented, ours);
}

#[tokio::test]
async fn operator_keys_are_managed_by_owners_and_their_secrets_shown_once() {
    let h = Harness::start_configured(|c| c.auth_cache = Duration::ZERO).await;
    let name = unique("support");
    let r = h
        .admin(
            "POST",
            "/v1/admin/operator-keys",
            Some(&json!({"name": name, "role": "viewer",
        "description": "support desk"})),
        )
        .await;
    let created = r.assert_created().clone();
    let id = created["key_id"].as_str().unwrap().to_string();
    let secret = created["key_secret"].as_str().unwrap().to_string();
    assert_eq!(id.len(), 16);
    assert!(secret.starts_with(&format!("cyo_{id}_")) && secret.len() > 60, "{secret}");
    assert_eq!(created["key_prefix"].as_str().unwrap(), &secret[..10]);
    assert_eq!((created["role"].as_str(), created["status"].as_str()), (Some("viewer"), Some("ACTIVE")));
    assert_eq!(created["created_by"], "ADMIN_API_KEY");
    assert!(created["expires_at"].is_string() && created.get("digest").is_none());

    // shown once: reads carry neither the secret nor its digest; the store holds no secret
    let got = h.admin("GET", &format!("/v1/admin/operator-keys/{id}"), None).await.assert_ok().clone();
    assert!(got.get("key_secret").is_none() && got.get("digest").is_none() && got.get("last_used_at").is_none());
    let stored: std::collections::HashMap<String, String> = redis::cmd("HGETALL")
        .arg(cycles_shared::keys::TenantKeys::new("__admin__").operator_key(&id))
        .query_async(&mut h.store.conn())
        .await
        .unwrap();
    assert!(stored.values().all(|v| !v.contains(&secret[10..])), "a secret was stored");
    h.admin_with(&secret, "GET", "/v1/admin/tenants?limit=1", None).await.assert_ok();
    let used = h.admin("GET", &format!("/v1/admin/operator-keys/{id}"), None).await;
    assert!(used.assert_ok()["last_used_at"].is_string(), "{}", used.raw);
    let listed = h.admin("GET", &format!("/v1/admin/operator-keys?role=viewer&search={name}"), None).await;
    let keys = listed.assert_ok()["keys"].as_array().unwrap().clone();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys[0]["key_id"], id.as_str());
    assert!(keys[0].get("key_secret").is_none());

    // a role change takes effect at once here (no cache), and is audited with the roles
    let r = h.admin("PATCH", &format!("/v1/admin/operator-keys/{id}"), Some(&json!({"role": "operator"}))).await;
    assert_eq!(r.assert_ok()["role"], "operator");
    let create_tenant = json!({"tenant_id": unique("t"), "name": "by an operator"});
    h.admin_with(&secret, "POST", "/v1/admin/tenants", Some(&create_tenant)).await.assert_created();
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id=__admin__&resource_id={id}"), None).await;
    let ops: Vec<String> =
        logs.assert_ok()["logs"].as_array().unwrap().iter().map(|l| l["operation"].as_str().unwrap().into()).collect();
    assert!(ops.contains(&"createOperatorKey".into()) && ops.contains(&"updateOperatorKey".into()), "{ops:?}");

    // refusals, each changing nothing
    let bad = [
        json!({"name": "x", "role": "admin"}),
        json!({"name": "x", "role": "owner", "tenant_pattern": "acme-*"}),
        json!({"name": "x", "role": "viewer", "tenant_pattern": "a/b"}),
        json!({"name": "x", "role": "viewer", "expires_at": "2001-01-01T00:00:00Z"}),
        json!({"name": "", "role": "viewer"}),
        json!({"name": "x", "role": "viewer", "permissions": ["*"]}),
    ];
    for body in bad {
        h.admin("POST", "/v1/admin/operator-keys", Some(&body)).await.assert_error(400, "INVALID_REQUEST");
    }
    let promote = json!({"role": "owner", "tenant_pattern": "acme-*"});
    let r = h.admin("PATCH", &format!("/v1/admin/operator-keys/{id}"), Some(&promote)).await;
    r.assert_error(400, "INVALID_REQUEST");
    let after = h.admin("GET", &format!("/v1/admin/operator-keys/{id}"), None).await;
    assert_eq!(after.assert_ok()["role"], "operator");
    for (method, path) in [
        ("GET", "/v1/admin/operator-keys/aaaaaaaaaaaaaaaa"),
        ("PATCH", "/v1/admin/operator-keys/aaaaaaaaaaaaaaaa"),
        ("DELETE", "/v1/admin/operator-keys/aaaaaaaaaaaaaaaa"),
        ("POST", "/v1/admin/operator-keys/aaaaaaaaaaaaaaaa/rotate"),
    ] {
        let body = (method == "PATCH").then(|| json!({"name": "y"}));
        h.admin(method, path, body.as_ref()).await.assert_error(404, "NOT_FOUND");
    }

    // an expiry in the past of the clock: refused once it passes
    let soon = cycles_shared::domain::format_rfc3339_ms(cycles_shared::domain::now_ms() + 1_000);
    let r = h.admin("PATCH", &format!("/v1/admin/operator-keys/{id}"), Some(&json!({"expires_at": soon}))).await;
    r.assert_ok();
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    h.admin_with(&secret, "GET", "/v1/admin/tenants?limit=1", None).await.assert_error(401, "UNAUTHORIZED");
    let expired = h.admin("GET", &format!("/v1/admin/operator-keys/{id}"), None).await;
    assert_eq!(expired.assert_ok()["status"], "EXPIRED");

    // revocation: effective now (no cache), and final
    let (other, other_secret) = h.operator_key("viewer", None).await;
    let r = h.admin("DELETE", &format!("/v1/admin/operator-keys/{other}?reason=leaked"), None).await;
    let revoked = r.assert_ok();
    assert_eq!((revoked["status"].as_str(), revoked["revoked_reason"].as_str()), (Some("REVOKED"), Some("leaked")));
    h.admin_with(&other_secret, "GET", "/v1/admin/tenants", None).await.assert_error(401, "UNAUTHORIZED");
    h.admin("DELETE", &format!("/v1/admin/operator-keys/{other}"), None).await.assert_error(409, "KEY_REVOKED");
    h.admin("POST", &format!("/v1/admin/operator-keys/{other}/rotate"), None).await.assert_error(409, "KEY_REVOKED");
}

/// The status of an operator-plane read with `key` on `h`.
async fn reads(h: &Harness, key: &str) -> u16 {
    h.admin_with(key, "GET", "/v1/admin/tenants?limit=1", None).await.status
}

#[tokio::test]
async fn a_rotation_or_revocation_reaches_every_container_within_the_cache_bound() {
    const CACHE_MS: u64 = 300;
    let cache = |c: &mut cycles_shared::config::Config| c.auth_cache = Duration::from_millis(CACHE_MS);
    let a = Harness::start_configured(cache).await;
    let b = Harness::start_beside(&a, cache).await;
    let (id, old) = a.operator_key("viewer", None).await;
    assert_eq!(reads(&b, &old).await, 200, "b checked and now trusts the old secret");

    let r = a
        .admin("POST", &format!("/v1/admin/operator-keys/{id}/rotate"), Some(&json!({"grace_period_ms": 1_000})))
        .await;
    let rotated = r.assert_ok().clone();
    let new = rotated["key_secret"].as_str().unwrap().to_string();
    assert!(new.starts_with(&format!("cyo_{id}_")) && new != old);
    assert!(rotated["previous_key_valid_until"].is_string());
    assert_eq!((reads(&b, &old).await, reads(&b, &new).await), (200, 200), "both work during the grace");
    tokio::time::sleep(Duration::from_millis(1_000 + CACHE_MS + 200)).await;
    assert_eq!((reads(&a, &old).await, reads(&b, &old).await), (401, 401), "the grace ended everywhere");
    assert_eq!((reads(&a, &new).await, reads(&b, &new).await), (200, 200));

    // a role change and a revocation made on one container reach the other within the bound
    let create = |tenant: String| json!({"tenant_id": tenant, "name": "x"});
    let r = b.admin_with(&new, "POST", "/v1/admin/tenants", Some(&create(unique("t")))).await;
    r.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    a.admin("PATCH", &format!("/v1/admin/operator-keys/{id}"), Some(&json!({"role": "operator"}))).await.assert_ok();
    tokio::time::sleep(Duration::from_millis(CACHE_MS + 200)).await;
    b.admin_with(&new, "POST", "/v1/admin/tenants", Some(&create(unique("t")))).await.assert_created();
    a.admin("DELETE", &format!("/v1/admin/operator-keys/{id}"), None).await.assert_ok();
    tokio::time::sleep(Duration::from_millis(CACHE_MS + 200)).await;
    assert_eq!((reads(&a, &new).await, reads(&b, &new).await), (401, 401), "revoked everywhere");
}

#[tokio::test]
async fn every_change_and_refusal_names_the_operator_key() {
    let h = Harness::start().await;
    let (op_id, op) = h.operator_key("operator", None).await;
    let (viewer_id, viewer) = h.operator_key("viewer", None).await;
    let tenant = unique("t");
    let r = h.admin_with(&op, "POST", "/v1/admin/tenants", Some(&json!({"tenant_id": tenant, "name": "n"}))).await;
    r.assert_created();
    let r = h.admin_with(&op, "POST", "/v1/admin/api-keys", Some(&json!({"tenant_id": tenant, "name": "k"}))).await;
    r.assert_created();
    // the audit entries and the events of the changes name the key
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={tenant}"), None).await;
    let logs = logs.assert_ok()["logs"].as_array().unwrap().clone();
    assert!(logs.len() >= 2);
    for l in &logs {
        let actor = l["metadata"]["actor_type"].as_str();
        assert_eq!((l["key_id"].as_str(), actor), (Some(op_id.as_str()), Some("admin")), "{l}");
    }
    for event_type in ["tenant.created", "api_key.created"] {
        let events = h.admin_events(&tenant, event_type).await;
        assert_eq!(events.len(), 1, "{event_type}");
        assert_eq!(events[0]["actor"], json!({"type": "admin", "key_id": op_id}), "{event_type}");
    }
    // the bootstrap key is named too
    h.admin("PATCH", &format!("/v1/admin/tenants/{tenant}"), Some(&json!({"name": "renamed"}))).await.assert_ok();
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={tenant}&operation=updateTenant"), None).await;
    assert_eq!(logs.assert_ok()["logs"][0]["key_id"], "ADMIN_API_KEY");

    // a refusal: audited under the key, with the role it lacked, and nothing written
    let other = unique("t");
    let r = h.admin_with(&viewer, "POST", "/v1/admin/tenants", Some(&json!({"tenant_id": other, "name": "n"}))).await;
    r.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    h.admin("GET", &format!("/v1/admin/tenants/{other}"), None).await.assert_error(404, "TENANT_NOT_FOUND");
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?key_id={viewer_id}"), None).await;
    let logs = logs.assert_ok()["logs"].as_array().unwrap().clone();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(
        (logs[0]["status"].as_u64(), logs[0]["error_code"].as_str()),
        (Some(403), Some("INSUFFICIENT_PERMISSIONS"))
    );
    assert_eq!(logs[0]["operation"], "createTenant");
}

#[tokio::test]
async fn failed_operator_keys_are_throttled_alerted_and_audited() {
    let h = Harness::start_configured(|c| c.auth_failure_limit = 3).await;
    let (id, secret) = h.operator_key("viewer", None).await;
    let wrong = format!("cyo_{id}_{}", "x".repeat(43));
    let client = client_from(57);
    let headers = [("x-admin-api-key", wrong.as_str())];
    let attempt = || send_with(&client, &h.admin_base, "GET", "/v1/admin/tenants", &headers, None);
    for _ in 0..3 {
        attempt().await.assert_error(401, "UNAUTHORIZED");
    }
    let r = attempt().await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    assert!(r.headers.contains_key("retry-after"));
    // the key id is throttled from any address; the right secret is not a failure
    let elsewhere =
        send_with(&client_from(58), &h.admin_base, "GET", "/v1/admin/tenants", &[("x-admin-api-key", &wrong)], None)
            .await;
    elsewhere.assert_error(429, "LIMIT_EXCEEDED");
    h.admin_with(&secret, "GET", "/v1/admin/tenants?limit=1", None).await.assert_ok();

    // the audit log shows the failures by source, under the presented key id
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id=__unauth__&key_id={id}"), None).await;
    let logs = logs.assert_ok()["logs"].as_array().unwrap().clone();
    assert_eq!(logs.len(), 5, "{logs:?}");
    assert_eq!(logs.iter().filter(|l| l["source_ip"] == "127.0.0.57").count(), 4);
    // and api_key.auth_failed names the key (the deployment's own stream)
    let failed = h.admin_events("__system__", "api_key.auth_failed").await;
    assert!(failed.iter().any(|e| e["data"]["key_id"] == id.as_str()), "no auth_failed event for {id}");
}

#[tokio::test]
async fn an_operator_limited_to_some_tenants_reaches_only_those() {
    let h = Harness::start().await;
    let prefix = unique("acme");
    let mine = format!("{prefix}-eu");
    h.admin("POST", "/v1/admin/tenants", Some(&json!({"tenant_id": mine, "name": "mine"}))).await.assert_created();
    h.budget(&mine, &format!("tenant:{mine}"), cycles_shared::model::Unit::Tokens, 100).await;
    let theirs = h.funded(100).await;
    let (_, key) = h.operator_key("operator", Some(&format!("{prefix}-*"))).await;

    h.admin_with(&key, "GET", &format!("/v1/admin/budgets?tenant_id={mine}"), None).await.assert_ok();
    let fund =
        json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5}, "idempotency_key": unique("f")});
    let fund_path = |t: &str| format!("/v1/admin/budgets/fund?tenant_id={t}&scope=tenant:{t}&unit=TOKENS");
    h.admin_with(&key, "POST", &fund_path(&mine), Some(&fund)).await.assert_ok();
    // another tenant, named or reached through its resources, or none named: 403, nothing changed
    let forbidden = [
        ("GET", format!("/v1/admin/budgets?tenant_id={}", theirs.id), None),
        ("GET", "/v1/admin/tenants".to_string(), None),
        ("POST", fund_path(&theirs.id), Some(fund.clone())),
        ("PATCH", format!("/v1/admin/api-keys/{}?tenant_id={mine}", theirs.key_id), Some(json!({"name": "hijack"}))),
        ("DELETE", format!("/v1/admin/api-keys/{}?tenant_id={mine}", theirs.key_id), None),
    ];
    for (method, path, body) in forbidden {
        let r = h.admin_with(&key, method, &path, body.as_ref()).await;
        r.assert_error(403, "FORBIDDEN");
    }
    let event = &h.admin_events(&theirs.id, "tenant.created").await[0];
    let path = format!("/v1/admin/events/{}?tenant_id={mine}", event["event_id"].as_str().unwrap());
    h.admin_with(&key, "GET", &path, None).await.assert_error(403, "FORBIDDEN");
    assert_eq!(h.root(&theirs).await.allocated, 100, "their budget was funded");
    let keys = h.admin("GET", &format!("/v1/admin/api-keys?tenant_id={}", theirs.id), None).await;
    let k = &keys.assert_ok()["keys"][0];
    assert_eq!((k["name"].as_str(), k["status"].as_str()), (Some("test"), Some("ACTIVE")));
    // introspection tells the key what it is
    let me = h.admin_with(&key, "GET", "/v1/auth/introspect", None).await;
    assert_eq!(me.assert_ok()["tenant_pattern"], format!("{prefix}-*"));
}

#[tokio::test]
async fn the_bootstrap_key_can_be_switched_off_once_owners_exist() {
    // a store of its own: who is the last owner depends on every owner key of the store
    let a = Harness::start_with_redis(EmbeddedRedis::start(&[]).await.expect("redis-server"), |_| {}).await;
    let (first_id, first) = a.operator_key("owner", None).await;
    let b = Harness::start_beside(&a, |c| c.bootstrap_admin_key = false).await;
    b.admin("GET", "/v1/admin/tenants?limit=1", None).await.assert_error(401, "UNAUTHORIZED");
    b.admin_with(&first, "GET", "/v1/admin/tenants?limit=1", None).await.assert_ok();

    // the last owner cannot be revoked or demoted while the bootstrap key is off
    let path = format!("/v1/admin/operator-keys/{first_id}");
    b.admin_with(&first, "DELETE", &path, None).await.assert_error(409, "INVALID_REQUEST");
    let demote = json!({"role": "operator"});
    b.admin_with(&first, "PATCH", &path, Some(&demote)).await.assert_error(409, "INVALID_REQUEST");
    b.admin_with(&first, "GET", &path, None).await.assert_ok();

    // with a second owner it can; the second names the first as its creator
    let r = b.admin_with(&first, "POST", "/v1/admin/operator-keys", Some(&json!({"name": "n", "role": "owner"}))).await;
    let second = r.assert_created().clone();
    assert_eq!(second["created_by"], first_id.as_str());
    let second_secret = second["key_secret"].as_str().unwrap();
    let r = b.admin_with(second_secret, "PATCH", &path, Some(&demote)).await;
    assert_eq!(r.assert_ok()["role"], "operator");
    let second_path = format!("/v1/admin/operator-keys/{}", second["key_id"].as_str().unwrap());
    b.admin_with(second_secret, "DELETE", &second_path, None).await.assert_error(409, "INVALID_REQUEST");
    // where the bootstrap key is on, it is the way back in: the last owner may go
    a.admin("DELETE", &second_path, None).await.assert_ok();
}

#[tokio::test]
async fn iam_principals_get_the_role_their_table_names() {
    let h = Harness::start().await;
    let mut config = cycles_shared::config::Config::from_env(Some(&h.redis_url));
    config.redis_url = h.redis_url.clone();
    config.auth_failure_limit = 0;
    config.iam_roles = Ok(vec![
        ("arn:aws:sts::123456789012:assumed-role/Support/*".to_string(), Role::Viewer),
        ("arn:aws:iam::123456789012:role/Ops".to_string(), Role::Operator),
    ]);
    let app = App::new(config.open_store().await.unwrap(), config);
    let call = |method: &str, path: &str, principal: &str, body: Option<Value>| {
        let (app, principal) = (&app, principal.to_string());
        let (method, path) = (method.parse::<http::Method>().unwrap(), path.to_string());
        async move {
            let (route, params) = api::route(Plane::Admin, &method, &path).expect("a route");
            let req = ApiRequest {
                method,
                path,
                params,
                body: body.map(|b| b.to_string().into()).unwrap_or_default(),
                iam_principal: Some(principal),
                ..Default::default()
            };
            let res = api::handle(app, route, req).await;
            (res.status, serde_json::from_slice::<Value>(&res.body).unwrap_or(Value::Null))
        }
    };
    let support = "arn:aws:sts::123456789012:assumed-role/Support/alice";
    let ops = "arn:aws:iam::123456789012:role/Ops";
    assert_eq!(call("GET", "/v1/admin/tenants", support, None).await.0, 200);
    let tenant = unique("t");
    let create = json!({"tenant_id": tenant, "name": "n"});
    let (status, body) = call("POST", "/v1/admin/tenants", support, Some(create.clone())).await;
    assert_eq!((status, body["error"].as_str()), (403, Some("INSUFFICIENT_PERMISSIONS")), "{body}");
    let (status, body) = call("GET", "/v1/admin/tenants", "arn:aws:iam::999999999999:user/Mallory", None).await;
    assert_eq!((status, body["error"].as_str()), (403, Some("INSUFFICIENT_PERMISSIONS")), "{body}");
    assert!(body["message"].as_str().unwrap().contains("CYCLES_IAM_ROLES"));
    assert_eq!(call("POST", "/v1/admin/tenants", ops, Some(create)).await.0, 201);
    // the principal is who did it
    let events = h.admin_events(&tenant, "tenant.created").await;
    assert_eq!(events[0]["actor"]["key_id"], format!("iam:{ops}"));
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={tenant}"), None).await;
    assert_eq!(logs.assert_ok()["logs"][0]["key_id"], format!("iam:{ops}"));
}

#[tokio::test]
async fn the_console_read_pages_work_with_a_viewer_key() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let (_, viewer) = h.operator_key("viewer", None).await;
    let me = h.admin_with(&viewer, "GET", "/v1/auth/introspect", None).await;
    let me = me.assert_ok();
    assert_eq!((me["auth_type"].as_str(), me["role"].as_str()), (Some("admin"), Some("viewer")));
    let caps = me["capabilities"].as_object().unwrap();
    for (name, on) in caps {
        assert_eq!(on.as_bool(), Some(name.starts_with("view_")), "{name}");
    }
    let event_id = h.admin_events(&t.id, "tenant.created").await[0]["event_id"].as_str().unwrap().to_string();
    let pages = [
        "/v1/admin/overview".to_string(),
        "/v1/admin/tenants".to_string(),
        format!("/v1/admin/tenants/{}", t.id),
        format!("/v1/admin/budgets?tenant_id={}", t.id),
        format!("/v1/admin/budgets/lookup?tenant_id={0}&scope=tenant:{0}&unit=TOKENS", t.id),
        "/v1/admin/api-keys".to_string(),
        format!("/v1/admin/policies?tenant_id={}", t.id),
        "/v1/admin/webhooks".to_string(),
        "/v1/admin/events".to_string(),
        format!("/v1/admin/events/{event_id}"),
        format!("/v1/admin/action-quota-counters?tenant_id={}", t.id),
        "/v1/admin/audit/logs".to_string(),
        "/v1/admin/config/webhook-security".to_string(),
    ];
    for page in pages {
        let r = h.admin_with(&viewer, "GET", &page, None).await;
        assert_eq!(r.status, 200, "{page}: {}", r.raw);
    }
    let r = send_with(
        &h.http,
        &h.base,
        "GET",
        &format!("/v1/reservations?tenant={}", t.id),
        &[("x-admin-api-key", &viewer)],
        None,
    )
    .await;
    r.assert_ok();
    // and nothing it could change
    let fund =
        json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5}, "idempotency_key": unique("f")});
    let path = format!("/v1/admin/budgets/fund?tenant_id={0}&scope=tenant:{0}&unit=TOKENS", t.id);
    h.admin_with(&viewer, "POST", &path, Some(&fund)).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    assert_eq!(h.root(&t).await.allocated, 100);
}
