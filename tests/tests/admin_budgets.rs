//! Operator plane: budgets (create, lookup, list, update, freeze, fund) and the admin-plane
//! balances view, with the ledger numbers after every funding operation.

use cycles_shared::model::Unit;
use cycles_tests::*;

fn tokens(n: i64) -> serde_json::Value {
    json!({"unit": "TOKENS", "amount": n})
}

async fn fund(h: &Harness, t: &Tenant, op: &str, amount: i64, extra: serde_json::Value) -> Resp {
    let mut body = json!({"operation": op, "amount": tokens(amount)});
    merge(&mut body, extra);
    h.admin(
        "POST",
        &format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id),
        Some(&body),
    )
    .await
}

#[tokio::test]
async fn create_lookup_and_conflicts() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let body = json!({"tenant_id": t.id, "scope": format!("tenant:{}/Workspace:Eng", t.id), "unit": "TOKENS",
        "allocated": tokens(500), "overdraft_limit": tokens(50), "commit_overage_policy": "REJECT",
        "period_start": "2026-01-01T00:00:00Z"});
    let r = h.admin("POST", "/v1/admin/budgets", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert_no_nulls(&r.body, &r.raw);
    let scope = format!("tenant:{}/workspace:eng", t.id);
    assert_eq!(r.body["scope"], scope.as_str(), "stored lower-cased, as the runtime derives it");
    assert_eq!((r.body["remaining"].clone(), r.body["status"].clone()), (tokens(500), json!("ACTIVE")));
    assert_eq!(r.body["period_start"], "2026-01-01T00:00:00.000Z");
    assert!(r.body.get("metadata").is_none());
    h.admin("POST", "/v1/admin/budgets", Some(&body)).await.assert_error(409, "DUPLICATE_RESOURCE");
    let found = h.admin("GET", &format!("/v1/admin/budgets/lookup?scope={scope}&unit=TOKENS"), None).await;
    assert_eq!(found.assert_ok()["ledger_id"], r.body["ledger_id"]);
    h.admin("GET", &format!("/v1/admin/budgets/lookup?scope={scope}&unit=CREDITS"), None)
        .await
        .assert_error(404, "BUDGET_NOT_FOUND");
    h.admin("GET", &format!("/v1/admin/budgets/lookup?scope={scope}"), None).await.assert_error(400, "INVALID_REQUEST");
    // the runtime uses it at once
    let rid = h.reserve_ok(&t, 100, json!({"subject": {"tenant": t.id, "workspace": "eng"}})).await;
    assert!(!rid.is_empty());
    let events = h.all_events(&t.id).await;
    assert!(events.iter().any(|e| e["event_type"] == "budget.created" && e["data"]["operation"] == "CREATE"));
}

#[tokio::test]
async fn create_validates_units_scopes_and_tenancy() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let other = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let base = || json!({"tenant_id": t.id, "scope": root, "unit": "TOKENS", "allocated": tokens(1)});
    let with = |extra: serde_json::Value| {
        let mut b = base();
        merge(&mut b, extra);
        b
    };
    let cases = [
        (with(json!({"allocated": {"unit": "CREDITS", "amount": 1}})), 400, "UNIT_MISMATCH"),
        (with(json!({"overdraft_limit": {"unit": "CREDITS", "amount": 1}})), 400, "UNIT_MISMATCH"),
        (with(json!({"allocated": tokens(-1)})), 400, "INVALID_REQUEST"),
        (with(json!({"scope": format!("{root}/agent:a/workspace:w")})), 400, "INVALID_REQUEST"),
        (with(json!({"scope": format!("{root}/agent:*")})), 400, "INVALID_REQUEST"),
        (with(json!({"scope": format!("tenant:{}", other.id)})), 400, "INVALID_REQUEST"),
        (with(json!({"unit": "GOLD"})), 400, "INVALID_REQUEST"),
        (with(json!({"rollover_policy": "SOMETIMES"})), 400, "INVALID_REQUEST"),
        (with(json!({"period_end": "soon"})), 400, "INVALID_REQUEST"),
        (with(json!({"tenant_id": null})), 400, "INVALID_REQUEST"),
        (with(json!({"tenant_id": "no-such-tenant", "scope": "tenant:no-such-tenant"})), 400, "TENANT_NOT_FOUND"),
    ];
    for (body, status, code) in cases {
        h.admin("POST", "/v1/admin/budgets", Some(&body)).await.assert_error(status, code);
    }
    // tenant keys: budgets:write required, tenant_id forbidden, own tenant implied
    let no_id = with(json!({"tenant_id": null}));
    h.admin_as(&t.key, "POST", "/v1/admin/budgets", Some(&no_id)).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    let writer = h.key(&t.id, Some(vec!["budgets:write".into(), "budgets:read".into()])).await;
    h.admin_as(&writer.secret, "POST", "/v1/admin/budgets", Some(&base())).await.assert_error(400, "INVALID_REQUEST");
    let r = h.admin_as(&writer.secret, "POST", "/v1/admin/budgets", Some(&no_id)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let events = h.all_events(&t.id).await;
    let created = events.iter().find(|e| e["event_type"] == "budget.created").unwrap();
    assert_eq!(created["actor"], json!({"type": "api_key", "key_id": writer.key_id}));
    // nothing was created by the refused requests
    let list = h.admin("GET", &format!("/v1/admin/budgets?tenant_id={}", t.id), None).await;
    assert_eq!(list.assert_ok()["ledgers"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn funding_follows_the_ledger_math() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    h.commit(&t, &rid, 50).await.assert_ok(); // spent 50
    h.reserve_ok(&t, 200, json!({})).await; // reserved 200
                                            // allocated 1000, spent 50, reserved 200, remaining 750
    let r = fund(&h, &t, "CREDIT", 100, json!({"reason": "top-up"})).await;
    let b = r.assert_ok();
    assert_eq!((b["previous_allocated"].clone(), b["new_allocated"].clone()), (tokens(1000), tokens(1100)));
    assert_eq!((b["previous_remaining"].clone(), b["new_remaining"].clone()), (tokens(750), tokens(850)));
    let l = h.root(&t).await;
    assert_eq!((l.allocated, l.remaining, l.spent, l.reserved, l.debt), (1100, 850, 50, 200, 0));
    fund(&h, &t, "DEBIT", 851, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    fund(&h, &t, "DEBIT", 850, json!({})).await.assert_ok();
    assert_eq!((h.root(&t).await.allocated, h.root(&t).await.remaining), (250, 0));
    fund(&h, &t, "RESET", 100, json!({})).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.allocated, l.remaining), (100, -150), "RESET may leave remaining negative");
    let r = fund(&h, &t, "RESET_SPENT", 600, json!({"spent": tokens(20)})).await;
    assert_eq!((r.assert_ok()["previous_spent"].clone(), r.body["new_spent"].clone()), (tokens(50), tokens(20)));
    let l = h.root(&t).await;
    assert_eq!((l.allocated, l.spent, l.remaining), (600, 20, 380));
    // debt: stage 70 of it with a zero limit, so the scope is over its limit
    h.set_budget(
        &t.id,
        &format!("tenant:{}", t.id),
        Unit::Tokens,
        &[("debt", "70"), ("remaining", "310"), ("is_over_limit", "true")],
    )
    .await;
    fund(&h, &t, "CREDIT", 10, json!({})).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.debt, l.is_over_limit), (70, true), "CREDIT never repays debt");
    let r = fund(&h, &t, "REPAY_DEBT", 100, json!({})).await;
    assert_eq!((r.assert_ok()["previous_debt"].clone(), r.body["new_debt"].clone()), (tokens(70), tokens(0)));
    let l = h.root(&t).await;
    assert_eq!(
        (l.allocated, l.remaining, l.debt, l.is_over_limit),
        (640, 420, 0, false),
        "surplus 30 becomes allocation"
    );
    let kinds: Vec<String> =
        h.all_events(&t.id).await.iter().map(|e| e["event_type"].as_str().unwrap().to_string()).collect();
    for k in [
        "budget.funded",
        "budget.debited",
        "budget.reset",
        "budget.reset_spent",
        "budget.debt_repaid",
        "budget.over_limit_exited",
    ] {
        assert!(kinds.iter().any(|x| x == k), "{k} missing from {kinds:?}");
    }
}

#[tokio::test]
async fn funding_is_idempotent_and_validated() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let first = fund(&h, &t, "CREDIT", 5, json!({"idempotency_key": "f-1"})).await;
    first.assert_ok();
    let again = fund(&h, &t, "CREDIT", 5, json!({"idempotency_key": "f-1"})).await;
    assert_eq!(again.raw, first.raw, "a replay answers the stored response");
    assert_eq!(h.root(&t).await.allocated, 105, "and changes nothing");
    fund(&h, &t, "CREDIT", 6, json!({"idempotency_key": "f-1"})).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    let count = h.all_events(&t.id).await.iter().filter(|e| e["event_type"] == "budget.funded").count();
    assert_eq!(count, 1);
    let bad = [
        (json!({"operation": "STEAL", "amount": tokens(1)}), 400, "INVALID_REQUEST"),
        (json!({"operation": "CREDIT", "amount": {"unit": "CREDITS", "amount": 1}}), 400, "UNIT_MISMATCH"),
        (json!({"operation": "CREDIT", "amount": tokens(-1)}), 400, "INVALID_REQUEST"),
        (json!({"operation": "CREDIT"}), 400, "INVALID_REQUEST"),
        (json!({"operation": "CREDIT", "amount": tokens(1), "idempotency_key": ""}), 400, "INVALID_REQUEST"),
        (json!({"operation": "CREDIT", "amount": tokens(i64::MAX - 50)}), 400, "INVALID_REQUEST"),
    ];
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
    for (body, status, code) in bad {
        h.admin("POST", &path, Some(&body)).await.assert_error(status, code);
    }
    assert_eq!(h.root(&t).await.allocated, 105, "refused requests write nothing");
    let no_tenant = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS", t.id);
    let credit = json!({"operation": "CREDIT", "amount": tokens(1)});
    h.admin("POST", &no_tenant, Some(&credit)).await.assert_error(400, "INVALID_REQUEST");
    h.admin(
        "POST",
        &format!("/v1/admin/budgets/fund?scope=tenant:{}/agent:x&unit=TOKENS&tenant_id={}", t.id, t.id),
        Some(&credit),
    )
    .await
    .assert_error(404, "BUDGET_NOT_FOUND");
    // tenant keys need budgets:write, and fund only their own tenant
    h.admin_as(&t.key, "POST", &no_tenant, Some(&credit)).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    let writer = h.key(&t.id, Some(vec!["budgets:write".into()])).await;
    h.admin_as(&writer.secret, "POST", &no_tenant, Some(&credit)).await.assert_ok();
    let other = h.funded(10).await;
    let foreign = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS", other.id);
    h.admin_as(&writer.secret, "POST", &foreign, Some(&credit)).await.assert_error(404, "BUDGET_NOT_FOUND");
    assert_eq!(h.root(&other).await.allocated, 10);
}

#[tokio::test]
async fn a_failing_script_leaves_nothing_half_written() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let events = h.all_events(&t.id).await.len();
    // a malformed tenant record makes the script fail closed before any write
    h.set_tenant(&t.id, &[("status", "HALF-WRITTEN")]).await;
    let r = fund(&h, &t, "CREDIT", 5, json!({"idempotency_key": "boom"})).await;
    r.assert_error(500, "INTERNAL_ERROR");
    let path = format!("/v1/admin/budgets/freeze?scope=tenant:{}&unit=TOKENS", t.id);
    h.admin("POST", &path, None).await.assert_error(500, "INTERNAL_ERROR");
    h.set_tenant(&t.id, &[("status", "ACTIVE")]).await;
    let l = h.root(&t).await;
    assert_eq!((l.allocated, l.remaining), (100, 100));
    assert_eq!(h.all_events(&t.id).await.len(), events, "no event without its state change");
    // the same idempotency key now runs for real: no stored response was left behind
    let r = fund(&h, &t, "CREDIT", 5, json!({"idempotency_key": "boom"})).await;
    assert_eq!(r.assert_ok()["new_allocated"], tokens(105));
}

#[tokio::test]
async fn update_freeze_and_the_runtime() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let root = format!("tenant:{}", t.id);
    let q = format!("scope={root}&unit=TOKENS");
    // over limit with debt 20 and limit 0; raising the limit to the debt clears the flag
    h.set_budget(&t.id, &root, Unit::Tokens, &[("debt", "20"), ("remaining", "80"), ("is_over_limit", "true")]).await;
    h.reserve(&t, 1, json!({})).await.assert_error(409, "OVERDRAFT_LIMIT_EXCEEDED");
    let r = h.admin("PATCH", &format!("/v1/admin/budgets?{q}"), Some(&json!({"overdraft_limit": tokens(20)}))).await;
    assert_eq!((r.assert_ok()["is_over_limit"].clone(), r.body["overdraft_limit"].clone()), (json!(false), tokens(20)));
    h.reserve_ok(&t, 1, json!({})).await;
    let kinds: Vec<_> = h.all_events(&t.id).await.iter().map(|e| e["event_type"].clone()).collect();
    assert!(kinds.contains(&json!("budget.updated")) && kinds.contains(&json!("budget.over_limit_exited")));
    let bad = json!({"overdraft_limit": {"unit": "CREDITS", "amount": 1}});
    h.admin("PATCH", &format!("/v1/admin/budgets?{q}"), Some(&bad)).await.assert_error(400, "UNIT_MISMATCH");
    h.admin("PATCH", &format!("/v1/admin/budgets?{q}"), Some(&json!({"allocated": tokens(1)})))
        .await
        .assert_error(400, "INVALID_REQUEST");
    h.admin_as(&t.key, "PATCH", &format!("/v1/admin/budgets?{q}"), Some(&json!({})))
        .await
        .assert_error(401, "UNAUTHORIZED");

    let r = h.admin("POST", &format!("/v1/admin/budgets/freeze?{q}"), Some(&json!({"reason": "audit"}))).await;
    assert_eq!(r.assert_ok()["status"], "FROZEN");
    h.admin("POST", &format!("/v1/admin/budgets/freeze?{q}"), None).await.assert_error(409, "INVALID_REQUEST");
    h.reserve(&t, 1, json!({})).await.assert_error(409, "BUDGET_FROZEN");
    fund(&h, &t, "CREDIT", 1, json!({})).await.assert_error(409, "BUDGET_FROZEN");
    h.admin("PATCH", &format!("/v1/admin/budgets?{q}"), Some(&json!({"commit_overage_policy": "REJECT"})))
        .await
        .assert_ok();
    h.admin("POST", &format!("/v1/admin/budgets/unfreeze?{q}"), None).await.assert_ok();
    h.reserve_ok(&t, 1, json!({})).await;
    let missing = format!("/v1/admin/budgets/freeze?scope={root}/agent:x&unit=TOKENS");
    h.admin("POST", &missing, None).await.assert_error(404, "BUDGET_NOT_FOUND");
    let missing = format!("/v1/admin/budgets?scope={root}/agent:x&unit=TOKENS");
    h.admin("PATCH", &missing, Some(&json!({"commit_overage_policy": "REJECT"})))
        .await
        .assert_error(404, "BUDGET_NOT_FOUND");
    h.admin("PATCH", &format!("/v1/admin/budgets?scope={root}"), Some(&json!({})))
        .await
        .assert_error(400, "INVALID_REQUEST");
}

async fn ledgers(h: &Harness, t: &Tenant, q: &str) -> Vec<String> {
    let r = h.admin("GET", &format!("/v1/admin/budgets?tenant_id={}&{q}", t.id), None).await;
    let items = r.assert_ok()["ledgers"].as_array().unwrap().clone();
    items.iter().map(|l| format!("{}|{}", l["scope"].as_str().unwrap(), l["unit"].as_str().unwrap())).collect()
}

#[tokio::test]
async fn listing_filters_and_admin_balances() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::Tokens, 100).await;
    h.budget(&t.id, &format!("{root}/agent:a"), Unit::Tokens, 50).await;
    h.budget(&t.id, &root, Unit::Credits, 7).await;
    let rid = h.reserve_ok(&t, 10, json!({"subject": {"tenant": t.id, "agent": "a"}})).await;
    h.commit(&t, &rid, 10).await.assert_ok();
    assert_eq!(ledgers(&h, &t, "unit=CREDITS").await, [format!("{root}|CREDITS")]);
    assert_eq!(ledgers(&h, &t, &format!("scope_prefix={root}/agent")).await, [format!("{root}/agent:a|TOKENS")]);
    // utilization: agent 10/50 = 0.2, root 10/100 = 0.1, credits 0
    let by_use = ledgers(&h, &t, "sort_by=utilization&sort_dir=desc").await;
    assert_eq!(by_use, [format!("{root}/agent:a|TOKENS"), format!("{root}|TOKENS"), format!("{root}|CREDITS")]);
    assert_eq!(ledgers(&h, &t, "utilization_min=0.15").await, [format!("{root}/agent:a|TOKENS")]);
    h.admin("GET", "/v1/admin/budgets?utilization_min=0.5&utilization_max=0.1", None)
        .await
        .assert_error(400, "INVALID_REQUEST");
    h.admin("GET", "/v1/admin/budgets?has_debt=maybe", None).await.assert_error(400, "INVALID_REQUEST");
    h.admin_as(&t.key, "GET", "/v1/admin/budgets", None).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");

    // the admin-plane balances: BudgetLedger items for the key's tenant only
    let r = h.admin_as(&t.key, "GET", "/v1/balances?unit=TOKENS", None).await;
    let items = r.assert_ok()["balances"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2);
    assert!(items.iter().all(|l| l["ledger_id"].is_string() && l["debt"].is_object()));
    let other = h.tenant().await;
    h.admin_as(&t.key, "GET", &format!("/v1/balances?tenant_id={}", other.id), None)
        .await
        .assert_error(403, "FORBIDDEN");
    h.admin("GET", "/v1/balances", None).await.assert_error(401, "UNAUTHORIZED");
    let page = h.admin_as(&t.key, "GET", "/v1/balances?limit=2", None).await;
    assert_eq!(page.assert_ok()["has_more"], true);
    let cursor = page.body["next_cursor"].as_str().unwrap();
    let rest = h.admin_as(&t.key, "GET", &format!("/v1/balances?limit=2&cursor={cursor}"), None).await;
    assert_eq!(rest.assert_ok()["balances"].as_array().unwrap().len(), 1);
    // the runtime port keeps the runtime contract of the same path
    h.get(&t.key, "/v1/balances").await.assert_error(400, "INVALID_REQUEST");
}
