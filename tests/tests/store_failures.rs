//! Redis failures give a clear, fast 5xx in the spec's error shape — never a hang, a panic or
//! a partial ledger — and the service recovers by itself once Redis is back.

use std::time::{Duration, Instant};

use cycles_shared::local::EmbeddedRedis;
use cycles_tests::*;

#[tokio::test]
async fn a_dead_redis_is_a_fast_500_and_service_resumes_after_restart() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let port = redis.port;
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;

    // Stop Redis: every request fails fast with 500 INTERNAL_ERROR.
    let mut h = h;
    drop(h.embedded.take());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    let r = h.commit(&t, &rid, 5).await;
    r.assert_error(500, "INTERNAL_ERROR");
    assert!(!r.body["message"].as_str().unwrap().contains("redis://"), "no store internals leak");
    h.reserve(&t, 1, json!({})).await.assert_error(500, "INTERNAL_ERROR");
    assert!(started.elapsed() < Duration::from_secs(15), "failures are fast: {:?}", started.elapsed());

    // Bring an empty Redis back on the same port: the same process serves again, no restart.
    let back = EmbeddedRedis::start_on_port(port, &[]).await.expect("restart redis-server");
    h.embedded = Some(back);
    let mut recovered = false;
    for _ in 0..50 {
        let r = h.reserve(&t, 1, json!({})).await;
        // The data is gone with the old process, so the key is unknown now: 401, not 500.
        if r.status == 401 {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(recovered, "the gateway reconnected to Redis by itself");
}

#[tokio::test]
async fn liveness_ignores_redis_and_readiness_checks_it() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let mut h = Harness::start_on(redis.url(), Some(redis)).await;
    let live = h.send("GET", "/health/live", &[], None).await;
    assert_eq!((live.status, live.body["status"].as_str()), (200, Some("ok")));
    assert!(live.headers.contains_key("x-request-id") && live.headers.contains_key("x-cycles-trace-id"));
    assert_eq!(h.send("GET", "/health/ready", &[], None).await.status, 200);
    // the running version, without a key
    let v = h.send("GET", "/version", &[], None).await;
    assert_eq!(
        (v.status, &v.body),
        (
            200,
            &json!({"name": "cycles-serverless", "version": env!("CARGO_PKG_VERSION"),
            "protocol_version": "0.1.26", "evidence_schema": "cycles-evidence/v0.1"})
        )
    );
    // the reference server's paths (Spring Boot actuator), in its shape
    for path in ["/actuator/health", "/actuator/health/liveness", "/actuator/health/readiness"] {
        let r = h.send("GET", path, &[], None).await;
        assert_eq!((r.status, &r.body), (200, &json!({"status": "UP"})), "{path}");
    }
    drop(h.embedded.take());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ready = h.send("GET", "/health/ready", &[], None).await;
    assert_eq!((ready.status, ready.body["status"].as_str()), (503, Some("unavailable")));
    assert_eq!(h.send("GET", "/health/live", &[], None).await.status, 200);
    for path in ["/actuator/health", "/actuator/health/readiness"] {
        let r = h.send("GET", path, &[], None).await;
        assert_eq!((r.status, &r.body), (503, &json!({"status": "DOWN", "store": "unreachable"})), "{path}");
    }
    let r = h.send("GET", "/actuator/health/liveness", &[], None).await;
    assert_eq!((r.status, &r.body), (200, &json!({"status": "UP"})));
}

/// A Redis that hangs (SIGSTOP) beyond the client timeout: requests fail with a clear 500 in
/// bounded time, never hang; once it resumes, the same process serves again, and a retry with
/// the same idempotency key applies the operation exactly once (the paused request may have
/// reached Redis after all).
#[tokio::test]
async fn a_paused_redis_is_a_bounded_500_and_retries_apply_once() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let pid = redis.pid().expect("redis pid").to_string();
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1000).await;
    let body = json!({"idempotency_key": "paused-1", "subject": {"tenant": t.id},
        "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 25}});
    let signal = |s: &str| std::process::Command::new("kill").args([s, &pid]).status().expect("kill");
    assert!(signal("-STOP").success());
    let started = Instant::now();
    let r = h.post(&t.key, "/v1/reservations", &body).await;
    let waited = started.elapsed();
    assert!(signal("-CONT").success());
    r.assert_error(500, "INTERNAL_ERROR");
    assert!(waited < Duration::from_secs(12), "bounded by the client timeout: {waited:?}");
    let mut answered = None;
    for _ in 0..50 {
        let r = h.post(&t.key, "/v1/reservations", &body).await;
        if r.status == 200 {
            answered = Some(r);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(answered.is_some(), "the service recovered without a restart");
    assert_eq!(h.root(&t).await.reserved, 25, "held exactly once");
    // the outage is told once the store answers again: lost, then restored, each once
    let system = h.all_events("__system__").await;
    let types: Vec<&str> = system.iter().map(|e| e["event_type"].as_str().unwrap()).collect();
    assert_eq!(types, ["system.store_connection_lost", "system.store_connection_restored"]);
    let (lost, restored) = (&system[0]["data"], &system[1]["data"]);
    assert_eq!((lost["component"].as_str(), lost["severity"].as_str()), (Some("store"), Some("critical")));
    assert_eq!(restored["severity"], "info");
    assert!(lost["details"]["failed_requests"].as_i64().unwrap() >= 1);
    assert!(lost["details"]["outage_ms"].as_i64().unwrap() > 0);
    for kind in ["system.store_connection_lost", "system.store_connection_restored"] {
        assert_eq!(h.admin_events("__system__", kind).await.len(), 1, "{kind}");
    }
}

/// Connections dropped under load (CLIENT KILL from the server side): requests fail fast or
/// succeed, never hang; retrying failures with the same idempotency key converges on exactly one
/// hold per key, so nothing is lost and nothing is applied twice.
#[tokio::test]
async fn dropped_connections_lose_nothing_and_double_nothing() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let url = redis.url();
    let h = std::sync::Arc::new(Harness::start_on(url.clone(), Some(redis)).await);
    let t = h.funded(1_000_000).await;
    let killer = tokio::spawn(async move {
        let client = redis::Client::open(url).unwrap();
        let mut c = client.get_multiplexed_async_connection().await.unwrap();
        let mut kills = 0u64;
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(40)).await;
            let n: u64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .arg("SKIPME")
                .arg("yes")
                .query_async(&mut c)
                .await
                .unwrap_or(0);
            kills += n;
        }
        kills
    });
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let (h, t) = (h.clone(), t.clone());
            tokio::spawn(async move {
                let mut failures = 0;
                for i in 0..40 {
                    let body = json!({"idempotency_key": format!("drop-{c}-{i}"), "subject": {"tenant": t.id},
                        "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 3}});
                    let mut attempts = 0;
                    loop {
                        let started = Instant::now();
                        let r = h.post(&t.key, "/v1/reservations", &body).await;
                        assert!(started.elapsed() < Duration::from_secs(10), "a request hung");
                        if r.status == 200 {
                            break;
                        }
                        r.assert_error(500, "INTERNAL_ERROR");
                        failures += 1;
                        attempts += 1;
                        assert!(attempts < 50, "no recovery");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                failures
            })
        })
        .collect();
    let mut failures = 0;
    for c in clients {
        failures += c.await.unwrap();
    }
    let kills = killer.await.unwrap();
    assert!(kills > 0, "connections were dropped");
    eprintln!("connections killed: {kills}, requests failed and retried: {failures}");
    // the harness shares the killed connection: let it reconnect before reading the ledger
    for _ in 0..3 {
        let _: Result<String, _> = redis::cmd("PING").query_async(&mut h.store.conn()).await;
    }
    assert_eq!(h.root(&t).await.reserved, 8 * 40 * 3, "exactly one hold per idempotency key");
}

/// The scripts' function library may vanish at any time (FUNCTION FLUSH, a failover to an
/// empty node, a new shard): the next call loads it again and answers normally, on every master.
#[tokio::test]
async fn a_flushed_function_library_is_loaded_again() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut h.store.conn()).await.unwrap();

    h.commit(&t, &rid, 7).await.assert_ok();
    let l = h.ledger(&t.id, &format!("tenant:{}", t.id), cycles_shared::model::Unit::Tokens).await;
    assert_eq!((l.spent, l.reserved), (7, 0));
    let libraries: redis::Value = redis::cmd("FUNCTION").arg("LIST").query_async(&mut h.store.conn()).await.unwrap();
    let wanted = format!("cycles_{}", cycles_shared::ops::LIBRARY.version);
    assert!(format!("{libraries:?}").contains(&wanted), "{wanted} loaded again: {libraries:?}");
}

async fn set_maxmemory(h: &Harness, bytes: &str) {
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(bytes).query_async(&mut h.store.conn()).await.unwrap();
}

/// Redis out of memory (`noeviction`): reads keep answering (the read-only functions are
/// registered `no-writes`), writes get a clear 500, readiness says the store refuses writes; a
/// library that cannot be loaded meanwhile (FUNCTION LOAD refused for memory) leaves the
/// scripts on EVALSHA only until a retry with backoff loads it, and FCALL is back.
#[tokio::test]
async fn reads_survive_a_store_that_refuses_writes_and_functions_come_back() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    set_maxmemory(&h, "1").await;
    let read_all = || async {
        h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_ok();
        h.get(&t.key, &format!("/v1/balances?tenant={}", t.id)).await.assert_ok();
        h.get(&t.key, "/v1/reservations").await.assert_ok();
    };
    read_all().await;
    h.reserve(&t, 1, json!({})).await.assert_error(500, "INTERNAL_ERROR");
    // (a listing that walks the listing index first writes the members of reservations waiting
    // for it, a write: the writes' 500 while one waits)
    h.get(&t.key, "/v1/reservations?sort_by=reserved").await.assert_error(500, "INTERNAL_ERROR");
    let ready = h.send("GET", "/health/ready", &[], None).await;
    assert_eq!(ready.status, 503);
    assert_eq!(ready.body, json!({"status": "unavailable", "store": "refusing_writes", "reason": "OOM"}));

    // The library vanishes while memory is short: loading it is refused, reads run by EVALSHA.
    let _: () = redis::cmd("FUNCTION").arg("FLUSH").query_async(&mut h.store.conn()).await.unwrap();
    let evalsha = h.command_calls("evalsha").await;
    read_all().await;
    read_all().await;
    assert!(h.command_calls("evalsha").await >= evalsha + 10, "reads ran by EVALSHA");
    let fcall = h.command_calls("fcall").await;
    read_all().await;
    assert_eq!(h.command_calls("fcall").await, fcall, "no FCALL attempt before the retry time");

    // Memory back: after the backoff the library is loaded again and FCALL serves.
    set_maxmemory(&h, "0").await;
    h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_ok();
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    h.commit(&t, &rid, 4).await.assert_ok();
    let fcall = h.command_calls("fcall").await;
    let evalsha = h.command_calls("evalsha").await;
    h.reserve_ok(&t, 1, json!({})).await;
    read_all().await;
    // reserve 1, get 1, balances 2 (ledger list, then the ledgers), listing 2 (index, records)
    assert_eq!(h.command_calls("fcall").await, fcall + 6, "FCALL in use again");
    assert_eq!(h.command_calls("evalsha").await, evalsha);
    assert_eq!(h.send("GET", "/health/ready", &[], None).await.status, 200);
    assert_eq!(h.root(&t).await.spent, 4);
}

async fn ready(h: &Harness) -> Resp {
    h.send("GET", "/health/ready", &[], None).await
}

/// Sets `maxmemory` and `maxmemory-policy` on one node; answers what they were.
async fn set_eviction(conn: &mut impl redis::aio::ConnectionLike, limit: &str, policy: &str) -> (String, String) {
    let get = |name: &str| redis::cmd("CONFIG").arg("GET").arg(name).clone();
    let (_, was_limit): (String, String) = get("maxmemory").query_async(conn).await.unwrap();
    let (_, was_policy): (String, String) = get("maxmemory-policy").query_async(conn).await.unwrap();
    let set = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg(limit).arg("maxmemory-policy").arg(policy).clone();
    let _: () = set.query_async(conn).await.unwrap();
    (was_limit, was_policy)
}

/// A store that may evict keys to make room (a memory limit and a policy other than
/// `noeviction`) could drop a budget, a quota counter or an idempotency record without a trace:
/// readiness answers 503 naming the policy, in both shapes, unless the operator allows it
/// (`CYCLES_STORE_EVICTION=allow`). No limit, or `noeviction`, is ready.
#[tokio::test]
async fn readiness_refuses_a_store_that_may_evict_keys() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let allowing = Harness::start_beside(&h, |c| c.allow_evicting_store = true).await;
    let mut conn = h.store.conn();
    for policy in ["volatile-lru", "allkeys-lru", "volatile-ttl", "allkeys-random"] {
        set_eviction(&mut conn, "10gb", policy).await;
        let r = ready(&h).await;
        assert_eq!(
            (r.status, &r.body),
            (
                503,
                &json!({"status": "unavailable", "store": "evicting", "reason": "EVICTION_POLICY", "policies": [policy]})
            ),
            "{policy}"
        );
        let r = h.send("GET", "/actuator/health/readiness", &[], None).await;
        assert_eq!(
            (r.status, r.body["status"].as_str(), r.body["store"].as_str()),
            (503, Some("DOWN"), Some("evicting"))
        );
        assert_eq!(ready(&allowing).await.status, 200, "allowed: {policy}");
    }
    // no limit: nothing is ever evicted, whatever the policy says
    set_eviction(&mut conn, "0", "allkeys-lru").await;
    let r = ready(&h).await;
    assert_eq!((r.status, r.body), (200, json!({"status": "ready", "store": "ok"})));
    set_eviction(&mut conn, "10gb", "noeviction").await;
    assert_eq!(ready(&h).await.status, 200);
}

/// On a Redis Cluster every master is asked: one master with an evicting policy, not the one
/// the readiness probe writes to, makes the store not ready. (Runs on the test cluster of
/// `scripts/test`; restores the master's settings before it asserts.)
#[tokio::test]
async fn readiness_asks_every_master_of_a_cluster_about_eviction() {
    let h = Harness::start().await;
    if !h.store.is_cluster() {
        eprintln!("standalone Redis: the per-master check is a cluster test (scripts/test runs it on a cluster)");
        return;
    }
    let seed = h.redis_url.split(',').next().unwrap().to_string();
    let mut c = redis::Client::open(seed.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let probe_slot: u16 =
        redis::cmd("CLUSTER").arg("KEYSLOT").arg(cycles_shared::keys::HEALTH_PROBE).query_async(&mut c).await.unwrap();
    let (masters, probed) = topology(&seed, probe_slot).await;
    let away = masters.iter().find(|m| m.id != probed.id).expect("a master that does not serve the probe's slot");
    let mut node = connect(away).await;
    let (was_limit, was_policy) = set_eviction(&mut node, "10gb", "volatile-lru").await;
    let evicting = ready(&h).await;
    set_eviction(&mut node, &was_limit, &was_policy).await;
    let restored = ready(&h).await;
    assert_eq!(
        (evicting.status, &evicting.body),
        (
            503,
            &json!({"status": "unavailable", "store": "evicting", "reason": "EVICTION_POLICY", "policies": ["volatile-lru"]})
        )
    );
    assert_eq!(restored.status, 200);
}

/// A store that does not tell its eviction policy (here INFO is refused to the server's user once
/// it is connected) is not refused for it: the probe's write decides readiness.
#[tokio::test]
async fn readiness_does_not_refuse_a_store_that_hides_its_eviction_policy() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
    let mut admin = redis::Client::open(redis.url()).unwrap().get_multiplexed_async_connection().await.unwrap();
    let user = |rules: &[&str]| redis::cmd("ACL").arg("SETUSER").arg("server").arg(rules).clone();
    let _: () = user(&["on", ">pw", "~*", "&*", "+@all"]).query_async(&mut admin).await.unwrap();
    let h = Harness::start_on(format!("redis://server:pw@127.0.0.1:{}", redis.port), Some(redis)).await;
    let _: () = user(&["-info"]).query_async(&mut admin).await.unwrap();
    assert!(h.store.evicting_policies().await.is_err(), "INFO is refused");
    let r = ready(&h).await;
    assert_eq!((r.status, r.body), (200, json!({"status": "ready", "store": "ok"})));
}
