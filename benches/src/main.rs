//! `cycles-bench`: the benchmark suite (method and results in `BENCHMARKS.md`) against the local
//! gateway and a fresh Redis, with the machine's floors measured in the same run.
//!
//!   cargo run --release -p cycles-benches -- [--iterations N] [--warmup N] [--json FILE]
//!       [--lambda-dir target/lambda]   (binary sizes and cold starts of built functions)
//!   cargo run --release -p cycles-benches -- --lambda-smoke target/lambda
//!       (the shared artifact answers an API Gateway event as a few functions; exit 1 if not)
//!   cargo run --release -p cycles-benches -- --baseline REV [--block N] [--rounds N] [--json FILE]
//!       (this tree beside revision REV: p50 and CPU per request of each process, new/base)
//!   cargo run --release -p cycles-benches -- --costs [--update-costs] | --costs-of REV [--without-functions]
//!   cargo run --release -p cycles-benches -- --history NAME REV
//!       (a release's counts as benches/history/NAME.json, and the chart of all of them,
//!       benches/history/costs.svg)
//!       (instructions and Redis commands per operation, held against benches/costs.json;
//!       of another revision's build, printed beside the budget)
//!
//! Prints a markdown table (p50/p95/p99/min/max/mean, ops/s, errors, p50 ratio to the service
//! floor) and optionally writes the same numbers as JSON.

use std::process::ExitCode;
use std::time::{Duration, Instant};

mod cold_start;
mod compare;
mod costs;
mod soak;

use cycles_shared::model::Unit;
use cycles_shared::provision::NewBudget;
use cycles_shared::store::PING;
use cycles_tests::{json, Harness, Tenant};
use serde_json::Value;

struct Opts {
    iterations: usize,
    warmup: usize,
    json: Option<String>,
    lambda_dir: Option<String>,
    lambda_smoke: Option<String>,
    soak_seconds: Option<u64>,
    idle_tenants: usize,
    baseline: Option<String>,
    block: usize,
    rounds: usize,
    costs: bool,
    update_costs: bool,
    costs_of: Option<String>,
    without_functions: bool,
    /// `--history NAME REV`: record a release's counts and redraw the chart.
    history: Option<(String, String)>,
}

const USAGE: &str = "usage: cycles-bench [--iterations N] [--warmup N] [--json FILE] [--idle-tenants N]
       cycles-bench --baseline REV [--rounds N] [--block N] [--json FILE]   (this tree beside REV, CPU per request)
       cycles-bench --costs | --update-costs | --costs-of REV [--without-functions]   (instruction budgets)
       cycles-bench --soak SECONDS | --lambda-dir DIR | --lambda-smoke DIR | --history NAME REV
(BENCHMARKS.md says what each prints)";

fn opts() -> Opts {
    let mut o = Opts {
        iterations: 200,
        warmup: 50,
        json: None,
        lambda_dir: None,
        lambda_smoke: None,
        soak_seconds: None,
        idle_tenants: 100_000,
        baseline: None,
        block: 100,
        rounds: 12,
        costs: false,
        update_costs: false,
        costs_of: None,
        without_functions: false,
        history: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut num = || it.next().and_then(|v| v.parse().ok()).expect("a number");
        match a.as_str() {
            "--iterations" => o.iterations = num(),
            "--warmup" => o.warmup = num(),
            "--json" => o.json = it.next(),
            "--lambda-dir" => o.lambda_dir = it.next(),
            "--lambda-smoke" => o.lambda_smoke = it.next(),
            "--soak" => o.soak_seconds = it.next().and_then(|v| v.parse().ok()),
            "--idle-tenants" => o.idle_tenants = num(),
            "--baseline" => o.baseline = it.next(),
            "--block" => o.block = num(),
            "--rounds" => o.rounds = num(),
            "--costs" => o.costs = true,
            "--costs-of" => {
                o.costs = true;
                o.costs_of = it.next()
            }
            "--without-functions" => o.without_functions = true,
            "--update-costs" => {
                o.costs = true;
                o.update_costs = true
            }
            "--history" => o.history = it.next().zip(it.next()),
            "--bench" => {} // passed by `cargo bench`
            "--help" | "-h" => {
                println!("{USAGE}");
                std::process::exit(0)
            }
            other => {
                eprintln!("unknown argument {other}\n{USAGE}");
                std::process::exit(2)
            }
        }
    }
    o
}

/// Latency statistics of one case, in milliseconds.
struct Stats {
    name: String,
    samples: Vec<f64>,
    errors: usize,
    wall: Duration,
    /// Redis commands per operation and server time per script call (µs), from INFO commandstats.
    redis: Option<(f64, f64)>,
}

impl Stats {
    /// Nearest-rank percentile: index min(ceil(x/100*N) - 1, N - 1).
    fn pct(&self, x: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let n = s.len();
        if n == 0 {
            return f64::NAN;
        }
        let i = ((x / 100.0 * n as f64).ceil() as usize).saturating_sub(1).min(n - 1);
        s[i]
    }
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len().max(1) as f64
    }
    fn ops(&self) -> f64 {
        self.samples.len() as f64 / self.wall.as_secs_f64()
    }
    fn to_json(&self, floor_p50: f64) -> Value {
        json!({"case": self.name, "p50_ms": self.pct(50.0), "p95_ms": self.pct(95.0), "p99_ms": self.pct(99.0),
            "min_ms": self.pct(0.0), "max_ms": self.pct(100.0), "mean_ms": self.mean(), "ops_per_s": self.ops(),
            "errors": self.errors, "p50_ratio_to_service_floor": self.pct(50.0) / floor_p50,
            "redis_commands_per_op": self.redis.map(|r| r.0), "script_usec_per_call": self.redis.map(|r| r.1)})
    }
}

/// One single-connection case: call index -> success.
type Op<'a> = Box<dyn FnMut(usize) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + 'a>> + 'a>;

/// Measures the single-connection cases. First each case alone for `stat_calls` calls, for its
/// Redis commands and script time (`INFO commandstats` cannot tell interleaved cases apart);
/// then `warmup` untimed and `iterations` timed rounds that run every case once each, so slow
/// drift of a shared machine hits every case and the floors alike and the ratios stay fair.
async fn measure_interleaved(h: &Harness, ops: &mut [(&str, Op<'_>)], stat_calls: usize, o: &Opts) -> Vec<Stats> {
    let mut stats = Vec::with_capacity(ops.len());
    for (name, op) in ops.iter_mut() {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut h.store.conn()).await.unwrap();
        for i in 0..stat_calls {
            op(i).await;
        }
        let redis = Some(command_stats(h, stat_calls as f64).await);
        stats.push(Stats { name: name.to_string(), samples: Vec::new(), errors: 0, wall: Duration::ZERO, redis });
    }
    for round in 0..o.warmup + o.iterations {
        for ((_, op), st) in ops.iter_mut().zip(stats.iter_mut()) {
            let t = Instant::now();
            let ok = op(stat_calls + round).await;
            let elapsed = t.elapsed();
            if round >= o.warmup {
                st.samples.push(elapsed.as_secs_f64() * 1000.0);
                st.wall += elapsed;
                st.errors += usize::from(!ok);
            }
        }
    }
    stats
}

/// From `INFO commandstats` since the last reset: Redis commands per operation and the server
/// time per script call in µs (the stats commands themselves excluded).
async fn command_stats(h: &Harness, ops: f64) -> (f64, f64) {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut h.store.conn()).await.unwrap();
    let field = |line: &str, name: &str| -> f64 {
        line.split([':', ','])
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let (mut calls, mut script_calls, mut script_usec) = (0.0, 0.0, 0.0);
    for line in info.lines().filter(|l| l.starts_with("cmdstat_")) {
        if line.starts_with("cmdstat_config") || line.starts_with("cmdstat_info") {
            continue;
        }
        calls += field(line, "calls");
        if ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"].iter().any(|c| line.starts_with(c)) {
            script_calls += field(line, "calls");
            script_usec += field(line, "usec");
        }
    }
    (calls / ops, if script_calls > 0.0 { script_usec / script_calls } else { 0.0 })
}

fn reserve_body(t: &Tenant, key: &str) -> Value {
    json!({"idempotency_key": key, "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "test-model"},
        "estimate": {"unit": "TOKENS", "amount": 100}, "ttl_ms": 60000, "overage_policy": "REJECT"})
}

/// A decide of the reserve body (without its reserve-only fields); whether it answered 200.
async fn decide(h: &Harness, t: &Tenant, key: String) -> bool {
    let mut body = reserve_body(t, &key);
    for f in ["ttl_ms", "overage_policy"] {
        body.as_object_mut().unwrap().remove(f);
    }
    h.post(&t.key, "/v1/decide", &body).await.status == 200
}

async fn reserve(h: &Harness, t: &Tenant, key: String) -> Option<String> {
    let r = h.post(&t.key, "/v1/reservations", &reserve_body(t, &key)).await;
    r.body["reservation_id"].as_str().map(str::to_string)
}

async fn pre_create(h: &Harness, t: &Tenant, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(reserve(h, t, format!("{prefix}-{i}")).await.expect("pre-create reservation"));
    }
    ids
}

/// The sweep's visits to one tenant, as many as compaction needs (each compacts a bounded
/// batch): what its finished reservations keep after that is their steady state.
pub async fn settle(store: &cycles_shared::store::Store, tenant: &str) {
    let opts = cycles_shared::config::SweepOptions::default();
    loop {
        let mut report = cycles_shared::jobs::sweep::SweepReport::default();
        cycles_shared::jobs::sweep::sweep_tenant(store, tenant, &opts, &mut report).await.expect("sweep");
        if report.compacted == 0 {
            break;
        }
    }
}

/// Redis's `used_memory` less what no reservation keeps: its clients' buffers
/// (`mem_clients_normal`: a large reply leaves one grown for a while); and the key tables'
/// bucket arrays counted at one bucket (8 B) per key instead of as they are: they double at
/// each power of two (+512 KB at 65,536 keys, +260 B per reservation of a 2,000-reservation
/// window that a doubling falls in, whichever build it is). The Lua VMs' heaps are not in
/// `used_memory` (Lua allocates with the C library's `realloc`, not Redis's allocator), so
/// nothing is taken off for them: taking off `used_memory_vm_functions`, as this did, put the
/// swing of that heap's garbage (hundreds of KB) into the figure.
pub async fn data_memory(store: &cycles_shared::store::Store) -> i64 {
    let info: String = redis::cmd("INFO").arg("memory").arg("keyspace").query_async(&mut store.conn()).await.unwrap();
    let field = |name: &str| -> i64 {
        info.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    };
    let used = field("used_memory:") - field("mem_clients_normal:");
    let stats: redis::Value = redis::cmd("MEMORY").arg("STATS").query_async(&mut store.conn()).await.unwrap();
    used - bucket_bytes(&info, &stats).map_or(0, |(buckets, keys)| buckets - 8 * keys)
}

/// The bytes of the key tables' bucket arrays, and the keys: `MEMORY STATS`'s
/// `overhead.hashtable.main` and `.expires` of every database less their entries (Redis 7:
/// 24 B of entry and 16 B of object per key, 24 B of entry per expiry); None where the fields
/// or sizes are not those.
fn bucket_bytes(info: &str, stats: &redis::Value) -> Option<(i64, i64)> {
    // "db0:keys=N,expires=E,avg_ttl=..."
    let (mut keys, mut expires) = (0, 0);
    for part in info.lines().filter(|l| l.starts_with("db")).flat_map(|l| l.split([':', ','])) {
        match part.split_once('=').map(|(name, v)| (name, v.trim().parse::<i64>().unwrap_or(0))) {
            Some(("keys", n)) => keys += n,
            Some(("expires", n)) => expires += n,
            _ => {}
        }
    }
    fn overheads(v: &redis::Value, out: &mut i64) {
        let redis::Value::Array(items) = v else { return };
        for pair in items.chunks(2) {
            match pair {
                [redis::Value::BulkString(name), redis::Value::Int(n)]
                    if name == b"overhead.hashtable.main" || name == b"overhead.hashtable.expires" =>
                {
                    *out += n
                }
                [_, nested] => overheads(nested, out),
                _ => {}
            }
        }
    }
    let mut overhead = 0;
    overheads(stats, &mut overhead);
    let buckets = overhead - 40 * keys - 24 * expires;
    (overhead > 0 && buckets >= 0 && buckets <= 32 * (keys + expires) + 1024).then_some((buckets, keys + expires))
}

/// Reserves `n` reservations with `body` from 16 concurrent clients.
async fn fill(h: &Harness, t: &Tenant, prefix: &str, n: usize, extra: Value) -> Vec<String> {
    let ids = std::sync::Mutex::new(Vec::with_capacity(n));
    let next = std::sync::atomic::AtomicUsize::new(0);
    let worker = || async {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= n {
                return;
            }
            let mut body = reserve_body(t, &format!("{prefix}-{i}"));
            cycles_tests::merge(&mut body, extra.clone());
            let r = h.post(&t.key, "/v1/reservations", &body).await;
            ids.lock().unwrap().push(r.body["reservation_id"].as_str().expect("reserve").to_string());
        }
    };
    futures_join(16, worker).await;
    ids.into_inner().unwrap()
}

async fn futures_join<F, Fut>(n: usize, make: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut set = Vec::with_capacity(n);
    for _ in 0..n {
        set.push(make());
    }
    for f in set {
        f.await;
    }
}

/// `clients` concurrent loops for `dur`, each running `op(client, i)` repeatedly; latencies of
/// every call go into one `Stats` whose ops/s is calls per second of the whole run.
async fn concurrent<F, Fut>(name: String, clients: usize, dur: Duration, op: F) -> Stats
where
    F: Fn(usize, usize) -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + dur;
    let started = Instant::now();
    let loops = (0..clients).map(|c| {
        let op = &op;
        async move {
            let (mut samples, mut errors, mut i) = (Vec::new(), 0, 0);
            while Instant::now() < deadline {
                let t = Instant::now();
                if !op(c, i).await {
                    errors += 1;
                }
                samples.push(t.elapsed().as_secs_f64() * 1000.0);
                i += 1;
            }
            (samples, errors)
        }
    });
    let results = futures_join_all(loops.collect()).await;
    let wall = started.elapsed();
    let mut stats = Stats { name, samples: Vec::new(), errors: 0, wall, redis: None };
    for (samples, errors) in results {
        stats.samples.extend(samples);
        stats.errors += errors;
    }
    stats
}

/// Polls all futures concurrently on this task (no spawning: they borrow the harness).
async fn futures_join_all<T, Fut: std::future::Future<Output = T>>(futs: Vec<Fut>) -> Vec<T> {
    let mut futs: Vec<std::pin::Pin<Box<Fut>>> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<T>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (i, f) in futs.iter_mut().enumerate() {
            if out[i].is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => out[i] = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().map(|v| v.expect("every future finished")).collect()
}

/// Lifecycle throughput (reserve 100 then commit 80) at 8/16/32 clients.
async fn lifecycles(h: &Harness, dur: Duration) -> Vec<Stats> {
    let mut out = Vec::new();
    for clients in [8, 16, 32] {
        let t = h.funded(1_000_000_000).await;
        let t = &t;
        let stats =
            concurrent(format!("Lifecycle, {clients} clients (per lifecycle)"), clients, dur, |c, i| async move {
                match reserve(h, t, format!("lc{clients}-{c}-{i}")).await {
                    Some(id) => h.commit(t, &id, 80).await.status == 200,
                    None => false,
                }
            })
            .await;
        out.push(stats);
    }
    out
}

/// Fan-out: N clients reserving 100 for `dur` against one shared tenant budget, then against one
/// agent budget per client; afterwards every budget must hold exactly successes x 100.
async fn fan_out(h: &Harness, dur: Duration) -> Value {
    let mut report = serde_json::Map::new();
    for clients in [1usize, 10, 50, 200] {
        for per_agent in [false, true] {
            let t = h.funded(i64::MAX / 4).await;
            if per_agent {
                for c in 0..clients {
                    let b = NewBudget::new(&t.id, &format!("tenant:{}/agent:c{c}", t.id), Unit::Tokens, i64::MAX / 4);
                    h.budget_with(b).await;
                }
            }
            let t = &t;
            let successes: Vec<std::sync::atomic::AtomicI64> = (0..clients).map(|_| Default::default()).collect();
            let successes = &successes;
            let stats = concurrent(String::new(), clients, dur, |c, i| async move {
                let mut body = reserve_body(t, &format!("fo-{c}-{i}"));
                if per_agent {
                    body["subject"]["agent"] = json!(format!("c{c}"));
                }
                let ok = h.post(&t.key, "/v1/reservations", &body).await.status == 200;
                if ok {
                    successes[c].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                ok
            })
            .await;
            let total: i64 = successes.iter().map(|s| s.load(std::sync::atomic::Ordering::Relaxed)).sum();
            let mut ledger_ok = h.root(t).await.reserved == total * 100;
            if per_agent {
                for (c, s) in successes.iter().enumerate() {
                    let l = h.ledger(&t.id, &format!("tenant:{}/agent:c{c}", t.id), Unit::Tokens).await;
                    ledger_ok &= l.reserved == s.load(std::sync::atomic::Ordering::Relaxed) * 100;
                }
            }
            let mode = if per_agent { "agent_budgets" } else { "shared_budget" };
            report.insert(
                format!("fanout_{mode}_{clients}_clients"),
                json!({"reserves_per_s": stats.ops().round(), "p50_ms": stats.pct(50.0), "p99_ms": stats.pct(99.0),
                    "errors": stats.errors, "ledger_check": if ledger_ok { "ok" } else { "MISMATCH" }}),
            );
            assert!(ledger_ok, "fan-out ledger check failed: {mode}, {clients} clients");
        }
    }
    Value::Object(report)
}

/// Memory per finished reservation and expiry-sweep throughput.
async fn extras(h: &Harness, o: &Opts) -> Value {
    let n = (o.iterations * 25).max(100);
    // Memory: a finished reservation keeps one hash (its own idempotency record for reserve,
    // commit and release included) and one created-index entry until retention removes them.
    let t = h.funded(i64::MAX / 2).await;
    let before = data_memory(&h.store).await;
    let ids = fill(h, &t, "mem", n, json!({})).await;
    for id in &ids {
        assert_eq!(h.commit(&t, id, 80).await.status, 200);
    }
    let before_compaction = (data_memory(&h.store).await - before) / n as i64;
    // what a finished reservation keeps once the sweep has visited its tenant (within a pass:
    // the listing compacted, the usage log folded)
    settle(&h.store, &t.id).await;
    let per_reservation = (data_memory(&h.store).await - before) / n as i64;
    // The same, attributed key by key: the records plus the tenant's created stream, listing
    // index and listing chunks.
    let keys = cycles_shared::keys::TenantKeys::new(&t.id);
    let mut attributed: i64 = 0;
    for id in &ids {
        let token = cycles_shared::ids::ReservationId::parse(id).unwrap().token;
        let usage: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(keys.reservation(&token))
            .query_async(&mut h.store.conn())
            .await
            .unwrap();
        attributed += usage.unwrap_or(0);
    }
    let chunks: Vec<String> =
        redis::cmd("KEYS").arg(format!("{}*", keys.listing_chunks())).query_async(&mut h.store.conn()).await.unwrap();
    for index in [keys.created_stream(), keys.listing_index()].into_iter().chain(chunks) {
        let usage: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(index)
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut h.store.conn())
            .await
            .unwrap();
        attributed += usage.unwrap_or(0);
    }
    let attributed = attributed / n as i64;
    // Sweep throughput: n overdue reservations of one tenant.
    let t = h.funded(i64::MAX / 2).await;
    fill(h, &t, "exp", n, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let started = Instant::now();
    let mut report = cycles_shared::jobs::sweep::SweepReport::default();
    let opts = cycles_shared::jobs::sweep::SweepOptions::default();
    cycles_shared::jobs::sweep::sweep_tenant(&h.store, &t.id, &opts, &mut report).await.unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(report.expired, n as u64);
    json!({"finished_reservations": n, "memory_bytes_per_finished_reservation": per_reservation,
        "memory_bytes_per_finished_reservation_before_compaction": before_compaction,
        "memory_bytes_per_finished_reservation_by_key": attributed,
        "expiries": report.expired, "expiries_per_second": (report.expired as f64 / secs).round(),
        "evidence_seal_us": seal_us()})
}

/// CPU time (µs) of one CyclesEvidence receipt of a typical reserve: the envelope, its JCS
/// bytes, its id, the Ed25519 signature and the stored text.
fn seal_us() -> f64 {
    let (signer, _) = cycles_shared::evidence::Signer::generate("https://bench.invalid/v1", 0);
    let balance = json!({"scope": "tenant:t", "scope_path": "tenant:t", "remaining": {"unit": "TOKENS", "amount": 999_900},
        "reserved": {"unit": "TOKENS", "amount": 100}, "spent": {"unit": "TOKENS", "amount": 0},
        "allocated": {"unit": "TOKENS", "amount": 1_000_000}});
    let payload = json!({"request": reserve_body(&Tenant { id: "t".into(), key: String::new(), key_id: String::new() }, "k-1"),
        "response": {"decision": "ALLOW", "reservation_id": "t.abcdefghijklmn.AbCdEfGh", "affected_scopes": ["tenant:t"],
            "reserved": {"unit": "TOKENS", "amount": 100}, "expires_at_ms": 1_800_000_000_000_i64, "scope_path": "tenant:t",
            "balances": [balance]}});
    let rounds = 2_000;
    let started = Instant::now();
    for i in 0..rounds {
        std::hint::black_box(signer.seal(
            "reserve",
            payload.clone(),
            1_800_000_000_000 + i,
            "0af7651916cd43dd8448eb211c80319c",
        ));
    }
    (started.elapsed().as_secs_f64() * 1e6 / rounds as f64 * 10.0).round() / 10.0
}

/// Redis server time (ms) of every command since the last `CONFIG RESETSTAT` (the stats
/// commands themselves excluded).
async fn redis_ms(h: &Harness) -> f64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut h.store.conn()).await.unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_config") && !l.starts_with("cmdstat_info"))
        .filter_map(|l| l.split(',').find_map(|kv| kv.strip_prefix("usec=")).and_then(|v| v.parse::<f64>().ok()))
        .sum::<f64>()
        / 1000.0
}

/// One sweep pass at scale, on a Redis of its own (no other case's holds expire meanwhile):
/// `o.idle_tenants` registered tenants with nothing due (registered straight into the registry
/// and their slots), plus 1,000 overdue reservations of 10 tenants. Reports the pass that
/// expires them and a pass with nothing due (the idle part: the due indexes of every slot in
/// use, plus the retention crawl's bounded stretch).
async fn sweep_at_scale(o: &Opts) -> Value {
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = &Harness::start_on(redis.url(), Some(redis)).await;
    use cycles_shared::jobs::sweep::{sweep, SweepOptions};
    use cycles_shared::keys::{TenantKeys, SWEEP_SLOTS, TENANT_REGISTRY};
    for chunk in (0..o.idle_tenants).collect::<Vec<_>>().chunks(5000) {
        let mut p = redis::pipe();
        for i in chunk {
            let t = format!("idle-{i}");
            p.sadd(SWEEP_SLOTS, TenantKeys::new(&t).slot()).ignore();
            p.sadd(TENANT_REGISTRY, t).ignore();
        }
        let _: () = p.query_async(&mut h.store.conn()).await.unwrap();
    }
    let mut due = Vec::new();
    for _ in 0..10 {
        let t = h.funded(1_000_000).await;
        fill(h, &t, "due", 100, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
        due.push(t);
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let opts = &SweepOptions::default();
    let pass = || async move {
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut h.store.conn()).await.unwrap();
        let started = Instant::now();
        let r = sweep(&h.store, opts).await.unwrap();
        let wall = started.elapsed().as_secs_f64() * 1000.0;
        (r, wall, redis_ms(h).await)
    };
    let (busy, busy_wall, busy_redis) = pass().await;
    assert_eq!(busy.expired, 1000, "{busy:?}");
    for t in &due {
        assert_eq!(h.root(t).await.reserved, 0, "every due hold returned");
    }
    let (idle, idle_wall, idle_redis) = pass().await;
    assert_eq!(idle.expired, 0, "{idle:?}");
    let slots: usize = redis::cmd("SCARD").arg(SWEEP_SLOTS).query_async(&mut h.store.conn()).await.unwrap();
    json!({"idle_tenants": o.idle_tenants, "slots_in_use": slots, "due_reservations": 1000,
        "due_pass_expired": busy.expired, "due_pass_wall_ms": busy_wall.round(), "due_pass_redis_ms": busy_redis.round(),
        "idle_pass_wall_ms": idle_wall.round(), "idle_pass_redis_ms": (idle_redis * 10.0).round() / 10.0,
        "tenants_crawled_per_pass": idle.trimmed_tenants})
}

/// Time from an event (a funding call returning) to its signed delivery at a local receiver,
/// with the dispatcher looping at its default pace as in `cycles-local`; with `tar_pits`,
/// another tenant has that many subscriptions whose endpoints accept every delivery and never
/// answer, and gets an event for each measured one (a healthy tenant's latency should not change,
/// however many: issue 27).
async fn webhook_latency(h: &Harness, o: &Opts, tar_pits: usize) -> Value {
    let tar_pit = tar_pits > 0;
    use cycles_tests::receiver::{Receiver, Reply};
    let subscribe = |t: &Tenant, url: String| {
        let path = format!("/v1/admin/webhooks?tenant_id={}", t.id);
        async move {
            let body = json!({"url": url, "event_types": ["budget.funded"], "retry_policy": {"max_retries": 0}});
            let r = h.admin("POST", &path, Some(&body)).await;
            assert_eq!(r.status, 201, "{}", r.raw);
        }
    };
    let fund = |t: &Tenant| {
        let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
        async move {
            let credit = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 1}});
            assert_eq!(h.admin("POST", &path, Some(&credit)).await.status, 200);
        }
    };
    let t = h.funded(1_000_000).await;
    let rx = Receiver::start().await;
    subscribe(&t, rx.url.clone()).await;
    let pit = Receiver::start().await;
    pit.always(Reply::Stall(Duration::from_secs(600)));
    let slow = h.funded(1_000_000).await;
    for _ in 0..tar_pits {
        subscribe(&slow, pit.url.clone()).await;
    }
    let interval = cycles_shared::config::Config::from_env(None).webhooks.interval;
    let pump = tokio::spawn(h.dispatcher.clone().run_loop(interval, None));
    let n = (o.iterations / 5).clamp(5, 50);
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        if tar_pit {
            fund(&slow).await;
        }
        fund(&t).await;
        let started = Instant::now();
        while rx.received().len() <= i {
            assert!(started.elapsed() < Duration::from_secs(10), "webhook delivery did not arrive");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        samples.push(started.elapsed().as_secs_f64() * 1000.0);
        // de-phase the next event from the dispatcher's loop
        tokio::time::sleep(Duration::from_millis(37)).await;
    }
    pump.abort();
    let st = Stats { name: "event to webhook".into(), samples, errors: 0, wall: Duration::ZERO, redis: None };
    let mut out = json!({"deliveries": n, "p50_ms": (st.pct(50.0) * 10.0).round() / 10.0,
        "p95_ms": (st.pct(95.0) * 10.0).round() / 10.0, "dispatcher_interval_ms": interval.as_millis() as u64});
    if tar_pit {
        out["tar_pit_attempts_started"] = json!(pit.received().len());
        out["attempt_timeout_ms"] = json!(h.dispatcher.config.timeout.as_millis() as u64);
    }
    out
}

// The load generator runs on one thread and the gateway on another (`start_isolated`), each
// with its own scheduler, as a client and a Lambda container would: neither pays for the other's
// thread hand-offs, so the floors and the cases measure the same path.
// Returns rather than `process::exit`s, so the harness (and the redis-server it started) is
// dropped on every way out.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let o = opts();
    if let Some(rev) = &o.baseline {
        let c = compare::CompareOpts { rev: rev.clone(), block: o.block, rounds: o.rounds, json: o.json.clone() };
        return if compare::compare(&c).await { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    if let Some((name, rev)) = &o.history {
        return if costs::record_history(name, rev).await { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    if o.costs {
        return if costs::costs(o.update_costs, o.costs_of.as_deref(), o.without_functions).await {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        };
    }
    // CyclesEvidence for the tenants that ask for it (`tenant` mode), so one run measures
    // receipts beside the unchanged cases (every other tenant has none)
    let h = Harness::start_isolated_configured(|c| {
        c.evidence.mode = cycles_shared::config::EvidenceMode::Tenant;
        let (signer, _) = cycles_shared::evidence::Signer::generate("https://bench.invalid/v1", 0);
        c.evidence.signer = Some(signer);
    })
    .await;
    if let Some(dir) = &o.lambda_smoke {
        // the deployed shape: the shared artifact answers as a few functions, then stop
        let functions = ["health-live", "create-tenant", "create-reservation", "commit-reservation", "list-audit-logs"];
        let ok = cold_start::smoke(std::path::Path::new(dir), &h.redis_url, &functions).await;
        return if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE };
    }
    if let Some(seconds) = o.soak_seconds {
        soak::run(std::sync::Arc::new(h), seconds).await;
        return ExitCode::SUCCESS;
    }
    let a = h.tenant().await;
    h.budget_with(NewBudget {
        overdraft_limit: 100_000,
        ..NewBudget::new(&a.id, &format!("tenant:{}", a.id), Unit::Tokens, 1_000_000_000)
    })
    .await;
    // Each case's op gets a call index unique within the case (a stats pass, then the
    // interleaved warm-up and timed rounds), so pre-created ids are never reused.
    let stat_calls = o.iterations.min(100);
    let n = stat_calls + o.warmup + o.iterations;
    let commit_ids = pre_create(&h, &a, "c", n).await;
    let release_ids = pre_create(&h, &a, "rl", n).await;
    let extend_ids = pre_create(&h, &a, "ex", n).await;
    let one = reserve(&h, &a, "get-one".into()).await.unwrap();
    let balances_path = format!("/v1/balances?tenant={}", a.id);
    let lt = h.funded(1_000_000).await;
    fill(&h, &lt, "ten", 10, json!({})).await;
    // a tenant whose reserves two policies match (caps from one, a rate limit never reached
    // from the other), with a third that matches nothing
    let pt = h.funded(1_000_000_000).await;
    for (name, pattern, extra) in [
        ("caps", format!("tenant:{}", pt.id), json!({"caps": {"max_tokens": 4096}, "priority": 5})),
        ("rate", "*".to_string(), json!({"rate_limits": {"max_reservations_per_minute": 1_000_000}})),
        ("other", "agent:*".to_string(), json!({"caps": {"max_tokens": 1}})),
    ] {
        let mut body = json!({"tenant_id": pt.id, "name": name, "scope_pattern": pattern});
        cycles_tests::merge(&mut body, extra);
        assert_eq!(h.admin("POST", "/v1/admin/policies", Some(&body)).await.status, 201, "policy {name}");
    }
    // a tenant whose reserves two v0.1.26 quota rules count (a risk-class and a per-kind quota,
    // never reached)
    let qt = h.funded(1_000_000_000).await;
    let body = json!({"tenant_id": qt.id, "name": "quotas", "scope_pattern": format!("tenant:{}", qt.id),
        "risk_class_quotas": [{"risk_class": "side_effect", "max_calls": 100_000, "window": "per_hour_tumbling"}],
        "action_quotas": [{"action_kind": "llm.completion", "max_calls": 100_000, "window": "per_day_tumbling"}]});
    assert_eq!(h.admin("POST", "/v1/admin/policies", Some(&body)).await.status, 201, "quota policy");
    // a tenant with receipts on: the same calls as tenant `a`'s, each with its signed envelope
    let et = h.tenant().await;
    h.budget_with(NewBudget {
        overdraft_limit: 100_000,
        ..NewBudget::new(&et.id, &format!("tenant:{}", et.id), Unit::Tokens, 1_000_000_000)
    })
    .await;
    let on = json!({"evidence_enabled": true});
    assert_eq!(h.admin("PATCH", &format!("/v1/admin/tenants/{}", et.id), Some(&on)).await.status, 200);
    let evidence_commit_ids = pre_create(&h, &et, "ec", n).await;
    let (h, a, lt, pt, qt, et) = (&h, &a, &lt, &pt, &qt, &et);
    let mut ops: Vec<(&str, Op)> = vec![
        // Floors: HTTP without Redis, one trivial EVALSHA from this process, and both together.
        (
            "Floor: HTTP",
            Box::new(move |_| Box::pin(async move { h.send("GET", "/_floor/http", &[], None).await.status == 200 })),
        ),
        (
            "Floor: Redis EVALSHA",
            Box::new(move |_| {
                Box::pin(async move {
                    let mut c = h.store.conn();
                    PING.key("cy:{floor}:x").invoke_async::<i64>(&mut c).await.is_ok()
                })
            }),
        ),
        (
            "Floor: service (HTTP + EVALSHA)",
            Box::new(move |_| Box::pin(async move { h.send("GET", "/_floor/redis", &[], None).await.status == 200 })),
        ),
        ("Reserve", Box::new(move |i| Box::pin(async move { reserve(h, a, format!("r-{i}")).await.is_some() }))),
        (
            "Reserve (2 matching policies)",
            Box::new(move |i| Box::pin(async move { reserve(h, pt, format!("rp-{i}")).await.is_some() })),
        ),
        (
            "Reserve (2 quota rules)",
            Box::new(move |i| Box::pin(async move { reserve(h, qt, format!("rq-{i}")).await.is_some() })),
        ),
        (
            "Commit",
            Box::new(|i| {
                let id = &commit_ids[i];
                Box::pin(async move { h.commit(a, id, 80).await.status == 200 })
            }),
        ),
        (
            "Reserve (evidence)",
            Box::new(move |i| Box::pin(async move { reserve(h, et, format!("re-{i}")).await.is_some() })),
        ),
        (
            "Commit (evidence)",
            Box::new(|i| {
                let id = &evidence_commit_ids[i];
                Box::pin(async move { h.commit(et, id, 80).await.status == 200 })
            }),
        ),
        ("Decide (evidence)", Box::new(move |i| Box::pin(async move { decide(h, et, format!("de-{i}")).await }))),
        (
            "Release",
            Box::new(|i| {
                let id = &release_ids[i];
                Box::pin(async move { h.release(a, id).await.status == 200 })
            }),
        ),
        (
            "Extend",
            Box::new(|i| {
                let id = &extend_ids[i];
                Box::pin(async move { h.extend(a, id, 10_000).await.status == 200 })
            }),
        ),
        ("Decide", Box::new(move |i| Box::pin(async move { decide(h, a, format!("d-{i}")).await }))),
        (
            "Reserve+Commit",
            Box::new(move |i| {
                Box::pin(async move {
                    match reserve(h, a, format!("rc-{i}")).await {
                        Some(id) => h.commit(a, &id, 80).await.status == 200,
                        None => false,
                    }
                })
            }),
        ),
        (
            "Reserve+Release",
            Box::new(move |i| {
                Box::pin(async move {
                    match reserve(h, a, format!("rr-{i}")).await {
                        Some(id) => h.release(a, &id).await.status == 200,
                        None => false,
                    }
                })
            }),
        ),
        (
            "Event",
            Box::new(move |i| {
                Box::pin(async move {
                    let body = json!({"idempotency_key": format!("ev-{i}"), "subject": {"tenant": a.id},
                "action": {"kind": "llm.completion", "name": "test-model"}, "actual": {"unit": "TOKENS", "amount": 50}});
                    h.post(&a.key, "/v1/events", &body).await.status == 201
                })
            }),
        ),
        (
            "GET reservation",
            Box::new(|_| {
                let p = format!("/v1/reservations/{one}");
                Box::pin(async move { h.get(&a.key, &p).await.status == 200 })
            }),
        ),
        (
            "GET balances",
            Box::new(|_| {
                let p = &balances_path;
                Box::pin(async move { h.get(&a.key, p).await.status == 200 })
            }),
        ),
        (
            "LIST reservations (limit=10)",
            Box::new(move |_| Box::pin(async move { h.get(&lt.key, "/v1/reservations?limit=10").await.status == 200 })),
        ),
    ];
    let mut cases = measure_interleaved(h, &mut ops, stat_calls, &o).await;
    let floor = cases[2].pct(50.0);
    drop(ops);
    // Sorted listing at 1k and 10k rows (half in each of two tenants; the listed tenant holds half).
    // Seed both datasets first, then measure (10k first), so drift cannot favour either size.
    let mut datasets = Vec::new();
    for total in [1_000usize, 10_000] {
        let (x, y) = (h.funded(i64::MAX / 4).await, h.funded(i64::MAX / 4).await);
        fill(h, &x, &format!("sx{total}"), total / 2, json!({})).await;
        fill(h, &y, &format!("sy{total}"), total / 2, json!({})).await;
        datasets.push((total, x));
    }

    // Interleaved, request by request, so machine noise hits both sizes alike.
    let path = "/v1/reservations?limit=20&sort_by=created_at_ms&sort_dir=desc";
    let mut sorted: Vec<Stats> = datasets
        .iter()
        .map(|(total, _)| Stats {
            name: format!("Sorted list, {total} rows"),
            samples: Vec::new(),
            errors: 0,
            wall: Duration::ZERO,
            redis: None,
        })
        .collect();
    for i in 0..o.warmup + o.iterations {
        for (k, (_, x)) in datasets.iter().enumerate() {
            let t = Instant::now();
            let ok = h.get(&x.key, path).await.status == 200;
            let elapsed = t.elapsed();
            if i >= o.warmup {
                let st = &mut sorted[k];
                st.samples.push(elapsed.as_secs_f64() * 1000.0);
                st.wall += elapsed;
                st.errors += usize::from(!ok);
            }
        }
    }
    cases.extend(sorted);

    println!("| case | p50 ms | p95 ms | p99 ms | min ms | max ms | mean ms | ops/s | errors | p50 / service floor | Redis commands/op (incl. inside scripts) | script µs/call |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for c in &cases {
        let (cmds, usec) = c.redis.map(|(a, b)| (format!("{a:.2}"), format!("{b:.1}"))).unwrap_or_default();
        println!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.0} | {} | {:.2} | {cmds} | {usec} |",
            c.name,
            c.pct(50.0),
            c.pct(95.0),
            c.pct(99.0),
            c.pct(0.0),
            c.pct(100.0),
            c.mean(),
            c.ops(),
            c.errors,
            c.pct(50.0) / floor
        );
    }
    if let Some(path) = &o.json {
        let out = json!({"iterations": o.iterations, "warmup": o.warmup,
            "cases": cases.iter().map(|c| c.to_json(floor)).collect::<Vec<_>>()});
        std::fs::write(path, serde_json::to_string_pretty(&out).unwrap()).expect("write --json file");
    }
    // Concurrency cases: 5 s each (shorter in smoke runs).
    let dur = if o.iterations >= 50 { Duration::from_secs(5) } else { Duration::from_millis(300) };
    let lifecycle = lifecycles(h, dur).await;
    let fanout = fan_out(h, dur).await;
    println!();
    println!(
        "| lifecycle case | lifecycles/s | p50 ms | p95 ms | p99 ms | errors | lifecycles/s / service-floor req/s |"
    );
    println!("|---|---|---|---|---|---|---|");
    for l in &lifecycle {
        println!(
            "| {} | {:.0} | {:.3} | {:.3} | {:.3} | {} | {:.2} |",
            l.name,
            l.ops(),
            l.pct(50.0),
            l.pct(95.0),
            l.pct(99.0),
            l.errors,
            l.ops() / cases[2].ops()
        );
    }
    let mut extra = extras(h, &o).await;
    extra["fan_out"] = fanout;
    extra["event_to_webhook"] = webhook_latency(h, &o, 0).await;
    extra["event_to_webhook_beside_a_tar_pit"] = webhook_latency(h, &o, 1).await;
    extra["event_to_webhook_beside_40_tar_pits_of_one_tenant"] = webhook_latency(h, &o, 40).await;
    extra["sweep_at_scale"] = sweep_at_scale(&o).await;
    if let Some(dir) = &o.lambda_dir {
        let functions = cold_start::measure(std::path::Path::new(dir), &h.redis_url).await;
        println!();
        println!("| function | binary MB | cold start ms (process start to first answer) |");
        println!("|---|---|---|");
        for f in functions.as_array().unwrap() {
            println!(
                "| {} | {} | {} |",
                f["function"].as_str().unwrap(),
                f["size_mb"],
                f.get("cold_start_ms").unwrap_or(&json!("(scheduled)"))
            );
        }
        extra["functions"] = functions;
    }
    for l in &lifecycle {
        extra[l.name.as_str()] = json!({"lifecycles_per_s": l.ops().round(), "p50_ms": l.pct(50.0),
            "p95_ms": l.pct(95.0), "p99_ms": l.pct(99.0), "errors": l.errors,
            "ratio_to_service_floor_rps": l.ops() / cases[2].ops()});
    }
    println!();
    println!("| measure | value |");
    println!("|---|---|");
    for (k, v) in extra.as_object().unwrap() {
        if v.is_array() {
            continue; // printed as its own table
        }
        if let Value::Object(rows) = v {
            for (k2, v2) in rows {
                println!("| {k} {k2} | {v2} |");
            }
        } else {
            println!("| {k} | {v} |");
        }
    }
    if let Some(path) = &o.json {
        let mut out: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        out["extra"] = extra;
        std::fs::write(path, serde_json::to_string_pretty(&out).unwrap()).expect("write --json file");
    }
    let errors: usize = cases.iter().chain(&lifecycle).map(|c| c.errors).sum();
    if errors > 0 {
        eprintln!("{errors} requests failed");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use redis::Value;

    fn stat(name: &str, n: i64) -> [Value; 2] {
        [Value::BulkString(name.as_bytes().to_vec()), Value::Int(n)]
    }

    #[test]
    fn the_key_tables_buckets_are_their_overhead_less_their_entries() {
        let db: Vec<Value> = [stat("overhead.hashtable.main", 1_832), stat("overhead.hashtable.expires", 160)].concat();
        let stats = Value::Array(
            [stat("peak.allocated", 2_219_824).to_vec(), vec![Value::BulkString(b"db.0".to_vec()), Value::Array(db)]]
                .concat(),
        );
        let info = "# Keyspace\r\ndb0:keys=33,expires=4,avg_ttl=0\r\n";
        // 33 keys of 40 B and 4 expiries of 24 B: 1,416 of the 1,992 B; 576 B are buckets
        assert_eq!(super::bucket_bytes(info, &stats), Some((576, 37)));
        // not the sizes this knows: no correction
        assert_eq!(super::bucket_bytes("db0:keys=1000,expires=0\r\n", &stats), None);
        assert_eq!(super::bucket_bytes(info, &Value::Array(vec![])), None);
    }
}
