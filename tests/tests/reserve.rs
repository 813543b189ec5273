//! createReservation (live).

use cycles_shared::model::{OveragePolicy, Unit};
use cycles_shared::provision::{NewBudget, NewTenant};
use cycles_tests::*;
use redis::AsyncCommands;

#[tokio::test]
async fn reserve_holds_the_estimate_on_every_budgeted_scope() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let ws = format!("{root}/workspace:prod");
    let agent = format!("{ws}/agent:bot");
    h.budget(&t.id, &root, Unit::Tokens, 1000).await;
    h.budget(&t.id, &agent, Unit::Tokens, 300).await;
    let r = h.reserve(&t, 120, json!({"subject": {"tenant": t.id, "workspace": "prod", "agent": "Bot"}})).await;
    let b = r.assert_ok();
    // Decision, ids, canonical scopes including the unbudgeted workspace.
    assert_eq!(b["decision"], "ALLOW");
    assert_eq!(b["reserved"], json!({"unit": "TOKENS", "amount": 120}));
    assert_eq!(b["affected_scopes"], json!([root, ws, agent]));
    assert_eq!(b["scope_path"], json!(agent));
    assert!(b["reservation_id"].as_str().unwrap().len() <= 128);
    assert!(b.get("caps").is_none() && b.get("reason_code").is_none());
    // `remaining_ttl_ms` on a fresh create equals the effective TTL (default 60 s).
    assert_eq!(b["remaining_ttl_ms"], 60000);
    // balances: the two budgeted scopes only, post-reservation, scope = leaf segment.
    let balances = b["balances"].as_array().unwrap();
    assert_eq!(balances.len(), 2);
    assert_eq!(balances[1]["scope"], "agent:bot");
    assert_eq!(balances[1]["scope_path"], json!(agent));
    assert_eq!(balances[1]["remaining"]["amount"], 180);
    assert_eq!(balances[0]["reserved"]["amount"], 120);
    // Ledgers after.
    let l = h.ledger(&t.id, &root, Unit::Tokens).await;
    assert_eq!((l.remaining, l.reserved, l.spent), (880, 120, 0));
    let l = h.ledger(&t.id, &agent, Unit::Tokens).await;
    assert_eq!((l.remaining, l.reserved), (180, 120));
}

#[tokio::test]
async fn gaps_are_skipped_in_affected_scopes() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let r = h.reserve(&t, 1, json!({"subject": {"tenant": t.id, "agent": "a"}})).await;
    assert_eq!(
        r.assert_ok()["affected_scopes"],
        json!([format!("tenant:{}", t.id), format!("tenant:{}/agent:a", t.id)])
    );
}

#[tokio::test]
async fn insufficient_budget_is_409_and_changes_nothing() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.budget(&t.id, &root, Unit::Tokens, 1000).await;
    h.budget(&t.id, &agent, Unit::Tokens, 50).await;
    // The deeper scope is short, so neither scope changes.
    let r = h.reserve(&t, 51, json!({"subject": {"tenant": t.id, "agent": "a"}})).await;
    r.assert_error(409, "BUDGET_EXCEEDED");
    assert_eq!(h.ledger(&t.id, &root, Unit::Tokens).await.remaining, 1000);
    assert_eq!(h.ledger(&t.id, &agent, Unit::Tokens).await.reserved, 0);
    // Remaining == estimate succeeds.
    h.reserve(&t, 50, json!({"subject": {"tenant": t.id, "agent": "a"}})).await.assert_ok();
    assert_eq!(h.ledger(&t.id, &agent, Unit::Tokens).await.remaining, 0);
}

#[tokio::test]
async fn over_limit_debt_frozen_closed_in_precedence_order() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.budget(&t.id, &root, Unit::Tokens, 10).await;
    h.budget(&t.id, &agent, Unit::Tokens, 1000).await;
    let sub = json!({"subject": {"tenant": t.id, "agent": "a"}});
    // Over-limit blocks even though remaining suffices, and outranks the ancestor's shortfall.
    h.set_budget(&t.id, &agent, Unit::Tokens, &[("is_over_limit", "true")]).await;
    h.reserve(&t, 50, sub.clone()).await.assert_error(409, "OVERDRAFT_LIMIT_EXCEEDED");
    // Over-limit plus debt -> OVERDRAFT_LIMIT_EXCEEDED.
    h.set_budget(&t.id, &agent, Unit::Tokens, &[("debt", "5"), ("remaining", "995")]).await;
    h.reserve(&t, 1, sub.clone()).await.assert_error(409, "OVERDRAFT_LIMIT_EXCEEDED");
    // Debt with a zero limit -> DEBT_OUTSTANDING.
    h.set_budget(&t.id, &agent, Unit::Tokens, &[("is_over_limit", "false")]).await;
    h.reserve(&t, 1, sub.clone()).await.assert_error(409, "DEBT_OUTSTANDING");
    // Debt within a positive limit does not block.
    h.set_budget(&t.id, &agent, Unit::Tokens, &[("overdraft_limit", "100")]).await;
    h.reserve(&t, 1, sub.clone()).await.assert_ok();
    // FROZEN and CLOSED; frozen outranks over-limit elsewhere.
    h.set_budget(&t.id, &agent, Unit::Tokens, &[("is_over_limit", "true")]).await;
    h.set_budget(&t.id, &root, Unit::Tokens, &[("status", "FROZEN")]).await;
    h.reserve(&t, 1, sub.clone()).await.assert_error(409, "BUDGET_FROZEN");
    h.set_budget(&t.id, &root, Unit::Tokens, &[("status", "CLOSED")]).await;
    h.reserve(&t, 1, sub.clone()).await.assert_error(409, "BUDGET_CLOSED");
    let l = h.ledger(&t.id, &agent, Unit::Tokens).await;
    assert_eq!(l.reserved, 1, "only the one allowed reservation holds budget");
}

#[tokio::test]
async fn unit_mismatch_and_missing_budget() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::UsdMicrocents, 1000).await;
    h.budget(&t.id, &root, Unit::Credits, 1000).await;
    // Only other units budgeted -> 400 UNIT_MISMATCH with details.
    let r = h.reserve(&t, 1, json!({})).await;
    r.assert_error(400, "UNIT_MISMATCH");
    assert_eq!(r.body["details"]["scope"], json!(root));
    assert_eq!(r.body["details"]["requested_unit"], "TOKENS");
    let mut units: Vec<String> = serde_json::from_value(r.body["details"]["expected_units"].clone()).unwrap();
    units.sort();
    assert_eq!(units, vec!["CREDITS", "USD_MICROCENTS"]);
    // No budget in any unit -> 404 naming the deepest scope.
    let r = h.reserve(&t, 1, json!({"subject": {"workspace": "nobody"}})).await;
    r.assert_error(404, "NOT_FOUND");
    assert_eq!(r.body["message"], "Budget not found for provided scope: workspace:nobody");
}

#[tokio::test]
async fn a_unit_budgeted_elsewhere_in_the_chain_is_enforced_alone() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.budget(&t.id, &root, Unit::UsdMicrocents, 5).await;
    h.budget(&t.id, &agent, Unit::Tokens, 500).await;
    let r = h.reserve(&t, 400, json!({"subject": {"tenant": t.id, "agent": "a"}})).await;
    assert_eq!(r.assert_ok()["balances"].as_array().unwrap().len(), 1);
    assert_eq!(h.ledger(&t.id, &root, Unit::UsdMicrocents).await.remaining, 5);
}

#[tokio::test]
async fn validation_errors_name_the_field() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let cases = [
        (json!({"ttl_ms": 999}), "ttl_ms"),
        (json!({"ttl_ms": 86400001}), "ttl_ms"),
        (json!({"grace_period_ms": 60001}), "grace_period_ms"),
        (json!({"grace_period_ms": -1}), "grace_period_ms"),
        (json!({"estimate": {"unit": "TOKENS", "amount": -1}}), "estimate.amount"),
        (json!({"estimate": {"unit": "TOKENS"}}), "amount"),
        (json!({"estimate": {"unit": "TOKENS", "amount": 9223372036854775808u64}}), "estimate.amount"),
        (json!({"estimate": {"unit": "EUROS", "amount": 1}}), "estimate.unit"),
        (json!({"estimate": null}), "estimate"),
        (json!({"subject": {}}), "subject"),
        (json!({"subject": {"dimensions": {"a": "b"}}}), "subject"),
        (json!({"subject": {"tenant": "x".repeat(129)}}), "subject.tenant"),
        (json!({"subject": {"agent": "has space"}}), "subject.agent"),
        (json!({"subject": {"agent": ""}}), "subject.agent"),
        (json!({"subject": {"agent": "a", "team": "x"}}), "team"),
        (json!({"action": {"kind": "", "name": "n"}}), "action.kind"),
        (json!({"action": {"kind": "k", "name": " "}}), "action.name"),
        (
            json!({"action": {"kind": "k", "name": "n", "tags": (0..11).map(|i| i.to_string()).collect::<Vec<_>>()}}),
            "action.tags",
        ),
        (json!({"idempotency_key": ""}), "idempotency_key"),
        (json!({"idempotency_key": "k".repeat(257)}), "idempotency_key"),
        (json!({"overage_policy": "SOMETIMES"}), "overage_policy"),
        (json!({"surprise": 1}), "surprise"),
        (json!({"metadata": "not an object"}), "metadata"),
    ];
    for (extra, field) in cases {
        let r = h.reserve(&t, 1, extra.clone()).await;
        r.assert_error(400, "INVALID_REQUEST");
        assert!(r.body["message"].as_str().unwrap().contains(field), "{extra} -> {}", r.raw);
    }
    // Malformed JSON and non-object bodies.
    for body in ["{", "[]", "", "null"] {
        let r = h.send("POST", "/v1/reservations", &[("x-cycles-api-key", &t.key)], Some(body)).await;
        r.assert_error(400, "INVALID_REQUEST");
    }
    // More than 16 dimensions, or a dimension value longer than 256.
    let dims: serde_json::Map<String, serde_json::Value> = (0..17).map(|i| (format!("d{i}"), json!("v"))).collect();
    h.reserve(&t, 1, json!({"subject": {"tenant": t.id, "dimensions": dims}}))
        .await
        .assert_error(400, "INVALID_REQUEST");
    h.reserve(&t, 1, json!({"subject": {"tenant": t.id, "dimensions": {"a": "v".repeat(257)}}}))
        .await
        .assert_error(400, "INVALID_REQUEST");
    assert_eq!(h.root(&t).await.reserved, 0, "nothing was written by any rejected request");
}

#[tokio::test]
async fn zero_estimate_and_amounts_above_2_pow_53_are_exact() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let big: i64 = 9_007_199_254_740_993; // 2^53 + 1
    h.budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, i64::MAX).await;
    // Zero is accepted.
    h.reserve(&t, 0, json!({})).await.assert_ok();
    // Amounts round-trip exactly.
    let r = h.reserve(&t, big, json!({})).await;
    let b = r.assert_ok();
    assert_eq!(b["reserved"]["amount"].as_i64(), Some(big));
    assert_eq!(b["balances"][0]["remaining"]["amount"].as_i64(), Some(i64::MAX - big));
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (big, i64::MAX - big));
    let rid = b["reservation_id"].as_str().unwrap();
    let c = h.commit(&t, rid, big - 1).await;
    assert_eq!(c.assert_ok()["released"]["amount"].as_i64(), Some(1));
    assert_eq!(h.root(&t).await.spent, big - 1);
}

#[tokio::test]
async fn ttl_defaults_and_caps_come_from_the_tenant() {
    let h = Harness::start().await;
    // Default TTL 60 s; requested TTL capped at 1 h without a tenant setting.
    let t = h.funded(100).await;
    let r = h.reserve(&t, 1, json!({"ttl_ms": 86400000})).await;
    assert_eq!(r.assert_ok()["remaining_ttl_ms"], 3_600_000);
    // Tenant settings: default TTL and a lower cap.
    let spec = NewTenant {
        default_reservation_ttl_ms: Some(20_000),
        max_reservation_ttl_ms: Some(30_000),
        ..Default::default()
    };
    let t = h.tenant_with(spec).await;
    h.budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, 100).await;
    let r = h.reserve(&t, 1, json!({})).await;
    let b = r.assert_ok();
    assert_eq!(b["remaining_ttl_ms"], 20_000);
    let r = h.reserve(&t, 1, json!({"ttl_ms": 40_000})).await;
    assert_eq!(r.assert_ok()["remaining_ttl_ms"], 30_000);
}

#[tokio::test]
async fn caps_from_the_deepest_scope_give_allow_with_caps() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let mut b = NewBudget::new(&t.id, &format!("tenant:{}/agent:capped", t.id), Unit::Tokens, 100);
    b.caps = Some(json!({"max_tokens": 50, "tool_denylist": ["shell"]}));
    h.budget_with(b).await;
    // Caps present iff ALLOW_WITH_CAPS.
    let r = h.reserve(&t, 10, json!({"subject": {"tenant": t.id, "agent": "capped"}})).await;
    let body = r.assert_ok();
    assert_eq!(body["decision"], "ALLOW_WITH_CAPS");
    assert_eq!(body["caps"], json!({"max_tokens": 50, "tool_denylist": ["shell"]}));
    // A subject whose deepest scope has no caps gets a plain ALLOW.
    let r = h.reserve(&t, 10, json!({"subject": {"tenant": t.id, "agent": "capped", "toolset": "x"}})).await;
    let body = r.assert_ok();
    assert_eq!(body["decision"], "ALLOW");
    assert!(body.get("caps").is_none());
}

#[tokio::test]
async fn overage_policy_defaults_from_ledger_then_tenant() {
    let h = Harness::start().await;
    // Tenant default REJECT applies when the request and ledgers name none.
    let t = h
        .tenant_with(NewTenant { default_commit_overage_policy: Some(OveragePolicy::Reject), ..Default::default() })
        .await;
    h.budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, 100).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.commit(&t, &rid, 11).await.assert_error(409, "BUDGET_EXCEEDED");
    // A ledger-level policy outranks the tenant default.
    let mut b = NewBudget::new(&t.id, &format!("tenant:{}/agent:x", t.id), Unit::Tokens, 100);
    b.commit_overage_policy = Some(OveragePolicy::AllowIfAvailable);
    h.budget_with(b).await;
    let rid = h.reserve_ok(&t, 10, json!({"subject": {"tenant": t.id, "agent": "x"}})).await;
    assert_eq!(h.commit(&t, &rid, 11).await.assert_ok()["charged"]["amount"], 11);
    // The request's policy outranks both.
    let rid =
        h.reserve_ok(&t, 10, json!({"subject": {"tenant": t.id, "agent": "x"}, "overage_policy": "REJECT"})).await;
    h.commit(&t, &rid, 11).await.assert_error(409, "BUDGET_EXCEEDED");
}

#[tokio::test]
async fn tenancy_rules() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let other = h.funded(100).await;
    // `subject.tenant` must equal the key's tenant (exact, case-sensitive).
    h.reserve(&t, 1, json!({"subject": {"tenant": other.id}})).await.assert_error(403, "FORBIDDEN");
    h.reserve(&t, 1, json!({"subject": {"tenant": t.id.to_uppercase()}})).await.assert_error(403, "FORBIDDEN");
    // A subject without tenant is owned by the key's tenant (and derives no tenant scope).
    let mut b = NewBudget::new(&t.id, &format!("tenant:{}", t.id), Unit::Credits, 5);
    b.scope = format!("tenant:{}", t.id);
    h.budget_with(b).await;
    let r = h.reserve(&t, 1, json!({"subject": {"agent": "x"}})).await;
    r.assert_error(404, "NOT_FOUND");
    assert_eq!(h.root(&other).await.reserved, 0);
}

/// A body that names a key twice is ambiguous (a reader that keeps the first value and one that
/// keeps the last disagree): 400 naming the key, and nothing is written, on both planes.
#[tokio::test]
async fn duplicate_json_keys_are_refused_at_any_depth() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let before = h.root(&t).await;
    let tenant = &t.id;
    let cases = [
        format!(
            r#"{{"idempotency_key":"d1","subject":{{"tenant":"{tenant}"}},"action":{{"kind":"llm","name":"m"}},
               "estimate":{{"unit":"TOKENS","amount":1}},"estimate":{{"unit":"TOKENS","amount":999999}}}}"#
        ),
        format!(
            r#"{{"idempotency_key":"d2","idempotency_key":"d3","subject":{{"tenant":"{tenant}"}},
               "action":{{"kind":"llm","name":"m"}},"estimate":{{"unit":"TOKENS","amount":1}}}}"#
        ),
        format!(
            r#"{{"idempotency_key":"d4","subject":{{"tenant":"{tenant}","agent":"a","agent":"b"}},
               "action":{{"kind":"llm","name":"m"}},"estimate":{{"unit":"TOKENS","amount":1}}}}"#
        ),
        format!(
            r#"{{"idempotency_key":"d5","subject":{{"tenant":"{tenant}"}},"action":{{"kind":"llm","name":"m"}},
               "estimate":{{"unit":"TOKENS","amount":1}},"metadata":{{"a":[{{"x":1,"x":2}}]}}}}"#
        ),
    ];
    let fields = ["estimate", "idempotency_key", "subject.agent", "metadata.a[].x"];
    for (body, field) in cases.iter().zip(fields) {
        for path in ["/v1/reservations", "/v1/decide"] {
            let r = h.send("POST", path, &[("x-cycles-api-key", &t.key)], Some(body)).await;
            r.assert_error(400, "INVALID_REQUEST");
            assert!(r.body["message"].as_str().unwrap().contains(&format!("duplicate field `{field}`")), "{}", r.raw);
        }
    }
    assert_eq!(h.root(&t).await, before, "nothing was reserved");
    let listed = h.get(&t.key, "/v1/reservations").await;
    assert_eq!(listed.assert_ok()["reservations"], json!([]));
    // the operator plane parses bodies the same way
    let body =
        r#"{"operation":"CREDIT","amount":{"unit":"TOKENS","amount":1},"amount":{"unit":"TOKENS","amount":5000}}"#;
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{tenant}&unit=TOKENS&tenant_id={tenant}");
    let r = h.send_to(&h.admin_base, "POST", &path, &[("x-admin-api-key", &h.admin_key)], Some(body)).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert_eq!(h.root(&t).await, before, "nothing was funded");
}

/// The scripts remember each ledger's last view decoded; a view changed by anything else (an
/// import, an operator's hand) is read as stored, never as remembered.
#[tokio::test]
async fn a_ledger_view_changed_outside_the_scripts_is_read_as_stored() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    h.reserve_ok(&t, 100, json!({})).await;
    let key = cycles_shared::keys::TenantKeys::new(&t.id).budget(&format!("tenant:{}", t.id), Unit::Tokens);
    let view: String = h.store.conn().hget(&key, "v").await.unwrap();
    let mut fields: Vec<&str> = view.split('\u{1f}').collect();
    assert_eq!(fields[4], "900", "remaining is the view's fifth field");
    // allocated 1000 -> 150 behind the scripts' back: 50 remain
    (fields[3], fields[4]) = ("150", "50");
    let _: () = h.store.conn().hset(&key, "v", fields.join("\u{1f}")).await.unwrap();
    h.reserve(&t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    h.reserve_ok(&t, 50, json!({})).await;
    assert_eq!(h.root(&t).await.remaining, 0);
}
