//! Durability (`CYCLES_DURABILITY`): the failover an operator fears. A primary with one
//! replica, six clients reserving, the replica paused for two seconds (it lags), the primary
//! killed, the replica promoted and a server pointed at it. With `replica` every reservation
//! answered 200 is still there and the ledger holds exactly what was acknowledged (the writes
//! the wait could not confirm answered 503, and their retries with the same idempotency key
//! settle them once); with `none` the same failover loses acknowledged reservations.
//! The servers here are this test's own (a primary and its replica), whatever REDIS_URL says.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cycles_shared::config::durability_from;
use cycles_shared::local::EmbeddedRedis;
use cycles_tests::{json, unique, Harness, Tenant};

const CLIENTS: usize = 6;

/// What the clients were told: the reservations answered 200 (id, idempotency key) and the
/// idempotency keys of requests whose outcome is unknown (503, or no answer).
#[derive(Default)]
struct Told {
    acknowledged: Vec<(String, String)>,
    unknown: Vec<String>,
    not_durable: usize,
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill").success();
    assert!(ok, "kill {sig} {pid}");
}

async fn replication_up(replica: &EmbeddedRedis) {
    let client = redis::Client::open(replica.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    for _ in 0..200 {
        let info: String = redis::cmd("INFO").arg("replication").query_async(&mut conn).await.unwrap();
        if info.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the replica never synchronised");
}

/// The failover with `CYCLES_DURABILITY=level`: what the clients were told, and a server on
/// the promoted replica with the tenant they reserved for.
async fn failover(level: &str) -> (Told, Harness, Tenant) {
    let primary = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let port = primary.port.to_string();
    let replica = EmbeddedRedis::start(&["--replicaof", "127.0.0.1", &port]).await.expect("replica");
    replication_up(&replica).await;
    let primary_pid = primary.pid().unwrap();
    let durability = durability_from(Some(level), None, Duration::from_millis(300));
    let h = Arc::new(Harness::start_with_redis(primary, move |c| c.durability = durability).await);
    let t = h.funded(1_000_000_000).await;
    // the set-up is on the replica before anything fails
    let copies: i64 = redis::cmd("WAIT").arg(1).arg(5_000).query_async(&mut h.store.conn()).await.unwrap();
    assert_eq!(copies, 1);

    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..CLIENTS {
        let (h, t, stop) = (h.clone(), t.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut told = Told::default();
            // metadata makes each write's replication large enough that two seconds of them
            // cannot all wait in the sockets' buffers of a paused replica
            let metadata = json!({"note": "x".repeat(4_000)});
            while !stop.load(Ordering::Relaxed) {
                let key = unique(&format!("fo{c}"));
                let r = h.reserve(&t, 1, json!({"idempotency_key": key, "metadata": metadata})).await;
                match r.status {
                    200 => told.acknowledged.push((r.body["reservation_id"].as_str().unwrap().to_string(), key)),
                    503 => {
                        assert_eq!(r.body["error"], "INTERNAL_ERROR", "{}", r.body);
                        assert!(r.body["message"].as_str().unwrap().contains("outcome is unknown"), "{}", r.body);
                        told.not_durable += 1;
                        told.unknown.push(key);
                    }
                    other => panic!("reserve answered {other}: {}", r.body),
                }
            }
            told
        }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let replica_pid = replica.pid().unwrap();
    signal(replica_pid, "-STOP");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut told = Told::default();
    for c in clients {
        let one = c.await.unwrap();
        told.acknowledged.extend(one.acknowledged);
        told.unknown.extend(one.unknown);
        told.not_durable += one.not_durable;
    }
    eprintln!("{level}: {} acknowledged, {} unknown", told.acknowledged.len(), told.unknown.len());
    signal(primary_pid, "-KILL");
    signal(replica_pid, "-CONT");
    let mut conn = redis::Client::open(replica.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut conn).await.unwrap();
    drop(h);
    (told, Harness::start_with_redis(replica, |_| {}).await, t)
}

/// How many acknowledged reservations the promoted store no longer has.
async fn lost(h: &Harness, t: &Tenant, told: &Told) -> usize {
    let mut lost = 0;
    for (rid, _) in &told.acknowledged {
        let r = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
        match r.status {
            200 => assert_eq!(r.body["status"], "ACTIVE"),
            404 => lost += 1,
            other => panic!("GET answered {other}: {}", r.body),
        }
    }
    lost
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_durability_a_failover_loses_no_acknowledged_reservation() {
    let (told, h, t) = failover("replica").await;
    assert!(told.acknowledged.len() > 50, "the clients were answered {} times", told.acknowledged.len());
    // the paused replica confirmed nothing: those writes answered 503, never 200
    assert!(told.not_durable > 0, "no write waited for the paused replica");
    assert_eq!(lost(&h, &t, &told).await, 0, "acknowledged reservations lost in the failover");

    // every unknown outcome is settled by its retry with the same idempotency key: it replays
    // the reservation where the write survived and makes it where it did not, never twice
    let mut settled = told.acknowledged.len();
    for key in &told.unknown {
        let r = h.reserve(&t, 1, json!({"idempotency_key": key, "metadata": {"note": "x".repeat(4_000)}})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        settled += 1;
        let again = h.reserve(&t, 1, json!({"idempotency_key": key, "metadata": {"note": "x".repeat(4_000)}})).await;
        assert_eq!(again.body["reservation_id"], r.body["reservation_id"], "a retry made a second reservation");
    }
    let ledger = h.root(&t).await;
    assert_eq!(ledger.reserved, settled as i64, "the ledger holds exactly what was acknowledged");
    assert_eq!(ledger.remaining, 1_000_000_000 - settled as i64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_durability_the_same_failover_loses_acknowledged_reservations() {
    let (told, h, t) = failover("none").await;
    assert_eq!(told.not_durable, 0, "nothing waits without durability");
    let lost = lost(&h, &t, &told).await;
    eprintln!("none: {lost} acknowledged reservations lost");
    assert!(
        lost > 0,
        "no acknowledged reservation was lost of {}: the failover test shows nothing",
        told.acknowledged.len()
    );
    // and the ledger agrees with the store it survived in, not with what the clients were told
    let ledger = h.root(&t).await;
    assert_eq!(ledger.reserved, (told.acknowledged.len() - lost) as i64);
}

#[test]
fn durability_settings_parse_or_stop_the_start() {
    use cycles_shared::store::Durability;
    let ms = Duration::from_millis(250);
    assert_eq!(durability_from(None, None, ms), Ok(Durability::Primary));
    assert_eq!(durability_from(Some("none"), None, ms), Ok(Durability::Primary));
    assert_eq!(durability_from(Some("replica"), None, ms), Ok(Durability::Replica { replicas: 1, timeout: ms }));
    assert_eq!(durability_from(Some("fsync"), Some("2"), ms), Ok(Durability::Fsync { replicas: 2, timeout: ms }));
    assert!(durability_from(Some("replicas"), None, ms).unwrap_err().contains("none, replica, fsync"));
    assert!(durability_from(Some("replica"), Some("0"), ms).unwrap_err().contains("at least 1"));
    assert!(durability_from(Some("replica"), None, Duration::ZERO).unwrap_err().contains("wait forever"));
}

/// A write the replicas do not confirm answers 503 (outcome unknown) although it took effect
/// on the primary; its retry with the same idempotency key replays it and waits again, so it is
/// held once. Here no replica ever confirms: the primary has none.
#[tokio::test]
async fn an_unconfirmed_write_answers_503_and_its_retry_never_charges_twice() {
    let set_up = Harness::start_with_redis(EmbeddedRedis::start(&[]).await.expect("redis-server"), |_| {}).await;
    let t = set_up.funded(1_000).await;
    let durability = durability_from(Some("replica"), None, Duration::from_millis(50));
    let h = Harness::start_beside(&set_up, move |c| c.durability = durability).await;
    for _ in 0..3 {
        let r = h.reserve(&t, 7, json!({"idempotency_key": "once"})).await;
        r.assert_error(503, "INTERNAL_ERROR");
        assert!(r.body["message"].as_str().unwrap().contains("retry with the same idempotency_key"));
    }
    let ledger = h.root(&t).await;
    assert_eq!((ledger.reserved, ledger.remaining), (7, 993), "held once across three attempts");
    // reads do not wait
    let listed = h.get(&t.key, "/v1/reservations").await;
    assert_eq!(listed.status, 200, "{}", listed.body);
    assert_eq!(listed.body["reservations"].as_array().unwrap().len(), 1);
}

/// `fsync` on a server without WAITAOF (before Redis 7.2) waits for the replicas alone.
#[tokio::test]
async fn fsync_on_a_server_without_waitaof_waits_for_replicas() {
    let primary = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let port = primary.port.to_string();
    let replica = EmbeddedRedis::start(&["--replicaof", "127.0.0.1", &port]).await.expect("replica");
    replication_up(&replica).await;
    let durability = durability_from(Some("fsync"), None, Duration::from_millis(1_000));
    let h = Harness::start_with_redis(primary, move |c| c.durability = durability).await;
    let t = h.funded(1_000).await;
    h.reserve_ok(&t, 10, json!({})).await;
    assert_eq!(h.root(&t).await.reserved, 10);
}
