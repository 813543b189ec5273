//! Protocol v0.1.26 action authority through the API: the policies' allow/deny lists and
//! quotas, the reservation evaluation order (access control, risk-class quotas, per-kind
//! quotas, budget) with counters moved in the same script, per_run lifecycles, policy-key
//! allowlists, observe mode, DenyDetail, threshold and reset events, the counter endpoints and
//! the v0.1.25 answer shapes. The checklist is docs/v0.1.26-checklist.md.

use std::time::Duration;

use cycles_shared::jobs::sweep::SweepOptions;
use cycles_tests::*;
use serde_json::Value;

const POLICIES: &str = "/v1/admin/policies";
const COUNTERS: &str = "/v1/admin/action-quota-counters";
const HOUR: i64 = 3_600_000;

async fn policy(h: &Harness, t: &Tenant, body: Value) -> Value {
    let mut body = body;
    body["tenant_id"] = json!(t.id);
    if body.get("name").is_none() {
        body["name"] = json!(unique("p"));
    }
    if body.get("scope_pattern").is_none() {
        body["scope_pattern"] = json!(format!("tenant:{}", t.id));
    }
    h.admin("POST", POLICIES, Some(&body)).await.assert_created().clone()
}

async fn counters(h: &Harness, t: &Tenant, query: &str) -> Vec<Value> {
    let r = h.admin("GET", &format!("{COUNTERS}?tenant_id={}&{query}", t.id), None).await;
    r.assert_ok()["counters"].as_array().unwrap().clone()
}

/// How long counter `member` of `t` has left before its cleanup deadline (ms; its due score).
async fn counter_deadline(h: &Harness, t: &Tenant, member: &str) -> i64 {
    let due: f64 = redis::cmd("ZSCORE")
        .arg(format!("cy:{{{}}}:quotas:due", t.id))
        .arg(member)
        .query_async(&mut h.store.conn())
        .await
        .unwrap();
    due as i64 - cycles_shared::domain::now_ms()
}

async fn policy_ids(h: &Harness, t: &Tenant, q: &str) -> Vec<String> {
    let r = h.admin("GET", &format!("{POLICIES}?tenant_id={}&{q}", t.id), None).await;
    r.assert_ok()["policies"].as_array().unwrap().iter().map(|p| p["policy_id"].as_str().unwrap().into()).collect()
}

fn kind(k: &str) -> Value {
    json!({"action": {"kind": k, "name": "tool"}})
}

async fn reserve_run(h: &Harness, t: &Tenant, k: &str, run: &str, extra: Value) -> Resp {
    let mut body =
        json!({"subject": {"tenant": t.id, "dimensions": {"run_id": run}}, "action": {"kind": k, "name": "x"}});
    merge(&mut body, extra);
    h.reserve(t, 10, body).await
}

#[tokio::test]
async fn policies_carry_action_rules_validated_and_announced() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let plain = policy(&h, &t, json!({"scope_pattern": "agent:*"})).await;
    for f in ["action_quotas", "risk_class_quotas", "allowed_action_kinds", "denied_action_kinds"] {
        assert_eq!(plain[f], json!([]), "{f}: empty lists, never absent");
    }
    let p = policy(
        &h,
        &t,
        json!({"action_quotas": [{"action_kind": "message.email.send", "max_calls": 5,
        "window": "per_run", "per_run_counter_ttl_ms": 60000, "host_allowlist": ["SMTP.Example.com"]}],
        "risk_class_quotas": [{"risk_class": "high_risk", "max_calls": 10, "window": "per_hour_tumbling"}],
        "denied_action_kinds": ["code.exec.shell"]}),
    )
    .await;
    assert_eq!(p["action_quotas"][0]["host_allowlist"], json!(["smtp.example.com"]), "hosts are stored lower-case");
    assert_eq!(p["risk_class_quotas"][0]["risk_class"], "high_risk");
    let id = p["policy_id"].as_str().unwrap();

    for bad in [
        json!({"allowed_action_kinds": ["llm.completion"], "denied_action_kinds": ["web.search"]}),
        json!({"action_quotas": [{"action_kind": "no.such.kind", "max_calls": 1, "window": "per_run"}]}),
        json!({"action_quotas": [{"action_kind": "custom.acme.erp", "max_calls": 1, "window": "per_run"}]}),
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 0, "window": "per_run"}]}),
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 1, "window": "per_week"}]}),
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 1, "window": "per_day_tumbling",
            "per_run_counter_ttl_ms": 60000}]}),
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 1, "window": "per_run",
            "threshold_pct": 1.5}]}),
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 1}]}),
        json!({"risk_class_quotas": [{"risk_class": "scary", "max_calls": 1, "window": "per_run"}]}),
        json!({"allowed_action_kinds": ["custom.acme.undeclared"]}),
        json!({"denied_action_kinds": ["Not A Kind"]}),
    ] {
        let mut body = bad.clone();
        body["tenant_id"] = json!(t.id);
        body["name"] = json!(unique("bad"));
        body["scope_pattern"] = json!("agent:*");
        h.admin("POST", POLICIES, Some(&body)).await.assert_error(400, "INVALID_REQUEST");
        h.admin("PATCH", &format!("{POLICIES}/{id}"), Some(&bad)).await.assert_error(400, "INVALID_REQUEST");
    }
    // clearing one list while setting the other is allowed; lists are replaced whole
    let patched = h
        .admin(
            "PATCH",
            &format!("{POLICIES}/{id}"),
            Some(&json!({"denied_action_kinds": [],
            "allowed_action_kinds": ["llm.completion", "web.search"]})),
        )
        .await;
    assert_eq!(patched.assert_ok()["allowed_action_kinds"], json!(["llm.completion", "web.search"]));
    assert_eq!(patched.body["denied_action_kinds"], json!([]));
    let updated = h.admin_events(&t.id, "policy.updated").await;
    let changed = &updated.last().unwrap()["data"]["changed_fields"];
    assert_eq!(changed, &json!(["allowed_action_kinds", "denied_action_kinds"]));

    // listPolicies filters
    assert_eq!(policy_ids(&h, &t, "has_action_quotas=true").await, vec![id.to_string()]);
    assert_eq!(
        policy_ids(&h, &t, "has_action_quotas=false").await,
        vec![plain["policy_id"].as_str().unwrap().to_string()]
    );
    assert_eq!(policy_ids(&h, &t, "references_action_kind=web.search").await, vec![id.to_string()]);
    assert_eq!(policy_ids(&h, &t, "references_action_kind=message.email.send").await, vec![id.to_string()]);
    assert!(policy_ids(&h, &t, "references_action_kind=http.get").await.is_empty());
    let r = h.admin("GET", &format!("{POLICIES}?tenant_id={}&has_action_quotas=maybe", t.id), None).await;
    r.assert_error(400, "INVALID_REQUEST");
}

#[tokio::test]
async fn a_tenant_observe_mode_is_kept_changed_and_filtered() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let path = format!("/v1/admin/tenants/{}", t.id);
    assert_eq!(h.admin("GET", &path, None).await.assert_ok()["observe_mode"], "ENFORCE");
    let r = h.admin("PATCH", &path, Some(&json!({"observe_mode": "OBSERVE"}))).await;
    assert_eq!(r.assert_ok()["observe_mode"], "OBSERVE");
    let e = h.admin_events(&t.id, "tenant.settings_changed").await;
    assert_eq!(e.last().unwrap()["data"]["changed_fields"], json!(["observe_mode"]));
    h.admin("PATCH", &path, Some(&json!({"observe_mode": "SOMETIMES"}))).await.assert_error(400, "INVALID_REQUEST");
    let listed = h.admin("GET", "/v1/admin/tenants?observe_mode=OBSERVE&limit=100", None).await;
    let ids: Vec<&str> =
        listed.assert_ok()["tenants"].as_array().unwrap().iter().map(|x| x["tenant_id"].as_str().unwrap()).collect();
    assert!(ids.contains(&t.id.as_str()));
    assert!(ids.iter().all(|id| *id != "x"), "only observing tenants");
    h.admin("GET", "/v1/admin/tenants?observe_mode=MAYBE", None).await.assert_error(400, "INVALID_REQUEST");
    let o = cycles_shared::ops::overview::refresh(&h.store).await.unwrap();
    assert!(o["tenant_counts"]["in_observe_mode"].as_i64().unwrap() >= 1);
}

#[tokio::test]
async fn access_lists_are_a_hard_gate_before_quotas_and_budgets() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let deny = policy(&h, &t, json!({"priority": 1, "denied_action_kinds": ["code.exec.shell"]})).await;
    let before = h.root(&t).await;
    let r = h.reserve(&t, 10, kind("code.exec.shell")).await;
    r.assert_error(409, "ACTION_KIND_DENIED");
    let d = &r.body["details"]["deny_detail"];
    assert_eq!(
        (d["reason_code"].as_str(), d["blocked_by_policy"].as_str()),
        (Some("ACTION_KIND_DENIED"), deny["policy_id"].as_str())
    );
    assert!(d["suggested_fix"].as_str().unwrap().contains("denied_action_kinds") && d.get("quota_violation").is_none());
    assert_eq!(h.root(&t).await.remaining, before.remaining, "no balance touched");
    // the denial wins over a budget that would also deny
    h.reserve(&t, 5000, kind("code.exec.shell")).await.assert_error(409, "ACTION_KIND_DENIED");
    h.reserve_ok(&t, 10, kind("web.search")).await;
    let ev = h.admin_events(&t.id, "reservation.denied").await;
    let last = &ev.last().unwrap()["data"];
    assert_eq!(
        (last["reason_code"].as_str(), last["policy_id"].as_str()),
        (Some("ACTION_KIND_DENIED"), deny["policy_id"].as_str())
    );
    assert_eq!(last["deny_detail"]["reason_code"], "ACTION_KIND_DENIED");

    // a higher-priority policy's lists replace the lower one's (never merged)
    let allow =
        policy(&h, &t, json!({"priority": 5, "allowed_action_kinds": ["code.exec.shell", "llm.completion"]})).await;
    h.reserve_ok(&t, 10, kind("code.exec.shell")).await;
    let r = h.reserve(&t, 10, kind("web.search")).await;
    r.assert_error(409, "ACTION_KIND_NOT_ALLOWED");
    assert_eq!(r.body["details"]["deny_detail"]["blocked_by_policy"], allow["policy_id"]);
    // decide and dry_run answer the same as a decision, with the detail mirrored
    let body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id}, "action": {"kind": "web.search", "name": "x"},
        "estimate": {"unit": "TOKENS", "amount": 1}});
    let d = h.post(&t.key, "/v1/decide", &body).await;
    let d = d.assert_ok();
    assert_eq!((d["decision"].as_str(), d["reason_code"].as_str()), (Some("DENY"), Some("ACTION_KIND_NOT_ALLOWED")));
    assert_eq!(d["deny_detail"]["reason_code"], "ACTION_KIND_NOT_ALLOWED");
    let dry = h.reserve(&t, 10, json!({"action": {"kind": "web.search", "name": "x"}, "dry_run": true})).await;
    assert_eq!(dry.assert_ok()["deny_detail"]["reason_code"], "ACTION_KIND_NOT_ALLOWED");
    let o = cycles_shared::ops::overview::refresh(&h.store).await.unwrap();
    assert!(o["recent_denials_by_reason"]["ACTION_KIND_DENIED"].as_i64().unwrap() >= 2);
    assert!(o["access_control_stats"]["policies_with_deny_list"].as_i64().unwrap() >= 1);
    assert!(o["access_control_stats"]["policies_with_allow_list"].as_i64().unwrap() >= 1);
    // the base-spec gates come first: a suspended tenant is denied as such, whatever the lists say
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "SUSPENDED"}))).await.assert_ok();
    let mut body = body;
    body["idempotency_key"] = json!(unique("d"));
    let d = h.post(&t.key, "/v1/decide", &body).await;
    assert_eq!(d.assert_ok()["reason_code"], "TENANT_SUSPENDED");
}

#[tokio::test]
async fn a_per_minute_quota_counts_holds_and_a_quota_denial_touches_no_balance() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let p = policy(
        &h,
        &t,
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 2,
        "window": "per_minute_tumbling"}]}),
    )
    .await;
    early_in_a_window(60_000, 15_000).await;
    // a budget denial moves no counter
    h.reserve(&t, 500, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    assert!(counters(&h, &t, "").await.is_empty());
    let a = h.reserve_ok(&t, 10, json!({})).await;
    let b = h.reserve_ok(&t, 10, json!({})).await;
    h.commit(&t, &a, 5).await.assert_ok();
    h.release(&t, &b).await.assert_ok();
    let r = h.reserve(&t, 10, json!({})).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    let v = &r.body["details"]["deny_detail"]["quota_violation"];
    let minute = &cycles_shared::domain::format_rfc3339_ms(cycles_shared::domain::now_ms())[..16];
    assert_eq!(v["action_kind"], "llm.completion");
    assert_eq!(
        (v["used"].as_i64(), v["limit"].as_i64()),
        (Some(2), Some(2)),
        "commit and release leave a calendar counter"
    );
    assert_eq!((v["window"].as_str(), v["window_key"].as_str()), (Some("per_minute_tumbling"), Some(minute)));
    assert_eq!(v["scope"], format!("tenant:{}", t.id));
    assert_eq!(v["policy_id"], p["policy_id"]);
    assert!(v.get("risk_class").is_none());
    let root = h.root(&t).await;
    assert_eq!((root.reserved, root.spent, root.remaining), (0, 5, 95), "the denied reserve held nothing");
    let c = counters(&h, &t, "").await;
    assert_eq!(c.len(), 1);
    assert_eq!(
        (c[0]["used"].as_i64(), c[0]["remaining"].as_i64(), c[0]["window_key"].as_str()),
        (Some(2), Some(0), Some(minute))
    );
    assert!(c[0]["expires_at"].as_str().unwrap().ends_with(":00.000Z") && c[0]["last_incremented_at"].is_string());
    // another kind is not counted by this quota
    h.reserve_ok(&t, 10, kind("web.search")).await;
    // the cleanup deadline (120 s after the minute starts) never defines the window
    let member = format!("tenant:{}|llm.completion|per_minute_tumbling|{minute}", t.id);
    let left = counter_deadline(&h, &t, &member).await;
    assert!((60_000..=120_000).contains(&left), "{left}");
    let o = cycles_shared::ops::overview::refresh(&h.store).await.unwrap();
    assert!(o["quota_health"]["counters_at_limit"].as_i64().unwrap() >= 1);
}

#[tokio::test]
async fn risk_class_quotas_aggregate_their_class_and_are_checked_first() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(
        &h,
        &t,
        json!({"risk_class_quotas": [{"risk_class": "external_side_effect", "max_calls": 2,
        "window": "per_hour_tumbling"}], "action_quotas": [{"action_kind": "http.post", "max_calls": 5,
        "window": "per_hour_tumbling"}]}),
    )
    .await;
    h.reserve_ok(&t, 10, kind("http.post")).await;
    h.reserve_ok(&t, 10, kind("message.email.send")).await;
    h.reserve_ok(&t, 10, kind("web.search")).await; // read_only: not in the class
    let r = h.reserve(&t, 10, kind("http.post")).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    let v = &r.body["details"]["deny_detail"]["quota_violation"];
    assert_eq!(
        (v["risk_class"].as_str(), v["action_kind"].as_str(), v["used"].as_i64()),
        (Some("external_side_effect"), Some("http.post"), Some(2))
    );
    let c = counters(&h, &t, "").await;
    let find = |k: &str| c.iter().find(|x| x["action_kind"] == k).cloned().unwrap();
    assert_eq!(find("__risk__")["risk_class"], "external_side_effect");
    assert_eq!(find("__risk__")["used"], 2);
    assert_eq!(find("http.post")["used"], 1, "one reservation counted in both; the denied one in neither");
    assert_eq!(counters(&h, &t, "action_kind=__risk__").await.len(), 1);
    assert_eq!(counters(&h, &t, "action_kind=http.post&window=per_hour_tumbling").await.len(), 1);
    assert!(counters(&h, &t, "window=per_run").await.is_empty());
}

#[tokio::test]
async fn per_run_quotas_need_the_run_id_and_give_uncommitted_calls_back() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(
        &h,
        &t,
        json!({"action_quotas": [{"action_kind": "message.email.send", "max_calls": 2, "window": "per_run",
        "per_run_counter_ttl_ms": 60000}]}),
    )
    .await;
    let r = h.reserve(&t, 10, kind("message.email.send")).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert!(r.body["message"].as_str().unwrap().contains("run_id"));
    let a = reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_ok()["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    let b = reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_ok()["reservation_id"]
        .as_str()
        .unwrap()
        .to_string();
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    reserve_run(&h, &t, "message.email.send", "r2", json!({})).await.assert_ok(); // another run, its own counter
    h.commit(&t, &a, 10).await.assert_ok(); // a committed call stays counted
    h.release(&t, &b).await.assert_ok(); // a released one is given back
    let c = counters(&h, &t, "run_id=r1").await;
    assert_eq!((c.len(), c[0]["used"].as_i64(), c[0]["window_key"].as_str()), (1, Some(1), Some("r1")));
    assert!(c[0].get("expires_at").is_none());
    let left = counter_deadline(&h, &t, &format!("tenant:{}|message.email.send|per_run|r1", t.id)).await;
    assert!((50_000..=60_000).contains(&left), "per_run deadline from the quota, refreshed per increment: {left}");
    // an expired, uncommitted call is given back too (once)
    reserve_run(&h, &t, "message.email.send", "r1", json!({"ttl_ms": 1000, "grace_period_ms": 0})).await.assert_ok();
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h.sweep_tenant(&t, &SweepOptions::default()).await.expired, 1);
    assert_eq!(counters(&h, &t, "run_id=r1").await[0]["used"], 1);
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_ok();
}

#[tokio::test]
async fn allowlists_scope_a_quota_by_the_kinds_declared_policy_keys() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(&h, &t, json!({"action_quotas": [
        {"action_kind": "http.post", "max_calls": 1, "window": "per_day_tumbling", "host_allowlist": ["api.example.com"]},
        {"action_kind": "llm.completion", "max_calls": 1, "window": "per_day_tumbling", "host_allowlist": ["api.openai.com"]}]}))
    .await;
    let post = |host: Option<&str>| {
        let mut a = json!({"kind": "http.post", "name": "x"});
        if let Some(host) = host {
            a["policy_keys"] = json!({"host": host, "custom": {"team": "a"}});
        }
        json!({"action": a})
    };
    // no host: the rule does not apply (unknown routing is never denied by it)
    h.reserve_ok(&t, 1, post(None)).await;
    h.reserve_ok(&t, 1, post(None)).await;
    h.reserve_ok(&t, 1, post(Some("other.example.org"))).await;
    h.reserve_ok(&t, 1, post(Some("API.Example.com"))).await;
    h.reserve(&t, 1, post(Some("api.example.com"))).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    // llm.completion declares no host dimension: the host is ignored for matching, so its
    // host-scoped rule never applies (and the request is not refused)
    let llm = json!({"action": {"kind": "llm.completion", "name": "x", "policy_keys": {"host": "api.openai.com"}}});
    h.reserve_ok(&t, 1, llm.clone()).await;
    h.reserve_ok(&t, 1, llm).await;
    let custom: serde_json::Map<String, Value> = (0..9).map(|i| (format!("k{i}"), json!("v"))).collect();
    let nine = json!({"action": {"kind": "http.post", "name": "x", "policy_keys": {"custom": custom}}});
    h.reserve(&t, 1, nine).await.assert_error(400, "INVALID_REQUEST");
    // undeclared dimensions still travel in events
    let e = h.events_of(&t.id, "reservation.denied").await;
    assert_eq!(e.last().unwrap()["data"]["action"]["policy_keys"]["custom"]["team"], "a");
}

#[tokio::test]
async fn observe_mode_evaluates_fully_changes_nothing_and_reports() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(100).await;
    policy(
        &h,
        &t,
        json!({"denied_action_kinds": ["code.exec.shell"],
        "action_quotas": [{"action_kind": "web.search", "max_calls": 1, "window": "per_day_tumbling"}]}),
    )
    .await;
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"observe_mode": "OBSERVE"})))
        .await
        .assert_ok();
    let before = h.root(&t).await;
    let ik = unique("obs");
    let ok = h
        .reserve(&t, 10, json!({"idempotency_key": ik, "subject": {"tenant": t.id, "dimensions": {"run_id": "run-7"}}}))
        .await;
    let ok = ok.assert_ok().clone();
    assert_eq!(ok["decision"], "ALLOW");
    assert!(
        ok.get("reservation_id").is_none() && ok.get("expires_at_ms").is_none() && ok["affected_scopes"].is_array()
    );
    let denied = h.reserve(&t, 10, kind("code.exec.shell")).await;
    let denied = denied.assert_ok();
    assert_eq!(
        (denied["decision"].as_str(), denied["reason_code"].as_str()),
        (Some("DENY"), Some("ACTION_KIND_DENIED"))
    );
    assert_eq!(denied["deny_detail"]["reason_code"], "ACTION_KIND_DENIED");
    // the budget would deny too: observed as a DENY, with budget_remaining
    let over = h.reserve(&t, 500, json!({})).await;
    assert_eq!(over.assert_ok()["deny_detail"]["budget_remaining"], 100);
    // no counter moves: the quota of 1 still admits the same search again
    for _ in 0..2 {
        assert_eq!(h.reserve(&t, 1, kind("web.search")).await.assert_ok()["decision"], "ALLOW");
    }
    assert!(counters(&h, &t, "include_zero=true").await.is_empty());
    let after = h.root(&t).await;
    assert_eq!((after.reserved, after.remaining), (before.reserved, before.remaining), "no balance moved");
    // a replay answers the same and writes no second event
    let again = h
        .reserve(&t, 10, json!({"idempotency_key": ik, "subject": {"tenant": t.id, "dimensions": {"run_id": "run-7"}}}))
        .await;
    assert_eq!(again.assert_ok()["decision"], "ALLOW");
    let allowed = h.events_of(&t.id, "reservation.observed_allowed").await;
    assert_eq!(allowed.len(), 3, "one per evaluation, none for the replay");
    assert_eq!(allowed[0]["data"]["observe_mode"], "OBSERVE");
    assert_eq!(allowed[0]["data"]["decision"], "ALLOW");
    assert!(allowed[0]["correlation_id"].is_string(), "correlated by run");
    assert!(allowed[1].get("correlation_id").is_none(), "no run id, no correlation id");
    let obs = h.admin_events(&t.id, "reservation.observed_denied").await;
    assert_eq!(obs.len(), 2);
    assert_eq!(obs[0]["data"]["deny_detail"]["reason_code"], "ACTION_KIND_DENIED");
    assert_eq!(obs[0]["data"]["would_have_blocked_at"], obs[0]["data"]["deny_detail"]["blocked_by_scope"]);
    assert!(obs[0]["correlation_id"].as_str().is_some_and(|c| c.len() == 40));
    assert_ne!(obs[0]["correlation_id"], obs[1]["correlation_id"], "another cause, another correlation");
    assert!(
        h.events_of(&t.id, "reservation.denied").await.is_empty(),
        "shadow denials stay out of the production stream"
    );

    // the request's mode wins: ENFORCE holds, even on an observing tenant
    let live = h.reserve(&t, 10, json!({"observe_mode": "ENFORCE"})).await;
    assert!(live.assert_ok()["reservation_id"].is_string());
    h.reserve(&t, 10, json!({"observe_mode": "DISABLED", "action": {"kind": "code.exec.shell", "name": "x"}}))
        .await
        .assert_error(409, "ACTION_KIND_DENIED");
    // and OBSERVE observes on an enforcing tenant; dry_run without observe writes no event
    h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"observe_mode": "ENFORCE"})))
        .await
        .assert_ok();
    let n = h.events_of(&t.id, "reservation.observed_allowed").await.len();
    let o = h.reserve(&t, 10, json!({"observe_mode": "OBSERVE"})).await;
    assert!(o.assert_ok().get("reservation_id").is_none());
    h.reserve(&t, 10, json!({"dry_run": true})).await.assert_ok();
    assert_eq!(h.events_of(&t.id, "reservation.observed_allowed").await.len(), n + 1);
}

#[tokio::test]
async fn threshold_approaching_is_announced_once_and_an_operator_can_reset_a_counter() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(
        &h,
        &t,
        json!({"action_quotas": [{"action_kind": "db.write", "max_calls": 5, "window": "per_hour_tumbling",
        "threshold_pct": 0.6}]}),
    )
    .await;
    for _ in 0..5 {
        h.reserve_ok(&t, 1, kind("db.write")).await;
    }
    h.reserve(&t, 1, kind("db.write")).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    let th = h.admin_events(&t.id, "quota.threshold_approaching").await;
    assert_eq!(th.len(), 1, "once per window instance");
    let d = &th[0]["data"];
    assert_eq!((d["used"].as_i64(), d["limit"].as_i64(), d["threshold_pct"].as_f64()), (Some(3), Some(5), Some(0.6)));
    assert_eq!(th[0]["category"], "reservation");
    assert!(th[0]["correlation_id"].as_str().is_some_and(|c| c.len() == 40));

    let c = &counters(&h, &t, "").await[0];
    let body = json!({"tenant_id": t.id, "scope": c["scope"], "action_kind": "db.write", "window": "per_hour_tumbling",
        "window_key": c["window_key"], "reason": "double counting"});
    // admin key only; every key field must match a counter
    h.admin_as(&t.key, "POST", &format!("{COUNTERS}/reset"), Some(&body)).await.assert_error(401, "UNAUTHORIZED");
    let mut missing = body.clone();
    missing["tenant_id"] = Value::Null;
    let r = h.admin("POST", &format!("{COUNTERS}/reset"), Some(&missing)).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert!(r.body["message"].as_str().unwrap().contains("tenant_id"));
    let mut other = body.clone();
    other["window_key"] = json!("2001-01-01T00");
    h.admin("POST", &format!("{COUNTERS}/reset"), Some(&other)).await.assert_error(404, "NOT_FOUND");
    let r = h.admin("POST", &format!("{COUNTERS}/reset"), Some(&body)).await;
    let r = r.assert_ok();
    assert_eq!(
        (r["previous_used"].as_i64(), r["counter"]["used"].as_i64(), r["counter"]["remaining"].as_i64()),
        (Some(5), Some(0), Some(5))
    );
    let member =
        format!("{}|db.write|per_hour_tumbling|{}", c["scope"].as_str().unwrap(), c["window_key"].as_str().unwrap());
    let left = counter_deadline(&h, &t, &member).await;
    let now = cycles_shared::domain::now_ms();
    let expected = now - now % HOUR + HOUR + 60_000 - now;
    assert!((expected - 5_000..=expected).contains(&left), "kept: a minute past its hour ({left}, {expected})");
    let reset = h.admin_events(&t.id, "quota.counter_reset").await;
    assert_eq!(reset.len(), 1);
    let d = &reset[0]["data"];
    assert_eq!(
        (d["previous_used"].as_i64(), d["actor_id"].as_str(), d["reason"].as_str()),
        (Some(5), Some("admin_api_key"), Some("double counting"))
    );
    assert!(reset[0]["correlation_id"].is_string());
    let audit = h
        .admin("GET", &format!("/v1/admin/audit/logs?tenant_id={}&operation=resetActionQuotaCounter", t.id), None)
        .await;
    let mut statuses: Vec<i64> =
        audit.assert_ok()["logs"].as_array().unwrap().iter().map(|l| l["status"].as_i64().unwrap()).collect();
    statuses.sort();
    assert_eq!(statuses, [200, 404], "the reset (in its script) and the refused attempt");
    h.reserve_ok(&t, 1, kind("db.write")).await;
}

#[tokio::test]
async fn counters_are_read_by_permission_in_bounded_pages() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(&h, &t, json!({"action_quotas": [{"action_kind": "web.search", "max_calls": 9, "window": "per_run"}]}))
        .await;
    for run in ["a", "b", "c"] {
        reserve_run(&h, &t, "web.search", run, json!({})).await.assert_ok();
    }
    let admin_only = h.admin("GET", COUNTERS, None).await;
    admin_only.assert_error(400, "INVALID_REQUEST");
    let primary = h.key(&t.id, Some(vec!["action_quotas:read".into()])).await;
    let r = h.admin_as(&primary.secret, "GET", &format!("{COUNTERS}?tenant_id=ignored"), None).await;
    assert_eq!(r.assert_ok()["counters"].as_array().unwrap().len(), 3, "own tenant");
    assert!(!r.headers.contains_key("x-cycles-permission-deprecated"));
    let legacy = h.key(&t.id, Some(vec!["balances:read".into()])).await;
    let r = h.admin_as(&legacy.secret, "GET", COUNTERS, None).await;
    r.assert_ok();
    assert_eq!(r.headers.get("x-cycles-permission-deprecated").map(String::as_str), Some("balances:read"));
    let none = h.key(&t.id, Some(vec!["reservations:create".into()])).await;
    h.admin_as(&none.secret, "GET", COUNTERS, None).await.assert_error(403, "INSUFFICIENT_PERMISSIONS");
    // pages of one, in key order, until has_more is false
    let mut seen = vec![];
    let mut cursor = String::new();
    loop {
        let r = h.admin("GET", &format!("{COUNTERS}?tenant_id={}&limit=1{cursor}", t.id), None).await;
        let b = r.assert_ok();
        seen.extend(b["counters"].as_array().unwrap().iter().map(|c| c["window_key"].as_str().unwrap().to_string()));
        if b["has_more"] == false {
            break;
        }
        cursor = format!("&cursor={}", b["next_cursor"].as_str().unwrap());
    }
    assert_eq!(seen, ["a", "b", "c"]);
    assert_eq!(counters(&h, &t, &format!("scope=tenant:{}", t.id)).await.len(), 3);
    assert!(counters(&h, &t, "scope=tenant:zzz").await.is_empty());
    for bad in ["limit=0", "limit=201", "window=weekly", "include_zero=yes", "cursor=%%%"] {
        let r = h.admin("GET", &format!("{COUNTERS}?tenant_id={}&{bad}", t.id), None).await;
        r.assert_error(400, "INVALID_REQUEST");
    }
}

#[tokio::test]
async fn custom_kinds_must_be_declared_and_unregistered_kinds_are_side_effects() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start_configured(|c| {
        c.custom_action_kinds = cycles_shared::domain::action_kinds::parse_custom_kinds(
            r#"[{"kind": "custom.acme.erp.post", "risk_class": "high_risk"}]"#,
        );
    })
    .await;
    let t = h.funded(1000).await;
    policy(
        &h,
        &t,
        json!({"risk_class_quotas": [{"risk_class": "high_risk", "max_calls": 1, "window": "per_hour_tumbling"},
        {"risk_class": "side_effect", "max_calls": 1, "window": "per_hour_tumbling"}],
        "action_quotas": [{"action_kind": "custom.acme.erp.post", "max_calls": 5, "window": "per_hour_tumbling"}]}),
    )
    .await;
    let r = h.reserve(&t, 1, kind("custom.acme.erp.unknown")).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert!(r.body["message"].as_str().unwrap().contains("not registered"));
    h.reserve_ok(&t, 1, kind("custom.acme.erp.post")).await;
    let r = h.reserve(&t, 1, kind("custom.acme.erp.post")).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    assert_eq!(r.body["details"]["deny_detail"]["quota_violation"]["risk_class"], "high_risk");
    // an unregistered kind is accepted and governed as side_effect
    h.reserve_ok(&t, 1, kind("proprietary.action")).await;
    let r = h.reserve(&t, 1, kind("llm.completion")).await;
    assert_eq!(r.body["details"]["deny_detail"]["quota_violation"]["risk_class"], "side_effect", "{}", r.raw);
    // declared custom kinds are not in the public registry
    assert_eq!(h.get("", "/v1/action-kinds/custom.acme.erp.post").await.status, 404);
}

#[tokio::test]
async fn v0_1_25_answers_keep_their_shape_unless_v0_1_26_is_in_play() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let decide = |extra: Value| {
        let mut body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id},
            "action": {"kind": "llm.completion", "name": "x"}, "estimate": {"unit": "TOKENS", "amount": 500}});
        merge(&mut body, extra);
        body
    };
    let plain = h.post(&t.key, "/v1/decide", &decide(json!({}))).await;
    assert_eq!(plain.assert_ok()["reason_code"], "BUDGET_EXCEEDED");
    assert!(plain.body.get("deny_detail").is_none(), "a v0.1.25 request sees the v0.1.25 shape");
    let dry = h.reserve(&t, 500, json!({"dry_run": true})).await;
    assert!(dry.assert_ok().get("deny_detail").is_none());
    // a v0.1.26 field puts the detail on, mirrored
    let keyed = decide(json!({"action": {"kind": "llm.completion", "name": "x", "policy_keys": {"host": "h"}}}));
    let d = h.post(&t.key, "/v1/decide", &keyed).await;
    let d = d.assert_ok();
    assert_eq!(d["deny_detail"]["reason_code"], d["reason_code"]);
    assert_eq!(d["deny_detail"]["budget_remaining"], 100);
    assert_eq!(d["deny_detail"]["blocked_by_scope"], format!("tenant:{}", t.id));
    assert!(d["deny_detail"]["suggested_fix"].as_str().unwrap().contains("400"), "fund by the shortfall");
    let dry = h.reserve(&t, 500, json!({"dry_run": true, "observe_mode": "ENFORCE"})).await;
    assert_eq!(dry.assert_ok()["deny_detail"]["reason_code"], "BUDGET_EXCEEDED");
    // a live 409 carries it in details (an open object in every client)
    let live = h.reserve(&t, 500, json!({})).await;
    live.assert_error(409, "BUDGET_EXCEEDED");
    assert_eq!(live.body["details"]["deny_detail"]["budget_remaining"], 100);
    let denied = h.events_of(&t.id, "reservation.denied").await;
    assert_eq!(denied.last().unwrap()["data"]["deny_detail"]["reason_code"], "BUDGET_EXCEEDED", "every denial event");
    // the deployment can ask for it always
    let always = Harness::start_configured(|c| c.deny_detail_always = true).await;
    let t2 = always.funded(100).await;
    let body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t2.id},
        "action": {"kind": "llm.completion", "name": "x"}, "estimate": {"unit": "TOKENS", "amount": 500}});
    let r = always.post(&t2.key, "/v1/decide", &body).await;
    assert_eq!(r.assert_ok()["deny_detail"]["reason_code"], "BUDGET_EXCEEDED");
}

#[tokio::test]
async fn quotas_come_from_the_top_policy_report_the_least_headroom_and_keep_counting_across_edits() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    // a lower-priority policy's stricter quota on the same kind is not merged in
    policy(
        &h,
        &t,
        json!({"priority": 1, "scope_pattern": "*", "action_quotas": [{"action_kind": "db.query", "max_calls": 1,
        "window": "per_hour_tumbling"}]}),
    )
    .await;
    let top = policy(
        &h,
        &t,
        json!({"priority": 9, "scope_pattern": "*", "counting": "scope_path", "action_quotas": [
        {"action_kind": "db.query", "max_calls": 3, "window": "per_hour_tumbling"},
        {"action_kind": "db.query", "max_calls": 3, "window": "per_day_tumbling"},
        {"action_kind": "db.query", "max_calls": 9, "window": "per_tenant_per_day"}]}),
    )
    .await;
    let agent = json!({"subject": {"tenant": t.id, "agent": "a1"}, "action": {"kind": "db.query", "name": "q"}});
    for _ in 0..3 {
        h.reserve_ok(&t, 1, agent.clone()).await;
    }
    // per_tenant_per_day counts at the tenant root; the others at the request's scope (the
    // policy says `counting: scope_path`)
    let c = counters(&h, &t, "window=per_tenant_per_day").await;
    assert_eq!((c[0]["scope"].as_str(), c[0]["used"].as_i64()), (Some(format!("tenant:{}", t.id).as_str()), Some(3)));
    assert_eq!(counters(&h, &t, "window=per_day_tumbling").await[0]["scope"], format!("tenant:{}/agent:a1", t.id));
    // lowering the limits keeps the counters (continuity); of two violated quotas the one with
    // the least headroom is reported
    let id = top["policy_id"].as_str().unwrap();
    let patch = json!({"action_quotas": [
        {"action_kind": "db.query", "max_calls": 2, "window": "per_hour_tumbling"},
        {"action_kind": "db.query", "max_calls": 1, "window": "per_day_tumbling"}]});
    h.admin("PATCH", &format!("{POLICIES}/{id}"), Some(&patch)).await.assert_ok();
    let r = h.reserve(&t, 1, agent.clone()).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    let v = &r.body["details"]["deny_detail"]["quota_violation"];
    assert_eq!(
        (v["window"].as_str(), v["used"].as_i64(), v["limit"].as_i64()),
        (Some("per_day_tumbling"), Some(3), Some(1))
    );
}

#[tokio::test]
async fn observed_allows_are_sampled_and_say_so() {
    early_in_a_window(HOUR, 15_000).await; // hour and day windows: one instance per test
    let h = Harness::start_configured(|c| c.observe_allow_sample_rate = 0.5).await;
    let t = h.funded(1_000_000).await;
    for _ in 0..40 {
        h.reserve(&t, 1, json!({"observe_mode": "OBSERVE"})).await.assert_ok();
    }
    let e = h.events_of(&t.id, "reservation.observed_allowed").await;
    assert!(!e.is_empty() && e.len() < 40, "about half of 40: {}", e.len());
    assert!(e.iter().all(|x| x["data"]["sample_rate"] == 0.5));
}

/// Issue 27 (8): one grammar for kinds, before any rule: other spellings of a denied or
/// quota'd kind (case, whitespace, NUL, zero-width and look-alike characters, full-width
/// letters, a trailing dot, a prefix) are 400 naming the field on reserve, dry_run, decide and
/// events alike, so none gets past a deny list or a quota as another kind.
#[tokio::test]
async fn other_spellings_of_a_kind_are_refused_before_any_rule() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    policy(
        &h,
        &t,
        json!({"denied_action_kinds": ["code.exec"],
        "action_quotas": [{"action_kind": "web.search", "max_calls": 2, "window": "per_hour_tumbling"}]}),
    )
    .await;
    let variants = [
        "CODE.EXEC",
        "Code.Exec",
        "code.EXEC",
        "code.exec\t",
        "code.exec\0",
        "code.exec\u{200b}",
        "\u{200b}code.exec",
        "cod\u{0435}.exec",
        "\u{ff43}\u{ff4f}\u{ff44}\u{ff45}.exec",
        "code.exec.",
        ".code.exec",
        "code..exec",
        "mcp:code.exec",
        " code.exec",
        "code.exec ",
        "code .exec",
        "code.exec\n",
        "code/exec",
        "code.exec*",
        "WEB.SEARCH",
        "Web.Search",
        "web.search\r",
        "web\u{2024}search",
    ];
    let evaluate = |path: &'static str, k: &str, dry: bool| {
        let mut body = json!({"idempotency_key": unique("v"), "subject": {"tenant": t.id},
            "action": {"kind": k, "name": "x"}});
        if path == "/v1/events" {
            body["actual"] = json!({"unit": "TOKENS", "amount": 1});
        } else {
            body["estimate"] = json!({"unit": "TOKENS", "amount": 1});
        }
        if dry {
            body["dry_run"] = json!(true);
        }
        let h = &h;
        let key = t.key.clone();
        async move { h.post(&key, path, &body).await }
    };
    for v in variants {
        for (path, dry) in
            [("/v1/reservations", false), ("/v1/reservations", true), ("/v1/decide", false), ("/v1/events", false)]
        {
            let r = evaluate(path, v, dry).await;
            r.assert_error(400, "INVALID_REQUEST");
            assert!(r.body["message"].as_str().unwrap().contains("action.kind"), "{path} {v:?}: {}", r.raw);
        }
    }
    assert!(h.ledger(&t.id, &format!("tenant:{}", t.id), cycles_shared::model::Unit::Tokens).await.reserved == 0);
    // the kind itself is denied, and its quota counts only its one spelling
    evaluate("/v1/reservations", "code.exec", false).await.assert_error(409, "ACTION_KIND_DENIED");
    for _ in 0..2 {
        evaluate("/v1/reservations", "web.search", false).await.assert_ok();
    }
    evaluate("/v1/reservations", "web.search", false).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    // policy lists hold the same grammar
    for bad in ["CODE.EXEC", "code.exec.", "mcp:code.exec", "code.exec\u{200b}"] {
        let body = json!({"tenant_id": t.id, "name": unique("bad"), "scope_pattern": format!("tenant:{}", t.id),
            "denied_action_kinds": [bad]});
        h.admin("POST", POLICIES, Some(&body)).await.assert_error(400, "INVALID_REQUEST");
    }
}

/// Issue 27 (9): quotas and rate limits of a pattern ending in `*` count at the policy's anchor
/// (its fixed prefix) by default, so invented scope paths of one tenant share one count (a
/// 2-per-hour quota on `tenant:T/*` admitted 23 holds from 11 paths); `counting: scope_path`
/// counts each path apart.
#[tokio::test]
async fn quotas_and_rate_limits_count_at_the_anchor_of_a_wildcard_pattern() {
    early_in_a_window(HOUR, 15_000).await;
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let p = policy(
        &h,
        &t,
        json!({"scope_pattern": format!("tenant:{}/*", t.id),
        "action_quotas": [{"action_kind": "web.search", "max_calls": 2, "window": "per_hour_tumbling"}]}),
    )
    .await;
    assert_eq!(p["counting"], "anchor", "the default for a pattern ending in *");
    let at = |agent: String, k: &str| json!({"subject": {"tenant": t.id, "agent": agent}, "action": {"kind": k, "name": "q"}});
    let mut admitted = 0;
    for i in 0..11 {
        let r = h.reserve(&t, 1, at(format!("invented-{i}"), "web.search")).await;
        if r.status == 200 {
            admitted += 1;
        } else {
            r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
            assert_eq!(r.body["details"]["deny_detail"]["quota_violation"]["scope"], format!("tenant:{}", t.id));
        }
    }
    assert_eq!(admitted, 2, "one count for every path under the anchor");
    let c = counters(&h, &t, "window=per_hour_tumbling").await;
    assert_eq!(
        (c.len(), c[0]["scope"].as_str(), c[0]["used"].as_i64()),
        (1, Some(format!("tenant:{}", t.id).as_str()), Some(2))
    );

    // a rate limit counts there too
    let t2 = h.funded(1_000_000).await;
    policy(
        &h,
        &t2,
        json!({"scope_pattern": format!("tenant:{}/workspace:w/*", t2.id),
        "rate_limits": {"max_reservations_per_minute": 3}}),
    )
    .await;
    let ws = |agent: String| json!({"subject": {"tenant": t2.id, "workspace": "w", "agent": agent}});
    let mut limited = 0;
    for i in 0..6 {
        let r = h.reserve(&t2, 1, ws(format!("a{i}"))).await;
        if r.status == 429 {
            r.assert_error(429, "LIMIT_EXCEEDED");
            assert!(
                r.body["message"].as_str().unwrap().contains(&format!("tenant:{}/workspace:w", t2.id)),
                "{}",
                r.raw
            );
            limited += 1;
        } else {
            r.assert_ok();
        }
    }
    assert_eq!(limited, 3, "three of six paths under one anchor");

    // counting per scope path, when the policy says so
    let t3 = h.funded(1_000_000).await;
    let p = policy(
        &h,
        &t3,
        json!({"scope_pattern": format!("tenant:{}/*", t3.id), "counting": "scope_path",
        "action_quotas": [{"action_kind": "web.search", "max_calls": 1, "window": "per_hour_tumbling"}]}),
    )
    .await;
    assert_eq!(p["counting"], "scope_path");
    let path = |agent: &str| json!({"subject": {"tenant": t3.id, "agent": agent}, "action": {"kind": "web.search", "name": "q"}});
    h.reserve(&t3, 1, path("x")).await.assert_ok();
    h.reserve(&t3, 1, path("y")).await.assert_ok();
    h.reserve(&t3, 1, path("x")).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    // and back to the default with null; an unknown value is 400
    let id = p["policy_id"].as_str().unwrap();
    let r = h.admin("PATCH", &format!("{POLICIES}/{id}"), Some(&json!({"counting": null}))).await;
    assert_eq!(r.assert_ok()["counting"], "anchor");
    h.admin("PATCH", &format!("{POLICIES}/{id}"), Some(&json!({"counting": "everywhere"})))
        .await
        .assert_error(400, "INVALID_REQUEST");
    // an exact pattern counts at its own (one) path
    let t4 = h.funded(1_000_000).await;
    let p = policy(&h, &t4, json!({"scope_pattern": format!("tenant:{}", t4.id)})).await;
    assert_eq!(p["counting"], "scope_path");
}

#[tokio::test]
async fn a_tumbling_quota_counts_each_window_instance_on_its_own_counter() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(
        &h,
        &t,
        json!({"action_quotas": [{"action_kind": "llm.completion", "max_calls": 1,
        "window": "per_minute_tumbling"}]}),
    )
    .await;
    // the last 1.5 s of a minute: one call fills its counter, the next is refused
    let into = cycles_shared::domain::now_ms() % 60_000;
    if into < 58_500 {
        tokio::time::sleep(Duration::from_millis((58_500 - into) as u64)).await;
    }
    let first = cycles_shared::domain::format_rfc3339_ms(cycles_shared::domain::now_ms())[..16].to_string();
    h.reserve_ok(&t, 10, json!({})).await;
    h.reserve(&t, 10, json!({})).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    // the next minute is a new instance with a counter of its own (the script VM's memory of
    // the rule's counter ends with its window)
    let into = cycles_shared::domain::now_ms() % 60_000;
    tokio::time::sleep(Duration::from_millis((60_000 - into + 200) as u64)).await;
    h.reserve_ok(&t, 10, json!({})).await;
    let r = h.reserve(&t, 10, json!({})).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    let second = r.body["details"]["deny_detail"]["quota_violation"]["window_key"].as_str().unwrap().to_string();
    assert_ne!(first, second);
    let c = counters(&h, &t, "").await;
    let mut keys: Vec<_> =
        c.iter().map(|x| (x["window_key"].as_str().unwrap().to_string(), x["used"].as_i64())).collect();
    keys.sort();
    assert_eq!(keys, vec![(first, Some(1)), (second, Some(1))]);
}

#[tokio::test]
async fn a_per_run_counter_past_its_deadline_is_gone_before_it_is_pruned() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    policy(
        &h,
        &t,
        json!({"action_quotas": [{"action_kind": "message.email.send", "max_calls": 1, "window": "per_run",
        "per_run_counter_ttl_ms": 60000}]}),
    )
    .await;
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_ok();
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    // the run goes quiet past its counter's TTL (its deadline moved to the past, as time would)
    let member = format!("tenant:{}|message.email.send|per_run|r1", t.id);
    let counters_key = format!("cy:{{{}}}:qc", t.id);
    let mut conn = h.store.conn();
    let text: String = redis::cmd("HGET").arg(&counters_key).arg(&member).query_async(&mut conn).await.unwrap();
    let parts: Vec<&str> = text.splitn(3, '\u{1f}').collect();
    let past = cycles_shared::domain::now_ms() - 1;
    let aged = format!("{}\u{1f}{past}\u{1f}{}", parts[0], parts[2]);
    let _: () = redis::cmd("HSET").arg(&counters_key).arg(&member).arg(&aged).query_async(&mut conn).await.unwrap();
    assert!(counters(&h, &t, "include_zero=true").await.is_empty(), "a counter past its deadline is not listed");
    let r = reserve_run(&h, &t, "message.email.send", "r1", json!({})).await;
    r.assert_ok();
    let c = counters(&h, &t, "run_id=r1").await;
    assert_eq!((c.len(), c[0]["used"].as_i64()), (1, Some(1)), "the run counts from 0 again");
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
}

#[tokio::test]
async fn counters_written_before_the_counter_hash_keep_counting() {
    early_in_a_window(HOUR, 15_000).await; // one hour instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let p = policy(
        &h,
        &t,
        json!({"action_quotas": [
            {"action_kind": "db.write", "max_calls": 3, "window": "per_hour_tumbling"},
            {"action_kind": "message.email.send", "max_calls": 2, "window": "per_run", "per_run_counter_ttl_ms": 60000}]}),
    )
    .await;
    let pid = p["policy_id"].as_str().unwrap();
    // two counters as the release before wrote them: a hash each, with a TTL, in both indexes
    let now = cycles_shared::domain::now_ms();
    let hour = &cycles_shared::domain::format_rfc3339_ms(now)[..13];
    let hourly = format!("tenant:{}|db.write|per_hour_tumbling|{hour}", t.id);
    let run = format!("tenant:{}|message.email.send|per_run|r1", t.id);
    let mut conn = h.store.conn();
    for (member, n, ttl) in [(&hourly, 3, 3_660_000), (&run, 2, 60_000)] {
        let key = format!("cy:{{{}}}:q:{member}", t.id);
        let _: () = redis::cmd("HSET")
            .arg(&key)
            .arg(&["n", &n.to_string(), "lim", "3", "pol", pid, "last", &now.to_string()])
            .query_async(&mut conn)
            .await
            .unwrap();
        let _: () = redis::cmd("PEXPIRE").arg(&key).arg(ttl).query_async(&mut conn).await.unwrap();
        for (index, score) in [("quotas", 0), ("quotas:due", now + ttl)] {
            let _: () = redis::cmd("ZADD")
                .arg(format!("cy:{{{}}}:{index}", t.id))
                .arg(score)
                .arg(member)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    }
    // the reserve reads them where they are: both full
    let r = h.reserve(&t, 1, kind("db.write")).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    assert_eq!(r.body["details"]["deny_detail"]["quota_violation"]["used"], 3);
    reserve_run(&h, &t, "message.email.send", "r1", json!({})).await.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    // moved into the counter hash: the old hashes are gone, the listing and a reset see them
    for member in [&hourly, &run] {
        let old: bool =
            redis::cmd("EXISTS").arg(format!("cy:{{{}}}:q:{member}", t.id)).query_async(&mut conn).await.unwrap();
        assert!(!old, "{member} moved");
    }
    let c = counters(&h, &t, "").await;
    assert_eq!(c.len(), 2);
    assert!(c.iter().all(|x| x["policy_id"] == pid && x["last_incremented_at"].is_string()));
    let left = counter_deadline(&h, &t, &run).await;
    assert!((50_000..=60_000).contains(&left), "the old TTL became the deadline: {left}");
    let body = json!({"tenant_id": t.id, "scope": format!("tenant:{}", t.id), "action_kind": "db.write",
        "window": "per_hour_tumbling", "window_key": hour});
    let r = h.admin("POST", &format!("{COUNTERS}/reset"), Some(&body)).await;
    assert_eq!(r.assert_ok()["previous_used"], 3);
    h.reserve_ok(&t, 1, kind("db.write")).await;
}

#[tokio::test]
async fn two_rules_on_one_counter_each_count_a_call() {
    early_in_a_window(HOUR, 15_000).await; // one hour instance per test
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    // the same kind and window twice (as two allowlists of one kind may be): one counter, which
    // each rule moves
    policy(
        &h,
        &t,
        json!({"action_quotas": [
            {"action_kind": "db.write", "max_calls": 4, "window": "per_hour_tumbling", "threshold_pct": 0.75},
            {"action_kind": "db.write", "max_calls": 10, "window": "per_hour_tumbling"}]}),
    )
    .await;
    h.reserve_ok(&t, 1, kind("db.write")).await;
    let c = counters(&h, &t, "").await;
    assert_eq!((c.len(), c[0]["used"].as_i64()), (1, Some(2)));
    h.reserve_ok(&t, 1, kind("db.write")).await;
    let r = h.reserve(&t, 1, kind("db.write")).await;
    r.assert_error(409, "ACTION_QUOTA_EXCEEDED");
    let v = &r.body["details"]["deny_detail"]["quota_violation"];
    assert_eq!((v["used"].as_i64(), v["limit"].as_i64()), (Some(4), Some(4)));
    let th = h.admin_events(&t.id, "quota.threshold_approaching").await;
    assert_eq!(th.len(), 1, "announced once, by the rule whose threshold its call reached");
    assert_eq!((th[0]["data"]["used"].as_i64(), th[0]["data"]["limit"].as_i64()), (Some(3), Some(4)));
}
