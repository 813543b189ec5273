//! Bulk actions on tenants, budgets and webhook subscriptions: the filter and count gates
//! (nothing written when they refuse), per-row outcomes, one event per changed row with the
//! invocation's correlation id, one audit entry per invocation, idempotent replays, and a retry
//! after a crash that finishes the rest without changing any row twice.

use cycles_shared::domain::payload_hash;
use cycles_shared::model::Unit;
use cycles_tests::*;
use serde_json::Value;

const TENANTS: &str = "/v1/admin/tenants/bulk-action";
const BUDGETS: &str = "/v1/admin/budgets/bulk-action";
const WEBHOOKS: &str = "/v1/admin/webhooks/bulk-action";

fn ids(v: &Value) -> Vec<String> {
    let mut out: Vec<String> = v.as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()).collect();
    out.sort();
    out
}

async fn status_of(h: &Harness, tenant: &str) -> String {
    let r = h.admin("GET", &format!("/v1/admin/tenants/{tenant}"), None).await;
    r.assert_ok()["status"].as_str().unwrap().to_string()
}

async fn events_of(h: &Harness, correlation: &str) -> Vec<Value> {
    let r = h.admin("GET", &format!("/v1/admin/events?correlation_id={correlation}&limit=100"), None).await;
    r.assert_ok()["events"].as_array().unwrap().clone()
}

/// Tenants named with a marker, so a filter's `search` selects exactly them.
async fn marked_tenants(h: &Harness, marker: &str, n: usize) -> Vec<String> {
    let mut out = vec![];
    for i in 0..n {
        let id = unique("bt");
        let body = json!({"tenant_id": id, "name": format!("{marker} {i}")});
        assert_eq!(h.admin("POST", "/v1/admin/tenants", Some(&body)).await.status, 201);
        out.push(id);
    }
    out.sort();
    out
}

#[tokio::test]
async fn tenant_bulk_actions_gate_apply_and_replay() {
    let h = Harness::start().await;
    let marker = unique("mk");
    let t = marked_tenants(&h, &marker, 3).await;
    h.budget(&t[1], &format!("tenant:{}", t[1]), Unit::Tokens, 100).await;
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t[2]), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    let filter = json!({"search": marker});

    // gates: nothing is written when they refuse
    let body = json!({"filter": filter, "action": "SUSPEND", "expected_count": 4, "idempotency_key": unique("k")});
    let r = h.admin("POST", TENANTS, Some(&body)).await;
    r.assert_error(409, "COUNT_MISMATCH");
    assert_eq!(
        (r.body["details"]["total_matched"].as_u64(), r.body["details"]["expected_count"].as_u64()),
        (Some(3), Some(4))
    );
    assert_eq!(status_of(&h, &t[0]).await, "ACTIVE");
    for bad in [
        json!({"filter": {}, "action": "SUSPEND", "idempotency_key": "k"}),
        json!({"filter": {"colour": "red"}, "action": "SUSPEND", "idempotency_key": "k"}),
        json!({"filter": filter, "action": "DELETE", "idempotency_key": "k"}),
        json!({"filter": filter, "action": "SUSPEND"}),
        json!({"filter": filter, "action": "SUSPEND", "idempotency_key": ""}),
        json!({"filter": {"status": "GONE"}, "action": "SUSPEND", "idempotency_key": "k"}),
        json!({"filter": filter, "action": "SUSPEND", "idempotency_key": "k", "expected_count": -1}),
    ] {
        let r = h.admin("POST", TENANTS, Some(&bad)).await;
        assert_eq!((r.status, r.error()), (400, "INVALID_REQUEST"), "{bad}: {}", r.raw);
    }
    assert_eq!(status_of(&h, &t[0]).await, "ACTIVE");

    // SUSPEND: two change, one is already there
    let key = unique("k");
    let body = json!({"filter": filter, "action": "SUSPEND", "expected_count": 3, "idempotency_key": key});
    let r = h.admin("POST", TENANTS, Some(&body)).await;
    let a = r.assert_ok().clone();
    assert_eq!(
        (a["action"].as_str(), a["total_matched"].as_u64(), a["idempotency_key"].as_str()),
        (Some("SUSPEND"), Some(3), Some(key.as_str()))
    );
    assert_eq!(ids(&a["succeeded"]), t[..2].to_vec());
    assert_eq!(a["skipped"], json!([{"id": t[2], "reason": "ALREADY_IN_TARGET_STATE"}]));
    assert_eq!(a["failed"], json!([]));
    for id in &t {
        assert_eq!(status_of(&h, id).await, "SUSPENDED");
    }
    // one event per changed row, with the invocation's correlation id
    let rid = r.headers["x-request-id"].clone();
    let events = events_of(&h, &format!("tenant_bulk_action:suspend:{rid}")).await;
    let mut changed: Vec<String> = events.iter().map(|e| e["tenant_id"].as_str().unwrap().to_string()).collect();
    changed.sort();
    assert_eq!(changed, t[..2].to_vec());
    assert!(events.iter().all(|e| e["event_type"] == "tenant.suspended"));
    // one audit entry for the invocation, with the outcome; none per row
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?request_id={rid}"), None).await;
    let logs = logs.assert_ok()["logs"].as_array().unwrap().clone();
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert_eq!(
        (logs[0]["operation"].as_str(), logs[0]["tenant_id"].as_str()),
        (Some("bulkActionTenants"), Some("__admin__"))
    );
    assert_eq!(logs[0]["metadata"]["actor_type"], "admin_on_behalf_of");
    assert_eq!(logs[0]["metadata"]["outcome"]["succeeded"].as_array().unwrap().len(), 2);

    // the same key: the first answer again, nothing re-applied; another body: 409
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t[0]), Some(&json!({"status": "ACTIVE"}))).await.assert_ok();
    let again = h.admin("POST", TENANTS, Some(&body)).await;
    assert_eq!(again.assert_ok(), &a);
    assert_eq!(status_of(&h, &t[0]).await, "ACTIVE", "the replay changed nothing");
    let other = json!({"filter": filter, "action": "CLOSE", "idempotency_key": key});
    h.admin("POST", TENANTS, Some(&other)).await.assert_error(409, "IDEMPOTENCY_MISMATCH");

    // CLOSE runs each row's cascade; REACTIVATE of a closed tenant fails that row only
    let close =
        json!({"filter": {"search": marker, "status": "SUSPENDED"}, "action": "CLOSE", "idempotency_key": unique("k")});
    let r = h.admin("POST", TENANTS, Some(&close)).await;
    assert_eq!(ids(&r.assert_ok()["succeeded"]), t[1..].to_vec());
    let rid = r.headers["x-request-id"].clone();
    let lookup = format!("/v1/admin/budgets/lookup?scope=tenant:{}&unit=TOKENS&tenant_id={}", t[1], t[1]);
    assert_eq!(h.admin("GET", &lookup, None).await.assert_ok()["status"], "CLOSED", "the cascade closed its budget");
    let cascade = events_of(&h, &format!("tenant_close_cascade:{}:{rid}", t[1])).await;
    assert!(cascade.iter().any(|e| e["event_type"] == "budget.closed_via_tenant_cascade"), "{cascade:?}");
    assert_eq!(events_of(&h, &format!("tenant_bulk_action:close:{rid}")).await.len(), 2);
    let reactivate = json!({"filter": {"search": marker}, "action": "REACTIVATE", "idempotency_key": unique("k")});
    let r = h.admin("POST", TENANTS, Some(&reactivate)).await;
    let a = r.assert_ok();
    assert_eq!(a["skipped"], json!([{"id": t[0], "reason": "ALREADY_IN_TARGET_STATE"}]));
    assert_eq!(ids(&a["failed"]), t[1..].to_vec());
    assert_eq!(a["failed"][0]["error_code"], "INVALID_TRANSITION");
}

#[tokio::test]
async fn a_retry_after_a_crash_finishes_the_rest() {
    let h = Harness::start().await;
    let marker = unique("mk");
    let t = marked_tenants(&h, &marker, 2).await;
    let key = unique("k");
    let body = json!({"filter": {"search": marker}, "action": "SUSPEND", "idempotency_key": key});
    // the crash: the invocation recorded its rows and changed the first, then died
    let rows: Vec<String> = t.iter().map(|id| format!("{id}\t")).collect();
    assert!(cycles_shared::ops::bulk::start(&h.store, "tenant", &key, &payload_hash(&body, &[]), &rows).await.unwrap());
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t[0]), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    // a new tenant matching the filter meanwhile is not part of the recorded invocation
    let late = marked_tenants(&h, &marker, 1).await;
    let r = h.admin("POST", TENANTS, Some(&body)).await;
    let a = r.assert_ok();
    assert_eq!((a["total_matched"].as_u64(), ids(&a["succeeded"])), (Some(2), vec![t[1].clone()]));
    assert_eq!(ids(&a["skipped"]), vec![t[0].clone()]);
    assert_eq!(status_of(&h, &late[0]).await, "ACTIVE");
}

#[tokio::test]
async fn more_than_500_matches_are_refused_whole() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    for i in 0..501 {
        let scope = format!("tenant:{}/agent:a{i}", t.id);
        h.budget(&t.id, &scope, Unit::Tokens, 10).await;
    }
    let body = json!({"filter": {"tenant_id": t.id}, "action": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1},
        "idempotency_key": unique("k")});
    let r = h.admin("POST", BUDGETS, Some(&body)).await;
    r.assert_error(400, "LIMIT_EXCEEDED");
    assert_eq!(r.body["details"]["total_matched"], 501);
    assert!(!r.headers.contains_key("retry-after"), "a 400, not a throttle");
    assert_eq!(
        h.ledger(&t.id, &format!("tenant:{}/agent:a0", t.id), Unit::Tokens).await.allocated,
        10,
        "nothing written"
    );
}

#[tokio::test]
async fn budget_bulk_actions_apply_fund_math_per_ledger_exactly_once() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let eng = format!("tenant:{}/workspace:eng", t.id);
    let agent = format!("{eng}/agent:a");
    h.budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, 5000).await;
    h.budget(&t.id, &eng, Unit::Tokens, 1000).await;
    h.budget(&t.id, &agent, Unit::Tokens, 500).await;
    h.budget(&t.id, &eng, Unit::Credits, 70).await;
    // spend something below eng
    let rid = h.reserve_ok(&t, 200, json!({"subject": {"tenant": t.id, "workspace": "eng", "agent": "a"}})).await;
    h.commit(&t, &rid, 200).await.assert_ok();

    // validation before anything is counted
    let base = json!({"filter": {"tenant_id": t.id, "scope_prefix": eng}, "idempotency_key": unique("k")});
    for (extra, status, code) in [
        (json!({"action": "CREDIT"}), 400, "INVALID_REQUEST"),
        (json!({"action": "CREDIT", "amount": {"unit": "TOKENS", "amount": -1}}), 400, "INVALID_REQUEST"),
        (json!({"action": "TOP_UP", "amount": {"unit": "TOKENS", "amount": 1}}), 400, "INVALID_REQUEST"),
        (
            json!({"action": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}, "filter": {"scope_prefix": eng}}),
            400,
            "INVALID_REQUEST",
        ),
        (
            json!({"action": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}, "filter": {"tenant_id": "no-such-tenant"}}),
            404,
            "TENANT_NOT_FOUND",
        ),
        (
            json!({"action": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1},
            "filter": {"tenant_id": t.id, "utilization_min": 0.9, "utilization_max": 0.1}}),
            400,
            "INVALID_REQUEST",
        ),
    ] {
        let mut body = base.clone();
        merge(&mut body, extra.clone());
        let r = h.admin("POST", BUDGETS, Some(&body)).await;
        assert_eq!((r.status, r.error()), (status, code), "{extra}: {}", r.raw);
    }

    // period end: RESET_SPENT on the eng subtree; the CREDITS ledger's row fails alone
    let key = unique("k");
    let body = json!({"filter": {"tenant_id": t.id, "scope_prefix": eng}, "action": "RESET_SPENT",
        "amount": {"unit": "TOKENS", "amount": 1000}, "expected_count": 3, "idempotency_key": key, "reason": "period end"});
    let r = h.admin("POST", BUDGETS, Some(&body)).await;
    let a = r.assert_ok().clone();
    assert_eq!((a["succeeded"].as_array().unwrap().len(), a["failed"].as_array().unwrap().len()), (2, 1), "{a}");
    assert_eq!(a["failed"][0]["error_code"], "INVALID_TRANSITION");
    for scope in [&eng, &agent] {
        let l = h.ledger(&t.id, scope, Unit::Tokens).await;
        assert_eq!((l.allocated, l.spent, l.remaining), (1000, 0, 1000), "{scope}");
    }
    assert_eq!(h.ledger(&t.id, &format!("tenant:{}", t.id), Unit::Tokens).await.spent, 200, "outside the prefix");
    let rid = r.headers["x-request-id"].clone();
    let events = events_of(&h, &format!("budget_bulk_action:reset_spent:{rid}")).await;
    assert_eq!(events.len(), 2);
    assert!(events.iter().all(|e| e["event_type"] == "budget.reset_spent"));
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={}&request_id={rid}", t.id), None).await;
    let logs = logs.assert_ok()["logs"].as_array().unwrap().clone();
    assert_eq!(logs.len(), 1, "one entry for the invocation: {logs:?}");
    assert_eq!(logs[0]["operation"], "bulkActionBudgets");

    // a crash after the rows were applied but before the answer was kept: the retry answers
    // each row from its own funding record, and no ledger is credited twice
    let credit = json!({"filter": {"tenant_id": t.id, "scope_prefix": eng, "unit": "TOKENS"}, "action": "CREDIT",
        "amount": {"unit": "TOKENS", "amount": 5}, "idempotency_key": unique("k")});
    let first = h.admin("POST", BUDGETS, Some(&credit)).await;
    let rows = first.assert_ok()["succeeded"].as_array().unwrap().len();
    assert_eq!(rows, 2);
    let key = credit["idempotency_key"].as_str().unwrap();
    let record = cycles_shared::keys::TenantKeys::new("__admin__").idempotency("bulk-budget", &[key]);
    let _: () = redis::AsyncCommands::del(&mut h.store.conn(), &record).await.unwrap();
    let handles = vec![format!("x\t{eng}\tTOKENS"), format!("y\t{agent}\tTOKENS")];
    assert!(cycles_shared::ops::bulk::start(&h.store, "budget", key, &payload_hash(&credit, &[]), &handles)
        .await
        .unwrap());
    let retry = h.admin("POST", BUDGETS, Some(&credit)).await;
    assert_eq!(retry.assert_ok()["succeeded"].as_array().unwrap().len(), 2);
    assert_eq!(h.ledger(&t.id, &eng, Unit::Tokens).await.allocated, 1005, "credited once");
    assert_eq!(h.ledger(&t.id, &agent, Unit::Tokens).await.allocated, 1005, "credited once");

    // DEBIT past remaining fails that row with BUDGET_EXCEEDED, the others go through
    let debit = json!({"filter": {"tenant_id": t.id, "unit": "TOKENS"}, "action": "DEBIT",
        "amount": {"unit": "TOKENS", "amount": 2000}, "idempotency_key": unique("k")});
    let a = h.admin("POST", BUDGETS, Some(&debit)).await;
    let a = a.assert_ok();
    assert_eq!((a["succeeded"].as_array().unwrap().len(), a["failed"].as_array().unwrap().len()), (1, 2), "{a}");
    assert!(a["failed"].as_array().unwrap().iter().all(|f| f["error_code"] == "BUDGET_EXCEEDED"));
}

#[tokio::test]
async fn webhook_bulk_actions_pause_resume_and_delete() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let mut subs = vec![];
    for _ in 0..3 {
        let body = json!({"url": "https://93.184.216.34/h", "event_types": ["budget.funded"]});
        let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&body)).await;
        subs.push(r.body["subscription"]["subscription_id"].as_str().unwrap().to_string());
    }
    h.admin("PATCH", &format!("/v1/admin/webhooks/{}", subs[1]), Some(&json!({"status": "PAUSED"}))).await.assert_ok();
    let record = cycles_shared::keys::TenantKeys::new(&t.id).webhook(&subs[2]);
    let _: () = redis::AsyncCommands::hset(&mut h.store.conn(), &record, "status", "DISABLED").await.unwrap();
    let filter = json!({"tenant_id": t.id});
    h.admin("POST", WEBHOOKS, Some(&json!({"filter": {}, "action": "PAUSE", "idempotency_key": "k"})))
        .await
        .assert_error(400, "INVALID_REQUEST");
    h.admin(
        "POST",
        WEBHOOKS,
        Some(&json!({"filter": {"event_type": "no.such"}, "action": "PAUSE", "idempotency_key": "k"})),
    )
    .await
    .assert_error(400, "INVALID_REQUEST");

    let r = h
        .admin("POST", WEBHOOKS, Some(&json!({"filter": filter, "action": "PAUSE", "idempotency_key": unique("k")})))
        .await;
    let a = r.assert_ok();
    assert_eq!(ids(&a["succeeded"]), vec![subs[0].clone()]);
    assert_eq!(ids(&a["skipped"]), {
        let mut s = vec![subs[1].clone(), subs[2].clone()];
        s.sort();
        s
    });
    let rid = r.headers["x-request-id"].clone();
    let events = events_of(&h, &format!("webhook_bulk_action:pause:{rid}")).await;
    assert_eq!((events.len(), events[0]["event_type"].as_str()), (1, Some("webhook.paused")));

    let r = h
        .admin("POST", WEBHOOKS, Some(&json!({"filter": filter, "action": "RESUME", "idempotency_key": unique("k")})))
        .await;
    let a = r.assert_ok();
    assert_eq!(ids(&a["succeeded"]), {
        let mut s = vec![subs[0].clone(), subs[1].clone()];
        s.sort();
        s
    });
    assert_eq!(
        a["failed"],
        json!([{"id": subs[2], "error_code": "INVALID_TRANSITION",
        "message": "A DISABLED subscription is re-enabled by updating its status to ACTIVE"}])
    );

    let body = json!({"filter": filter, "action": "DELETE", "expected_count": 3, "idempotency_key": unique("k")});
    let r = h.admin("POST", WEBHOOKS, Some(&body)).await;
    assert_eq!(r.assert_ok()["succeeded"].as_array().unwrap().len(), 3);
    for id in &subs {
        h.admin("GET", &format!("/v1/admin/webhooks/{id}"), None).await.assert_error(404, "WEBHOOK_NOT_FOUND");
    }
    let rid = r.headers["x-request-id"].clone();
    assert_eq!(events_of(&h, &format!("webhook_bulk_action:delete:{rid}")).await.len(), 3);
    let r = h
        .admin("POST", WEBHOOKS, Some(&json!({"filter": filter, "action": "DELETE", "idempotency_key": unique("k")})))
        .await;
    assert_eq!(r.assert_ok()["total_matched"], 0);
}
