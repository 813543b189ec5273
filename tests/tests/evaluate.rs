//! `dry_run` and decide: evaluation without effect.

use cycles_shared::model::Unit;
use cycles_shared::provision::NewBudget;
use cycles_tests::*;

async fn decide(h: &Harness, t: &Tenant, amount: i64, extra: serde_json::Value) -> Resp {
    let mut body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": amount}});
    merge(&mut body, extra);
    h.post(&t.key, "/v1/decide", &body).await
}

#[tokio::test]
async fn dry_run_allows_without_touching_anything() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let r = h.reserve(&t, 60, json!({"dry_run": true})).await;
    let b = r.assert_ok();
    // A dry run answers the decision and the would-be effect, without ids, and moves nothing.
    assert_eq!(b["decision"], "ALLOW");
    for f in ["reservation_id", "expires_at_ms", "remaining_ttl_ms", "reason_code", "caps"] {
        assert!(b.get(f).is_none(), "{f} present");
    }
    assert_eq!(b["affected_scopes"], json!([format!("tenant:{}", t.id)]));
    assert_eq!(b["reserved"]["amount"], 60);
    assert_eq!(b["balances"][0]["remaining"]["amount"], 100, "pre-evaluation state");
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.reserved), (100, 0));
}

#[tokio::test]
async fn dry_run_and_decide_deny_with_reason_codes() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let root = format!("tenant:{}", t.id);
    // Insufficient budget is a DENY with a reason, never a 409, for dry_run and decide alike.
    let r = h.reserve(&t, 101, json!({"dry_run": true})).await;
    let b = r.assert_ok();
    assert_eq!((b["decision"].as_str(), b["reason_code"].as_str()), (Some("DENY"), Some("BUDGET_EXCEEDED")));
    assert!(b.get("balances").is_none() && b.get("reserved").is_none());
    assert!(b["affected_scopes"].is_array());
    assert_eq!(decide(&h, &t, 101, json!({})).await.assert_ok()["reason_code"], "BUDGET_EXCEEDED");
    // Each blocking ledger state gives its own reason code.
    let states: [(&[(&str, &str)], &str); 4] = [
        (&[("debt", "1"), ("remaining", "99")], "DEBT_OUTSTANDING"),
        (&[("is_over_limit", "true")], "OVERDRAFT_LIMIT_EXCEEDED"),
        (&[("status", "FROZEN")], "BUDGET_FROZEN"),
        (&[("status", "CLOSED")], "BUDGET_CLOSED"),
    ];
    for (fields, reason) in states {
        h.set_budget(&t.id, &root, Unit::Tokens, fields).await;
        let r = h.reserve(&t, 1, json!({"dry_run": true})).await;
        assert_eq!(r.assert_ok()["reason_code"], reason);
        let r = decide(&h, &t, 1, json!({})).await;
        assert_eq!(
            (r.status, r.body["decision"].as_str(), r.body["reason_code"].as_str()),
            (200, Some("DENY"), Some(reason))
        );
    }
    // No budget anywhere -> DENY; only another unit -> 400.
    let r = h.reserve(&t, 1, json!({"dry_run": true, "subject": {"workspace": "none"}})).await;
    assert_eq!(r.assert_ok()["reason_code"], "BUDGET_NOT_FOUND");
    let r = decide(&h, &t, 1, json!({"estimate": {"unit": "CREDITS", "amount": 1}})).await;
    r.assert_error(400, "UNIT_MISMATCH");
    h.reserve(&t, 1, json!({"dry_run": true, "estimate": {"unit": "CREDITS", "amount": 1}}))
        .await
        .assert_error(400, "UNIT_MISMATCH");
}

#[tokio::test]
async fn decide_shape_and_caps() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let mut b = NewBudget::new(&t.id, &format!("tenant:{}/agent:c", t.id), Unit::Tokens, 100);
    b.caps = Some(json!({"max_steps_remaining": 3}));
    h.budget_with(b).await;
    let r = decide(&h, &t, 1, json!({"subject": {"tenant": t.id, "agent": "c"}})).await;
    let body = r.assert_ok();
    // decide answers caps and affected scopes only, and holds nothing.
    assert_eq!(body["decision"], "ALLOW_WITH_CAPS");
    assert_eq!(body["caps"], json!({"max_steps_remaining": 3}));
    assert_eq!(body["affected_scopes"].as_array().unwrap().len(), 2);
    for f in ["scope_path", "balances", "reservation_id"] {
        assert!(body.get(f).is_none());
    }
    let r = decide(&h, &t, 1, json!({})).await;
    assert!(r.assert_ok().get("caps").is_none());
    assert_eq!(h.root(&t).await.reserved, 0);
    // decide's 403 on a foreign subject.tenant
    decide(&h, &t, 1, json!({"subject": {"tenant": "someone-else"}})).await.assert_error(403, "FORBIDDEN");
}

#[tokio::test]
async fn evaluation_replays_reflect_the_original_decision() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let body = json!({"idempotency_key": "dec-1"});
    let first = decide(&h, &t, 50, body.clone()).await;
    assert_eq!(first.assert_ok()["decision"], "ALLOW");
    h.set_budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, &[("status", "FROZEN")]).await;
    // The replay returns the original ALLOW, byte for byte.
    let again = decide(&h, &t, 50, body.clone()).await;
    assert_eq!(again.raw, first.raw);
    decide(&h, &t, 51, body).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
    let dry = h.reserve(&t, 5, json!({"idempotency_key": "dry-1", "dry_run": true})).await;
    assert_eq!(dry.assert_ok()["reason_code"], "BUDGET_FROZEN");
    assert_eq!(h.reserve(&t, 5, json!({"idempotency_key": "dry-1", "dry_run": true})).await.raw, dry.raw);
    // The same key live -> mismatch (shared namespace)
    h.reserve(&t, 5, json!({"idempotency_key": "dry-1"})).await.assert_error(409, "IDEMPOTENCY_MISMATCH");
}

#[tokio::test]
async fn denials_are_recorded_as_events_once() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    decide(&h, &t, 5, json!({})).await.assert_ok();
    let body = json!({"idempotency_key": "deny-1"});
    let r = decide(&h, &t, 50, body.clone()).await;
    assert_eq!(r.assert_ok()["decision"], "DENY");
    decide(&h, &t, 50, body).await.assert_ok();
    h.reserve(&t, 99, json!({"dry_run": true})).await.assert_ok();
    let ev = h.events(&t.id).await;
    assert_eq!(ev.len(), 2, "one per fresh DENY, none for ALLOW or replays: {ev:?}");
    assert_eq!(ev[0]["event_type"], "reservation.denied");
    assert_eq!(ev[0]["data"]["reason_code"], "BUDGET_EXCEEDED");
    assert_eq!(ev[0]["data"]["requested_amount"], 50);
    assert_eq!(ev[0]["data"]["remaining"], 10, "{}", ev[0]);
    assert_eq!(ev[0]["data"]["scope"], format!("tenant:{}", t.id));
    assert_eq!(ev[0]["data"]["subject"]["tenant"], t.id.as_str());
    assert_eq!(ev[0]["request_id"], r.headers["x-request-id"].as_str());
    assert_eq!(ev[1]["data"]["requested_amount"], 99);
}
