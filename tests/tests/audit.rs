//! listAuditLogs: every operator-plane change, refusal and failure leaves one entry (a change's
//! written by its own script, everything else by the dispatcher), and with
//! `CYCLES_AUDIT_READS=on` every successful read too; with the spec's fields, sentinel owners,
//! every filter and sort, cursors, entries from before the audit stream, and retention.

use cycles_shared::keys::TenantKeys;
use cycles_tests::*;
use redis::AsyncCommands;
use serde_json::Value;

async fn logs(h: &Harness, query: &str) -> Vec<Value> {
    let r = h.admin("GET", &format!("/v1/admin/audit/logs?{query}"), None).await;
    r.assert_ok()["logs"].as_array().unwrap().clone()
}

fn ops(entries: &[Value]) -> Vec<String> {
    entries.iter().map(|e| e["operation"].as_str().unwrap().to_string()).collect()
}

/// A server that audits reads too (`CYCLES_AUDIT_READS=on`).
async fn auditing_reads() -> Harness {
    Harness::start_configured(|c| c.audit_reads = true).await
}

#[tokio::test]
async fn every_operator_request_leaves_one_entry_with_the_spec_fields() {
    let h = auditing_reads().await;
    let t = h.funded(1000).await;
    // a change: its entry comes from the script that made it
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5}});
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
    let r = h
        .send_to(
            &h.admin_base,
            "POST",
            &path,
            &[("x-admin-api-key", ADMIN_KEY), ("user-agent", "console/1.0")],
            Some(&fund.to_string()),
        )
        .await;
    r.assert_ok();
    let rid = r.headers["x-request-id"].clone();
    let found = logs(&h, &format!("tenant_id={}&request_id={rid}", t.id)).await;
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert!(e["log_id"].as_str().unwrap().starts_with("aud_"));
    assert_eq!(
        (e["tenant_id"].as_str(), e["operation"].as_str(), e["status"].as_u64()),
        (Some(t.id.as_str()), Some("fundBudget"), Some(200))
    );
    assert_eq!((e["resource_type"].as_str(), e["user_agent"].as_str()), (Some("budget"), Some("console/1.0")));
    assert_eq!(e["trace_id"], r.headers["x-cycles-trace-id"].as_str());
    assert_eq!(e["source_ip"], "127.0.0.1");
    assert_eq!(e["metadata"]["actor_type"], "admin_on_behalf_of");
    assert!(e.get("error_code").is_none());
    // a read of one tenant: the dispatcher's entry, under that tenant
    let r = h.admin("GET", &format!("/v1/admin/tenants/{}", t.id), None).await;
    let rid = r.headers["x-request-id"].clone();
    let e = &logs(&h, &format!("request_id={rid}")).await[0];
    assert_eq!(
        (e["tenant_id"].as_str(), e["operation"].as_str(), e["resource_id"].as_str()),
        (Some(t.id.as_str()), Some("getTenant"), Some(t.id.as_str()))
    );
    // a cross-tenant read by the admin key: `__admin__`
    let r = h.admin("GET", "/v1/admin/tenants", None).await;
    let e = &logs(&h, &format!("tenant_id=__admin__&request_id={}", r.headers["x-request-id"])).await[0];
    assert_eq!((e["operation"].as_str(), e["status"].as_u64()), (Some("listTenants"), Some(200)));
    // a refusal records its status and code
    let r = h.admin("GET", &format!("/v1/admin/budgets/lookup?scope=tenant:{}/app:none&unit=TOKENS", t.id), None).await;
    r.assert_error(404, "BUDGET_NOT_FOUND");
    let e = &logs(&h, &format!("request_id={}", r.headers["x-request-id"])).await[0];
    assert_eq!((e["status"].as_u64(), e["error_code"].as_str()), (Some(404), Some("BUDGET_NOT_FOUND")));
    // a request that failed authentication: `__unauth__`
    let r = h.send_to(&h.admin_base, "GET", "/v1/admin/tenants", &[("x-admin-api-key", "wrong")], None).await;
    r.assert_error(401, "UNAUTHORIZED");
    let e = &logs(&h, &format!("tenant_id=__unauth__&request_id={}", r.headers["x-request-id"])).await[0];
    assert_eq!((e["tenant_id"].as_str(), e["status"].as_u64()), (Some("__unauth__"), Some(401)));
    // a tenant key on the operator plane: its tenant and key
    let r = h.send_to(&h.admin_base, "GET", "/v1/admin/budgets", &[("x-cycles-api-key", &t.key)], None).await;
    r.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    let e = &logs(&h, &format!("request_id={}", r.headers["x-request-id"])).await[0];
    assert_eq!((e["tenant_id"].as_str(), e["key_id"].as_str()), (Some(t.id.as_str()), Some(t.key_id.as_str())));
    assert_eq!((e["status"].as_u64(), e["metadata"]["actor_type"].as_str()), (Some(403), Some("api_key")));
    // the listing itself is audited too, once
    let r = h.admin("GET", "/v1/admin/audit/logs?limit=1", None).await;
    assert_eq!(logs(&h, &format!("request_id={}", r.headers["x-request-id"])).await.len(), 1);
}

#[tokio::test]
async fn filters_sorts_and_cursors() {
    let h = auditing_reads().await;
    let t = h.funded(1000).await;
    for i in 0..3 {
        h.admin("GET", &format!("/v1/admin/tenants/{}", t.id), None).await.assert_ok();
        h.admin("GET", &format!("/v1/admin/budgets/lookup?scope=tenant:{}/app:n{i}&unit=TOKENS", t.id), None).await;
    }
    let q = format!("tenant_id={}", t.id);
    // provisioning wrote createTenant, createApiKey, createBudget
    let all = logs(&h, &q).await;
    assert_eq!(ops(&all)[..3], ["lookupBudget", "getTenant", "lookupBudget"], "newest first");
    let times: Vec<&str> = all.iter().map(|e| e["timestamp"].as_str().unwrap()).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]));
    assert_eq!(logs(&h, &format!("{q}&operation=getTenant,createBudget")).await.len(), 4);
    assert_eq!(logs(&h, &format!("{q}&status=404")).await.len(), 3);
    assert_eq!(logs(&h, &format!("{q}&status_min=400&status_max=499")).await.len(), 3);
    assert_eq!(logs(&h, &format!("{q}&error_code=BUDGET_NOT_FOUND")).await.len(), 3);
    // exclusion never hides entries without an error code
    assert_eq!(logs(&h, &format!("{q}&error_code_exclude=BUDGET_NOT_FOUND")).await.len(), all.len() - 3);
    assert_eq!(logs(&h, &format!("{q}&resource_type=tenant")).await.len(), 4);
    assert_eq!(logs(&h, &format!("{q}&search=lookup")).await.len(), 3);
    let sorted = ops(&logs(&h, &format!("{q}&sort_by=operation&sort_dir=asc")).await);
    let mut expected = sorted.clone();
    expected.sort();
    assert_eq!(sorted, expected);
    // pages walk every entry once
    let mut seen = vec![];
    let mut path = format!("/v1/admin/audit/logs?{q}&limit=2");
    loop {
        let r = h.admin("GET", &path, None).await;
        let body = r.assert_ok().clone();
        seen.extend(body["logs"].as_array().unwrap().iter().map(|e| e["log_id"].as_str().unwrap().to_string()));
        match body["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/admin/audit/logs?{q}&limit=2&cursor={c}"),
            None => break,
        }
    }
    let unique: std::collections::HashSet<_> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len());
    assert!(seen.len() >= all.len());
    // a time window
    let newest = all[0]["timestamp"].as_str().unwrap();
    assert!(!logs(&h, &format!("{q}&from={}", newest.replace(':', "%3A"))).await.is_empty());
    assert!(logs(&h, &format!("{q}&to=2000-01-01T00%3A00%3A00Z")).await.is_empty());
    // bad combinations are 400
    for bad in [
        "status=200&status_min=100",
        "status_min=500&status_max=400",
        "status_min=99",
        "trace_id=XYZ",
        "sort_by=color",
        "limit=0",
    ] {
        h.admin("GET", &format!("/v1/admin/audit/logs?{bad}"), None).await.assert_error(400, "INVALID_REQUEST");
    }
    let many = (0..26).map(|i| format!("op{i}")).collect::<Vec<_>>().join(",");
    h.admin("GET", &format!("/v1/admin/audit/logs?operation={many}"), None).await.assert_error(400, "INVALID_REQUEST");
    // admin only
    let r = h.send_to(&h.admin_base, "GET", "/v1/admin/audit/logs", &[("x-cycles-api-key", &t.key)], None).await;
    r.assert_error(401, "UNAUTHORIZED");
}

#[tokio::test]
async fn entries_from_before_the_audit_stream_are_listed_and_age_out() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    let keys = TenantKeys::new(&t.id);
    let old = cycles_shared::domain::now_ms() - 10 * 86_400_000;
    for (i, ms) in [old, old + 1].iter().enumerate() {
        let row = json!({"timestamp_ms": ms, "action": "budget.fund", "resource_type": "budget", "resource_id": format!("led_{i}"),
            "actor_type": "admin", "request_id": format!("legacy-{i}")});
        let _: () = h.store.conn().rpush(keys.legacy_audit_log(), row.to_string()).await.unwrap();
    }
    let found = logs(&h, &format!("tenant_id={}&resource_type=budget&to=2999-01-01T00%3A00%3A00Z", t.id)).await;
    let legacy: Vec<&Value> =
        found.iter().filter(|e| e["request_id"].as_str().is_some_and(|r| r.starts_with("legacy-"))).collect();
    assert_eq!(legacy.len(), 2);
    assert_eq!(
        (legacy[0]["operation"].as_str(), legacy[0]["resource_id"].as_str()),
        (Some("budget.fund"), Some("led_1"))
    );
    // retention: with a 5-day audit retention the sweep drops them (and keeps today's)
    let opts = cycles_shared::config::SweepOptions {
        audit_retention: std::time::Duration::from_secs(5 * 86_400),
        ..Default::default()
    };
    cycles_shared::jobs::sweep::sweep_tenant(&h.store, &t.id, &opts, &mut Default::default()).await.unwrap();
    let len: usize = h.store.conn().llen(keys.legacy_audit_log()).await.unwrap();
    assert_eq!(len, 0);
    assert!(!logs(&h, &format!("tenant_id={}", t.id)).await.is_empty(), "recent entries stay");
}

/// By default the audit log holds what an auditor looks for: changes, refusals and failures,
/// not the console's polling (successful reads).
#[tokio::test]
async fn successful_reads_are_audited_only_when_asked() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let q = format!("tenant_id={}", t.id);
    let before = logs(&h, &q).await.len();
    h.admin("GET", &format!("/v1/admin/tenants/{}", t.id), None).await.assert_ok();
    h.admin("GET", &format!("/v1/admin/budgets?tenant_id={}", t.id), None).await.assert_ok();
    assert_eq!(logs(&h, &q).await.len(), before, "a successful read was audited");
    // a refused read and a change are
    let r = h.admin("GET", &format!("/v1/admin/budgets/lookup?scope=tenant:{}/app:none&unit=TOKENS", t.id), None).await;
    r.assert_error(404, "BUDGET_NOT_FOUND");
    let body = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5}, "idempotency_key": "f-1"});
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
    h.admin("POST", &path, Some(&body)).await.assert_ok();
    assert_eq!(ops(&logs(&h, &q).await)[..2], ["fundBudget", "lookupBudget"]);
    // the same reads with CYCLES_AUDIT_READS=on are
    let reading = Harness::start_beside(&h, |c| c.audit_reads = true).await;
    reading.admin("GET", &format!("/v1/admin/tenants/{}", t.id), None).await.assert_ok();
    assert_eq!(ops(&logs(&h, &q).await)[0], "getTenant");
}
