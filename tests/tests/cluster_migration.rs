//! Resharding under load (Redis Cluster only): the slot of a busy tenant moves to another
//! master and back while clients reserve and commit against it. Redis answers ASK, TRYAGAIN
//! and finally MOVED during each move; no client may see an error and no write may be lost.
//! On standalone Redis there is no slot to move and the test says so.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cycles_shared::keys::TenantKeys;
use cycles_tests::*;

/// The test's harness when it runs on a cluster; on standalone Redis, None (and a word why).
async fn cluster_harness() -> Option<Arc<Harness>> {
    let h = Harness::start().await;
    if !h.store.is_cluster() {
        eprintln!("standalone Redis: slot migration is a cluster test (scripts/test runs it on a 3-master cluster)");
        return None;
    }
    Some(Arc::new(h))
}

/// A tenant's slot on the test cluster: a seed node's URL, the slot, the masters, the one that
/// serves the slot (`home`) and another (`away`).
struct Slot {
    seed: String,
    slot: u16,
    masters: Vec<Node>,
    home: Node,
    away: Node,
}

async fn slot_of(h: &Harness, tenant: &str) -> Slot {
    let seed = h.redis_url.split(',').next().unwrap().to_string();
    let mut c = redis::Client::open(seed.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let slot: u16 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(TenantKeys::new(tenant).tenant()).query_async(&mut c).await.unwrap();
    let (masters, home) = topology(&seed, slot).await;
    let away = masters.iter().find(|m| m.id != home.id).expect("a second master").clone();
    Slot { seed, slot, masters, home, away }
}

/// Moves `slot` from `from` to `to` the way `redis-cli --cluster reshard` does: mark it
/// importing/migrating, MIGRATE its keys in batches while clients keep writing, then assign it.
async fn move_slot(slot: u16, from: &Node, to: &Node, masters: &[Node]) -> usize {
    open_move(slot, from, to).await;
    finish_move(slot, from, to, masters).await
}

/// The start of a move: `to` imports `slot`, `from` migrates it (no key moved yet).
async fn open_move(slot: u16, from: &Node, to: &Node) {
    let setslot = |state: &str, node: &str| redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(state).arg(node).clone();
    let _: () = setslot("IMPORTING", &from.id).query_async(&mut connect(to).await).await.unwrap();
    let _: () = setslot("MIGRATING", &to.id).query_async(&mut connect(from).await).await.unwrap();
}

/// The rest of a move: the keys in batches, clients running between them, then the slot
/// assigned on every master. Answers how many keys moved.
async fn finish_move(slot: u16, from: &Node, to: &Node, masters: &[Node]) -> usize {
    let mut src = connect(from).await;
    let setslot = |state: &str, node: &str| redis::cmd("CLUSTER").arg("SETSLOT").arg(slot).arg(state).arg(node).clone();
    let mut moved = 0;
    loop {
        let keys: Vec<Vec<u8>> =
            redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(50).query_async(&mut src).await.unwrap();
        if keys.is_empty() {
            break;
        }
        moved += keys.len();
        let mut migrate = redis::cmd("MIGRATE");
        migrate.arg(&to.host).arg(to.port).arg("").arg(0).arg(5000).arg("KEYS").arg(&keys);
        let _: () = migrate.query_async(&mut src).await.unwrap();
        // Let clients run between batches, so requests meet a half-moved slot.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for node in std::iter::once(to)
        .chain(std::iter::once(from))
        .chain(masters.iter().filter(|m| m.id != to.id && m.id != from.id))
    {
        let _: () = setslot("NODE", &to.id).query_async(&mut connect(node).await).await.unwrap();
    }
    moved
}

/// Redis checks the keys a call names before it runs it (ASK or TRYAGAIN while their slot
/// moves), but a key a script reaches through its `KEY` table (the usage log, event counts, a
/// reservation's metadata) only when the script touches it: while the slot migrates, a touch
/// of one that is not on the source node (moved already, or not made yet) raised mid-script,
/// after the writes before it. Here every key a commit names is on the source and its usage
/// log is not (none ended yet; the sweep's fold deletes it): the commit must wait for the move
/// and then be whole (before, it charged the ledger, failed, and left the hold ACTIVE).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_meeting_a_moving_slot_writes_all_or_nothing() {
    let Some(h) = cluster_harness().await else { return };
    commit_meeting_a_moving_slot(h).await;
}

/// The same by EVALSHA (a server without Functions, or an ACL without them: here a user of the
/// test cluster's masters denied FUNCTION and FCALL), whose scripts read the slot's check key
/// without first asking whether the server is a cluster node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_by_evalsha_meeting_a_moving_slot_writes_all_or_nothing() {
    let Some(h) = cluster_harness().await else { return };
    let seed = h.redis_url.split(',').next().unwrap().to_string();
    let (masters, _) = topology(&seed, 0).await;
    let mut seeds = Vec::new();
    for m in &masters {
        let mut acl = redis::cmd("ACL");
        acl.arg(&["SETUSER", "cycles-evalsha", "on", ">pw", "~*", "&*", "+@all", "-function", "-fcall", "-fcall_ro"]);
        let _: () = acl.query_async(&mut connect(m).await).await.unwrap();
        seeds.push(format!("redis://cycles-evalsha:pw@{}:{}", m.host, m.port));
    }
    let by_evalsha = Arc::new(Harness::start_on_configured(seeds.join(","), |_| {}).await);
    let before = evalsha_calls(&masters).await;
    commit_meeting_a_moving_slot(by_evalsha).await;
    assert!(evalsha_calls(&masters).await > before, "the scripts ran by EVALSHA");
}

/// EVALSHA calls the masters have served.
async fn evalsha_calls(masters: &[Node]) -> u64 {
    let mut calls = 0;
    for m in masters {
        calls += command_calls(&mut connect(m).await, "evalsha").await;
    }
    calls
}

async fn commit_meeting_a_moving_slot(h: Arc<Harness>) {
    let t = Arc::new(h.funded(1_000).await);
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    // (the listing index, which a commit names, is written by the sweep or a listing's flush)
    cycles_shared::ops::listing::flush(&h.store, &t.id, 1, false).await.unwrap();
    let keys = TenantKeys::new(&t.id);
    let Slot { slot, masters, home, away, .. } = slot_of(&h, &t.id).await;
    let mut at_home = connect(&home).await;
    let usage_log: bool = redis::cmd("EXISTS").arg(keys.usage_log()).query_async(&mut at_home).await.unwrap();
    assert!(!usage_log, "the commit's usage log is made by the commit");

    open_move(slot, &home, &away).await;
    let id = rid.clone();
    let commit = {
        let (h, t) = (h.clone(), t.clone());
        tokio::spawn(async move { h.commit(&t, &rid, 60).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    finish_move(slot, &home, &away, &masters).await;
    let r = commit.await.unwrap();
    assert_eq!(r.status, 200, "the commit waited for the move: {}", r.raw);
    let root = h.root(&t).await;
    assert_eq!((root.spent, root.reserved, root.remaining), (60, 0, 940), "one whole commit");
    let got = h.get(&t.key, &format!("/v1/reservations/{id}")).await;
    assert_eq!(got.assert_ok()["status"], "COMMITTED", "the record is finished with its ledger");
    move_slot(slot, &away, &home, &masters).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moving_a_busy_tenants_slot_shows_no_errors_and_loses_no_writes() {
    let Some(h) = cluster_harness().await else { return };
    const ALLOCATED: i64 = 1_000_000_000;
    let t = Arc::new(h.funded(ALLOCATED).await);
    let Slot { seed, slot, masters, home, away } = slot_of(&h, &t.id).await;

    let stop = Arc::new(AtomicBool::new(false));
    let (ops, committed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicI64::new(0)));
    let slowest_ms = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut clients = Vec::new();
    for n in 0..8 {
        let (h, t, stop, ops, committed, errors, slowest_ms) =
            (h.clone(), t.clone(), stop.clone(), ops.clone(), committed.clone(), errors.clone(), slowest_ms.clone());
        clients.push(tokio::spawn(async move {
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let started = Instant::now();
                let r = h.reserve(&t, 10, json!({})).await;
                let Some(rid) = r.body["reservation_id"].as_str().map(str::to_string) else {
                    errors.lock().unwrap().push(format!("reserve: {} {}", r.status, r.raw));
                    continue;
                };
                let r = if (n + i) % 3 == 0 { h.release(&t, &rid).await } else { h.commit(&t, &rid, 7).await };
                if r.status != 200 {
                    errors.lock().unwrap().push(format!("finish: {} {}", r.status, r.raw));
                } else if r.body["charged"].is_object() {
                    committed.fetch_add(7, Ordering::Relaxed);
                }
                ops.fetch_add(2, Ordering::Relaxed);
                slowest_ms.fetch_max(started.elapsed().as_millis() as u64, Ordering::Relaxed);
            }
        }));
    }

    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = ops.load(Ordering::Relaxed);
    let moved_out = move_slot(slot, &home, &away, &masters).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moved_back = move_slot(slot, &away, &home, &masters).await;
    let during = ops.load(Ordering::Relaxed) - before;
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }

    let slowest = slowest_ms.load(Ordering::Relaxed);
    eprintln!("moved {moved_out} keys out and {moved_back} back; {during} operations meanwhile; slowest lifecycle {slowest} ms");
    let errors = errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{} client-visible errors, first: {:?}", errors.len(), errors.first());
    assert!(moved_out > 0 && moved_back >= moved_out, "keys moved: {moved_out} out, {moved_back} back");
    assert!(during > 20, "load overlapped the moves: {during} operations");
    assert!(slowest < 3_000, "retries during a move are short: slowest lifecycle {slowest} ms");
    assert_eq!(topology(&seed, slot).await.1.id, home.id, "the slot is home again");
    // No lost or doubled write: every commit is in `spent`, every hold came back.
    let root = h.root(&t).await;
    let spent = committed.load(Ordering::Relaxed);
    assert_eq!((root.spent, root.reserved, root.remaining), (spent, 0, ALLOCATED - spent), "ledger after the moves");
}
