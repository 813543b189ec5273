//! Export and import of a tenant (`cycles-admin export` / `import`): every record read at one
//! point, restored into an empty store, answers every API read as before; open holds settle
//! and idempotent retries replay there; both are audited; an existing tenant is refused unless
//! replaced.

use cycles_shared::domain::now_ms;
use cycles_shared::local::EmbeddedRedis;
use cycles_shared::model::Unit;
use cycles_shared::ops::transfer;
use cycles_tests::{json, Harness, Tenant};
use serde_json::Value;

/// A tenant using most of what a tenant can have: budgets at two levels, an open, a committed
/// and a released reservation, an event, a decide, a policy and a webhook subscription.
/// Answers the tenant, its open reservation and the body of its first reserve (for the replay).
async fn busy_tenant(h: &Harness) -> (Tenant, String, Value) {
    let t = h.funded(100_000).await;
    h.budget(&t.id, &format!("tenant:{}/workspace:eng", t.id), Unit::Tokens, 50_000).await;
    let body = json!({"idempotency_key": "open-1", "subject": {"tenant": t.id, "workspace": "eng"},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 1_200},
        "metadata": {"run": "r-1"}});
    let r = h.post(&t.key, "/v1/reservations", &body).await;
    let open = r.assert_ok()["reservation_id"].as_str().unwrap().to_string();
    let done = h.reserve_ok(&t, 500, json!({})).await;
    h.commit(&t, &done, 420).await.assert_ok();
    let gone = h.reserve_ok(&t, 300, json!({})).await;
    h.release(&t, &gone).await.assert_ok();
    let event = json!({"idempotency_key": "ev-1", "subject": {"tenant": t.id},
        "action": {"kind": "tool.search", "name": "web"}, "actual": {"unit": "TOKENS", "amount": 33}});
    assert_eq!(h.post(&t.key, "/v1/events", &event).await.status, 201);
    let decide = json!({"idempotency_key": "d-1", "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 10}});
    h.post(&t.key, "/v1/decide", &decide).await.assert_ok();
    let policy = json!({"tenant_id": t.id, "name": "caps", "scope_pattern": format!("tenant:{}/*", t.id),
        "action_quotas": [{"action_kind": "llm.completion", "max_calls": 1000, "window": "per_day_tumbling"}]});
    assert_eq!(h.admin("POST", "/v1/admin/policies", Some(&policy)).await.status, 201);
    let hook = json!({"url": "http://127.0.0.1:9/cycles", "event_types": ["budget.funded"]});
    let r = h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={}", t.id), Some(&hook)).await;
    assert_eq!(r.status, 201, "{}", r.raw);
    (t, open, body)
}

/// Every read of the tenant a client or an operator makes, by path and answer.
async fn reads(h: &Harness, t: &Tenant, reservations: &[&str]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let runtime = [
        "/v1/reservations?limit=50".to_string(),
        "/v1/reservations?status=ACTIVE".to_string(),
        format!("/v1/balances?tenant={}", t.id),
    ];
    for path in runtime.iter().cloned().chain(reservations.iter().map(|id| format!("/v1/reservations/{id}"))) {
        let r = h.get(&t.key, &path).await;
        assert_eq!(r.status, 200, "{path}: {}", r.raw);
        out.push((path, r.body));
    }
    for path in [
        format!("/v1/admin/tenants/{}", t.id),
        format!("/v1/admin/budgets?tenant_id={}", t.id),
        format!("/v1/admin/api-keys?tenant_id={}", t.id),
        format!("/v1/admin/policies?tenant_id={}", t.id),
        format!("/v1/admin/webhooks?tenant_id={}", t.id),
        format!("/v1/admin/events?tenant_id={}&limit=100", t.id),
        format!("/v1/admin/action-quota-counters?tenant_id={}", t.id),
    ] {
        let r = h.admin("GET", &path, None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.raw);
        out.push((path, r.body));
    }
    out
}

async fn audited(h: &Harness, tenant: &str, operation: &str) -> bool {
    let r = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id={tenant}&limit=100"), None).await;
    r.body["logs"].as_array().unwrap().iter().any(|e| e["operation"] == operation)
}

#[tokio::test]
async fn an_exported_tenant_imported_into_an_empty_store_answers_every_read_alike() {
    let h = Harness::start().await;
    let (t, open, first_reserve) = busy_tenant(&h).await;
    let listed = h.get(&t.key, "/v1/reservations?limit=50").await;
    let ids: Vec<String> = listed.body["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reservation_id"].as_str().unwrap().into())
        .collect();
    assert_eq!(ids.len(), 3);
    let ids: Vec<&str> = ids.iter().map(String::as_str).collect();

    let lines = transfer::export(&h.store, &t.id, now_ms()).await.expect("export");
    assert_eq!(lines[0]["format"], transfer::FORMAT);
    assert_eq!(lines[0]["records"], lines.len() - 1);
    assert!(audited(&h, &t.id, "exportTenant").await, "the export is audited");
    // API keys travel as digests, never as secrets
    let text: String = lines.iter().map(Value::to_string).collect();
    assert!(!text.contains(&t.key), "an export holds a key secret");

    let target = Harness::start_with_redis(EmbeddedRedis::start(&[]).await.expect("redis-server"), |_| {}).await;
    let before = reads(&h, &t, &ids).await;
    let imported = transfer::import(&target.store, &lines, false).await.expect("import");
    assert_eq!(imported.records as usize, lines.len() - 1);
    let after = reads(&target, &t, &ids).await;
    for ((path, a), (_, b)) in before.iter().zip(&after) {
        assert_eq!(a, b, "{path} answers differently after the import");
    }
    assert!(audited(&target, &t.id, "importTenant").await, "the import is audited");

    // an idempotent retry of the first reserve replays there, and its open hold settles there
    let replay = target.post(&t.key, "/v1/reservations", &first_reserve).await;
    assert_eq!(replay.body["reservation_id"], open.as_str(), "{}", replay.raw);
    target.commit(&t, &open, 1_000).await.assert_ok();
    let ledger = target.root(&t).await;
    assert_eq!((ledger.reserved, ledger.spent), (0, 420 + 33 + 1_000));

    // the tenant exists there now: refused, unless replaced (back to the export's state)
    let again = transfer::import(&target.store, &lines, false).await.unwrap_err();
    assert_eq!(again.code.as_str(), "DUPLICATE_RESOURCE");
    // (an export whose copy of a key's checked fields went stale: the copy is made again from
    // the fields imported beside it)
    let mut stale = lines.clone();
    let key_line =
        stale.iter_mut().find(|l| l["key"].as_str().is_some_and(|k| k.starts_with(":key:"))).expect("the key");
    let fields = key_line["value"].as_array_mut().unwrap();
    let at = fields.iter().position(|f| f == "auth").expect("the key's copy is exported");
    fields[at + 1] = json!("stale");
    // (and so did the tenant record's digest of its policy rules, the last field of its runtime
    // copy: made again from the rules)
    let tenant_line = stale.iter_mut().find(|l| l["key"] == ":tenant").expect("the tenant record");
    let fields = tenant_line["value"].as_array_mut().unwrap();
    let at = fields.iter().position(|f| f == "runtime").expect("the runtime copy is exported");
    let copy = fields[at + 1].as_str().unwrap().rsplit_once('\u{1f}').unwrap().0.to_string();
    fields[at + 1] = json!(format!("{copy}\u{1f}stale"));
    transfer::import(&target.store, &stale, true).await.expect("import with replace");
    target.key_check_copy_is_current(&t.id, &t.key_id).await;
    assert_ne!(target.rules_digest_is_current(&t.id).await, "stale");
    assert_eq!(target.root(&t).await.reserved, 1_200, "replace restores the export's open hold");
    let after_replace = reads(&target, &t, &ids).await;
    assert_eq!(after_replace, after);
}

#[tokio::test]
async fn a_malformed_or_cut_export_writes_nothing() {
    let h = Harness::start().await;
    let t = h.funded(1_000).await;
    let mut lines = transfer::export(&h.store, &t.id, now_ms()).await.expect("export");
    let target = Harness::start_with_redis(EmbeddedRedis::start(&[]).await.expect("redis-server"), |_| {}).await;

    let cut = &lines[..lines.len() - 1];
    assert_eq!(transfer::import(&target.store, cut, false).await.unwrap_err().code.as_str(), "INVALID_REQUEST");
    let last = lines.len() - 1;
    lines[last]["type"] = json!("hyperloglog");
    assert_eq!(transfer::import(&target.store, &lines, false).await.unwrap_err().code.as_str(), "INVALID_REQUEST");
    lines[last]["key"] = json!("cy:{other}:tenant");
    assert_eq!(transfer::import(&target.store, &lines, false).await.unwrap_err().code.as_str(), "INVALID_REQUEST");
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut target.store.conn()).await.unwrap();
    assert!(keys.iter().all(|k| !k.contains(&t.id)), "a refused import wrote {keys:?}");
    assert_eq!(transfer::export(&h.store, "no-such-tenant", now_ms()).await.unwrap_err().code.as_str(), "NOT_FOUND");
}

/// The keys are listed and read by one script: an export taken while a client keeps reserving
/// is one point in time (its ledger holds exactly the holds of its ACTIVE records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_export_under_load_is_one_point_in_time() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let h = std::sync::Arc::new(Harness::start().await);
    let t = h.funded(1_000_000).await;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let writer = {
        let (h, t, stop) = (h.clone(), t.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                h.reserve_ok(&t, 1, json!({})).await;
                n += 1;
            }
            n
        })
    };
    let mut holds_seen = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(std::time::Duration::from_millis(60)).await;
        let lines = transfer::export(&h.store, &t.id, now_ms()).await.expect("export under load");
        let active = lines[1..]
            .iter()
            .filter(|l| l["key"].as_str().unwrap().starts_with(":r:"))
            .filter(|l| l["value"].as_str().unwrap().starts_with("2\u{1f}A\u{1f}"))
            .count();
        let ledger = lines[1..].iter().find(|l| l["key"].as_str().unwrap().starts_with(":b:")).expect("the ledger");
        let fields = ledger["value"].as_array().unwrap();
        let view = fields.iter().position(|f| f == "v").map(|i| fields[i + 1].as_str().unwrap()).expect("its view");
        let reserved: usize = view.split('\u{1f}').nth(5).unwrap().parse().unwrap();
        assert_eq!(reserved, active, "the ledger and the records were read at different points");
        holds_seen.push(active);
    }
    stop.store(true, Ordering::Relaxed);
    let made = writer.await.unwrap();
    assert!(holds_seen.windows(2).any(|w| w[0] < w[1]), "the exports saw no writes happening: {holds_seen:?}");
    assert!(made > 10, "the writer made {made} reservations");
}
