//! `GET /v1/balances` on the runtime plane: filters, tenancy, paging and the ledger fields.

use cycles_shared::model::Unit;
use cycles_tests::*;

#[tokio::test]
async fn balances_match_segments_and_reflect_every_call() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::Tokens, 1000).await;
    h.budget(&t.id, &root, Unit::UsdMicrocents, 5_000_000).await;
    h.budget(&t.id, &format!("{root}/workspace:prod"), Unit::Tokens, 500).await;
    h.budget(&t.id, &format!("{root}/workspace:prod/agent:bot"), Unit::Tokens, 100).await;
    h.budget(&t.id, &format!("{root}/workspace:dev"), Unit::Tokens, 50).await;
    let rid = h.reserve_ok(&t, 40, json!({"subject": {"tenant": t.id, "workspace": "prod", "agent": "bot"}})).await;
    // Effects are visible right away.
    let r = h.get(&t.key, "/v1/balances?workspace=PROD");
    let body = r.await.assert_ok().clone();
    let rows = body["balances"].as_array().unwrap();
    let paths: Vec<&str> = rows.iter().map(|b| b["scope_path"].as_str().unwrap()).collect();
    assert_eq!(paths, vec![format!("{root}/workspace:prod"), format!("{root}/workspace:prod/agent:bot")]);
    assert_eq!(rows[1]["scope"], "agent:bot");
    assert_eq!(rows[1]["reserved"]["amount"], 40);
    assert_eq!(rows[1]["remaining"]["amount"], 60);
    assert_eq!(body["has_more"], false);
    assert!(body.get("next_cursor").is_none());
    // Invariant on every row, one unit per row.
    let all = h.get(&t.key, &format!("/v1/balances?tenant={}", t.id)).await;
    let rows = all.assert_ok()["balances"].as_array().unwrap().clone();
    assert_eq!(rows.len(), 5);
    for b in &rows {
        let n = |f: &str| b[f]["amount"].as_i64().unwrap_or(0);
        assert_eq!(n("remaining"), n("allocated") - n("spent") - n("reserved") - n("debt"), "{b}");
        let unit = &b["remaining"]["unit"];
        for f in ["allocated", "spent", "reserved"] {
            assert_eq!(&b[f]["unit"], unit);
        }
    }
    h.commit(&t, &rid, 30).await.assert_ok();
    let r = h.get(&t.key, "/v1/balances?agent=bot").await;
    let row = &r.assert_ok()["balances"][0];
    assert_eq!((row["spent"]["amount"].as_i64(), row["reserved"]["amount"].as_i64()), (Some(30), Some(0)));
}

#[tokio::test]
async fn balances_require_a_filter_and_stay_in_the_tenant() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let other = h.funded(100).await;
    // A tenant key must name a filter.
    h.get(&t.key, "/v1/balances").await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, "/v1/balances?tenant=&limit=10").await.assert_error(400, "INVALID_REQUEST");
    // Another tenant's ledgers are forbidden.
    h.get(&t.key, &format!("/v1/balances?tenant={}", other.id)).await.assert_error(403, "FORBIDDEN");
    // A segment filter never reaches another tenant's ledgers.
    let r = h.get(&t.key, "/v1/balances?workspace=x&unknown=1").await;
    assert_eq!(r.assert_ok()["balances"], json!([]));
    let r = h.get(&t.key, &format!("/v1/balances?tenant={}", t.id)).await;
    assert_eq!(r.assert_ok()["balances"].as_array().unwrap().len(), 1);
    h.get(&t.key, &format!("/v1/balances?tenant={}&limit=0", t.id)).await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, &format!("/v1/balances?tenant={}&limit=201", t.id)).await.assert_error(400, "INVALID_REQUEST");
    // include_children is a boolean (its effect may be ignored in v0, its type may not).
    let r = h.get(&t.key, &format!("/v1/balances?tenant={}&include_children=-5", t.id)).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert!(r.body["message"].as_str().unwrap().contains("include_children"), "{}", r.raw);
    let r = h.get(&t.key, &format!("/v1/balances?tenant={}&include_children=true", t.id)).await;
    assert_eq!(r.assert_ok()["balances"].as_array().unwrap().len(), 1);
    h.send("GET", &format!("/v1/balances?tenant={}", t.id), &[("x-admin-api-key", ADMIN_KEY)], None)
        .await
        .assert_error(401, "UNAUTHORIZED");
}

#[tokio::test]
async fn balances_over_limit_and_debt_are_reported() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    h.set_budget(
        &t.id,
        &format!("tenant:{}", t.id),
        Unit::Tokens,
        &[("debt", "30"), ("remaining", "70"), ("overdraft_limit", "10"), ("is_over_limit", "true")],
    )
    .await;
    // Over-limit state, debt and the overdraft limit are reported.
    let r = h.get(&t.key, &format!("/v1/balances?tenant={}", t.id)).await;
    let b = &r.assert_ok()["balances"][0];
    assert_eq!(b["is_over_limit"], true);
    assert_eq!(b["debt"]["amount"], 30);
    assert_eq!(b["overdraft_limit"]["amount"], 10);
}

#[tokio::test]
async fn balances_paginate_with_cursors() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::Tokens, 100).await;
    for i in 0..7 {
        h.budget(&t.id, &format!("{root}/agent:a{i}"), Unit::Tokens, 10).await;
    }
    // `has_more` only with next_cursor; every row exactly once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/balances?tenant={}&limit=3&cursor={c}", t.id),
            None => format!("/v1/balances?tenant={}&limit=3", t.id),
        };
        let r = h.get(&t.key, &path).await;
        let b = r.assert_ok().clone();
        assert!(b["balances"].as_array().unwrap().len() <= 3);
        seen.extend(b["balances"].as_array().unwrap().iter().map(|x| x["scope_path"].as_str().unwrap().to_string()));
        assert_eq!(b["has_more"].as_bool().unwrap(), b.get("next_cursor").is_some());
        match b.get("next_cursor") {
            Some(c) => {
                // a new ledger created between pages sorts after the cursor and is not duplicated
                if seen.len() == 3 {
                    h.budget(&t.id, &format!("{root}/agent:zz"), Unit::Tokens, 1).await;
                }
                cursor = Some(c.as_str().unwrap().to_string())
            }
            None => break,
        }
    }
    let mut unique = seen.clone();
    unique.dedup();
    assert_eq!(unique.len(), seen.len());
    assert_eq!(seen.len(), 9);
    // A cursor reused with other filters, or garbage, is a 400.
    let first = h.get(&t.key, &format!("/v1/balances?tenant={}&limit=3", t.id)).await;
    let c = first.body["next_cursor"].as_str().unwrap();
    h.get(&t.key, &format!("/v1/balances?agent=a1&limit=3&cursor={c}")).await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, &format!("/v1/balances?tenant={}&cursor=%%%", t.id)).await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, &format!("/v1/balances?tenant={}&cursor=bm9wZQ", t.id)).await.assert_error(400, "INVALID_REQUEST");
}
