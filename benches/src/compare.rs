//! `--baseline REV`: this tree and the code of REV side by side in one run. Each is built in a
//! target directory of its own (`target/baseline/<sha>`, kept for the next run), started as
//! `cycles-local` on a Redis of its own, given the same fixture over HTTP, and driven by the
//! same client in alternating blocks, so that the machine's drift falls on both alike. For each
//! case it prints the new/baseline ratio of the p50 and of the CPU each process spent per
//! request (the gateway and its `redis-server`, from the kernel's per-thread run time, which
//! machine noise barely moves), and the memory a finished reservation keeps.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use cycles_shared::local::{free_port, EmbeddedRedis};
use cycles_shared::model::Unit;
use cycles_shared::provision::NewBudget;
use cycles_tests::{json, Harness, Tenant};
use serde_json::Value;

const ADMIN_KEY: &str = "bench-admin-key";

/// One server under test: its gateway process, its Redis, and a harness that talks to both.
struct Server {
    label: String,
    gateway: tokio::process::Child,
    redis: EmbeddedRedis,
    h: Harness,
}

impl Server {
    async fn start(label: &str, binary: &Path) -> Server {
        let redis = EmbeddedRedis::start(&[]).await.expect("redis-server");
        let (port, admin_port) = (free_port().unwrap(), free_port().unwrap());
        let gateway = tokio::process::Command::new(binary)
            // requests only: the background loops (the sweep, webhook delivery) would land
            // their CPU in whichever case runs when they wake, and builds differ in them; the
            // sweep's compaction is measured apart (`memory_per_reservation`)
            .args(["--port", &port.to_string(), "--admin-port", &admin_port.to_string(), "--redis-url", &redis.url()])
            .args(knows_no_background(binary).then_some("--no-background"))
            .env("ADMIN_API_KEY", ADMIN_KEY)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let (base, admin_base) = (format!("http://127.0.0.1:{port}"), format!("http://127.0.0.1:{admin_port}"));
        // Every server's Redis on one core, every gateway on the other (when the machine has
        // two or more): a process the scheduler placed on another core than its counterpart
        // ran beside other neighbours and caches, which moved one build's CPU by several percent.
        pin(redis.pid(), 1);
        pin(gateway.id(), 0);
        let h = Harness::remote(base, admin_base, redis.url(), ADMIN_KEY.to_string()).await;
        for _ in 0..200 {
            if h.http.get(format!("{}/health/live", h.base)).send().await.is_ok() {
                return Server { label: label.to_string(), gateway, redis, h };
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("{label} ({}) did not answer", binary.display());
    }

    /// CPU seconds so far of the gateway and of its Redis.
    fn cpu(&self) -> (f64, f64) {
        (cpu_seconds(self.gateway.id().unwrap_or(0)), cpu_seconds(self.redis.pid().unwrap_or(0)))
    }

    /// The gateway's read and write system calls so far.
    fn io_calls(&self) -> u64 {
        io_calls(self.gateway.id().unwrap_or(0))
    }

    async fn used_memory(&self) -> i64 {
        super::data_memory(&self.h.store).await
    }
}

/// Pins process `pid` (and its threads) to CPU `cpu` with `taskset`, where there are two CPUs
/// or more and `taskset` is installed; otherwise leaves it where it is.
fn pin(pid: Option<u32>, cpu: usize) {
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let Some(pid) = pid.filter(|_| cpus >= 2) else { return };
    let _ = std::process::Command::new("taskset")
        .args(["-a", "-c", "-p", &cpu.to_string(), &pid.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether a `cycles-local` build has `--no-background` (serve requests only; older builds
/// always run their background loops).
pub fn knows_no_background(binary: &Path) -> bool {
    let help = std::process::Command::new(binary).arg("--help").output().map(|o| o.stderr).unwrap_or_default();
    String::from_utf8_lossy(&help).contains("--no-background")
}

/// On-CPU time of every thread of a process (`/proc/<pid>/task/*/schedstat`, nanoseconds).
pub fn cpu_seconds(pid: u32) -> f64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0.0 };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .sum::<u64>() as f64
        / 1e9
}

/// Read and write system calls of every thread of a process so far (`syscr` + `syscw` of
/// `/proc/<pid>/io`): a count that machine noise cannot move, unlike CPU seconds.
pub fn io_calls(pid: u32) -> u64 {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap_or_default();
    io.lines()
        .filter(|l| l.starts_with("syscr:") || l.starts_with("syscw:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

fn run(cmd: &mut std::process::Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed ({status})");
}

/// `cycles-local` of the working tree, built in release mode.
pub fn build_current() -> PathBuf {
    eprintln!("building cycles-local of the working tree");
    run(std::process::Command::new("cargo").args([
        "build",
        "--release",
        "--locked",
        "-p",
        "cycles-functions",
        "--bin",
        "cycles-local",
    ]));
    workspace().join("target/release/cycles-local")
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `cycles-local` of revision `rev`, built from its own sources in its own target directory
/// (both kept under `target/baseline/<sha>`, so a second run reuses them).
/// The commit a revision names (panics on one this repository does not have).
pub fn resolve(rev: &str) -> String {
    let out = std::process::Command::new("git").args(["rev-parse", "--verify", &format!("{rev}^{{commit}}")]).output();
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_string(),
        _ => panic!("{rev} is not a revision of this repository"),
    }
}

pub fn build_baseline(rev: &str) -> PathBuf {
    let sha = resolve(rev);
    let dir = workspace().join("target/baseline").join(&sha[..12]);
    let src = dir.join("src");
    let binary = dir.join("target/release/cycles-local");
    if binary.exists() {
        return binary;
    }
    if !src.join("Cargo.toml").exists() {
        std::fs::create_dir_all(&src).unwrap();
        let mut archive = std::process::Command::new("git")
            .args(["archive", "--format=tar", &sha])
            .stdout(Stdio::piped())
            .spawn()
            .expect("git archive");
        run(std::process::Command::new("tar").arg("-x").arg("-C").arg(&src).stdin(archive.stdout.take().unwrap()));
        assert!(archive.wait().is_ok_and(|s| s.success()), "git archive {sha}");
    }
    eprintln!("building cycles-local of {rev} ({}) in {}", &sha[..12], dir.display());
    run(std::process::Command::new("cargo")
        .args(["build", "--release", "--locked", "-p", "cycles-functions", "--bin", "cycles-local"])
        .current_dir(&src)
        .env("CARGO_TARGET_DIR", dir.join("target")));
    binary
}

/// The reservation body of the benchmark's fixture (`BENCHMARKS.md`).
fn reserve_body(t: &Tenant, key: &str) -> Value {
    json!({"idempotency_key": key, "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "test-model"},
        "estimate": {"unit": "TOKENS", "amount": 100}, "ttl_ms": 60000, "overage_policy": "REJECT"})
}

/// The cases, as requests of one server: each call gets a fresh index.
#[derive(Clone, Copy, PartialEq)]
enum Case {
    Reserve,
    Commit,
    Release,
    Extend,
    Decide,
    Event,
    GetReservation,
    ReserveCommit,
    /// A reserve whose tenant has a policy with two v0.1.26 quota rules (never reached).
    ReserveTwoQuotas,
}

impl Case {
    fn name(self) -> &'static str {
        match self {
            Case::Reserve => "reserve",
            Case::Commit => "commit",
            Case::Release => "release",
            Case::Extend => "extend",
            Case::Decide => "decide",
            Case::Event => "event",
            Case::GetReservation => "GET reservation",
            Case::ReserveCommit => "reserve+commit (per request)",
            Case::ReserveTwoQuotas => "reserve, 2 quota rules",
        }
    }
    /// Requests one call makes.
    fn requests(self) -> f64 {
        if self == Case::ReserveCommit {
            2.0
        } else {
            1.0
        }
    }
}

/// What one server needs for the cases: a funded tenant, reservations made ahead for the
/// cases that settle one, and (where the build has policies) a tenant with two quota rules.
struct Fixture {
    t: Tenant,
    quota_tenant: Option<Tenant>,
    held: Vec<String>,
    one: String,
}

async fn fixture(s: &Server, held: usize) -> Fixture {
    let h = &s.h;
    let t = h.tenant().await;
    h.budget_with(NewBudget {
        overdraft_limit: 100_000,
        ..NewBudget::new(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, 1_000_000_000_000)
    })
    .await;
    let qt = h.funded(1_000_000_000_000).await;
    let body = json!({"tenant_id": qt.id, "name": "quotas", "scope_pattern": format!("tenant:{}", qt.id),
        "risk_class_quotas": [{"risk_class": "side_effect", "max_calls": 100_000, "window": "per_hour_tumbling"}],
        "action_quotas": [{"action_kind": "llm.completion", "max_calls": 100_000, "window": "per_day_tumbling"}]});
    let quota_tenant = (h.admin("POST", "/v1/admin/policies", Some(&body)).await.status == 201).then_some(qt);
    let mut ids = Vec::with_capacity(held);
    for i in 0..held {
        let r = h.post(&t.key, "/v1/reservations", &reserve_body(&t, &format!("held-{i}"))).await;
        ids.push(r.body["reservation_id"].as_str().expect("reserve").to_string());
    }
    let one = ids.pop().expect("one reservation");
    Fixture { t, quota_tenant, held: ids, one }
}

/// One call of `case` on server `s` (its `i`-th); whether it was answered as expected.
async fn call(s: &Server, f: &Fixture, case: Case, i: usize, next_held: &mut usize) -> bool {
    let (h, t) = (&s.h, &f.t);
    let mut held = || {
        *next_held += 1;
        f.held[*next_held - 1].clone()
    };
    match case {
        Case::Reserve => h.post(&t.key, "/v1/reservations", &reserve_body(t, &format!("r-{i}"))).await.status == 200,
        Case::ReserveTwoQuotas => match &f.quota_tenant {
            Some(q) => h.post(&q.key, "/v1/reservations", &reserve_body(q, &format!("q-{i}"))).await.status == 200,
            None => false,
        },
        Case::Commit => h.commit(t, &held(), 80).await.status == 200,
        Case::Release => h.release(t, &held()).await.status == 200,
        Case::Extend => h.extend(t, &held(), 1_000).await.status == 200,
        Case::Decide => {
            let body = json!({"idempotency_key": format!("d-{i}"), "subject": {"tenant": t.id},
                "action": {"kind": "llm.completion", "name": "test-model"}, "estimate": {"unit": "TOKENS", "amount": 100}});
            h.post(&t.key, "/v1/decide", &body).await.status == 200
        }
        Case::Event => {
            let body = json!({"idempotency_key": format!("ev-{i}"), "subject": {"tenant": t.id},
                "action": {"kind": "llm.completion", "name": "test-model"}, "actual": {"unit": "TOKENS", "amount": 50}});
            h.post(&t.key, "/v1/events", &body).await.status == 201
        }
        Case::GetReservation => h.get(&t.key, &format!("/v1/reservations/{}", f.one)).await.status == 200,
        Case::ReserveCommit => {
            let r = h.post(&t.key, "/v1/reservations", &reserve_body(t, &format!("rc-{i}"))).await;
            match r.body["reservation_id"].as_str() {
                Some(id) => h.commit(t, id, 80).await.status == 200,
                None => false,
            }
        }
    }
}

/// What one server spent on one case over all its blocks.
#[derive(Default, Clone)]
struct Spent {
    samples: Vec<f64>,
    /// CPU µs per request of the gateway and of Redis, block by block (one block per round).
    blocks: Vec<[f64; 2]>,
    gateway_io: u64,
    requests: f64,
    errors: usize,
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The median over rounds of new/base CPU per request of process `p` (0: gateway, 1: Redis):
/// each round's two blocks ran next to each other, so a ratio per round cancels the machine's
/// drift, and the median drops a block a neighbour's burst fell on (a sum keeps it).
fn paired_ratio(new: &Spent, base: &Spent, p: usize) -> f64 {
    median(round_ratios(new, base, p))
}

fn round_ratios(new: &Spent, base: &Spent, p: usize) -> Vec<f64> {
    new.blocks.iter().zip(&base.blocks).map(|(n, b)| n[p] / b[p]).collect()
}

/// A 95% confidence interval of the median of `v`, assuming nothing of its distribution: the
/// k-th smallest and k-th largest values, k the largest with P(Binomial(n, 1/2) < k) <= 2.5%
/// (each value falls below the median with probability 1/2). None below 6 values, where no
/// such k exists. With 40 rounds it spans the 14th to the 27th value.
fn median_interval(mut v: Vec<f64>) -> Option<(f64, f64)> {
    let n = v.len();
    let mut below = 0.5f64.powi(n as i32); // P(X < k) for k = 1: P(X = 0)
    let mut term = below;
    let mut k = 0;
    for i in 1..n {
        if below > 0.025 {
            break;
        }
        k = i;
        term *= (n - i + 1) as f64 / i as f64; // P(X = i)
        below += term;
    }
    if k == 0 {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    Some((v[k - 1], v[n - k]))
}

/// The paired ratio of process `p` with its interval, and the verdict on "at most 1.0": `yes`
/// when the whole interval is at or below 1, `no` when it is above, else `noise`.
fn paired_cell(new: &Spent, base: &Spent, p: usize) -> (String, Value) {
    let ratios = round_ratios(new, base, p);
    let mid = median(ratios.clone());
    match median_interval(ratios) {
        Some((lo, hi)) => {
            let verdict = if hi <= 1.0 {
                "yes"
            } else if lo > 1.0 {
                "no"
            } else {
                "noise"
            };
            (
                format!("{mid:.2} [{lo:.2}, {hi:.2}] {verdict}"),
                json!({"median": mid, "low": lo, "high": hi, "at_most_1": verdict}),
            )
        }
        None => (format!("{mid:.2}"), json!({"median": mid})),
    }
}

impl Spent {
    fn p50_ms(&self) -> f64 {
        median(self.samples.clone())
    }
    /// CPU µs per request: the median over blocks.
    fn gateway_us(&self) -> f64 {
        median(self.blocks.iter().map(|b| b[0]).collect())
    }
    fn redis_us(&self) -> f64 {
        median(self.blocks.iter().map(|b| b[1]).collect())
    }
    fn gateway_io(&self) -> f64 {
        self.gateway_io as f64 / self.requests
    }
}

pub struct CompareOpts {
    pub rev: String,
    /// Calls per block, and blocks per server, of each case.
    pub block: usize,
    pub rounds: usize,
    pub json: Option<String>,
}

/// Runs the comparison; false when any request failed.
pub async fn compare(o: &CompareOpts) -> bool {
    let baseline = build_baseline(&o.rev);
    let current = build_current();
    let new = Server::start("new", &current).await;
    let base = Server::start(&o.rev, &baseline).await;
    let servers = [&new, &base];
    let cases = [
        Case::Reserve,
        Case::Commit,
        Case::Release,
        Case::Extend,
        Case::Decide,
        Case::Event,
        Case::GetReservation,
        Case::ReserveCommit,
        Case::ReserveTwoQuotas,
    ];
    let settling = cases.iter().filter(|c| matches!(c, Case::Commit | Case::Release | Case::Extend)).count();
    // reservations held ahead for the cases that settle one, plus the warm-up's
    let held = settling * (o.block * o.rounds + 50) + 1;
    eprintln!("provisioning both servers ({held} held reservations each)");
    let fixtures = [fixture(&new, held).await, fixture(&base, held).await];
    let mut next_held = [0usize, 0];
    let mut report = Vec::new();
    let mut ok = true;
    for case in cases {
        let mut spent = [Spent::default(), Spent::default()];
        let mut index = 0usize;
        // warm-up, then blocks that alternate between the servers (which goes first alternates too)
        for (k, s) in servers.iter().enumerate() {
            for _ in 0..25 {
                call(s, &fixtures[k], case, index, &mut next_held[k]).await;
                index += 1;
            }
        }
        for round in 0..o.rounds {
            for turn in 0..2 {
                let k = (round + turn) % 2;
                let s = servers[k];
                let ((g0, r0), io0) = (s.cpu(), s.io_calls());
                for _ in 0..o.block {
                    let started = Instant::now();
                    let answered = call(s, &fixtures[k], case, index, &mut next_held[k]).await;
                    spent[k].samples.push(started.elapsed().as_secs_f64() * 1000.0 / case.requests());
                    spent[k].errors += usize::from(!answered);
                    index += 1;
                }
                let ((g1, r1), io1) = (s.cpu(), s.io_calls());
                let requests = o.block as f64 * case.requests();
                spent[k].blocks.push([(g1 - g0) * 1e6 / requests, (r1 - r0) * 1e6 / requests]);
                spent[k].gateway_io += io1 - io0;
                spent[k].requests += requests;
            }
        }
        // a baseline without quota rules has no such case
        let missing = case == Case::ReserveTwoQuotas && fixtures[1].quota_tenant.is_none();
        ok &= spent[0].errors == 0 && (missing || spent[1].errors == 0);
        report.push((case, spent, missing));
    }
    let (memory_new, sweep_us) = memory_per_reservation(&new).await;
    let memory = [memory_new, memory_per_reservation(&base).await.0];

    println!(
        "\nnew = this tree, base = {}; p50 per request; CPU per request of each process (the median over \
         blocks; new/base: the median over rounds of each round's ratio, its 95% interval, and whether the \
         ratio is at most 1.0: yes, no, or noise where the interval holds 1)\n",
        o.rev
    );
    println!("| case | p50 ms new | base | new/base | gateway µs new | base | new/base | Redis µs new | base | new/base | errors |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for (case, [n, b], missing) in &report {
        let ratio = |x: f64, y: f64| if *missing { "-".to_string() } else { format!("{:.2}", x / y) };
        let base_cell = |v: f64| if *missing { "-".to_string() } else { format!("{v:.1}") };
        // (each process's paired ratio and interval, once: the table and the JSON show the same)
        let cells = (!missing).then(|| [0, 1].map(|p| paired_cell(n, b, p)));
        let paired = |p: usize| cells.as_ref().map_or("-".to_string(), |c| c[p].0.clone());
        println!(
            "| {} | {:.3} | {} | {} | {:.1} | {} | {} | {:.1} | {} | {} | {}/{} |",
            case.name(),
            n.p50_ms(),
            if *missing { "-".to_string() } else { format!("{:.3}", b.p50_ms()) },
            ratio(n.p50_ms(), b.p50_ms()),
            n.gateway_us(),
            base_cell(b.gateway_us()),
            paired(0),
            n.redis_us(),
            base_cell(b.redis_us()),
            paired(1),
            n.errors,
            if *missing { 0 } else { b.errors },
        );
        let ratios = cells.as_ref().map(|[(_, gateway), (_, redis)]| {
            json!({"gateway_cpu": gateway["median"], "redis_cpu": redis["median"],
                "gateway_cpu_interval": gateway, "redis_cpu_interval": redis})
        });
        rows.push(
            json!({"case": case.name(), "new": side(n), "base": (!missing).then(|| side(b)), "new_over_base": ratios}),
        );
    }
    println!("\ngateway read and write system calls per request (/proc/<pid>/io: counted, not timed)\n");
    println!("| case | new | base |");
    println!("|---|---|---|");
    for (case, [n, b], missing) in &report {
        let base = if *missing { "-".to_string() } else { format!("{:.2}", b.gateway_io()) };
        println!("| {} | {:.2} | {} |", case.name(), n.gateway_io(), base);
    }
    let quotas = quota_over_plain(&new, &fixtures[0], o).await;
    if let Some([gateway, redis]) = quotas {
        println!(
            "\nreserve with 2 quota rules / plain reserve (new, the median over rounds of a block of each): \
             Redis CPU {redis:.2}, gateway CPU {gateway:.2}"
        );
    }
    println!(
        "\nmemory per finished reservation: new {} B, base {} B, new/base {:.2}",
        memory[0],
        memory[1],
        memory[0] as f64 / memory[1] as f64
    );
    println!("the sweep's visit (new: listing compaction, usage fold): Redis CPU {sweep_us:.1} µs per finished reservation, once");
    if let Some(path) = &o.json {
        let out = json!({"baseline": o.rev, "block": o.block, "rounds": o.rounds, "cases": rows,
            "memory_bytes_per_finished_reservation": {"new": memory[0], "base": memory[1]},
            "sweep_redis_cpu_us_per_reservation": sweep_us,
            "quota_over_plain": quotas.map(|[g, r]| json!({"gateway_cpu": g, "redis_cpu": r}))});
        std::fs::write(path, serde_json::to_string_pretty(&out).unwrap()).expect("write --json file");
    }
    ok
}

/// CPU per request of a reserve with two quota rules over a plain reserve on server `s`
/// (gateway, Redis): each round a block of each, next to each other (which goes first
/// alternates), and the median over rounds of each round's ratio. None without quota rules.
async fn quota_over_plain(s: &Server, f: &Fixture, o: &CompareOpts) -> Option<[f64; 2]> {
    f.quota_tenant.as_ref()?;
    let mut blocks: [Spent; 2] = Default::default();
    // (idempotency keys apart from the cases' own)
    let (mut index, mut next_held) = (1_000_000usize, 0usize);
    for round in 0..o.rounds {
        for turn in 0..2 {
            let k = (round + turn) % 2;
            let case = [Case::Reserve, Case::ReserveTwoQuotas][k];
            let (g0, r0) = s.cpu();
            for _ in 0..o.block {
                if !call(s, f, case, index, &mut next_held).await {
                    eprintln!("{}: a {} failed; no quota ratio", s.label, case.name());
                    return None;
                }
                index += 1;
            }
            let (g1, r1) = s.cpu();
            blocks[k].blocks.push([(g1 - g0) * 1e6 / o.block as f64, (r1 - r0) * 1e6 / o.block as f64]);
        }
    }
    let [plain, quotas] = &blocks;
    Some([paired_ratio(quotas, plain, 0), paired_ratio(quotas, plain, 1)])
}

fn side(s: &Spent) -> Value {
    json!({"p50_ms": s.p50_ms(), "gateway_cpu_us": s.gateway_us(), "redis_cpu_us": s.redis_us(),
        "gateway_io_calls": s.gateway_io(), "errors": s.errors})
}

/// Bytes of Redis memory per reservation reserved and committed (2,000 of them, after the
/// other cases; a fresh tenant), once the sweep has visited the tenant (compacting its listing,
/// folding its usage log), and the Redis CPU µs per reservation of that visit: this tree's sweep
/// runs on this tree's server only (a baseline keeps what its own build keeps).
async fn memory_per_reservation(s: &Server) -> (i64, f64) {
    const N: usize = 2_000;
    let t = s.h.funded(1_000_000_000_000).await;
    let before = s.used_memory().await;
    for i in 0..N {
        let r = s.h.post(&t.key, "/v1/reservations", &reserve_body(&t, &format!("m-{i}"))).await;
        let id = r.body["reservation_id"].as_str().unwrap_or_else(|| panic!("{}: reserve: {}", s.label, r.raw));
        assert_eq!(s.h.commit(&t, id, 80).await.status, 200, "{}: commit", s.label);
    }
    let cpu = s.cpu().1;
    if s.label == "new" {
        super::settle(&s.h.store, &t.id).await;
    }
    let sweep_us = (s.cpu().1 - cpu) * 1e6 / N as f64;
    ((s.used_memory().await - before) / N as i64, sweep_us)
}

#[cfg(test)]
mod tests {
    use super::median_interval;

    #[test]
    fn the_median_interval_takes_the_order_statistics_of_the_binomial() {
        let values = |n: usize| (1..=n).rev().map(|i| i as f64).collect::<Vec<_>>();
        assert_eq!(median_interval(values(40)), Some((14.0, 27.0)));
        assert_eq!(median_interval(values(12)), Some((3.0, 10.0)));
        assert_eq!(median_interval(values(6)), Some((1.0, 6.0)));
        assert_eq!(median_interval(values(5)), None);
    }
}
