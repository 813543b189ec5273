//! Alert events: each produced through the API and read back from `GET /v1/admin/events`, with
//! its EventData shape; the thresholds of a tenant's subscriptions; and the 429 answer to
//! repeated authentication failures on both planes.

use std::time::Duration;

use cycles_shared::domain::{format_rfc3339_ms, now_ms};
use cycles_shared::jobs::sweep::SweepOptions;
use cycles_shared::model::Unit;
use cycles_tests::*;
use serde_json::Value;

fn balances(t: &Tenant) -> String {
    format!("/v1/balances?tenant={}", t.id)
}

#[tokio::test]
async fn utilization_thresholds_fire_once_per_direction() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let r79 = h.reserve_ok(&t, 79, json!({})).await;
    assert!(h.admin_events(&t.id, "budget.threshold_crossed").await.is_empty(), "0.79 crosses nothing");
    let r2 = h.reserve_ok(&t, 2, json!({})).await;
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    assert_eq!(crossed.len(), 1);
    let d = &crossed[0]["data"];
    assert_eq!((d["threshold"].as_f64(), d["direction"].as_str()), (Some(0.8), Some("rising")));
    assert_eq!(
        (d["utilization"].as_f64(), d["allocated"].as_i64(), d["reserved"].as_i64()),
        (Some(0.81), Some(100), Some(81))
    );
    assert_eq!((d["remaining"].as_i64(), d["spent"].as_i64(), d["unit"].as_str()), (Some(19), Some(0), Some("TOKENS")));
    assert_eq!(crossed[0]["scope"], format!("tenant:{}", t.id).as_str());
    // staying above: nothing; back to exactly 0.80: still at-or-above, nothing
    let r1 = h.reserve_ok(&t, 1, json!({})).await;
    h.release(&t, &r2).await.assert_ok();
    assert_eq!(h.admin_events(&t.id, "budget.threshold_crossed").await.len(), 1);
    // below: one falling crossing (a commit of less than the hold returns the rest)
    h.commit(&t, &r1, 0).await.assert_ok();
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    assert_eq!(crossed.len(), 2);
    assert_eq!(
        (crossed[1]["data"]["threshold"].as_f64(), crossed[1]["data"]["direction"].as_str()),
        (Some(0.8), Some("falling"))
    );
    // one change across two thresholds: two events
    h.reserve_ok(&t, 16, json!({})).await;
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    let last: Vec<(f64, &str)> = crossed[2..]
        .iter()
        .map(|e| (e["data"]["threshold"].as_f64().unwrap(), e["data"]["direction"].as_str().unwrap()))
        .collect();
    assert_eq!(last, vec![(0.8, "rising"), (0.95, "rising")]);
    h.release(&t, &r79).await.assert_ok();
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    assert_eq!(crossed.len(), 6, "0.95 -> 0.16: both fall");
}

/// A reserve that takes a ledger's remaining to 0 is its exhaustion (a hold writes only the
/// utilization events: thresholds crossed and budget.exhausted); releasing it exhausts nothing
/// and brings the thresholds back down, as an expiry does; none writes what only a charge can cause.
#[tokio::test]
async fn a_hold_that_takes_the_last_of_a_budget_exhausts_it() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    let exhausted = h.admin_events(&t.id, "budget.exhausted").await;
    assert_eq!(exhausted.len(), 1);
    let d = &exhausted[0]["data"];
    assert_eq!(
        (d["remaining"].as_i64(), d["reserved"].as_i64(), d["utilization"].as_f64(), d["direction"].as_str()),
        (Some(0), Some(100), Some(1.0), Some("rising"))
    );
    assert_eq!(exhausted[0]["scope"], format!("tenant:{}", t.id).as_str());
    assert_eq!(h.admin_events(&t.id, "budget.threshold_crossed").await.len(), 3, "0.8, 0.95 and 1.0 rising");
    h.release(&t, &rid).await.assert_ok();
    assert_eq!(h.admin_events(&t.id, "budget.exhausted").await.len(), 1, "a release exhausts nothing");
    assert_eq!(h.admin_events(&t.id, "budget.threshold_crossed").await.len(), 6, "and all three fall");
    // an expiry gives a hold back alike: its thresholds fall, nothing is exhausted
    h.reserve_ok(&t, 90, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    assert_eq!(h.admin_events(&t.id, "budget.threshold_crossed").await.len(), 7, "0.8 rising");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h.sweep_tenant(&t, &SweepOptions::default()).await.expired, 1);
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    assert_eq!(crossed.len(), 8, "and falls when the hold expires");
    assert_eq!(
        (crossed[7]["data"]["threshold"].as_f64(), crossed[7]["data"]["direction"].as_str()),
        (Some(0.8), Some("falling"))
    );
    assert_eq!(h.admin_events(&t.id, "budget.exhausted").await.len(), 1);
    for kind in ["budget.debt_incurred", "budget.over_limit_entered", "budget.burn_rate_anomaly"] {
        assert!(h.admin_events(&t.id, kind).await.is_empty(), "{kind}");
    }
}

#[tokio::test]
async fn a_subscriptions_thresholds_are_the_ones_alerted() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let sub = json!({"url": "http://127.0.0.1:9/x", "event_types": ["budget.threshold_crossed"],
        "thresholds": {"budget_utilization": [0.5]}});
    let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&sub)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    let id = r.body["subscription"]["subscription_id"].as_str().unwrap().to_string();
    h.reserve_ok(&t, 60, json!({})).await;
    h.reserve_ok(&t, 25, json!({})).await;
    let crossed: Vec<f64> = h
        .admin_events(&t.id, "budget.threshold_crossed")
        .await
        .iter()
        .map(|e| e["data"]["threshold"].as_f64().unwrap())
        .collect();
    assert_eq!(crossed, vec![0.5], "only the subscription's threshold, not the defaults");
    // without subscriptions the defaults apply again
    h.admin("DELETE", &format!("/v1/admin/webhooks/{id}"), None).await;
    h.reserve_ok(&t, 10, json!({})).await;
    let crossed = h.admin_events(&t.id, "budget.threshold_crossed").await;
    assert_eq!(crossed.last().unwrap()["data"]["threshold"].as_f64(), Some(0.95));
}

#[tokio::test]
async fn a_live_denial_is_an_event_and_many_are_a_spike() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    let r = h.reserve(&t, 100, json!({})).await;
    r.assert_error(409, "BUDGET_EXCEEDED");
    let denied = h.admin_events(&t.id, "reservation.denied").await;
    assert_eq!(denied.len(), 1);
    let d = &denied[0]["data"];
    assert_eq!(
        (d["reason_code"].as_str(), d["requested_amount"].as_i64(), d["remaining"].as_i64()),
        (Some("BUDGET_EXCEEDED"), Some(100), Some(10))
    );
    assert_eq!(denied[0]["request_id"], r.headers["x-request-id"].as_str());
    assert_eq!(h.root(&t).await.reserved, 0, "a denial holds nothing");
    assert!(h.admin_events(&t.id, "reservation.denial_rate_spike").await.is_empty(), "one attempt is no rate");
    for _ in 0..12 {
        h.reserve(&t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    }
    let spikes = h.admin_events(&t.id, "reservation.denial_rate_spike").await;
    assert_eq!(spikes.len(), 1, "once per window");
    let d = &spikes[0]["data"];
    assert_eq!(
        (d["metric"].as_str(), d["current_rate"].as_f64(), d["threshold_rate"].as_f64()),
        (Some("denial_rate"), Some(1.0), Some(0.1))
    );
    assert_eq!((d["window_seconds"].as_i64(), d["sample_count"].as_i64()), (Some(300), Some(10)));
}

#[tokio::test]
async fn reservations_made_over_the_window_are_attempts_of_the_denial_rate() {
    let h = Harness::start().await;
    let t = h.funded(10).await;
    // a one-minute window, so tenths of six seconds
    let sub = json!({"url": "http://127.0.0.1:9/x", "event_types": ["reservation.denial_rate_spike"],
        "thresholds": {"rate_window_seconds": 60}});
    let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&sub)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    early_in_a_window(6_000, 3_000).await;
    for _ in 0..10 {
        h.reserve_ok(&t, 1, json!({})).await;
    }
    // in the next tenth the ten made are still attempts of the window
    tokio::time::sleep(Duration::from_millis((6_000 - now_ms() % 6_000 + 100) as u64)).await;
    h.reserve(&t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    let spikes = h.admin_events(&t.id, "reservation.denial_rate_spike").await;
    assert!(spikes.is_empty(), "one denial in eleven attempts is under 10%: {spikes:?}");
    h.reserve(&t, 100, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
    let spikes = h.admin_events(&t.id, "reservation.denial_rate_spike").await;
    assert_eq!(spikes.len(), 1);
    let d = &spikes[0]["data"];
    assert_eq!((d["current_rate"].as_f64(), d["sample_count"].as_i64()), (Some(0.1667), Some(12)));
    assert_eq!(d["window_seconds"].as_i64(), Some(60));
}

#[tokio::test]
async fn expiries_over_the_threshold_are_a_spike() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    for _ in 0..10 {
        h.reserve_ok(&t, 1, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h.sweep_tenant(&t, &SweepOptions::default()).await.expired, 10);
    let spikes = h.admin_events(&t.id, "reservation.expiry_rate_spike").await;
    assert_eq!(spikes.len(), 1);
    let d = &spikes[0]["data"];
    // the first expiry of ten reservations is already 10% > 5%
    assert_eq!(
        (d["metric"].as_str(), d["current_rate"].as_f64(), d["threshold_rate"].as_f64()),
        (Some("expiry_rate"), Some(0.1), Some(0.05))
    );
    assert_eq!(d["sample_count"].as_i64(), Some(10));
    assert_eq!(spikes[0]["actor"]["type"], "system");

    // reservations made before the window (here: its tenths' hashes gone, as they are once
    // the window has moved past them) are no reservations made in it: their expiries alone
    // are the rate, 10 of 10
    let t = h.funded(1000).await;
    for _ in 0..10 {
        h.reserve_ok(&t, 1, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    }
    let keys = cycles_shared::keys::TenantKeys::new(&t.id);
    let tenth = now_ms() / 30_000;
    let windows = [keys.alert_window(30_000, tenth - 1), keys.alert_window(30_000, tenth)];
    let removed: i64 = redis::cmd("DEL").arg(&windows).query_async(&mut h.store.conn()).await.unwrap();
    assert!(removed >= 1, "the reserves marked their tenth");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h.sweep_tenant(&t, &SweepOptions::default()).await.expired, 10);
    let spikes = h.admin_events(&t.id, "reservation.expiry_rate_spike").await;
    assert_eq!(spikes.len(), 1);
    let d = &spikes[0]["data"];
    assert_eq!((d["current_rate"].as_f64(), d["sample_count"].as_i64()), (Some(1.0), Some(10)));
}

#[tokio::test]
async fn spending_far_over_the_baseline_is_a_burn_rate_anomaly() {
    let h = Harness::start().await;
    let t = h.funded(100_000).await;
    let root = format!("tenant:{}", t.id);
    // five windows of history at 10 per window (staged: windows are minutes long)
    let w = 300_000;
    early_in_a_window(w, 10_000).await;
    let start = now_ms() - now_ms() % w;
    h.set_budget(&t.id, &root, Unit::Tokens, &[("burn", &format!("{start}:0:10:5:0"))]).await;
    let rid = h.reserve_ok(&t, 25, json!({})).await;
    h.commit(&t, &rid, 25).await.assert_ok();
    assert!(h.admin_events(&t.id, "budget.burn_rate_anomaly").await.is_empty(), "25 < 3 x 10");
    let rid = h.reserve_ok(&t, 5, json!({})).await;
    h.commit(&t, &rid, 5).await.assert_ok();
    let anomalies = h.admin_events(&t.id, "budget.burn_rate_anomaly").await;
    assert_eq!(anomalies.len(), 1);
    let d = &anomalies[0]["data"];
    assert_eq!((d["multiplier"].as_f64(), d["window_seconds"].as_i64()), (Some(3.0), Some(300)));
    assert_eq!((d["current_rate"].as_f64(), d["baseline_rate"].as_f64()), (Some(6.0), Some(2.0)), "per minute");
    let remaining = h.root(&t).await.remaining as f64;
    assert!((d["projected_exhaustion_minutes"].as_f64().unwrap() - remaining / 6.0).abs() < 0.01);
    // once per window
    let rid = h.reserve_ok(&t, 50, json!({})).await;
    h.commit(&t, &rid, 50).await.assert_ok();
    assert_eq!(h.admin_events(&t.id, "budget.burn_rate_anomaly").await.len(), 1);
    // the stored window says so too (what a script VM that remembers nothing reads back)
    let key = cycles_shared::keys::TenantKeys::new(&t.id).budget(&root, Unit::Tokens);
    let stored: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(&key).query_async(&mut h.store.conn()).await.unwrap();
    let view = cycles_shared::ops::ledgers::with_view(&stored).unwrap();
    assert_eq!(view["burn"], format!("{start}:80:10:5:1"), "window start, spend, baseline, windows, alerted");
    // a window closes into the baseline (weight 1/12) and empty windows decay it
    let t2 = h.funded(100_000).await;
    let root2 = format!("tenant:{}", t2.id);
    h.set_budget(&t2.id, &root2, Unit::Tokens, &[("burn", &format!("{}:100:10:5:0", start - 2 * w))]).await;
    let rid = h.reserve_ok(&t2, 40, json!({})).await;
    h.commit(&t2, &rid, 40).await.assert_ok();
    assert!(h.admin_events(&t2.id, "budget.burn_rate_anomaly").await.is_empty(), "40 < 3 x 16.04");
    let rid = h.reserve_ok(&t2, 10, json!({})).await;
    h.commit(&t2, &rid, 10).await.assert_ok();
    assert_eq!(h.admin_events(&t2.id, "budget.burn_rate_anomaly").await.len(), 1, "50 >= 3 x 16.04");
}

#[tokio::test]
async fn failed_authentications_are_events_a_spike_and_expire_keys() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let wrong = format!("{}x", t.key);
    let r = h.reserve(&Tenant { key: wrong.clone(), ..t.clone() }, 1, json!({})).await;
    r.assert_error(401, "UNAUTHORIZED");
    let failed = h.admin_events(&t.id, "api_key.auth_failed").await;
    assert_eq!(failed.len(), 1);
    let d = &failed[0]["data"];
    assert_eq!(
        (d["key_id"].as_str(), d["failure_reason"].as_str(), d["source_ip"].as_str()),
        (Some(t.key_id.as_str()), Some("invalid_key"), Some("127.0.0.1"))
    );
    assert_eq!(failed[0]["request_id"], r.headers["x-request-id"].as_str());
    // sampled: more failures of the same key and source this minute write no more events, and
    // count once toward the tenant's failure rate: whoever knows a key id cannot raise the
    // tenant's spike alone (issue 27)
    for _ in 0..30 {
        h.get(&wrong, &balances(&t)).await.assert_error(401, "UNAUTHORIZED");
    }
    assert_eq!(h.admin_events(&t.id, "api_key.auth_failed").await.len(), 1);
    assert!(h.admin_events(&t.id, "api_key.auth_failure_rate_spike").await.is_empty(), "one key id: no spike");
    // failures of many of the tenant's key ids are a spike
    for _ in 0..11 {
        let k = h.key(&t.id, None).await;
        h.get(&format!("{}x", k.secret), &balances(&t)).await.assert_error(401, "UNAUTHORIZED");
    }
    let spikes = h.admin_events(&t.id, "api_key.auth_failure_rate_spike").await;
    assert_eq!(spikes.len(), 1);
    assert_eq!(spikes[0]["data"]["metric"], "auth_failure_rate");
    assert_eq!(spikes[0]["data"]["threshold_rate"].as_f64(), Some(0.1));
    // an unknown key id is a system event
    let unknown = "cyc_live_zzzzzzzzzzzzzzzz_nope";
    h.get(unknown, &balances(&t)).await.assert_error(401, "UNAUTHORIZED");
    let system = h.admin_events("__system__", "api_key.auth_failed").await;
    assert!(system
        .iter()
        .any(|e| e["data"]["key_id"] == "zzzzzzzzzzzzzzzz" && e["data"]["failure_reason"] == "key_not_found"));

    // a key past its expiry: EXPIRED at its next use, with api_key.expired (once)
    let soon = format_rfc3339_ms(now_ms() + 1200);
    let body = json!({"tenant_id": t.id, "name": "short", "permissions": ["reservations:create", "balances:read"], "expires_at": soon});
    let k = h.admin("POST", "/v1/admin/api-keys", Some(&body)).await;
    assert_eq!(k.status, 201, "{}", k.raw);
    let (key, key_id) =
        (k.body["key_secret"].as_str().unwrap().to_string(), k.body["key_id"].as_str().unwrap().to_string());
    h.get(&key, &balances(&t)).await.assert_ok();
    tokio::time::sleep(Duration::from_millis(1300)).await;
    h.get(&key, &balances(&t)).await.assert_error(401, "UNAUTHORIZED");
    h.get(&key, &balances(&t)).await.assert_error(401, "UNAUTHORIZED");
    let expired = h.admin_events(&t.id, "api_key.expired").await;
    assert_eq!(expired.len(), 1);
    assert!(h.key_check_copy_is_current(&t.id, &key_id).await.contains("\u{1f}EXPIRED\u{1f}"));
    assert_eq!(
        (expired[0]["data"]["key_id"].as_str(), expired[0]["data"]["new_status"].as_str()),
        (Some(key_id.as_str()), Some("EXPIRED"))
    );
    let shown = h.admin("GET", &format!("/v1/admin/api-keys?tenant_id={}&status=EXPIRED", t.id), None).await;
    let listed = shown.assert_ok()["keys"].as_array().unwrap().clone();
    assert!(listed.iter().any(|k| k["key_id"] == key_id.as_str()), "{}", shown.raw);
    // and unused keys past their expiry are found by the sweep
    let body = json!({"tenant_id": t.id, "name": "idle", "permissions": ["balances:read"], "expires_at": format_rfc3339_ms(now_ms() + 1000)});
    let idle = h.admin("POST", "/v1/admin/api-keys", Some(&body)).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(h.sweep_tenant(&t, &SweepOptions::default()).await.keys_expired, 1);
    assert_eq!(h.sweep_tenant(&t, &SweepOptions::default()).await.keys_expired, 0);
    let expired = h.admin_events(&t.id, "api_key.expired").await;
    assert_eq!(expired.len(), 2);
    assert_eq!(expired[1]["data"]["key_id"], idle.body["key_id"]);
    let idle_id = idle.body["key_id"].as_str().unwrap();
    assert!(h.key_check_copy_is_current(&t.id, idle_id).await.contains("\u{1f}EXPIRED\u{1f}"));
}

#[tokio::test]
async fn repeated_failures_are_throttled_on_both_planes() {
    early_in_a_window(60_000, 5_000).await; // the limits count per calendar minute
    let h = Harness::start_configured(|c| c.auth_failure_limit = 3).await;
    let t = h.funded(100).await;
    // a key id failing from one address: the fourth failure in the minute is 429
    let client = client_from(41);
    let wrong = format!("{}x", t.key);
    for _ in 0..3 {
        let r = send_with(&client, &h.base, "GET", &balances(&t), &[("x-cycles-api-key", &wrong)], None).await;
        r.assert_error(401, "UNAUTHORIZED");
    }
    let r = send_with(&client, &h.base, "GET", &balances(&t), &[("x-cycles-api-key", &wrong)], None).await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    let after: i64 = r.headers["retry-after"].parse().unwrap();
    assert!((1..=60).contains(&after), "Retry-After {after}");
    // the same key id from another address is throttled too (by its key id); the right key is not
    let r = send_with(&client_from(42), &h.base, "GET", &balances(&t), &[("x-cycles-api-key", &wrong)], None).await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    h.get(&t.key, &balances(&t)).await.assert_ok();
    // the admin key: counted by source address
    let client = client_from(43);
    for _ in 0..3 {
        let r =
            send_with(&client, &h.admin_base, "GET", "/v1/admin/tenants", &[("x-admin-api-key", "wrong")], None).await;
        r.assert_error(401, "UNAUTHORIZED");
    }
    let r = send_with(&client, &h.admin_base, "GET", "/v1/admin/tenants", &[("x-admin-api-key", "wrong")], None).await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    assert!(r.headers.contains_key("retry-after"));
    // the right admin key from that address still works
    let ok =
        send_with(&client, &h.admin_base, "GET", "/v1/admin/tenants", &[("x-admin-api-key", &h.admin_key)], None).await;
    ok.assert_ok();
}

#[tokio::test]
async fn a_slow_minute_is_a_high_latency_alert() {
    let h = Harness::start_configured(|c| {
        c.high_latency_ms = 0.000_001;
        c.high_latency_window = Duration::from_millis(300);
    })
    .await;
    let t = h.funded(100).await;
    for _ in 0..25 {
        h.get(&t.key, &balances(&t)).await.assert_ok();
    }
    tokio::time::sleep(Duration::from_millis(350)).await;
    h.get(&t.key, &balances(&t)).await.assert_ok();
    let slow: Vec<Value> = h
        .admin_events("__system__", "system.high_latency")
        .await
        .into_iter()
        .filter(|e| e["data"]["details"]["operation"] == "getBalances")
        .collect();
    assert!(!slow.is_empty(), "{:?}", h.all_events("__system__").await);
    let d = &slow.last().unwrap()["data"];
    assert_eq!((d["component"].as_str(), d["severity"].as_str()), (Some("api"), Some("warning")));
    assert!(d["details"]["p99_ms"].as_f64().unwrap() > 0.0);
    assert!(d["details"]["requests"].as_i64().unwrap() >= 20);
}

#[tokio::test]
async fn repaying_debt_below_the_limit_exits_over_limit() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.overdraft_budget(&t.id, &root, 100, 50).await;
    h.set_budget(&t.id, &root, Unit::Tokens, &[("debt", "60"), ("remaining", "40"), ("is_over_limit", "true")]).await;
    let path = format!("/v1/admin/budgets/fund?scope={root}&unit=TOKENS&tenant_id={}", t.id);
    let body = json!({"operation": "REPAY_DEBT", "amount": {"unit": "TOKENS", "amount": 20}});
    h.admin("POST", &path, Some(&body)).await.assert_ok();
    let exited = h.admin_events(&t.id, "budget.over_limit_exited").await;
    assert_eq!(exited.len(), 1);
    let d = &exited[0]["data"];
    assert_eq!(
        (d["debt"].as_i64(), d["overdraft_limit"].as_i64(), d["is_over_limit"].as_bool()),
        (Some(40), Some(50), Some(false))
    );
    assert_eq!(d["scope"], root.as_str());
    // the runtime admits the tenant again
    h.reserve_ok(&t, 1, json!({})).await;
}

#[tokio::test]
async fn the_wrong_credential_for_a_route_says_so() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    h.admin_as(&t.key, "GET", "/v1/admin/tenants", None).await.assert_error(401, "UNAUTHORIZED");
    let failed = h.admin_events(&t.id, "api_key.auth_failed").await;
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0]["data"]["failure_reason"], "admin_key_required");
}
