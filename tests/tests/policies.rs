//! Policies: createPolicy, listPolicies, updatePolicy (both auth modes, validation, events and
//! audit), and what they change at run time inside the operation's one script: caps, the
//! commit overage policy, reservation TTL and extensions, and per-minute rate limits.

use cycles_tests::*;
use serde_json::Value;

const PATH: &str = "/v1/admin/policies";

async fn create(h: &Harness, tenant: &str, body: Value) -> Value {
    let mut body = body;
    body["tenant_id"] = json!(tenant);
    let r = h.admin("POST", PATH, Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    r.body.clone()
}

async fn patch(h: &Harness, id: &str, body: Value) -> Resp {
    h.admin("PATCH", &format!("{PATH}/{id}"), Some(&body)).await
}

#[tokio::test]
async fn policies_are_created_listed_and_updated_under_both_auth_modes() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let body = json!({"name": "Eng default", "description": "d", "scope_pattern": format!("tenant:{}/*", t.id),
        "priority": 10, "caps": {"max_tokens": 4096, "tool_denylist": []}, "commit_overage_policy": "REJECT",
        "reservation_ttl_override": {"default_ttl_ms": 5000, "max_ttl_ms": 60000, "max_extensions": 2},
        "rate_limits": {"max_reservations_per_minute": 100}, "effective_from": "2026-01-01T00:00:00Z"});
    let p = create(&h, &t.id, body).await;
    let id = p["policy_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("pol_"));
    assert_eq!((p["status"].as_str(), p["priority"].as_i64()), (Some("ACTIVE"), Some(10)));
    assert_eq!(p["caps"], json!({"max_tokens": 4096, "tool_denylist": []}), "caps kept exactly");
    assert_eq!(p["reservation_ttl_override"]["max_extensions"], 2);
    assert_eq!(p["effective_from"], "2026-01-01T00:00:00.000Z");
    assert!(p["created_at"].is_string() && p["updated_at"].is_string() && p.get("tenant_id").is_none());

    // the same name again (any case) is a duplicate
    let dup = json!({"tenant_id": t.id, "name": "ENG DEFAULT", "scope_pattern": "agent:*"});
    h.admin("POST", PATH, Some(&dup)).await.assert_error(409, "DUPLICATE_RESOURCE");
    // tenant_id rules of the two auth modes
    h.admin("POST", PATH, Some(&json!({"name": "x", "scope_pattern": "agent:*"})))
        .await
        .assert_error(400, "INVALID_REQUEST");
    // (policies:* are not in the default permission set of a key)
    let pk = h.key(&t.id, Some(vec!["policies:write".into(), "policies:read".into()])).await;
    let own = json!({"name": "mine", "scope_pattern": "agent:*"});
    let with_tenant = json!({"tenant_id": t.id, "name": "mine", "scope_pattern": "agent:*"});
    h.admin_as(&pk.secret, "POST", PATH, Some(&with_tenant)).await.assert_error(400, "INVALID_REQUEST");
    h.admin_as(&t.key, "POST", PATH, Some(&own)).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    let mine = h.admin_as(&pk.secret, "POST", PATH, Some(&own)).await;
    assert_eq!(mine.status, 201, "{}", mine.raw);
    let unknown = json!({"tenant_id": "no-such-tenant", "name": "x", "scope_pattern": "agent:*"});
    h.admin("POST", PATH, Some(&unknown)).await.assert_error(400, "TENANT_NOT_FOUND");

    // bad policies are refused whole
    for bad in [
        json!({"scope_pattern": "tenant:someone-else/*"}),
        json!({"scope_pattern": "robot:x"}),
        json!({"scope_pattern": ""}),
        json!({"reservation_ttl_override": {"max_ttl_ms": 999}}),
        json!({"reservation_ttl_override": {"default_ttl_ms": 9000, "max_ttl_ms": 5000}}),
        json!({"rate_limits": {"max_commits_per_minute": 0}}),
        json!({"rate_limits": {"per_hour": 3}}),
        json!({"caps": {"max_tokens": -1}}),
        json!({"priority": -1}),
        json!({"effective_from": "2026-02-01T00:00:00Z", "effective_until": "2026-01-01T00:00:00Z"}),
        json!({"commit_overage_policy": "SOMETIMES"}),
        json!({"colour": "red"}),
    ] {
        let mut body = json!({"tenant_id": t.id, "name": "bad", "scope_pattern": "agent:*"});
        merge(&mut body, bad.clone());
        let r = h.admin("POST", PATH, Some(&body)).await;
        assert_eq!((r.status, r.error()), (400, "INVALID_REQUEST"), "{bad}: {}", r.raw);
        assert_error_shape(&r);
    }

    // listing: the admin key names the tenant; a tenant key sees its own
    h.admin("GET", PATH, None).await.assert_error(400, "INVALID_REQUEST");
    let all = h.admin("GET", &format!("{PATH}?tenant_id={}", t.id), None).await;
    let names: Vec<&str> =
        all.assert_ok()["policies"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["Eng default", "mine"], "highest priority first");
    let other = h.tenant().await;
    let other_key = h.key(&other.id, Some(vec!["policies:write".into(), "policies:read".into()])).await;
    let theirs = h.admin_as(&other_key.secret, "GET", PATH, None).await;
    assert_eq!(theirs.assert_ok()["policies"], json!([]));
    let page = h.admin("GET", &format!("{PATH}?tenant_id={}&limit=1", t.id), None).await;
    let next = page.assert_ok()["next_cursor"].as_str().unwrap().to_string();
    let page2 = h.admin("GET", &format!("{PATH}?tenant_id={}&limit=1&cursor={next}", t.id), None).await;
    assert_eq!(page2.assert_ok()["policies"][0]["name"], "mine");
    let filtered = h.admin("GET", &format!("{PATH}?tenant_id={}&scope_pattern=agent:*", t.id), None).await;
    assert_eq!(filtered.assert_ok()["policies"].as_array().unwrap().len(), 1);

    // update: fields change, null clears, the resulting state is checked, owners are enforced
    let r = patch(&h, &id, json!({"priority": 3, "caps": null, "status": "DISABLED", "description": null})).await;
    let u = r.assert_ok();
    assert_eq!((u["priority"].as_i64(), u["status"].as_str()), (Some(3), Some("DISABLED")));
    assert!(u.get("caps").is_none() && u.get("description").is_none(), "{u}");
    assert_eq!(u["created_at"], p["created_at"]);
    patch(&h, &id, json!({"reservation_ttl_override": {"default_ttl_ms": 90000000}}))
        .await
        .assert_error(400, "INVALID_REQUEST");
    patch(&h, &id, json!({"name": "mine"})).await.assert_error(409, "DUPLICATE_RESOURCE");
    patch(&h, &id, json!({"scope_pattern": "agent:*"})).await.assert_error(400, "INVALID_REQUEST");
    patch(&h, "pol_nope", json!({"priority": 1})).await.assert_error(404, "NOT_FOUND");
    h.admin_as(&other_key.secret, "PATCH", &format!("{PATH}/{id}"), Some(&json!({"priority": 1})))
        .await
        .assert_error(404, "NOT_FOUND");
    let renamed = patch(&h, &id, json!({"name": "Renamed"})).await;
    assert_eq!(renamed.assert_ok()["name"], "Renamed");
    // the old name is free again
    let again = json!({"tenant_id": t.id, "name": "eng default", "scope_pattern": "agent:*"});
    assert_eq!(h.admin("POST", PATH, Some(&again)).await.status, 201);

    // events and audit rows, written with the change
    let events = h.all_events(&t.id).await;
    let kinds: Vec<&str> =
        events.iter().filter_map(|e| e["event_type"].as_str()).filter(|k| k.starts_with("policy.")).collect();
    assert_eq!(kinds, ["policy.created", "policy.created", "policy.updated", "policy.updated", "policy.created"]);
    let updated = events.iter().find(|e| e["event_type"] == "policy.updated").unwrap();
    assert_eq!(updated["data"]["policy_id"], id.as_str());
    assert_eq!(updated["data"]["changed_fields"], json!(["description", "priority", "caps", "status"]));
    assert_eq!(updated["scope"], format!("tenant:{}/*", t.id));
    let logs = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={}&operation=updatePolicy", t.id), None).await;
    let rows = logs.assert_ok()["logs"].as_array().unwrap().clone();
    assert!(rows.iter().any(|e| e["status"] == 200 && e["resource_id"] == id.as_str()), "{rows:?}");

    // a closed tenant's policies are read-only
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "CLOSED"}))).await.assert_ok();
    patch(&h, &id, json!({"priority": 1})).await.assert_error(409, "TENANT_CLOSED");
    let closed = json!({"tenant_id": t.id, "name": "late", "scope_pattern": "agent:*"});
    h.admin("POST", PATH, Some(&closed)).await.assert_error(409, "TENANT_CLOSED");
}

#[tokio::test]
async fn scope_filtered_keys_write_and_see_only_admitted_patterns() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let k = h.key(&t.id, Some(vec!["policies:write".into(), "policies:read".into()])).await;
    h.admin("PATCH", &format!("/v1/admin/api-keys/{}", k.key_id), Some(&json!({"scope_filter": ["workspace:eng"]})))
        .await
        .assert_ok();
    let outside = json!({"name": "ops", "scope_pattern": format!("tenant:{}/workspace:ops/*", t.id)});
    h.admin_as(&k.secret, "POST", PATH, Some(&outside)).await.assert_error(403, "FORBIDDEN");
    let inside = json!({"name": "eng", "scope_pattern": format!("tenant:{}/workspace:eng/*", t.id)});
    assert_eq!(h.admin_as(&k.secret, "POST", PATH, Some(&inside)).await.status, 201);
    create(&h, &t.id, json!({"name": "everything", "scope_pattern": "*"})).await;
    let seen = h.admin_as(&k.secret, "GET", PATH, None).await;
    let names: Vec<&str> =
        seen.assert_ok()["policies"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["eng"]);
    let no_perm = h.key(&t.id, Some(vec!["reservations:create".into()])).await;
    h.admin_as(&no_perm.secret, "GET", PATH, None).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");
}

#[tokio::test]
async fn caps_come_from_the_highest_priority_matching_policy_in_effect() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let agent = json!({"subject": {"tenant": t.id, "agent": "bot"}});
    assert_eq!(h.reserve(&t, 1, agent.clone()).await.assert_ok()["decision"], "ALLOW");
    let low = create(&h, &t.id, json!({"name": "low", "scope_pattern": "agent:*", "caps": {"max_tokens": 100}})).await;
    let high = create(
        &h,
        &t.id,
        json!({"name": "high", "scope_pattern": format!("tenant:{}/agent:bot", t.id), "priority": 5,
            "caps": {"max_tokens": 10, "tool_denylist": ["shell"]}}),
    )
    .await;
    let r = h.reserve(&t, 1, agent.clone()).await;
    assert_eq!(r.assert_ok()["decision"], "ALLOW_WITH_CAPS");
    assert_eq!(r.body["caps"], json!({"max_tokens": 10, "tool_denylist": ["shell"]}));
    // decide and dry_run answer the same caps
    let decide = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id, "agent": "bot"},
        "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 1}});
    let d = h.post(&t.key, "/v1/decide", &decide).await;
    assert_eq!(
        (d.assert_ok()["decision"].as_str(), d.body["caps"]["max_tokens"].as_i64()),
        (Some("ALLOW_WITH_CAPS"), Some(10))
    );
    // a path the patterns do not match: no caps
    assert_eq!(h.reserve(&t, 1, json!({})).await.assert_ok()["decision"], "ALLOW");
    // disabled: the next one wins; out of its window: none
    patch(&h, high["policy_id"].as_str().unwrap(), json!({"status": "DISABLED"})).await.assert_ok();
    assert_eq!(h.reserve(&t, 1, agent.clone()).await.assert_ok()["caps"]["max_tokens"], 100);
    patch(&h, low["policy_id"].as_str().unwrap(), json!({"effective_until": "2026-01-01T00:00:00Z"})).await.assert_ok();
    assert_eq!(h.reserve(&t, 1, agent.clone()).await.assert_ok()["decision"], "ALLOW");
    patch(
        &h,
        low["policy_id"].as_str().unwrap(),
        json!({"effective_until": null, "effective_from": "2099-01-01T00:00:00Z"}),
    )
    .await
    .assert_ok();
    assert_eq!(h.reserve(&t, 1, agent).await.assert_ok()["decision"], "ALLOW");
}

#[tokio::test]
async fn overage_policy_precedence_is_request_then_policy_then_budget() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    h.admin(
        "PATCH",
        &format!("/v1/admin/budgets?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id),
        Some(&json!({"commit_overage_policy": "ALLOW_IF_AVAILABLE"})),
    )
    .await
    .assert_ok();
    create(
        &h,
        &t.id,
        json!({"name": "strict", "scope_pattern": format!("tenant:{}", t.id), "commit_overage_policy": "REJECT"}),
    )
    .await;
    // the policy's REJECT beats the budget's ALLOW_IF_AVAILABLE
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.commit(&t, &rid, 20).await.assert_error(409, "BUDGET_EXCEEDED");
    assert_eq!(h.root(&t).await.reserved, 10, "the refused commit changed nothing");
    // the request's own policy beats the policy's
    let rid = h.reserve_ok(&t, 10, json!({"overage_policy": "ALLOW_IF_AVAILABLE"})).await;
    assert_eq!(h.commit(&t, &rid, 20).await.assert_ok()["charged"]["amount"], 20);
    // post-only events follow the same order
    let event = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id}, "action": {"kind": "tool", "name": "x"},
        "actual": {"unit": "TOKENS", "amount": 5000}});
    h.post(&t.key, "/v1/events", &event).await.assert_error(409, "BUDGET_EXCEEDED");
}

#[tokio::test]
async fn ttl_overrides_tighten_the_tenant_limits() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    create(
        &h,
        &t.id,
        json!({"name": "short", "scope_pattern": format!("tenant:{}", t.id),
            "reservation_ttl_override": {"default_ttl_ms": 5000, "max_ttl_ms": 20000, "max_extensions": 1}}),
    )
    .await;
    let before = cycles_shared::domain::now_ms();
    let r = h.reserve(&t, 1, json!({})).await;
    let expires = r.assert_ok()["expires_at_ms"].as_i64().unwrap();
    assert!((before + 4000..=before + 6500).contains(&expires), "the policy default: {}", expires - before);
    let r = h.reserve(&t, 1, json!({"ttl_ms": 600000})).await;
    let expires = r.assert_ok()["expires_at_ms"].as_i64().unwrap();
    assert!(expires <= cycles_shared::domain::now_ms() + 20500, "capped by the policy maximum");
    let rid = r.body["reservation_id"].as_str().unwrap().to_string();
    h.extend(&t, &rid, 1000).await.assert_ok();
    h.extend(&t, &rid, 1000).await.assert_error(409, "MAX_EXTENSIONS_EXCEEDED");
}

#[tokio::test]
async fn rate_limits_answer_429_and_touch_nothing() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    create(
        &h,
        &t.id,
        json!({"name": "rl", "scope_pattern": "agent:*", "counting": "scope_path",
            "rate_limits": {"max_reservations_per_minute": 2, "max_commits_per_minute": 1}}),
    )
    .await;
    early_in_a_window(60_000, 15_000).await;
    let bot = json!({"subject": {"tenant": t.id, "agent": "bot"}});
    let a = h.reserve_ok(&t, 10, bot.clone()).await;
    let b = h.reserve_ok(&t, 10, bot.clone()).await;
    let ledger = h.root(&t).await;
    let r = h.reserve(&t, 10, bot.clone()).await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    assert_error_shape(&r);
    let after: i64 = r.headers["retry-after"].parse().unwrap();
    assert!((1..=60).contains(&after), "{after}");
    let reset: i64 = r.headers["x-ratelimit-reset"].parse().unwrap();
    assert_eq!(reset % 60, 0);
    assert!(reset * 1000 > cycles_shared::domain::now_ms());
    assert_eq!(h.root(&t).await, ledger, "a limited reserve touches no balance");
    // per scope path (`counting: scope_path`): another agent has its own window; a path the
    // pattern misses has none
    h.reserve_ok(&t, 10, json!({"subject": {"tenant": t.id, "agent": "other"}})).await;
    h.reserve_ok(&t, 10, json!({})).await;
    // commits: the second in the minute is refused and the reservation stays open
    h.commit(&t, &a, 5).await.assert_ok();
    h.commit(&t, &b, 5).await.assert_error(429, "LIMIT_EXCEEDED");
    let got = h.get(&t.key, &format!("/v1/reservations/{b}")).await;
    assert_eq!(got.assert_ok()["status"], "ACTIVE");
    // decide is never limited
    let decide = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id, "agent": "bot"},
        "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 1}});
    h.post(&t.key, "/v1/decide", &decide).await.assert_ok();
}

/// A policy's window opens and closes with time alone (no write to it between): the settings
/// in force, which the scripts remember per rule texts and scope, are worked out again when a
/// window of any rule starts or ends.
#[tokio::test]
async fn a_window_opens_and_closes_with_time_alone() {
    use cycles_shared::domain::{format_rfc3339_ms, now_ms};
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let start = now_ms() + 1_500;
    create(
        &h,
        &t.id,
        json!({"name": "window", "scope_pattern": format!("tenant:{}", t.id), "caps": {"max_tokens": 7},
            "effective_from": format_rfc3339_ms(start), "effective_until": format_rfc3339_ms(start + 1_500)}),
    )
    .await;
    let decision = || async { h.reserve(&t, 1, json!({})).await.assert_ok()["decision"].as_str().unwrap().to_string() };
    assert_eq!(decision().await, "ALLOW", "before its window");
    tokio::time::sleep(std::time::Duration::from_millis((start - now_ms() + 100).max(0) as u64)).await;
    let r = h.reserve(&t, 1, json!({})).await;
    assert_eq!(
        (r.assert_ok()["decision"].as_str(), r.body["caps"]["max_tokens"].as_i64()),
        (Some("ALLOW_WITH_CAPS"), Some(7))
    );
    tokio::time::sleep(std::time::Duration::from_millis((start + 1_500 - now_ms() + 100).max(0) as u64)).await;
    assert_eq!(decision().await, "ALLOW", "after its window");
}

/// Rules whose stored texts are long (past what the scripts remember the settings by: 4 KB)
/// are weighed on every request instead, with the same answers.
#[tokio::test]
async fn long_rules_are_weighed_alike() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let scope = format!("tenant:{}", t.id);
    let long = "x".repeat(1_000);
    let mut ids = Vec::new();
    for (i, tokens) in [10, 20, 30, 40, 50].into_iter().enumerate() {
        let body = json!({"name": format!("p{i}"), "description": long, "scope_pattern": scope, "priority": i,
            "caps": {"max_tokens": tokens}});
        ids.push(create(&h, &t.id, body).await["policy_id"].as_str().unwrap().to_string());
    }
    let caps = || async { h.reserve(&t, 1, json!({})).await.assert_ok()["caps"]["max_tokens"].as_i64() };
    assert_eq!(caps().await, Some(50), "the highest priority");
    patch(&h, &ids[4], json!({"status": "DISABLED"})).await.assert_ok();
    assert_eq!(caps().await, Some(40), "the next one, once the first is disabled");
    assert_eq!(caps().await, Some(40));
}

/// The tenant record counts its rules and keeps their digest through every policy write, and
/// the settings in force follow each write at the next request (the scripts remember them by
/// that digest: a write that left it as it was would leave them stale).
#[tokio::test]
async fn each_policy_write_is_seen_by_the_next_request() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let scope = format!("tenant:{}", t.id);
    let caps = || async { h.reserve(&t, 1, json!({})).await.assert_ok()["caps"]["max_tokens"].as_i64() };
    assert_eq!(h.rules_digest_is_current(&t.id).await, "", "no rules, no digest");
    assert_eq!(caps().await, None);
    let body = json!({"name": "cap", "scope_pattern": scope, "caps": {"max_tokens": 7}});
    let id = create(&h, &t.id, body).await["policy_id"].as_str().unwrap().to_string();
    let first = h.rules_digest_is_current(&t.id).await;
    assert_eq!(caps().await, Some(7));
    patch(&h, &id, json!({"caps": {"max_tokens": 9}})).await.assert_ok();
    let second = h.rules_digest_is_current(&t.id).await;
    assert_ne!(first, second);
    assert_eq!(caps().await, Some(9), "the update, at the next request");
    create(&h, &t.id, json!({"name": "higher", "scope_pattern": scope, "priority": 5, "caps": {"max_tokens": 3}}))
        .await;
    assert_ne!(h.rules_digest_is_current(&t.id).await, second);
    assert_eq!(caps().await, Some(3), "the new policy, at the next request");
    patch(&h, &id, json!({"caps": {"max_tokens": 7}})).await.assert_ok();
    assert_ne!(h.rules_digest_is_current(&t.id).await, first, "two rules are another digest than one");
    assert_eq!(caps().await, Some(3));
}
