//! Durability (`CYCLES_DURABILITY`): the failover an operator fears. A primary with one
//! replica, six clients reserving, the replica paused for two seconds (it lags), the primary
//! killed, the replica promoted and a server pointed at it. With `replica` every reservation
//! answered 200 is still there and the ledger holds exactly what was acknowledged (the writes
//! the wait could not confirm answered 503, and their retries with the same idempotency key
//! settle them once); with `none` the same failover loses acknowledged reservations. Both on a
//! standalone primary and on a Redis Cluster with a replica per master (`CLUSTER FAILOVER
//! TAKEOVER` on the replica of the killed master). The servers here are this test's own,
//! whatever REDIS_URL says.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cycles_shared::config::durability_from;
use cycles_shared::keys::TenantKeys;
use cycles_shared::local::EmbeddedRedis;
use cycles_tests::{json, unique, Harness, Tenant};

const CLIENTS: usize = 6;
const ALLOCATED: i64 = 1_000_000_000;

/// What the clients were told: the reservations answered 200 (id, idempotency key), the
/// commits and the fundings answered 200, and the requests whose outcome is unknown (503), to
/// retry with the same idempotency key.
#[derive(Default)]
struct Told {
    acknowledged: Vec<(String, String)>,
    committed: Vec<String>,
    funded: usize,
    unknown: Vec<Unknown>,
}

/// A request answered 503, as its retry sends it again.
enum Unknown {
    Reserve(String),
    Commit { reservation: String, key: String },
    Fund(String),
}

const FUNDING: i64 = 10;

impl Told {
    fn add(&mut self, other: Told) {
        self.acknowledged.extend(other.acknowledged);
        self.committed.extend(other.committed);
        self.funded += other.funded;
        self.unknown.extend(other.unknown);
    }
}

/// 200, or (503) an unknown outcome whose answer says to retry with the same key.
fn answered(r: &cycles_tests::Resp) -> bool {
    match r.status {
        200 => true,
        503 => {
            assert_eq!(r.body["error"], "INTERNAL_ERROR", "{}", r.body);
            assert!(r.body["message"].as_str().unwrap().contains("outcome is unknown"), "{}", r.body);
            false
        }
        other => panic!("answered {other}: {}", r.body),
    }
}

async fn reserve(h: &Harness, t: &Tenant, key: &str) -> cycles_tests::Resp {
    h.reserve(t, 1, json!({"idempotency_key": key, "metadata": metadata()})).await
}

async fn commit(h: &Harness, t: &Tenant, reservation: &str, key: &str) -> cycles_tests::Resp {
    let body = json!({"idempotency_key": key, "actual": {"unit": "TOKENS", "amount": 1}});
    h.post(&t.key, &format!("/v1/reservations/{reservation}/commit"), &body).await
}

async fn fund(h: &Harness, t: &Tenant, key: &str) -> cycles_tests::Resp {
    let body = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": FUNDING}, "idempotency_key": key});
    h.admin(
        "POST",
        &format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id),
        Some(&body),
    )
    .await
}

fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill").success();
    assert!(ok, "kill {sig} {pid}");
}

async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url).unwrap().get_multiplexed_async_connection().await.unwrap()
}

async fn info(url: &str, section: &str) -> String {
    redis::cmd("INFO").arg(section).query_async(&mut conn(url).await).await.unwrap()
}

async fn replication_up(replica_url: &str) {
    for _ in 0..200 {
        if info(replica_url, "replication").await.contains("master_link_status:up") {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the replica never synchronised");
}

/// Waits until the replica has everything its primary has written so far.
async fn caught_up(primary_url: &str, replica_url: &str) {
    let offset = |text: String, field: &str| -> i64 {
        text.lines().find_map(|l| l.strip_prefix(field)).and_then(|v| v.trim().parse().ok()).unwrap_or(-1)
    };
    let target = offset(info(primary_url, "replication").await, "master_repl_offset:");
    for _ in 0..200 {
        if offset(info(replica_url, "replication").await, "slave_repl_offset:") >= target {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the replica never caught up");
}

/// Six clients until `stop`: each reserves 1 token (with 4 KB of metadata, so two seconds of
/// writes cannot all wait in the sockets' buffers of a paused replica) and commits every third
/// reservation it was answered; the first also funds the budget after every fifth reserve.
fn start_clients(h: &Arc<Harness>, t: &Tenant, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Told>> {
    (0..CLIENTS)
        .map(|c| {
            let (h, t, stop) = (h.clone(), t.clone(), stop.clone());
            tokio::spawn(async move {
                let mut told = Told::default();
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let key = unique(&format!("fo{c}"));
                    let r = reserve(&h, &t, &key).await;
                    if !answered(&r) {
                        told.unknown.push(Unknown::Reserve(key));
                        continue;
                    }
                    let id = r.body["reservation_id"].as_str().unwrap().to_string();
                    if n % 3 == 0 {
                        let key = unique("co");
                        if answered(&commit(&h, &t, &id, &key).await) {
                            told.committed.push(id.clone());
                        } else {
                            told.unknown.push(Unknown::Commit { reservation: id.clone(), key });
                        }
                    }
                    told.acknowledged.push((id, key));
                    if c == 0 && n % 5 == 0 {
                        let key = unique("fu");
                        if answered(&fund(&h, &t, &key).await) {
                            told.funded += 1;
                        } else {
                            told.unknown.push(Unknown::Fund(key));
                        }
                    }
                }
                told
            })
        })
        .collect()
}

fn metadata() -> serde_json::Value {
    json!({"note": "x".repeat(4_000)})
}

/// Runs the clients, pauses the replica `replica_pid` after 0.4 s for 2 s, stops the clients.
async fn reserve_through_a_lagging_replica(h: &Arc<Harness>, t: &Tenant, replica_pid: u32) -> Told {
    let stop = Arc::new(AtomicBool::new(false));
    let clients = start_clients(h, t, &stop);
    tokio::time::sleep(Duration::from_millis(400)).await;
    signal(replica_pid, "-STOP");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let mut told = Told::default();
    for c in clients {
        told.add(c.await.unwrap());
    }
    told
}

/// How many acknowledged reservations and commits the promoted store no longer has.
async fn lost(h: &Harness, t: &Tenant, told: &Told) -> usize {
    let mut lost = 0;
    for (rid, _) in &told.acknowledged {
        let r = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
        match r.status {
            200 if told.committed.contains(rid) && r.body["status"] != "COMMITTED" => lost += 1,
            200 => {}
            404 => lost += 1,
            other => panic!("GET answered {other}: {}", r.body),
        }
    }
    lost
}

/// With `replica`: nothing acknowledged is lost, some writes answered 503 (the paused replica
/// confirmed nothing), each such unknown outcome is settled by its retry with the same key (a
/// replay where the write survived, the write made where it did not, never twice), and the
/// ledger holds exactly what was acknowledged: every held reservation, commit and funding.
async fn nothing_acknowledged_was_lost(h: &Harness, t: &Tenant, mut told: Told) {
    assert!(told.acknowledged.len() > 50, "the clients were answered {} times", told.acknowledged.len());
    assert!(!told.unknown.is_empty(), "no write waited for the paused replica");
    assert!(!told.committed.is_empty() && told.funded > 0, "commits and fundings were acknowledged too");
    assert_eq!(lost(h, t, &told).await, 0, "acknowledged writes lost in the failover");
    for unknown in std::mem::take(&mut told.unknown) {
        match unknown {
            Unknown::Reserve(key) => {
                let r = reserve(h, t, &key).await;
                assert_eq!(r.status, 200, "{}", r.body);
                let again = reserve(h, t, &key).await;
                assert_eq!(again.body["reservation_id"], r.body["reservation_id"], "a retry reserved twice");
                told.acknowledged.push((r.body["reservation_id"].as_str().unwrap().to_string(), key));
            }
            Unknown::Commit { reservation, key } => {
                assert_eq!(commit(h, t, &reservation, &key).await.status, 200);
                assert_eq!(commit(h, t, &reservation, &key).await.status, 200, "a retried commit replays");
                told.committed.push(reservation);
            }
            Unknown::Fund(key) => {
                assert_eq!(fund(h, t, &key).await.status, 200);
                assert_eq!(fund(h, t, &key).await.status, 200, "a retried funding replays");
                told.funded += 1;
            }
        }
    }
    let (held, spent) = (told.acknowledged.len() - told.committed.len(), told.committed.len());
    let ledger = h.root(t).await;
    assert_eq!(
        (ledger.allocated, ledger.reserved, ledger.spent),
        (ALLOCATED + FUNDING * told.funded as i64, held as i64, spent as i64),
        "the ledger holds exactly what was acknowledged"
    );
}

/// With `none`: acknowledged writes are gone.
async fn acknowledged_reservations_were_lost(h: &Harness, t: &Tenant, told: &Told) {
    assert!(told.unknown.is_empty(), "nothing waits without durability");
    let lost = lost(h, t, told).await;
    eprintln!("none: {lost} of {} acknowledged reservations lost", told.acknowledged.len());
    assert!(lost > 0, "no acknowledged reservation was lost: the failover test shows nothing");
}

/// The failover on a standalone primary with `CYCLES_DURABILITY=level`: what the clients were
/// told, and a server on the promoted replica with the tenant they reserved for.
async fn standalone_failover(level: &str) -> (Told, Harness, Tenant) {
    let primary = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let port = primary.port.to_string();
    let replica = EmbeddedRedis::start(&["--replicaof", "127.0.0.1", &port]).await.expect("replica");
    replication_up(&replica.url()).await;
    let (primary_pid, primary_url) = (primary.pid().unwrap(), primary.url());
    let durability = durability_from(Some(level), None, Duration::from_millis(300));
    let h = Arc::new(Harness::start_with_redis(primary, move |c| c.durability = durability).await);
    let t = h.funded(ALLOCATED).await;
    caught_up(&primary_url, &replica.url()).await;

    let told = reserve_through_a_lagging_replica(&h, &t, replica.pid().unwrap()).await;
    signal(primary_pid, "-KILL");
    signal(replica.pid().unwrap(), "-CONT");
    let _: () =
        redis::cmd("REPLICAOF").arg("NO").arg("ONE").query_async(&mut conn(&replica.url()).await).await.unwrap();
    drop(h);
    (told, Harness::start_with_redis(replica, |_| {}).await, t)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_replica_durability_a_failover_loses_no_acknowledged_reservation() {
    let (told, h, t) = standalone_failover("replica").await;
    nothing_acknowledged_was_lost(&h, &t, told).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_durability_the_same_failover_loses_acknowledged_reservations() {
    let (told, h, t) = standalone_failover("none").await;
    acknowledged_reservations_were_lost(&h, &t, &told).await;
}

/// A Redis Cluster of three masters with a replica each (`scripts/redis-cluster`), stopped
/// when dropped.
struct Cluster {
    dir: PathBuf,
    ports: Vec<u16>,
}

impl Cluster {
    fn script() -> String {
        format!("{}/../scripts/redis-cluster", env!("CARGO_MANIFEST_DIR"))
    }

    /// Started, and settled: every node knows three replicas and each replica is in sync.
    async fn start() -> Cluster {
        let dir = std::env::temp_dir().join(unique("cycles-failover-cluster"));
        let out = std::process::Command::new(Self::script()).arg("start").arg(&dir).arg("1").output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let urls = String::from_utf8(out.stdout).unwrap();
        let ports = urls.trim().split(',').map(|u| u.rsplit(':').next().unwrap().parse().unwrap()).collect();
        let cluster = Cluster { dir, ports };
        for port in &cluster.ports {
            let url = format!("redis://127.0.0.1:{port}");
            let mut settled = false;
            for _ in 0..200 {
                let nodes: String =
                    redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn(&url).await).await.unwrap();
                let replication = info(&url, "replication").await;
                settled = nodes.matches("slave").count() == 3
                    && (replication.contains("role:master") || replication.contains("master_link_status:up"));
                if settled {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert!(settled, "node {port} never settled");
        }
        cluster
    }

    fn pid(&self, port: u16) -> u32 {
        std::fs::read_to_string(self.dir.join(format!("{port}.pid"))).unwrap().trim().parse().unwrap()
    }

    fn urls(&self) -> String {
        self.urls_except(0)
    }

    fn urls_except(&self, port: u16) -> String {
        let urls: Vec<String> =
            self.ports.iter().filter(|p| **p != port).map(|p| format!("redis://127.0.0.1:{p}")).collect();
        urls.join(",")
    }

    /// The master serving `slot` and its replica, as (port, node id) pairs.
    async fn master_and_replica(&self, slot: u16) -> ((u16, String), (u16, String)) {
        let nodes: String = redis::cmd("CLUSTER")
            .arg("NODES")
            .query_async(&mut conn(&format!("redis://127.0.0.1:{}", self.ports[0])).await)
            .await
            .unwrap();
        let rows: Vec<Vec<&str>> = nodes.lines().map(|l| l.split(' ').collect()).collect();
        let port = |row: &Vec<&str>| row[1].split(['@', ':']).nth(1).unwrap().parse::<u16>().unwrap();
        let serves = |row: &Vec<&str>| {
            row[8..].iter().any(|range| {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
            })
        };
        let master = rows.iter().find(|r| r[2].contains("master") && serves(r)).expect("a master for the slot");
        let replica = rows.iter().find(|r| r[2].contains("slave") && r[3] == master[0]).expect("its replica");
        ((port(master), master[0].to_string()), (port(replica), replica[0].to_string()))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new(Self::script()).arg("stop").arg(&self.dir).output();
    }
}

/// The failover on a Redis Cluster: the replica of the tenant's master paused, the master
/// killed, the replica taking over (`CLUSTER FAILOVER TAKEOVER`), a server on the survivors.
async fn cluster_failover(level: &str) -> (Told, Harness, Tenant, Cluster) {
    let cluster = Cluster::start().await;
    let seeds = cluster.urls();
    let durability = durability_from(Some(level), None, Duration::from_millis(300));
    // the tenant is made without waiting for replicas (a slow acknowledgement on a loaded
    // machine would fail the setup, which is not what the failover tests), then the server
    // under test starts beside it
    let set_up = Harness::start_on_configured(seeds, |_| {}).await;
    let t = set_up.funded(ALLOCATED).await;
    let h = Arc::new(Harness::start_beside(&set_up, move |c| c.durability = durability).await);
    drop(set_up);
    let slot = TenantKeys::new(&t.id).slot();
    let ((master, _), (replica, replica_id)) = cluster.master_and_replica(slot).await;
    let (master_url, replica_url) = (format!("redis://127.0.0.1:{master}"), format!("redis://127.0.0.1:{replica}"));
    replication_up(&replica_url).await;
    caught_up(&master_url, &replica_url).await;

    let told = reserve_through_a_lagging_replica(&h, &t, cluster.pid(replica)).await;
    signal(cluster.pid(master), "-KILL");
    signal(cluster.pid(replica), "-CONT");
    let _: () =
        redis::cmd("CLUSTER").arg("FAILOVER").arg("TAKEOVER").query_async(&mut conn(&replica_url).await).await.unwrap();
    // every surviving node knows the replica serves the slot now
    for port in cluster.ports.iter().filter(|p| **p != master) {
        let url = format!("redis://127.0.0.1:{port}");
        let mut known = false;
        for _ in 0..200 {
            let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(&mut conn(&url).await).await.unwrap();
            known = nodes.lines().any(|l| l.starts_with(&replica_id) && l.contains("master"));
            if known {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(known, "node {port} never learned of the takeover");
    }
    drop(h);
    let survivors = Harness::start_on_configured(cluster.urls_except(master), |_| {}).await;
    (told, survivors, t, cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_with_replica_durability_a_failover_loses_no_acknowledged_reservation() {
    let (told, h, t, _cluster) = cluster_failover("replica").await;
    nothing_acknowledged_was_lost(&h, &t, told).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_a_cluster_without_durability_the_same_failover_loses_acknowledged_reservations() {
    let (told, h, t, _cluster) = cluster_failover("none").await;
    acknowledged_reservations_were_lost(&h, &t, &told).await;
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
    // so do the writes outside the scripts (an id's owner, the tenant registry, audit entries)
    let probe = cycles_tests::unique("cy:durability-probe");
    let set = redis::cmd("SET").arg(&probe).arg("1").to_owned();
    assert_eq!(h.store.write::<()>(set, &probe).await.unwrap_err().status(), 503);
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
    replication_up(&replica.url()).await;
    let durability = durability_from(Some("fsync"), None, Duration::from_millis(1_000));
    let h = Harness::start_with_redis(primary, move |c| c.durability = durability).await;
    let t = h.funded(1_000).await;
    h.reserve_ok(&t, 10, json!({})).await;
    assert_eq!(h.root(&t).await.reserved, 10);
    let probe = cycles_tests::unique("cy:durability-probe");
    h.store.write::<()>(redis::cmd("SET").arg(&probe).arg("1").to_owned(), &probe).await.expect("confirmed");
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
