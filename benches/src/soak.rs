//! The soak run (long; not in CI): mixed load from 16 clients for a given time while the expiry
//! sweep runs as in `cycles-local`; every 30 s it samples Redis memory, key count and latency.
//! It passes when there are zero errors, memory and key count stay flat once retention applies
//! (run it with short retention, see BENCHMARKS.md), and no index entry is orphaned.
//!
//!   CYCLES_RETENTION_MS=30000 CYCLES_EVENT_RETENTION_MS=30000 \
//!     cargo run --release -p cycles-benches -- --soak 600

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cycles_tests::{json, Harness};
use redis::AsyncCommands;

async fn info_number(h: &Harness, section: &str, field: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg(section).query_async(&mut h.store.conn()).await.unwrap();
    info.lines().find_map(|l| l.strip_prefix(&format!("{field}:"))).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

async fn keys(h: &Harness) -> i64 {
    redis::cmd("DBSIZE").query_async(&mut h.store.conn()).await.unwrap()
}

pub async fn run(h: Arc<Harness>, seconds: u64) {
    let config = cycles_shared::config::Config::from_env(None);
    let t = h.funded(i64::MAX / 4).await;
    let ops = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let latency_us = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let sweeper = {
        let (store, opts, interval) = (h.store.clone(), config.sweep_options(), config.sweep_interval);
        tokio::spawn(async move { cycles_shared::jobs::sweep::sweep_loop(&store, &opts, interval, None).await })
    };
    let clients: Vec<_> = (0..16u64)
        .map(|c| {
            let (h, t, ops, errors, latency_us) = (h.clone(), t.clone(), ops.clone(), errors.clone(), latency_us.clone());
            tokio::spawn(async move {
                let mut i = 0u64;
                while Instant::now() < deadline {
                    i += 1;
                    let started = Instant::now();
                    let ok = match i % 5 {
                        // reserve + commit, reserve + release, an expiring hold, an event, a decide
                        0 | 1 => {
                            let body = json!({"idempotency_key": format!("s-{c}-{i}"), "subject": {"tenant": t.id, "agent": format!("a{}", i % 7)},
                                "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 100}});
                            let r = h.post(&t.key, "/v1/reservations", &body).await;
                            let id = r.body["reservation_id"].as_str().unwrap_or_default().to_string();
                            let done = if i.is_multiple_of(5) { h.commit(&t, &id, 80).await } else { h.release(&t, &id).await };
                            r.status == 200 && done.status == 200
                        }
                        2 => {
                            let body = json!({"idempotency_key": format!("s-{c}-{i}"), "subject": {"tenant": t.id},
                                "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 10},
                                "ttl_ms": 1000, "grace_period_ms": 0});
                            h.post(&t.key, "/v1/reservations", &body).await.status == 200
                        }
                        3 => {
                            let body = json!({"idempotency_key": format!("s-{c}-{i}"), "subject": {"tenant": t.id},
                                "action": {"kind": "tool", "name": "t"}, "actual": {"unit": "TOKENS", "amount": 5}});
                            h.post(&t.key, "/v1/events", &body).await.status == 201
                        }
                        _ => {
                            let body = json!({"idempotency_key": format!("s-{c}-{i}"), "subject": {"tenant": t.id},
                                "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 1}});
                            h.post(&t.key, "/v1/decide", &body).await.status == 200
                        }
                    };
                    ops.fetch_add(1, Ordering::Relaxed);
                    latency_us.fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
                    if !ok {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    println!("| minute | ops | mean latency ms | used_memory MB | keys | errors |");
    println!("|---|---|---|---|---|---|");
    let mut last_ops = 0;
    let mut last_latency = 0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(30).min(deadline.saturating_duration_since(Instant::now()))).await;
        let (n, l) = (ops.load(Ordering::Relaxed), latency_us.load(Ordering::Relaxed));
        let mean = if n > last_ops { (l - last_latency) as f64 / (n - last_ops) as f64 / 1000.0 } else { 0.0 };
        (last_ops, last_latency) = (n, l);
        println!(
            "| {:.1} | {n} | {mean:.2} | {:.1} | {} | {} |",
            (seconds as f64 - deadline.saturating_duration_since(Instant::now()).as_secs_f64()) / 60.0,
            info_number(&h, "memory", "used_memory").await as f64 / 1_048_576.0,
            keys(&h).await,
            errors.load(Ordering::Relaxed)
        );
    }
    for c in clients {
        c.await.unwrap();
    }
    // the last short holds lapse and are swept (the sweeper keeps running meanwhile)
    for _ in 0..60 {
        if h.root(&t).await.reserved == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sweeper.abort();
    // orphans: every expiry-index entry must name an ACTIVE reservation
    let tk = cycles_shared::keys::TenantKeys::new(&t.id);
    let due: Vec<String> = h.store.conn().zrange(tk.expiry_index(), 0, -1).await.unwrap();
    let mut orphans = 0;
    for rid in &due {
        let token = cycles_shared::ids::ReservationId::parse(rid).map(|r| r.token).unwrap_or_default();
        let rec: Option<String> = h.store.conn().get(tk.reservation(&token)).await.unwrap();
        if !rec.is_some_and(|r| r.contains("\"status\":\"ACTIVE\"")) {
            orphans += 1;
        }
    }
    let errors = errors.load(Ordering::Relaxed);
    println!(
        "\nsoak: {} operations, {errors} errors, {orphans} orphaned expiry-index entries",
        ops.load(Ordering::Relaxed)
    );
    let l = h.root(&t).await; // balance identity asserted
    assert_eq!(l.reserved, 0, "every hold was committed, released or expired");
    assert!(errors == 0 && orphans == 0, "soak failed");
}
