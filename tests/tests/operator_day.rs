//! An operator's whole day against the local gateway (the handlers `cycles-local` serves):
//! create, fund, edit policies and security settings, reset at period end in bulk, query and
//! export the audit log, read the overview. Nothing answers 404 or 405, and each step does what
//! it says.

use cycles_tests::*;
use serde_json::Value;

/// One operator call that must succeed (2xx), never a missing route.
async fn call(h: &Harness, method: &str, path: &str, body: Option<Value>) -> Value {
    let r = h.admin(method, path, body.as_ref()).await;
    assert!(r.status != 404 && r.status != 405, "{method} {path}: {}", r.raw);
    assert!((200..300).contains(&r.status), "{method} {path}: {} {}", r.status, r.raw);
    r.body.clone()
}

#[tokio::test]
async fn an_operators_day_runs_end_to_end() {
    let h = Harness::start().await;
    let tenant = unique("day");
    // morning: onboarding
    call(&h, "POST", "/v1/admin/tenants", Some(json!({"tenant_id": tenant, "name": "Day Corp"}))).await;
    let key = call(&h, "POST", "/v1/admin/api-keys", Some(json!({"tenant_id": tenant, "name": "agents"}))).await;
    let secret = key["key_secret"].as_str().unwrap().to_string();
    let valid = call(&h, "POST", "/v1/auth/validate", Some(json!({"key_secret": secret}))).await;
    assert_eq!((valid["valid"].as_bool(), valid["tenant_id"].as_str()), (Some(true), Some(tenant.as_str())));
    for scope in [format!("tenant:{tenant}"), format!("tenant:{tenant}/workspace:eng")] {
        let body = json!({"tenant_id": tenant, "scope": scope, "unit": "TOKENS",
            "allocated": {"unit": "TOKENS", "amount": 10_000}});
        call(&h, "POST", "/v1/admin/budgets", Some(body)).await;
    }
    let fund =
        json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5_000}, "idempotency_key": "topup-1"});
    call(
        &h,
        "POST",
        &format!("/v1/admin/budgets/fund?scope=tenant:{tenant}&unit=TOKENS&tenant_id={tenant}"),
        Some(fund),
    )
    .await;

    // policies and security settings
    let policy = call(
        &h,
        "POST",
        "/v1/admin/policies",
        Some(
            json!({"tenant_id": tenant, "name": "eng caps", "scope_pattern": format!("tenant:{tenant}/workspace:eng"),
            "caps": {"max_tokens": 2048}}),
        ),
    )
    .await;
    let id = policy["policy_id"].as_str().unwrap();
    call(&h, "PATCH", &format!("/v1/admin/policies/{id}"), Some(json!({"priority": 7}))).await;
    let listed = call(&h, "GET", &format!("/v1/admin/policies?tenant_id={tenant}"), None).await;
    assert_eq!(listed["policies"][0]["priority"], 7);
    let security = call(&h, "GET", "/v1/admin/config/webhook-security", None).await;
    call(&h, "PUT", "/v1/admin/config/webhook-security", Some(security.clone())).await;
    // (the setting is deployment-wide; tests sharing a Redis Cluster must not inherit it)
    let setting = cycles_shared::ops::settings::WEBHOOK_SECURITY;
    let _: () = redis::AsyncCommands::del(&mut h.store.conn(), setting).await.unwrap();

    // the agents work through the day
    let t = Tenant { id: tenant.clone(), key: secret, key_id: key["key_id"].as_str().unwrap().to_string() };
    let eng = json!({"subject": {"tenant": tenant, "workspace": "eng"}});
    for _ in 0..3 {
        let r = h.reserve(&t, 1_000, eng.clone()).await;
        assert_eq!(r.assert_ok()["decision"], "ALLOW_WITH_CAPS", "the policy's caps reach the agents");
        let rid = r.body["reservation_id"].as_str().unwrap().to_string();
        h.commit(&t, &rid, 900).await.assert_ok();
    }

    // evening: period end, reset every ledger below the tenant in one bulk action
    let filter = json!({"tenant_id": tenant, "scope_prefix": format!("tenant:{tenant}")});
    let preview =
        call(&h, "GET", &format!("/v1/admin/budgets?tenant_id={tenant}&scope_prefix=tenant:{tenant}"), None).await;
    let count = preview["ledgers"].as_array().unwrap().len();
    let reset = json!({"filter": filter, "action": "RESET_SPENT", "amount": {"unit": "TOKENS", "amount": 10_000},
        "expected_count": count, "idempotency_key": unique("period")});
    let done = call(&h, "POST", "/v1/admin/budgets/bulk-action", Some(reset)).await;
    assert_eq!(done["succeeded"].as_array().unwrap().len(), 2);
    let root = h.ledger(&tenant, &format!("tenant:{tenant}"), cycles_shared::model::Unit::Tokens).await;
    assert_eq!((root.spent, root.allocated, root.remaining), (0, 10_000, 10_000));

    // the audit: query, then export every entry of the tenant page by page
    let mut exported = vec![];
    let mut path = format!("/v1/admin/audit/logs?tenant_id={tenant}&limit=5");
    loop {
        let page = call(&h, "GET", &path, None).await;
        exported.extend(page["logs"].as_array().unwrap().iter().cloned());
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/admin/audit/logs?tenant_id={tenant}&limit=5&cursor={c}"),
            None => break,
        }
    }
    let operations: Vec<&str> = exported.iter().filter_map(|e| e["operation"].as_str()).collect();
    for op in [
        "createTenant",
        "createApiKey",
        "createBudget",
        "fundBudget",
        "createPolicy",
        "updatePolicy",
        "bulkActionBudgets",
    ] {
        assert!(operations.contains(&op), "{op} missing from the export: {operations:?}");
    }
    let mut ids: Vec<&str> = exported.iter().map(|e| e["log_id"].as_str().unwrap()).collect();
    ids.dedup();
    assert_eq!(ids.len(), exported.len(), "each entry exported once");

    // the dashboard, and who may see what
    let overview = call(&h, "GET", "/v1/admin/overview", None).await;
    assert!(overview["tenant_counts"]["total"].as_i64().unwrap() >= 1);
    let me = call(&h, "GET", "/v1/auth/introspect", None).await;
    assert!(me["capabilities"].as_object().unwrap().values().all(|v| v == true));
    // close of business: pause the tenant's webhooks and suspend it
    let hook = json!({"url": "https://93.184.216.34/h", "event_types": ["budget.funded"]});
    call(&h, "POST", &format!("/v1/admin/webhooks?tenant_id={tenant}"), Some(hook)).await;
    let pause = json!({"filter": {"tenant_id": tenant}, "action": "PAUSE", "idempotency_key": unique("p")});
    assert_eq!(
        call(&h, "POST", "/v1/admin/webhooks/bulk-action", Some(pause)).await["succeeded"].as_array().unwrap().len(),
        1
    );
    let suspend =
        json!({"filter": {"search": tenant}, "action": "SUSPEND", "expected_count": 1, "idempotency_key": unique("s")});
    call(&h, "POST", "/v1/admin/tenants/bulk-action", Some(suspend)).await;
    assert_eq!(call(&h, "GET", &format!("/v1/admin/tenants/{tenant}"), None).await["status"], "SUSPENDED");
}
