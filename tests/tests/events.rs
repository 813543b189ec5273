//! createEvent (post-only accounting) and the budget events every charge can cause.

use cycles_shared::model::Unit;
use cycles_tests::*;

async fn event(h: &Harness, t: &Tenant, actual: i64, extra: serde_json::Value) -> Resp {
    let mut body = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id},
        "action": {"kind": "tool.call", "name": "search"}, "actual": {"unit": "TOKENS", "amount": actual}});
    merge(&mut body, extra);
    h.post(&t.key, "/v1/events", &body).await
}

#[tokio::test]
async fn an_event_debits_every_budgeted_scope() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.budget(&t.id, &root, Unit::Tokens, 1000).await;
    h.budget(&t.id, &agent, Unit::Tokens, 100).await;
    let r = event(&h, &t, 60, json!({"subject": {"tenant": t.id, "agent": "a"}, "client_time_ms": 5})).await;
    // An event debits every scope at once and answers 201 APPLIED with the balances after.
    assert_eq!(r.status, 201, "{}", r.raw);
    assert_eq!(r.body["status"], "APPLIED");
    assert!(r.body["event_id"].as_str().unwrap().starts_with("evt_"));
    assert!(r.body.get("charged").is_none());
    assert_eq!(r.body["balances"].as_array().unwrap().len(), 2);
    assert_eq!(r.body["balances"][1]["remaining"]["amount"], 40);
    let (a, b) = (h.ledger(&t.id, &root, Unit::Tokens).await, h.ledger(&t.id, &agent, Unit::Tokens).await);
    assert_eq!((a.remaining, a.spent, b.remaining, b.spent), (940, 60, 40, 60));
}

#[tokio::test]
async fn overage_policies_on_events() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    // REJECT with actual > remaining -> 409, nothing changes.
    event(&h, &t, 101, json!({"overage_policy": "REJECT"})).await.assert_error(409, "BUDGET_EXCEEDED");
    assert_eq!(h.root(&t).await.spent, 0);
    event(&h, &t, 100, json!({"overage_policy": "REJECT"})).await;
    // ALLOW_IF_AVAILABLE caps, flags, no debt.
    let t = h.funded(100).await;
    let r = event(&h, &t, 150, json!({})).await;
    assert_eq!(r.status, 201);
    assert_eq!(r.body["charged"], json!({"unit": "TOKENS", "amount": 100}));
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.spent, l.debt, l.is_over_limit), (0, 100, 0, true));
    // Over-limit does not block an event.
    assert_eq!(event(&h, &t, 0, json!({})).await.status, 201);
    // ALLOW_WITH_OVERDRAFT accrues debt within the limit, 409 beyond it.
    let t = h.tenant().await;
    h.overdraft_budget(&t.id, &format!("tenant:{}", t.id), 100, 50).await;
    let r = event(&h, &t, 130, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"})).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    assert!(r.body.get("charged").is_none());
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.spent, l.debt), (-30, 100, 30));
    event(&h, &t, 21, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"}))
        .await
        .assert_error(409, "OVERDRAFT_LIMIT_EXCEEDED");
    // Existing debt within the limit does not block either.
    assert_eq!(event(&h, &t, 20, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"})).await.status, 201);
    assert_eq!(h.root(&t).await.debt, 50);
}

#[tokio::test]
async fn event_errors() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    // Unit, scope, tenant, amount and body errors, and frozen or closed budgets, refuse the event.
    event(&h, &t, 1, json!({"actual": {"unit": "CREDITS", "amount": 1}})).await.assert_error(400, "UNIT_MISMATCH");
    event(&h, &t, 1, json!({"subject": {"workspace": "none"}})).await.assert_error(404, "NOT_FOUND");
    event(&h, &t, 1, json!({"subject": {"tenant": "other-tenant"}})).await.assert_error(403, "FORBIDDEN");
    event(&h, &t, -1, json!({})).await.assert_error(400, "INVALID_REQUEST");
    event(&h, &t, 1, json!({"client_time_ms": -1})).await.assert_error(400, "INVALID_REQUEST");
    event(&h, &t, 1, json!({"extra": true})).await.assert_error(400, "INVALID_REQUEST");
    h.set_budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, &[("status", "FROZEN")]).await;
    event(&h, &t, 1, json!({})).await.assert_error(409, "BUDGET_FROZEN");
    h.set_budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, &[("status", "ACTIVE")]).await;
    h.set_tenant(&t.id, &[("status", "CLOSED")]).await;
    event(&h, &t, 1, json!({})).await.assert_error(409, "TENANT_CLOSED");
    assert_eq!(h.root(&t).await.spent, 0);
}

#[tokio::test]
async fn event_idempotency() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let first = event(&h, &t, 10, json!({"idempotency_key": "e1", "client_time_ms": 1})).await;
    // A retry differing only in client_time_ms replays.
    let again = event(&h, &t, 10, json!({"idempotency_key": "e1", "client_time_ms": 999})).await;
    assert_eq!((again.status, &again.raw), (201, &first.raw));
    event(&h, &t, 11, json!({"idempotency_key": "e1"})).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    assert_eq!(h.root(&t).await.spent, 10);
    // Separate from commit's namespace: an SDK falls back to an event with the commit's key.
    let rid = h.reserve_ok(&t, 5, json!({})).await;
    let c = json!({"idempotency_key": "shared-key", "actual": {"unit": "TOKENS", "amount": 5}});
    h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &c).await.assert_ok();
    assert_eq!(event(&h, &t, 7, json!({"idempotency_key": "shared-key"})).await.status, 201);
    assert_eq!(h.root(&t).await.spent, 22);
}

#[tokio::test]
async fn budget_events_fire_on_transitions_only() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.overdraft_budget(&t.id, &root, 100, 50).await;
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let body = json!({"idempotency_key": "exhaust", "subject": {"tenant": t.id},
        "action": {"kind": "k", "name": "n"}, "actual": {"unit": "TOKENS", "amount": 100}});
    let r = h
        .send("POST", "/v1/events", &[("x-cycles-api-key", &t.key), ("traceparent", tp)], Some(&body.to_string()))
        .await;
    assert_eq!(r.status, 201);
    // replay: no second event
    h.send("POST", "/v1/events", &[("x-cycles-api-key", &t.key)], Some(&body.to_string())).await;
    let ev = h.events(&t.id).await;
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["event_type"], "budget.exhausted");
    assert_eq!(ev[0]["scope"], root.as_str());
    assert_eq!(ev[0]["data"]["remaining"], 0);
    assert_eq!(ev[0]["data"]["direction"], "rising");
    assert_eq!(ev[0]["request_id"], r.headers["x-request-id"].as_str());
    assert_eq!(ev[0]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(ev[0]["actor"]["type"], "api_key");
    assert_eq!(ev[0]["actor"]["key_id"], t.key_id.as_str());
    // A commit with overage under overdraft: commit_overage + debt_incurred.
    let rid = h.reserve_ok(&t, 0, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"})).await;
    h.commit(&t, &rid, 30).await.assert_ok();
    let ev = h.events(&t.id).await;
    let types: Vec<&str> = ev.iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(types, vec!["budget.exhausted", "budget.debt_incurred", "reservation.commit_overage"]);
    assert_eq!(ev[1]["data"]["debt_incurred"], 30);
    assert_eq!(ev[1]["data"]["reservation_id"], rid.as_str());
    assert_eq!(ev[2]["data"]["overage"], 30);
    assert_eq!(ev[2]["data"]["debt_incurred"], 30);
    // Over the limit by an operator lowering it is not a runtime event; a capped
    // ALLOW_IF_AVAILABLE event is: over_limit_entered once.
    let t2 = h.funded(10).await;
    event(&h, &t2, 20, json!({})).await;
    event(&h, &t2, 20, json!({})).await;
    let types: Vec<String> =
        h.events(&t2.id).await.iter().map(|e| e["event_type"].as_str().unwrap().to_string()).collect();
    assert_eq!(types, vec!["budget.exhausted", "budget.over_limit_entered"]);
}

/// An event's id is guessed from what the script VM last wrote to its stream; a guess the stream
/// refuses (an entry written from elsewhere: another script VM, or before the clock stepped back)
/// is corrected from the stream's last entry, so ids stay monotonic and each is found by its id.
#[tokio::test]
async fn event_ids_stay_monotonic_past_entries_the_scripts_did_not_write() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    let events = cycles_shared::keys::TenantKeys::new(&t.id).events();
    h.reserve(&t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    // an entry an hour ahead, which the scripts did not write (removed again: the stream keeps
    // its last id)
    let ahead = cycles_shared::domain::now_ms() + 3_600_000;
    let mut conn = h.store.conn();
    let _: String = redis::cmd("XADD")
        .arg(&events)
        .arg(format!("{ahead}-5"))
        .arg("type")
        .arg("x")
        .arg("event")
        .arg("{}")
        .query_async(&mut conn)
        .await
        .unwrap();
    for _ in 0..2 {
        h.reserve(&t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    }
    let _: i64 = redis::cmd("XDEL").arg(&events).arg(format!("{ahead}-5")).query_async(&mut conn).await.unwrap();
    let denied = h.admin_events(&t.id, "reservation.denied").await;
    let ids: Vec<&str> = denied.iter().map(|e| e["event_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert_eq!(ids[1], format!("evt_{ahead}-6.{}", t.id));
    assert_eq!(ids[2], format!("evt_{ahead}-7.{}", t.id));
    for id in ids {
        let r = h.admin("GET", &format!("/v1/admin/events/{id}?tenant_id={}", t.id), None).await;
        assert_eq!(r.assert_ok()["event_id"], id);
    }
}

/// An event's stream entry id is chosen before it is written (the id is in its JSON). When the
/// stream's last id is past the one chosen and its entries up to it are gone (trimmed, as when
/// the newest events were written under a clock ahead of today's, e.g. before a failover), the
/// event takes the id after the stream's last: it is written with the change it records, never
/// failing after that change was.
#[tokio::test]
async fn an_event_after_the_streams_last_entries_were_trimmed_is_still_written() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let events = cycles_shared::keys::TenantKeys::new(&t.id).events();
    let ahead = cycles_shared::domain::now_ms() + 3_600_000;
    let mut c = h.store.conn();
    let xadd = redis::cmd("XADD").arg(&events).arg(format!("{ahead}-0")).arg("type").arg("x").clone();
    let _: String = xadd.query_async(&mut c).await.unwrap();
    let trim = redis::cmd("XTRIM").arg(&events).arg("MINID").arg(ahead + 1).clone();
    let _: i64 = trim.query_async(&mut c).await.unwrap();

    let r = h.reserve(&t, 81, json!({})).await; // crosses 80%: one threshold event with the hold
    r.assert_ok();
    assert_eq!(h.root(&t).await.reserved, 81);
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    assert_eq!(crossed.len(), 1, "the hold's event is written");
    let id = crossed[0]["event_id"].as_str().unwrap();
    assert!(id.starts_with(&format!("evt_{ahead}-1.")), "after the stream's last id: {id}");
}
