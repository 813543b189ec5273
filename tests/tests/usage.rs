//! Spend analytics (`lua/lib/usage.lua`, `GET /v1/usage`, `GET /v1/admin/usage`): rollups kept
//! with every charge and every ending of a reservation, equal to the sum of what they came
//! from; bounded groups; the sweep's fold; the scoped key's view; CSV; pagination.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cycles_shared::domain::{format_rfc3339_ms, now_ms};
use cycles_shared::keys::TenantKeys;
use cycles_tests::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use redis::AsyncCommands;
use serde_json::Value;

/// A report's query string over the last and next hour.
fn window(extra: &str) -> String {
    let now = now_ms();
    format!("from={}&to={}{extra}", format_rfc3339_ms(now - 3_600_000), format_rfc3339_ms(now + 3_600_000))
}

async fn usage(h: &Harness, t: &Tenant, query: &str) -> Value {
    h.get(&t.key, &format!("/v1/usage?{query}")).await.assert_ok().clone()
}

async fn admin_usage(h: &Harness, t: &Tenant, query: &str) -> Resp {
    h.admin("GET", &format!("/v1/admin/usage?tenant_id={}&{query}", t.id), None).await
}

/// Figures per group (the listed dimension values joined by '|'), summed over buckets.
type Totals = BTreeMap<String, [i64; 5]>;

fn totals(report: &Value, dims: &[&str]) -> Totals {
    let mut out = Totals::new();
    for row in report["rows"].as_array().unwrap() {
        let key = dims.iter().map(|d| row[*d].as_str().unwrap_or("").to_string()).collect::<Vec<_>>().join("|");
        let t = out.entry(key).or_default();
        for (i, f) in ["spent", "estimated", "charges", "reservations", "released"].iter().enumerate() {
            t[i] += row[*f].as_i64().unwrap_or_else(|| panic!("{f} in {row}"));
        }
    }
    out
}

async fn event(h: &Harness, t: &Tenant, agent: &str, name: &str, amount: i64) -> i64 {
    let body = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id, "agent": agent},
        "action": {"kind": "tool.call", "name": name}, "actual": {"unit": "TOKENS", "amount": amount}});
    let r = h.post(&t.key, "/v1/events", &body).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    r.body["charged"]["amount"].as_i64().unwrap_or(amount)
}

/// Random reserves, commits, releases and events over three agents and two actions; then the
/// report (by agent and action name, at every granularity) must equal what the answers said.
async fn run_case(h: Arc<Harness>, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let t = h.funded(1_000_000_000).await;
    let mut want = Totals::new();
    for _ in 0..24 {
        let agent = ["a", "b", "c"][rng.gen_range(0..3)];
        let name = ["gpt", "claude"][rng.gen_range(0..2)];
        let key = format!("{agent}|{name}");
        match rng.gen_range(0..4) {
            0 => {
                let spent = event(&h, &t, agent, name, rng.gen_range(0..500)).await;
                let w = want.entry(key).or_default();
                w[0] += spent;
                w[2] += 1;
            }
            op => {
                let estimate = rng.gen_range(1..300);
                let rid = h
                    .reserve_ok(
                        &t,
                        estimate,
                        json!({"subject": {"tenant": t.id, "agent": agent},
                        "action": {"kind": "llm.completion", "name": name}}),
                    )
                    .await;
                let w = want.entry(key).or_default();
                if op == 3 {
                    assert_eq!(h.release(&t, &rid).await.status, 200);
                    w[4] += 1;
                } else {
                    let r = h.commit(&t, &rid, rng.gen_range(0..400)).await;
                    let charged = r.assert_ok()["charged"]["amount"].as_i64().unwrap();
                    w[0] += charged;
                    w[2] += 1;
                }
                w[1] += estimate;
                w[3] += 1;
            }
        }
    }
    for g in ["hour", "day", "month"] {
        let report = usage(&h, &t, &window(&format!("&granularity={g}&group_by=agent,action_name"))).await;
        assert_eq!(totals(&report, &["agent", "action_name"]), want, "seed {seed}, {g}");
    }
    // folded exactly once: the log is gone and a second read adds nothing
    let log: bool = h.store.conn().exists(TenantKeys::new(&t.id).usage_log()).await.unwrap();
    assert!(!log, "seed {seed}: the usage log outlived its fold");
    let again = usage(&h, &t, &window("&group_by=agent,action_name")).await;
    assert_eq!(totals(&again, &["agent", "action_name"]), want, "seed {seed}: read twice");
}

#[test]
fn rollups_equal_the_sum_of_the_charges_they_came_from() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let h = Arc::new(rt.block_on(Harness::start()));
    let config = ProptestConfig { cases: 6, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(seed in any::<u64>())| {
        eprintln!("usage case: seed={seed}");
        rt.block_on(run_case(h.clone(), seed));
    });
}

#[tokio::test]
async fn a_bucket_holds_at_most_max_groups_and_the_rest_lands_in_other() {
    let h = Harness::start_configured(|c| c.usage.max_groups = 3).await;
    let t = h.funded(1_000_000).await;
    for (i, agent) in ["a", "b", "c", "d", "e"].iter().enumerate() {
        event(&h, &t, agent, "search", 10 * (i as i64 + 1)).await;
    }
    let report = usage(&h, &t, &window("&group_by=scope")).await;
    let got = totals(&report, &["scope"]);
    let scope = |a: &str| format!("tenant:{}/agent:{a}", t.id);
    // three groups, then `other` with the two that came past the cap (never an error)
    assert_eq!(got.len(), 4, "{report}");
    assert_eq!(got[&scope("a")][0], 10);
    assert_eq!(got[&scope("c")][0], 30);
    assert_eq!(got["other"], [40 + 50, 0, 2, 0, 0]);
    assert!(!got.contains_key(&scope("d")));
}

#[tokio::test]
async fn the_sweep_folds_expiries_as_released_and_buckets_expire_after_retention() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    let rid = h.reserve_ok(&t, 70, json!({"ttl_ms": 1_000, "grace_period_ms": 0})).await;
    let keys = TenantKeys::new(&t.id);
    let mut conn = h.store.conn();
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let report = h.sweep_tenant(&t, &Default::default()).await;
    assert_eq!(report.expired, 1);
    assert_eq!(report.usage_folded, 1, "{report:?}");
    let log: bool = conn.exists(keys.usage_log()).await.unwrap();
    assert!(!log);
    h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_error(410, "RESERVATION_EXPIRED");
    let got = totals(&usage(&h, &t, &window("")).await, &["unit"]);
    assert_eq!(got["TOKENS"], [0, 70, 0, 1, 1]);
    // each bucket lives its retention past its end (400 days by default)
    let hour = now_ms() / 3_600_000;
    let ttl: i64 = conn.pttl(keys.usage_bucket(format!("h{hour}"))).await.unwrap();
    let retention = 400 * 86_400_000i64;
    assert!(ttl > retention - 60_000 && ttl <= retention + 3_600_000, "{ttl}");
}

#[tokio::test]
async fn a_closed_tenants_open_reservations_count_as_released() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    h.reserve_ok(&t, 40, json!({})).await;
    let r = h.admin("PATCH", &format!("/v1/admin/tenants/{}", t.id), Some(&json!({"status": "CLOSED"}))).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let got = totals(&admin_usage(&h, &t, &window("")).await.assert_ok().clone(), &["unit"]);
    assert_eq!(got["TOKENS"], [0, 40, 0, 1, 1]);
}

#[tokio::test]
async fn a_scoped_key_sees_its_scopes_csv_pages_and_bad_input() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    for (ws, amount) in [("a", 5), ("b", 7), ("a", 11)] {
        let body = json!({"idempotency_key": unique("ev"), "subject": {"tenant": t.id, "workspace": ws},
            "action": {"kind": "tool.call", "name": "x,\"y\""}, "actual": {"unit": "TOKENS", "amount": amount}});
        assert_eq!(h.post(&t.key, "/v1/events", &body).await.status, 201);
    }
    let body = json!({"tenant_id": t.id, "name": "ws-a", "scope_filter": ["workspace:a"]});
    let scoped = h.admin("POST", "/v1/admin/api-keys", Some(&body)).await.assert_created()["key_secret"]
        .as_str()
        .unwrap()
        .to_string();
    let by_ws = |r: &Value| totals(r, &["workspace"]);
    let all = admin_usage(&h, &t, &window("&group_by=workspace")).await;
    assert_eq!(by_ws(all.assert_ok()), BTreeMap::from([("a".into(), [16, 0, 2, 0, 0]), ("b".into(), [7, 0, 1, 0, 0])]));
    let own = h.get(&scoped, &format!("/v1/usage?{}", window("&group_by=workspace"))).await;
    assert_eq!(by_ws(own.assert_ok()), BTreeMap::from([("a".into(), [16, 0, 2, 0, 0])]));
    // a scope prefix keeps whole segments below it
    let r = usage(&h, &t, &window(&format!("&group_by=workspace&scope_prefix=tenant:{}/workspace:b", t.id))).await;
    assert_eq!(by_ws(&r).keys().collect::<Vec<_>>(), vec!["b"]);
    // unit filter
    let r = usage(&h, &t, &window("&unit=CREDITS")).await;
    assert!(r["rows"].as_array().unwrap().is_empty());

    // CSV, with client text quoted
    let r = h.get(&t.key, &format!("/v1/usage?{}", window("&group_by=workspace,action_name&format=csv"))).await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"].starts_with("text/csv"), "{:?}", r.headers);
    let lines: Vec<&str> = r.raw.split("\r\n").filter(|l| !l.is_empty()).collect();
    assert_eq!(
        lines[0],
        "bucket_start,bucket_end,workspace,action_name,unit,spent,estimated,charges,reservations,released"
    );
    assert_eq!(lines.len(), 3, "{}", r.raw);
    assert!(lines[1].ends_with(",a,\"x,\"\"y\"\"\",TOKENS,16,0,2,0,0"), "{}", lines[1]);

    // pages of one row, by cursor, give every row once
    let mut rows = Vec::new();
    let mut query = window("&group_by=workspace&limit=1");
    loop {
        let page = usage(&h, &t, &query).await;
        rows.extend(page["rows"].as_array().unwrap().iter().map(|r| r["workspace"].clone()));
        match page["next_cursor"].as_str() {
            Some(c) => {
                assert_eq!(page["has_more"], true);
                query = format!("{}&cursor={c}", window("&group_by=workspace&limit=1"));
            }
            None => break,
        }
        assert!(rows.len() < 10, "pages never end");
    }
    assert_eq!(rows, vec![json!("a"), json!("b")]);

    // bad input: 400 in the ErrorResponse shape
    for bad in [
        "granularity=week&".to_string() + &window(""),
        window("&group_by=model"),
        window("&group_by=agent,agent"),
        window("&format=xml"),
        window("&unit=GOLD"),
        window("&cursor=bm90LWEtY3Vyc29y"),
        "to=2026-01-01T00:00:00Z".to_string(),
        "from=2026-02-01T00:00:00Z&to=2026-01-01T00:00:00Z".to_string(),
        "from=2000-01-01T00:00:00Z&granularity=hour".to_string(),
    ] {
        let r = h.get(&t.key, &format!("/v1/usage?{bad}")).await;
        r.assert_error(400, "INVALID_REQUEST");
        assert_error_shape(&r);
    }
    // the admin key names its tenant; a tenant key reads only its own
    let r = h.admin("GET", &format!("/v1/admin/usage?{}", window("")), None).await;
    r.assert_error(400, "INVALID_REQUEST");
    let other = h.tenant().await;
    let r = h
        .send_to(
            &h.admin_base,
            "GET",
            &format!("/v1/admin/usage?tenant_id={}&{}", other.id, window("")),
            &[("x-cycles-api-key", &t.key)],
            None,
        )
        .await;
    r.assert_error(403, "FORBIDDEN");
    let r = h.get("cyc_live_not-a-key", &format!("/v1/usage?{}", window(""))).await;
    assert_eq!(r.status, 401);
    // a key without balances:read reads no spend
    let writer = h.key(&t.id, Some(vec!["reservations:create".into()])).await;
    let r = h.get(&writer.secret, &format!("/v1/usage?{}", window(""))).await;
    r.assert_error(403, "FORBIDDEN");
    assert!(r.body["message"].as_str().unwrap().contains("balances:read"), "{}", r.raw);
}
