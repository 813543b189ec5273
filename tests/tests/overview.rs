//! getAdminOverview: the spec's dashboard in one request, from a snapshot that requests read
//! (and rebuild only when it is older than its maximum age) and the sweep keeps fresh.

use cycles_tests::*;

#[tokio::test]
async fn the_overview_counts_and_lists_what_an_operator_must_see() {
    let h = Harness::start_configured(|c| c.overview_max_age = std::time::Duration::ZERO).await;
    let t = h.tenant().await;
    let scope = format!("tenant:{}", t.id);
    h.overdraft_budget(&t.id, &scope, 0, 1_000_000_000_000_000).await;
    let event = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id}, "action": {"kind": "tool", "name": "x"},
        "actual": {"unit": "TOKENS", "amount": 1_000_000_000_000_000i64}, "overage_policy": "ALLOW_WITH_OVERDRAFT"});
    assert_eq!(h.post(&t.key, "/v1/events", &event).await.status, 201);
    let path = format!("/v1/admin/budgets?scope={scope}&unit=TOKENS&tenant_id={}", t.id);
    h.admin("PATCH", &path, Some(&json!({"overdraft_limit": {"unit": "TOKENS", "amount": 0}}))).await.assert_ok();
    // a denial, and a subscription that failed
    let decide = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id}, "action": {"kind": "llm", "name": "m"},
        "estimate": {"unit": "TOKENS", "amount": 1}});
    assert_eq!(h.post(&t.key, "/v1/decide", &decide).await.assert_ok()["decision"], "DENY");
    let hook = json!({"url": "http://127.0.0.1:9/dead", "event_types": ["budget.funded", "budget.debt_repaid"], "retry_policy": {"max_retries": 0}});
    h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&hook)).await;
    let fund = json!({"operation": "REPAY_DEBT", "amount": {"unit": "TOKENS", "amount": 1}});
    h.admin("POST", &format!("/v1/admin/budgets/fund?scope={scope}&unit=TOKENS&tenant_id={}", t.id), Some(&fund))
        .await
        .assert_ok();
    h.deliver(&[&t.id]).await;

    let r = h.admin("GET", "/v1/admin/overview", None).await;
    let o = r.assert_ok();
    assert_no_nulls(o, &r.raw);
    assert_eq!(o["event_window_seconds"], 3600);
    assert!(o.get("as_of_ms").is_none(), "only the spec's fields");
    assert!(o["tenant_counts"]["total"].as_i64().unwrap() >= 1);
    assert!(o["tenant_counts"]["active"].as_i64().unwrap() >= 1);
    let b = &o["budget_counts"];
    assert!(b["over_limit"].as_i64().unwrap() >= 1 && b["with_debt"].as_i64().unwrap() >= 1, "{b}");
    assert!(b["by_unit"]["TOKENS"].as_i64().unwrap() >= 1);
    let over = o["over_limit_scopes"].as_array().unwrap();
    assert!(over.len() <= 10);
    let mine = over.iter().find(|s| s["scope"] == scope.as_str()).expect("the largest debt is listed");
    assert_eq!((mine["debt"].as_i64(), mine["allocated"].as_i64()), (Some(999_999_999_999_999), Some(0)));
    assert!(o["debt_scopes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s["scope"] == scope.as_str() && s["overdraft_limit"] == 0));
    assert!(o["webhook_counts"]["with_failures"].as_i64().unwrap() >= 1, "{}", o["webhook_counts"]);
    let denial = &o["recent_denials"][0];
    assert_eq!(
        (denial["event_type"].as_str(), denial["tenant_id"].as_str()),
        (Some("reservation.denied"), Some(t.id.as_str()))
    );
    let reason = denial["data"]["reason_code"].as_str().unwrap();
    assert!(o["recent_denials_by_reason"][reason].as_i64().unwrap() >= 1, "{}", o["recent_denials_by_reason"]);
    assert!(o["event_counts"]["by_category"]["budget"].as_i64().unwrap() >= 2);
    assert!(o["event_counts"]["total_recent"].as_i64().unwrap() >= 3);
    // counted from the counters the scripts keep, never from the stream
    let events = cycles_shared::keys::TenantKeys::new(&t.id).events();
    let _: () = redis::AsyncCommands::del(&mut h.store.conn(), &events).await.unwrap();
    let again = h.admin("GET", "/v1/admin/overview", None).await;
    let again = again.assert_ok();
    assert_eq!(again["recent_denials_by_reason"][reason], o["recent_denials_by_reason"][reason]);
    assert!(again["recent_denials"].as_array().unwrap().iter().any(|e| e["event_id"] == denial["event_id"]));
    // the admin key only
    h.send_to(&h.admin_base, "GET", "/v1/admin/overview", &[("x-cycles-api-key", &t.key)], None)
        .await
        .assert_error(401, "UNAUTHORIZED");
}

#[tokio::test]
async fn requests_read_the_snapshot_until_it_is_too_old() {
    // a Redis of its own: no other test's operator change marks this snapshot stale
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_with_redis(redis, |c| c.overview_max_age = std::time::Duration::from_secs(3600)).await;
    let first = h.admin("GET", "/v1/admin/overview", None).await.assert_ok().clone();
    let t = h.tenant().await;
    // a runtime request changes no operator state: the snapshot stands
    h.reserve(&t, 0, json!({})).await;
    let second = h.admin("GET", "/v1/admin/overview", None).await.assert_ok().clone();
    assert_eq!(first, second, "one read of the stored snapshot, rebuilt at most once a second");
    // the operator's change is seen by the next read once the snapshot is a second old
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let third = h.admin("GET", "/v1/admin/overview", None).await.assert_ok().clone();
    assert_ne!(first["as_of"], third["as_of"]);
    assert_eq!(
        third["tenant_counts"]["total"].as_i64().unwrap(),
        first["tenant_counts"]["total"].as_i64().unwrap() + 1
    );
    // nothing changed since: reads keep the snapshot
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let fourth = h.admin("GET", "/v1/admin/overview", None).await.assert_ok().clone();
    assert_eq!(third["as_of"], fourth["as_of"], "no change, no rebuild");
    // a budget and a webhook: counted on the next read (issue 27: tiles lagged up to 60 s)
    h.budget(&t.id, &format!("tenant:{}/workspace:w", t.id), cycles_shared::model::Unit::Tokens, 10).await;
    let hook = json!({"url": "http://127.0.0.1:9/x", "event_types": ["budget.funded"]});
    h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&hook)).await.assert_created();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let fifth = h.admin("GET", "/v1/admin/overview", None).await.assert_ok().clone();
    let budgets = |o: &serde_json::Value| o["budget_counts"]["total"].as_i64().unwrap_or(0);
    assert_eq!(budgets(&fifth), budgets(&fourth) + 1, "{fifth}");
    assert_eq!(fifth["webhook_counts"]["total"].as_i64().unwrap_or(0), 1, "{fifth}");
    // the sweep rebuilds a snapshot older than its refresh age
    let opts =
        cycles_shared::config::SweepOptions { overview_refresh: std::time::Duration::ZERO, ..Default::default() };
    cycles_shared::jobs::sweep::sweep(&h.store, &opts).await.unwrap();
    let sixth = h.admin("GET", "/v1/admin/overview", None).await.assert_ok().clone();
    assert_ne!(fifth["as_of"], sixth["as_of"]);
}
