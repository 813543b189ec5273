//! The expiry sweep (issue: scheduled maintenance): exactly-once expiry with the hold returned
//! and one event, grace respected, safe overlap, clean resume, quarantine of corrupt records.

use std::sync::Arc;
use std::time::Duration;

use cycles_shared::jobs::sweep::{sweep, SweepOptions, SweepReport};
use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;

async fn sweep_one(h: &Harness, t: &Tenant, opts: &SweepOptions) -> SweepReport {
    h.sweep_tenant(t, opts).await
}

#[tokio::test]
async fn overdue_reservations_expire_once_and_return_their_hold() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::Tokens, 1000).await;
    h.budget(&t.id, &format!("{root}/agent:a"), Unit::Tokens, 500).await;
    let sub = json!({"subject": {"tenant": t.id, "agent": "a"}, "ttl_ms": 1000, "grace_period_ms": 0});
    let due = h.reserve_ok(&t, 100, sub.clone()).await;
    let in_grace = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 30000})).await;
    let alive = h.reserve_ok(&t, 1, json!({})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = sweep_one(&h, &t, &SweepOptions::default()).await;
    assert_eq!((r.expired, r.quarantined), (1, 0));
    // The hold is back on both budgeted scopes; grace and live reservations are untouched.
    let l = h.ledger(&t.id, &root, Unit::Tokens).await;
    assert_eq!((l.reserved, l.remaining), (11, 989));
    assert_eq!(h.ledger(&t.id, &format!("{root}/agent:a"), Unit::Tokens).await.reserved, 0);
    h.get(&t.key, &format!("/v1/reservations/{due}")).await.assert_error(410, "RESERVATION_EXPIRED");
    h.commit(&t, &in_grace, 10).await.assert_ok();
    h.get(&t.key, &format!("/v1/reservations/{alive}")).await.assert_ok();
    // Exactly once: a second sweep finds nothing, and one event was written.
    assert_eq!(sweep_one(&h, &t, &SweepOptions::default()).await.expired, 0);
    let ev = h.events(&t.id).await;
    assert_eq!(ev.len(), 1);
    let e = &ev[0];
    assert_eq!(e["event_type"], "reservation.expired");
    assert_eq!(e["category"], "reservation");
    assert_eq!(e["tenant_id"], t.id.as_str());
    assert_eq!(e["actor"]["type"], "system");
    assert_eq!(e["data"]["reservation_id"], due.as_str());
    assert_eq!(e["data"]["estimated_amount"], 100);
    assert_eq!(e["data"]["ttl_ms"], 1000);
    assert_eq!(e["data"]["extensions_used"], 0);
    assert_eq!(e["scope"], format!("{root}/agent:a"));
    let ts = e["timestamp"].as_str().unwrap();
    assert!(ts.len() == 24 && ts.ends_with('Z') && &ts[10..11] == "T", "{ts}");
    assert!(e["event_id"].as_str().unwrap().starts_with("evt_"));
}

#[tokio::test]
async fn expire_on_touch_and_sweep_never_double_count() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 50, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.release(&t, &rid).await.assert_error(410, "RESERVATION_EXPIRED");
    let r = sweep_one(&h, &t, &SweepOptions::default()).await;
    assert_eq!(r.expired, 0);
    assert_eq!(h.events(&t.id).await.len(), 1);
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (0, 1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlapping_sweeps_never_double_refund() {
    let h = Arc::new(Harness::start().await);
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::Tokens, 100_000).await;
    h.budget(&t.id, &format!("{root}/workspace:w"), Unit::Tokens, 100_000).await;
    let n = 240;
    let mut tasks = Vec::new();
    for i in 0..n {
        let (h, t) = (h.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            let ws = if i % 2 == 0 { json!({"tenant": t.id, "workspace": "w"}) } else { json!({"tenant": t.id}) };
            h.reserve_ok(&t, 7, json!({"subject": ws, "ttl_ms": 1000, "grace_period_ms": 0})).await
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let opts = SweepOptions { batch: 25, ..Default::default() };
    let sweeps: Vec<_> = (0..3)
        .map(|_| {
            let (h, t, opts) = (h.clone(), t.clone(), opts.clone());
            tokio::spawn(async move { sweep_one(&h, &t, &opts).await })
        })
        .collect();
    let mut expired = 0;
    for s in sweeps {
        expired += s.await.unwrap().expired;
    }
    assert_eq!(expired, n as u64, "every reservation expired exactly once across overlapping sweeps");
    let l = h.ledger(&t.id, &root, Unit::Tokens).await;
    assert_eq!((l.reserved, l.remaining), (0, 100_000));
    let l = h.ledger(&t.id, &format!("{root}/workspace:w"), Unit::Tokens).await;
    assert_eq!((l.reserved, l.remaining), (0, 100_000));
    assert_eq!(h.events_of(&t.id, "reservation.expired").await.len(), n);
    // every reservation expiring is a spike, announced once per window however many sweeps saw it
    assert_eq!(h.events_of(&t.id, "reservation.expiry_rate_spike").await.len(), 1);
}

#[tokio::test]
async fn an_interrupted_sweep_resumes_where_it_stopped() {
    let h = Harness::start().await;
    let t = h.funded(10_000).await;
    for _ in 0..35 {
        h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // A sweep that dies after its first batch (the work of each batch is atomic)...
    let killed = SweepOptions { batch: 10, max_batches_per_tenant: Some(1), ..Default::default() };
    assert_eq!(sweep_one(&h, &t, &killed).await.expired, 10);
    assert_eq!(h.root(&t).await.reserved, 250);
    // ...is finished by the next one.
    assert_eq!(sweep_one(&h, &t, &SweepOptions { batch: 10, ..Default::default() }).await.expired, 25);
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (0, 10_000));
}

#[tokio::test]
async fn corrupt_reservations_are_quarantined_not_refunded() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let bad = h.reserve_ok(&t, 40, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    let good = h.reserve_ok(&t, 60, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    let token = cycles_shared::ids::ReservationId::parse(&bad).unwrap().token;
    let key = TenantKeys::new(&t.id).reservation(&token);
    let raw: String = h.store.conn().get(&key).await.unwrap();
    let _: () = h
        .store
        .conn()
        .set_options(
            &key,
            raw.replacen("\x1f40\x1f", "\x1fforty\x1f", 1),
            redis::SetOptions::default().with_expiration(redis::SetExpiry::KEEPTTL),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = sweep_one(&h, &t, &SweepOptions::default()).await;
    assert_eq!((r.expired, r.quarantined), (1, 1));
    let reason: Option<String> = h.store.conn().hget(TenantKeys::new(&t.id).quarantine(), &bad).await.unwrap();
    assert!(reason.is_some());
    // The corrupt hold stays on the ledger (an operator decides); the good one came back.
    assert_eq!(h.root(&t).await.reserved, 40);
    h.commit(&t, &bad, 1).await.assert_error(500, "INTERNAL_ERROR");
    h.get(&t.key, &format!("/v1/reservations/{good}")).await.assert_error(410, "RESERVATION_EXPIRED");
}

#[tokio::test]
async fn the_sweep_visits_every_registered_tenant() {
    // A private Redis: a full sweep on a shared one would expire other tests' reservations.
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let a = h.funded(100).await;
    let b = h.funded(100).await;
    h.reserve_ok(&a, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    h.reserve_ok(&b, 20, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = sweep(&h.store, &SweepOptions::default()).await.unwrap();
    assert!(r.tenants >= 2 && r.expired >= 2, "{r:?}");
    assert_eq!((h.root(&a).await.reserved, h.root(&b).await.reserved), (0, 0));
}

#[tokio::test]
async fn dead_holds_never_block_a_reserve() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    h.reserve_ok(&t, 60, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    h.reserve_ok(&t, 30, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // No sweep has run: the reserve reclaims the tenant's overdue holds itself.
    h.reserve(&t, 80, json!({})).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (80, 20));
    assert_eq!(h.events(&t.id).await.len(), 2);
    // A genuine shortage is still a 409 after the reclaim attempt.
    h.reserve(&t, 21, json!({})).await.assert_error(409, "BUDGET_EXCEEDED");
}

#[tokio::test]
async fn retention_removes_history_and_keeps_live_records() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let keys = TenantKeys::new(&t.id);
    let opts = SweepOptions {
        retention: Duration::from_millis(1000),
        event_retention: Duration::from_millis(1000),
        ..Default::default()
    };
    let finished = h.reserve_ok(&t, 10, json!({})).await;
    let expiring = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    let live = h.reserve_ok(&t, 10, json!({"ttl_ms": 600000})).await;
    // Finished records carry the retention as their TTL (the harness' gateway uses 30 days, so
    // give this one the short retention by hand).
    h.commit(&t, &finished, 5).await.assert_ok();
    let token = |id: &str| cycles_shared::ids::ReservationId::parse(id).unwrap().token;
    let _: () = h.store.conn().pexpire(keys.reservation(token(&finished)), 1000).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let first = sweep_one(&h, &t, &opts).await;
    assert_eq!(first.expired, 1);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = sweep_one(&h, &t, &opts).await;
    // The committed record expired by TTL and its index entry went; the expired one too (its
    // record took the sweep's 1 s retention); the live one stays, record and index entry.
    assert_eq!(first.trimmed_index + r.trimmed_index, 2, "{first:?} {r:?}");
    assert_eq!(created_tokens(&h, &keys).await, [token(&live)]);
    h.get(&t.key, &format!("/v1/reservations/{live}")).await.assert_ok();
    h.get(&t.key, &format!("/v1/reservations/{expiring}")).await.assert_error(404, "NOT_FOUND");
    // The one reservation.expired event is older than its 1 s retention now: trimmed.
    assert_eq!(r.trimmed_events, 1);
    assert!(h.events(&t.id).await.is_empty());
    assert_eq!(h.root(&t).await.reserved, 10);
}

/// The expiry predicate at the exact boundary, with an injected clock: a reservation is still
/// live at `expires_at + grace` (inclusive) and expires one millisecond later.
#[tokio::test]
async fn grace_boundary_is_inclusive() {
    let h = Harness::start().await;
    let lib = cycles_shared::ops::helpers();
    let probe = r#"
local r = {rid = 'x.tok.', status = 'ACTIVE', estimate = '5', expires_at = 1000, grace_ms = 500,
  scope_path = 'tenant:x', unit = 'TOKENS', created_at = 0, extensions = 0, rec = {}}
local ix = {reservation = KEYS[1], expiry_index = KEYS[2], events = KEYS[3], listing_index = KEYS[4], budgets = {}}
local at = expire_if_overdue(r, ix, 1500, '1000')
local after = expire_if_overdue(r, ix, 1501, '1000')
return {at and 1 or 0, after and 1 or 0}
"#;
    let script = redis::Script::new(&format!("{lib}\n{probe}"));
    let keys = TenantKeys::new(&unique("boundary"));
    let out: Vec<i64> = script
        .key(keys.reservation("tok"))
        .key(keys.expiry_index())
        .key(keys.events())
        .key(keys.listing_index())
        .invoke_async(&mut h.store.conn())
        .await
        .unwrap();
    assert_eq!(out, vec![0, 1]);
}

/// The maintenance function's loop: sweeps every interval and returns before its deadline.
#[tokio::test]
async fn the_sweep_loop_works_until_its_deadline() {
    use std::time::Instant;
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(100).await;
    h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    let started = Instant::now();
    let deadline = started + Duration::from_millis(2500);
    let total = cycles_shared::jobs::sweep::sweep_loop(
        &h.store,
        &SweepOptions::default(),
        Duration::from_millis(200),
        Some(deadline),
    )
    .await;
    assert!(Instant::now() <= deadline + Duration::from_millis(300), "returned in time");
    assert!(started.elapsed() >= Duration::from_millis(2000), "kept sweeping until shortly before the deadline");
    assert_eq!(total.expired, 1, "the reservation that expired meanwhile was swept");
    assert_eq!(h.root(&t).await.reserved, 0);
}

/// A live reservation at the head of the created index never blocks the trim behind it, and
/// one sweep walks as many batches as it needs.
#[tokio::test]
async fn trimming_walks_past_live_records() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let keys = TenantKeys::new(&t.id);
    let opts = SweepOptions { batch: 2, retention: Duration::from_millis(1000), ..Default::default() };
    let live = h.reserve_ok(&t, 10, json!({"ttl_ms": 600000})).await;
    let token = |id: &str| cycles_shared::ids::ReservationId::parse(id).unwrap().token;
    for _ in 0..5 {
        let id = h.reserve_ok(&t, 1, json!({})).await;
        h.commit(&t, &id, 1).await.assert_ok();
        let _: () = h.store.conn().pexpire(keys.reservation(token(&id)), 1000).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let r = sweep_one(&h, &t, &opts).await;
    assert_eq!(r.trimmed_index, 5, "{r:?}");
    assert_eq!(created_tokens(&h, &keys).await, [token(&live)]);
}

/// The tokens of a tenant's created stream, oldest first.
async fn created_tokens(h: &Harness, keys: &TenantKeys) -> Vec<String> {
    let entries: redis::streams::StreamRangeReply = h.store.conn().xrange_all(keys.created_stream()).await.unwrap();
    entries.ids.iter().map(|e| e.get::<String>("t").unwrap()).collect()
}

/// Reservations indexed before the created stream (in the created index) are listed in order
/// with newer ones and trimmed like them.
#[tokio::test]
async fn reservations_of_the_created_index_list_and_trim_with_the_stream() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let keys = TenantKeys::new(&t.id);
    let token = |id: &str| cycles_shared::ids::ReservationId::parse(id).unwrap().token;
    // two reservations moved from the stream to the created index, as written before it
    let old: Vec<String> = vec![h.reserve_ok(&t, 1, json!({})).await, h.reserve_ok(&t, 2, json!({})).await];
    let entries: redis::streams::StreamRangeReply = h.store.conn().xrange_all(keys.created_stream()).await.unwrap();
    for e in &entries.ids {
        let ms = e.id.split('-').next().unwrap();
        let member = format!("{ms:0>13}{}", e.get::<String>("t").unwrap());
        let _: () = h.store.conn().zadd(keys.created_index(), member, 0).await.unwrap();
        let _: () =
            redis::cmd("XDEL").arg(keys.created_stream()).arg(&e.id).query_async(&mut h.store.conn()).await.unwrap();
    }
    let new: Vec<String> = vec![h.reserve_ok(&t, 3, json!({})).await, h.reserve_ok(&t, 4, json!({})).await];
    // in creation order, ties (one millisecond) by reservation id ascending in both directions
    let mut all: Vec<(i64, String)> = Vec::new();
    for id in old.iter().chain(&new) {
        let d = h.get(&t.key, &format!("/v1/reservations/{id}")).await;
        all.push((d.assert_ok()["created_at_ms"].as_i64().unwrap(), id.clone()));
    }
    let mut asc = all.clone();
    asc.sort();
    let mut desc = all.clone();
    desc.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let ids = |v: Vec<(i64, String)>| v.into_iter().map(|(_, id)| id).collect::<Vec<_>>();
    for (dir, expected) in [("asc", ids(asc)), ("desc", ids(desc))] {
        // pages of one, so every page boundary is crossed (between the two as well)
        let mut seen = Vec::new();
        let mut cursor = String::new();
        loop {
            let path = format!("/v1/reservations?sort_by=created_at_ms&sort_dir={dir}&limit=1{cursor}");
            let page = h.get(&t.key, &path).await;
            let body = page.assert_ok();
            seen.extend(
                body["reservations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["reservation_id"].as_str().unwrap().to_string()),
            );
            match body["next_cursor"].as_str() {
                Some(c) => cursor = format!("&cursor={c}"),
                None => break,
            }
        }
        assert_eq!(seen, expected, "{dir}");
    }
    // finished and past retention, whichever index holds them
    for id in [&old[0], &new[0]] {
        h.commit(&t, id, 1).await.assert_ok();
        let _: () = h.store.conn().pexpire(keys.reservation(token(id)), 1000).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let opts = SweepOptions { retention: Duration::from_millis(1000), ..Default::default() };
    let r = sweep_one(&h, &t, &opts).await;
    assert_eq!(r.trimmed_index, 2, "{r:?}");
    let indexed: Vec<String> = h.store.conn().zrange(keys.created_index(), 0, -1).await.unwrap();
    assert_eq!(indexed.len(), 1);
    assert!(indexed[0].ends_with(&token(&old[1])));
    assert_eq!(created_tokens(&h, &keys).await, [token(&new[1])]);

    // a clock that stepped back (the stream's last id ahead of Redis's time) takes the next id
    let ahead = format!("{}-0", cycles_shared::domain::now_ms() + 60_000);
    let _: () = redis::cmd("XADD")
        .arg(keys.created_stream())
        .arg(&ahead)
        .arg("t")
        .arg("gone0000000000")
        .query_async(&mut h.store.conn())
        .await
        .unwrap();
    let late = h.reserve_ok(&t, 5, json!({})).await;
    assert_eq!(created_tokens(&h, &keys).await, [token(&new[1]), "gone0000000000".to_string(), token(&late)]);
    let listed = h.get(&t.key, "/v1/reservations?sort_by=created_at_ms&sort_dir=desc").await;
    assert_eq!(listed.assert_ok()["reservations"][0]["reservation_id"], late.as_str());
}

/// A pass finds due work without visiting idle tenants: thousands of registered tenants with
/// nothing due cost it no reads of their own, only its bounded retention crawl visits some; a
/// tenant the due index does not know (as after an upgrade) is found by that crawl.
#[tokio::test]
async fn a_pass_visits_due_tenants_only_and_the_crawl_misses_none() {
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let mut idle = redis::pipe();
    for i in 0..3000 {
        idle.sadd(cycles_shared::keys::TENANT_REGISTRY, format!("idle-{i}")).ignore();
    }
    let _: () = idle.query_async(&mut h.store.conn()).await.unwrap();
    let (a, b, hidden) = (h.funded(100).await, h.funded(100).await, h.funded(100).await);
    for t in [&a, &b, &hidden] {
        h.reserve_ok(t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    }
    // `hidden` is absent from its slot's due index, as a tenant of an older version would be
    let keys = TenantKeys::new(&hidden.id);
    let _: () = h.store.conn().zrem(keys.due_index(), &hidden.id).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let opts = SweepOptions { trim_tenants: 100, ..Default::default() };
    let r = sweep(&h.store, &opts).await.unwrap();
    assert_eq!(r.tenants, 2, "only the two due tenants were visited for expiry: {r:?}");
    assert!(r.trimmed_tenants <= 200, "the crawl is bounded: {r:?}");
    assert_eq!((h.root(&a).await.reserved, h.root(&b).await.reserved), (0, 0));
    // The crawl reaches every tenant within a bounded number of passes and finds the hidden hold.
    let mut passes = 1;
    while h.root(&hidden).await.reserved != 0 {
        passes += 1;
        assert!(passes <= 3003 / 100 + 5, "the crawl found the hidden tenant's due hold");
        sweep(&h.store, &opts).await.unwrap();
    }
    // and re-registered its due time: no further pass has anything left for it
    let due: Option<f64> = h.store.conn().zscore(keys.due_index(), &hidden.id).await.unwrap();
    assert_eq!(due, None);
}
