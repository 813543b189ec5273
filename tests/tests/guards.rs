//! Runaway-agent guards (policy extensions, `lua/lib/guards.lua`): ledgers made from a budget
//! template at a scope's first call, the cap on reservations ACTIVE at once, spend-rate limits
//! per minute and hour; each exact under concurrency, given back by every path that ends a
//! reservation, answered as DENY by decide and dry_run and as 409 LIMIT_EXCEEDED by a reserve.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;
use serde_json::Value;

async fn policy(h: &Harness, t: &Tenant, body: Value) -> String {
    let mut body = body;
    body["tenant_id"] = json!(t.id);
    body["name"] = json!(unique("guard"));
    let r = h.admin("POST", "/v1/admin/policies", Some(&body)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    r.body["policy_id"].as_str().unwrap().to_string()
}

fn agent(t: &Tenant, a: &str) -> Value {
    json!({"subject": {"tenant": t.id, "agent": a}})
}

async fn event(h: &Harness, t: &Tenant, a: &str, actual: i64) -> Resp {
    let body = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id, "agent": a},
        "action": {"kind": "tool.call", "name": "search"}, "actual": {"unit": "TOKENS", "amount": actual}});
    h.post(&t.key, "/v1/events", &body).await
}

async fn decide(h: &Harness, t: &Tenant, a: &str, amount: i64) -> Value {
    let body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id, "agent": a},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": amount}});
    h.post(&t.key, "/v1/decide", &body).await.assert_ok().clone()
}

async fn exists(h: &Harness, t: &Tenant, scope: &str) -> bool {
    let key = TenantKeys::new(&t.id).budget(scope, Unit::Tokens);
    h.store.conn().exists(key).await.unwrap()
}

/// The reason code of a guard's 409, after checking its shape.
fn limited(r: &Resp) -> String {
    r.assert_error(409, "LIMIT_EXCEEDED");
    let d = &r.body["details"];
    assert!(d["limit"]["policy_id"].is_string() && d["limit"]["limit"].is_number(), "{}", r.raw);
    assert_eq!(d["deny_detail"]["blocked_by_policy"], d["limit"]["policy_id"]);
    d["deny_detail"]["reason_code"].as_str().unwrap().to_string()
}

/// 64 reserves at once for `subject` (of `amount` each), every answer.
async fn at_once(h: &Arc<Harness>, t: &Tenant, amount: i64, subject: Value) -> Vec<Resp> {
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let (h, t, subject) = (h.clone(), t.clone(), subject.clone());
            tokio::spawn(async move { h.reserve(&t, amount, subject).await })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// One field of a guard's counter hash (0 when absent).
async fn count_at(h: &Harness, key: String, field: &str) -> i64 {
    let n: Option<i64> = h.store.conn().hget(key, field).await.unwrap();
    n.unwrap_or(0)
}

async fn active_count(h: &Harness, t: &Tenant, field: &str) -> i64 {
    count_at(h, TenantKeys::new(&t.id).active_holds(), field).await
}

#[tokio::test]
async fn a_template_gives_every_new_agent_its_own_ledger_at_its_first_call() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": format!("tenant:{}/agent:*", t.id),
        "budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 100},
            "period_recurrence": "DAILY"}}),
    )
    .await;
    let a1 = format!("tenant:{}/agent:a1", t.id);
    let rid = h.reserve_ok(&t, 60, agent(&t, "a1")).await;
    let l = h.ledger(&t.id, &a1, Unit::Tokens).await;
    assert_eq!((l.allocated, l.reserved, l.remaining), (100, 60, 40));
    // the agent's own cap holds; another agent has its own
    h.reserve(&t, 60, agent(&t, "a1")).await.assert_error(409, "BUDGET_EXCEEDED");
    h.reserve_ok(&t, 60, agent(&t, "a2")).await;
    h.commit(&t, &rid, 30).await.assert_ok();
    assert_eq!(h.ledger(&t.id, &a1, Unit::Tokens).await.spent, 30);
    assert_eq!(h.root(&t).await.reserved, 60, "the tenant's ledger holds both agents' calls");

    // a normal budget: read, listed, with its period, frozen like any other
    let got = h.admin("GET", &format!("/v1/admin/budgets/lookup?scope={a1}&unit=TOKENS"), None).await;
    let b = got.assert_ok();
    assert_eq!(b["allocated"]["amount"], 100, "{}", got.raw);
    assert_eq!(b["period_recurrence"], "DAILY", "{}", got.raw);
    let created = h.events_of(&t.id, "budget.created").await;
    let mine: Vec<&Value> = created.iter().filter(|e| e["scope"] == a1.as_str()).collect();
    assert_eq!(mine.len(), 1);
    assert_eq!(mine[0]["data"]["policy_id"], id.as_str());

    // dry_run sees the ledger that would be made and makes none; decide makes it, as a reserve
    let dry = h.reserve(&t, 101, json!({"subject": {"tenant": t.id, "agent": "a3"}, "dry_run": true})).await;
    assert_eq!(dry.assert_ok()["reason_code"], "BUDGET_EXCEEDED");
    let ok = h.reserve(&t, 100, json!({"subject": {"tenant": t.id, "agent": "a3"}, "dry_run": true})).await;
    assert_eq!(ok.assert_ok()["decision"], "ALLOW");
    assert!(!exists(&h, &t, &format!("tenant:{}/agent:a3", t.id)).await);
    assert_eq!(decide(&h, &t, "a3", 101).await["reason_code"], "BUDGET_EXCEEDED");
    let l = h.ledger(&t.id, &format!("tenant:{}/agent:a3", t.id), Unit::Tokens).await;
    assert_eq!((l.allocated, l.reserved), (100, 0), "made by decide, nothing held");
    assert_eq!(decide(&h, &t, "a3", 100).await["decision"], "ALLOW");
    // an event makes one too (and charges it)
    event(&h, &t, "a4", 70).await.assert_created();
    assert_eq!(h.ledger(&t.id, &format!("tenant:{}/agent:a4", t.id), Unit::Tokens).await.spent, 70);
    // a scope the pattern does not match gets none
    let other = json!({"subject": {"tenant": t.id, "workflow": "w"}});
    h.reserve_ok(&t, 10, other).await;
    assert!(!exists(&h, &t, &format!("tenant:{}/workflow:w", t.id)).await);

    // the balances know every made ledger, beside a scope's ledger in another unit
    let a5 = format!("tenant:{}/agent:a5", t.id);
    h.budget(&t.id, &a5, Unit::Credits, 1_000).await;
    h.reserve_ok(&t, 10, agent(&t, "a5")).await;
    let r = h.admin_as(&t.key, "GET", "/v1/balances?limit=50", None).await;
    let mut listed: Vec<String> = r.assert_ok()["balances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{}|{}", l["scope"].as_str().unwrap(), l["unit"].as_str().unwrap()))
        .collect();
    listed.sort();
    let root = format!("tenant:{}", t.id);
    let mut want: Vec<String> =
        ["a1", "a2", "a3", "a4", "a5"].iter().map(|a| format!("{root}/agent:{a}|TOKENS")).collect();
    want.extend([format!("{a5}|CREDITS"), format!("{root}|TOKENS")]);
    want.sort();
    assert_eq!(listed, want, "{}", r.raw);
}

#[tokio::test]
async fn racing_first_calls_on_one_new_scope_make_one_ledger() {
    let h = Arc::new(Harness::start().await);
    let t = h.funded(1_000_000).await;
    policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*",
        "budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1000}}}),
    )
    .await;
    let answers = at_once(&h, &t, 1, agent(&t, "fresh")).await;
    assert!(answers.iter().all(|r| r.status == 200), "every call admitted");
    let scope = format!("tenant:{}/agent:fresh", t.id);
    assert_eq!(h.ledger(&t.id, &scope, Unit::Tokens).await.reserved, 64);
    let made = h.events_of(&t.id, "budget.created").await;
    assert_eq!(made.iter().filter(|e| e["scope"] == scope.as_str()).count(), 1, "one ledger, one event");
}

#[tokio::test]
async fn a_template_makes_at_most_max_instances_ledgers_and_the_sweep_reclaims_idle_ones() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*",
        "budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 100}, "max_instances": 2}}),
    )
    .await;
    let held = h.reserve_ok(&t, 10, agent(&t, "a1")).await;
    let r2 = h.reserve_ok(&t, 10, agent(&t, "a2")).await;
    h.release(&t, &r2).await.assert_ok();
    let past = h.reserve(&t, 10, agent(&t, "a3")).await;
    assert_eq!(limited(&past), "TEMPLATE_INSTANCES_EXCEEDED");
    assert_eq!(past.body["details"]["limit"]["limit_name"], "max_instances");
    assert_eq!(past.body["details"]["limit"]["current"], 2);
    let d = decide(&h, &t, "a3", 10).await;
    assert_eq!(
        (d["decision"].as_str(), d["reason_code"].as_str()),
        (Some("DENY"), Some("TEMPLATE_INSTANCES_EXCEEDED"))
    );
    assert_eq!(d["deny_detail"]["blocked_by_policy"], id.as_str());
    let reached = h.events_of(&t.id, "policy.limit_reached").await;
    assert_eq!(reached.len(), 1);
    assert_eq!(reached[0]["data"]["limit_name"], "max_instances");
    // the known scopes go on
    let r = h.reserve_ok(&t, 10, agent(&t, "a2")).await;
    h.release(&t, &r).await.assert_ok();

    // the sweep reclaims a ledger idle past CYCLES_TEMPLATE_IDLE_MS with nothing held or owed
    // (a2's after its release), never one with a hold (a1's)
    let opts = cycles_shared::jobs::sweep::SweepOptions { template_idle: Duration::ZERO, ..Default::default() };
    tokio::time::sleep(Duration::from_millis(5)).await;
    let report = h.sweep_tenant(&t, &opts).await;
    assert_eq!(report.reclaimed_ledgers, 1, "{report:?}");
    let (a1, a2) = (format!("tenant:{}/agent:a1", t.id), format!("tenant:{}/agent:a2", t.id));
    assert!(exists(&h, &t, &a1).await && !exists(&h, &t, &a2).await);
    let closed = h.events_of(&t.id, "budget.closed").await;
    assert_eq!(closed[0]["data"]["operation"], "RECLAIM");
    // which gave the policy's count back: a3 gets one now
    h.reserve_ok(&t, 10, agent(&t, "a3")).await;
    h.commit(&t, &held, 5).await.assert_ok();
}

#[tokio::test]
async fn at_most_n_reservations_are_active_at_once_and_every_ending_gives_one_back() {
    let h = Arc::new(Harness::start().await);
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*", "counting": "scope_path",
        "rate_limits": {"max_active_reservations": 5}}),
    )
    .await;
    let field = format!("{id}|tenant:{}/agent:a", t.id);
    let answers = at_once(&h, &t, 1, agent(&t, "a")).await;
    let ok: Vec<String> =
        answers.iter().filter(|r| r.status == 200).map(|r| r.body["reservation_id"].as_str().unwrap().into()).collect();
    assert_eq!(ok.len(), 5, "N allowed, never N+1");
    for r in answers.iter().filter(|r| r.status != 200) {
        assert_eq!(limited(r), "ACTIVE_RESERVATIONS_EXCEEDED");
    }
    assert_eq!(active_count(&h, &t, &field).await, 5);
    // another agent counts apart
    h.reserve_ok(&t, 1, agent(&t, "b")).await;
    // decide and dry_run answer DENY with the reason
    let d = decide(&h, &t, "a", 1).await;
    assert_eq!(
        (d["decision"].as_str(), d["reason_code"].as_str()),
        (Some("DENY"), Some("ACTIVE_RESERVATIONS_EXCEEDED"))
    );
    assert!(d["deny_detail"]["suggested_fix"].as_str().unwrap().contains("5 active reservations"));
    // observe mode: the reserve is an evaluation (nothing held, nothing counted)
    let seen = h.reserve(&t, 1, json!({"subject": {"tenant": t.id, "agent": "a"}, "observe_mode": "OBSERVE"})).await;
    assert_eq!(seen.assert_ok()["decision"], "DENY", "{}", seen.raw);
    assert_eq!(active_count(&h, &t, &field).await, 5);

    // commit, release and expiry each give one back
    h.commit(&t, &ok[0], 1).await.assert_ok();
    assert_eq!(active_count(&h, &t, &field).await, 4);
    h.release(&t, &ok[1]).await.assert_ok();
    assert_eq!(active_count(&h, &t, &field).await, 3);
    let short = json!({"subject": {"tenant": t.id, "agent": "a"}, "ttl_ms": 1000, "grace_period_ms": 0});
    h.reserve_ok(&t, 1, short).await;
    assert_eq!(active_count(&h, &t, &field).await, 4);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let report = h.sweep_tenant(&t, &Default::default()).await;
    assert_eq!(report.expired, 1, "{report:?}");
    assert_eq!(active_count(&h, &t, &field).await, 3);
    // and closing the tenant ends the rest
    let r = h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "CLOSED"}))).await;
    r.assert_ok();
    let holds: HashMap<String, i64> = h.store.conn().hgetall(TenantKeys::new(&t.id).active_holds()).await.unwrap();
    assert!(holds.is_empty(), "{holds:?}");
}

async fn spent_this_minute(h: &Harness, t: &Tenant, field: &str) -> i64 {
    let minute = cycles_shared::domain::now_ms() / 60_000;
    count_at(h, TenantKeys::new(&t.id).spend_window(format!("m{minute}")), field).await
}

#[tokio::test]
async fn spend_per_minute_counts_estimates_corrected_by_commits_and_is_exact_under_concurrency() {
    let h = Arc::new(Harness::start().await);
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*", "counting": "scope_path",
        "rate_limits": {"max_amount_per_minute": {"unit": "TOKENS", "amount": 100},
            "max_amount_per_hour": {"unit": "TOKENS", "amount": 1000}}}),
    )
    .await;
    let field = format!("{id}|tenant:{}/agent:a", t.id);
    early_in_a_window(60_000, 10_000).await;
    // 64 reserves of 10 against 100 a minute: exactly 10 admitted
    let answers = at_once(&h, &t, 10, agent(&t, "a")).await;
    let ok: Vec<String> =
        answers.iter().filter(|r| r.status == 200).map(|r| r.body["reservation_id"].as_str().unwrap().into()).collect();
    assert_eq!(ok.len(), 10, "N allowed, never N+1");
    let refused = answers.iter().find(|r| r.status != 200).unwrap();
    assert_eq!(limited(refused), "SPEND_RATE_EXCEEDED");
    let lim = &refused.body["details"]["limit"];
    assert_eq!(
        (lim["limit_name"].as_str(), lim["limit"].as_i64(), lim["current"].as_i64()),
        (Some("max_amount_per_minute"), Some(100), Some(100))
    );
    assert_eq!(spent_this_minute(&h, &t, &field).await, 100);
    // a commit moves the count from the estimate to the actual, a release gives it back
    h.commit(&t, &ok[0], 4).await.assert_ok();
    assert_eq!(spent_this_minute(&h, &t, &field).await, 94);
    h.release(&t, &ok[1]).await.assert_ok();
    assert_eq!(spent_this_minute(&h, &t, &field).await, 84);
    // an event adds what it charges (never refused by the limit)
    event(&h, &t, "a", 10).await.assert_created();
    assert_eq!(spent_this_minute(&h, &t, &field).await, 94);
    let d = decide(&h, &t, "a", 7).await;
    assert_eq!((d["decision"].as_str(), d["reason_code"].as_str()), (Some("DENY"), Some("SPEND_RATE_EXCEEDED")));
    assert_eq!(decide(&h, &t, "a", 6).await["decision"], "ALLOW");
    h.reserve_ok(&t, 6, agent(&t, "a")).await;
    // another unit is not counted
    let credits = json!({"subject": {"tenant": t.id, "agent": "a"}, "estimate": {"unit": "CREDITS", "amount": 500}});
    h.budget(&t.id, &format!("tenant:{}", t.id), Unit::Credits, 1000).await;
    h.reserve_ok(&t, 0, credits).await;
    // one policy.limit_reached for the window, however many refusals
    let reached = h.events_of(&t.id, "policy.limit_reached").await;
    assert_eq!(reached.len(), 1, "{reached:?}");
    assert_eq!(reached[0]["data"]["reason_code"], "SPEND_RATE_EXCEEDED");
    assert_eq!(reached[0]["category"], "reservation", "a tenant may subscribe to it");
    assert_eq!(reached[0]["data"]["scope"], format!("tenant:{}/agent:a", t.id));
    // and each refusal is a reservation.denied (54 reserves and the one decide)
    assert_eq!(h.events_of(&t.id, "reservation.denied").await.len(), 55);
}

#[tokio::test]
async fn guard_fields_are_validated_kept_and_shown_and_a_tenant_without_them_counts_nothing() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let pattern = format!("tenant:{}/agent:*", t.id);
    let bad = [
        json!({"rate_limits": {"max_active_reservations": 0}}),
        json!({"rate_limits": {"max_amount_per_minute": {"unit": "TOKENS", "amount": 0}}}),
        json!({"budget_template": {"unit": "TOKENS", "allocated": {"unit": "CREDITS", "amount": 1}}}),
        json!({"budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": -1}}}),
        json!({"budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1}, "max_instances": 0}}),
        json!({"budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1},
            "period_recurrence": "SOMETIMES"}}),
        json!({"budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1},
            "rollover_policy": "KEEP"}}),
        json!({"budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1}, "extra": 1}}),
    ];
    for extra in bad {
        let mut body = json!({"tenant_id": t.id, "name": unique("bad"), "scope_pattern": pattern});
        merge(&mut body, extra.clone());
        h.admin("POST", "/v1/admin/policies", Some(&body)).await.assert_error(400, "INVALID_REQUEST");
    }
    let template = json!({"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 100},
        "overdraft_limit": {"unit": "TOKENS", "amount": 10}, "commit_overage_policy": "ALLOW_WITH_OVERDRAFT",
        "period_recurrence": "P1D", "rollover_policy": "CARRY_FORWARD", "max_instances": 50});
    let limits = json!({"max_active_reservations": 3, "max_amount_per_minute": {"unit": "TOKENS", "amount": 500},
        "max_amount_per_hour": {"unit": "TOKENS", "amount": 5000}});
    let id =
        policy(&h, &t, json!({"scope_pattern": pattern, "budget_template": template, "rate_limits": limits})).await;
    // read back whole (the console shows what it knows)
    let got = h.admin("GET", &format!("/v1/admin/policies?tenant_id={}", t.id), None).await;
    let p = &got.assert_ok()["policies"][0];
    assert_eq!((&p["budget_template"], &p["rate_limits"]), (&template, &limits));
    // a PATCH clears them
    let cleared = h
        .admin(
            "PATCH",
            &format!("/v1/admin/policies/{id}"),
            Some(&json!({"budget_template": null, "rate_limits": null})),
        )
        .await;
    let c = cleared.assert_ok();
    assert!(c.get("budget_template").is_none() && c.get("rate_limits").is_none(), "{}", cleared.raw);
    // with no guard in force, a reserve writes no guard counter
    h.reserve_ok(&t, 10, agent(&t, "a")).await;
    let keys = TenantKeys::new(&t.id);
    let n: i64 = h
        .store
        .conn()
        .exists(vec![keys.active_holds(), keys.template_counts(), keys.template_ledgers()])
        .await
        .unwrap();
    assert_eq!(n, 0);
}

#[tokio::test]
async fn a_template_ledger_made_by_an_overdraft_template_takes_debt_and_alerts_like_any_other() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*", "budget_template": {"unit": "TOKENS",
        "allocated": {"unit": "TOKENS", "amount": 100}, "overdraft_limit": {"unit": "TOKENS", "amount": 50},
        "commit_overage_policy": "ALLOW_WITH_OVERDRAFT"}}),
    )
    .await;
    let rid = h.reserve_ok(&t, 90, agent(&t, "a")).await;
    h.commit(&t, &rid, 130).await.assert_ok();
    let l = h.ledger(&t.id, &format!("tenant:{}/agent:a", t.id), Unit::Tokens).await;
    assert_eq!((l.spent, l.debt, l.overdraft_limit), (100, 30, 50));
    let crossed = h.events_of(&t.id, "budget.threshold_crossed").await;
    assert!(crossed.iter().any(|e| e["scope"] == format!("tenant:{}/agent:a", t.id)), "{crossed:?}");
}

#[tokio::test]
async fn max_instances_and_spend_per_hour_are_exact_under_concurrency_and_expiry_gives_spend_back() {
    let h = Arc::new(Harness::start().await);
    // 64 new agents at once against max_instances 10: ten ledgers, never eleven
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*",
        "budget_template": {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 100}, "max_instances": 10}}),
    )
    .await;
    let tasks: Vec<_> = (0..64)
        .map(|i| {
            let (h, t) = (h.clone(), t.clone());
            tokio::spawn(async move { h.reserve(&t, 1, agent(&t, &format!("n{i}"))).await })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        let r = task.await.unwrap();
        if r.status == 200 {
            admitted += 1;
        } else {
            assert_eq!(limited(&r), "TEMPLATE_INSTANCES_EXCEEDED");
        }
    }
    assert_eq!(admitted, 10);
    let n: i64 = h.store.conn().hget(TenantKeys::new(&t.id).template_counts(), &id).await.unwrap();
    assert_eq!(n, 10, "refusals give their count back");
    let made = h.events_of(&t.id, "budget.created").await;
    assert_eq!(made.len(), 11, "the tenant's own and ten agents'");

    // 64 reserves of 10 against 150 an hour: fifteen, never sixteen
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": format!("tenant:{}", t.id),
        "rate_limits": {"max_amount_per_hour": {"unit": "TOKENS", "amount": 150}}}),
    )
    .await;
    early_in_a_window(3_600_000, 20_000).await;
    let answers = at_once(&h, &t, 10, json!({})).await;
    assert_eq!(answers.iter().filter(|r| r.status == 200).count(), 15);
    let hour = cycles_shared::domain::now_ms() / 3_600_000;
    let key = TenantKeys::new(&t.id).spend_window(format!("h{hour}"));
    let field = format!("{id}|tenant:{}", t.id);
    assert_eq!(count_at(&h, key.clone(), &field).await, 150);
    // an expiry gives its estimate back
    let ok: Vec<&str> =
        answers.iter().filter(|r| r.status == 200).map(|r| r.body["reservation_id"].as_str().unwrap()).collect();
    h.release(&t, ok[0]).await.assert_ok();
    let short = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    assert!(!short.is_empty());
    assert_eq!(count_at(&h, key.clone(), &field).await, 150);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h.sweep_tenant(&t, &Default::default()).await.expired, 1);
    assert_eq!(count_at(&h, key, &field).await, 140);
}

#[tokio::test]
async fn a_changed_policy_is_in_force_on_the_next_request() {
    // (the scripts keep decoded rules per stored text: a change is a new text, never a stale one)
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": format!("tenant:{}", t.id),
        "rate_limits": {"max_active_reservations": 1}}),
    )
    .await;
    h.reserve_ok(&t, 1, json!({})).await;
    assert_eq!(limited(&h.reserve(&t, 1, json!({})).await), "ACTIVE_RESERVATIONS_EXCEEDED");
    let path = format!("/v1/admin/policies/{id}");
    h.admin("PATCH", &path, Some(&json!({"rate_limits": {"max_active_reservations": 2}}))).await.assert_ok();
    h.reserve_ok(&t, 1, json!({})).await;
    assert_eq!(limited(&h.reserve(&t, 1, json!({})).await), "ACTIVE_RESERVATIONS_EXCEEDED");
    h.admin("PATCH", &path, Some(&json!({"status": "DISABLED"}))).await.assert_ok();
    h.reserve_ok(&t, 1, json!({})).await;
}

/// A live reserve takes its active-hold slot at the check; one refused after that (by the
/// budget, a spend-rate limit or a ledger that would pass int64) gives it back: the count stays
/// what the ACTIVE reservations hold, and the cap still admits exactly N.
#[tokio::test]
async fn a_refused_reserve_gives_its_active_hold_slot_back() {
    let h = Harness::start().await;
    let t = h.funded(50).await;
    let id = policy(
        &h,
        &t,
        json!({"scope_pattern": "agent:*", "counting": "scope_path",
        "rate_limits": {"max_active_reservations": 2, "max_amount_per_minute": {"unit": "TOKENS", "amount": 60}}}),
    )
    .await;
    let field = format!("{id}|tenant:{}/agent:a", t.id);
    h.reserve(&t, 55, agent(&t, "a")).await.assert_error(409, "BUDGET_EXCEEDED");
    assert_eq!(active_count(&h, &t, &field).await, 0, "refused by the budget");
    early_in_a_window(60_000, 10_000).await;
    assert_eq!(limited(&h.reserve(&t, 70, agent(&t, "a")).await), "SPEND_RATE_EXCEEDED");
    assert_eq!(active_count(&h, &t, &field).await, 0, "refused by the spend rate");
    let scope = format!("tenant:{}/agent:b", t.id);
    let reserved = (i64::MAX - 5).to_string();
    let fields = [
        ("scope", scope.as_str()),
        ("unit", "TOKENS"),
        ("allocated", "100"),
        ("remaining", "100"),
        ("reserved", reserved.as_str()),
    ];
    h.set_budget(&t.id, &scope, Unit::Tokens, &fields).await;
    h.reserve(&t, 10, agent(&t, "b")).await.assert_error(500, "INTERNAL_ERROR");
    assert_eq!(active_count(&h, &t, &format!("{id}|{scope}")).await, 0, "refused by int64");
    h.reserve_ok(&t, 10, agent(&t, "a")).await;
    h.reserve_ok(&t, 10, agent(&t, "a")).await;
    assert_eq!(limited(&h.reserve(&t, 10, agent(&t, "a")).await), "ACTIVE_RESERVATIONS_EXCEEDED");
    assert_eq!(active_count(&h, &t, &field).await, 2);
}
