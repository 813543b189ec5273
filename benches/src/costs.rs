//! `--costs`: the deterministic cost of each hot operation, held against a budget file. Redis
//! and the gateway (`cycles-local`) each run under `valgrind --tool=callgrind`, which counts
//! the instructions a process executes: repeatable for the same build and inputs whatever
//! else the machine is doing, where seconds are not. Per operation it counts the instructions
//! of `redis-server` and of the gateway per request, and the Redis commands per request
//! (`INFO commandstats`, commands run inside scripts included). `benches/costs.json` holds the
//! budget; an operation over it by more than `TOLERANCE` fails the run (CI runs it), and
//! `--update-costs` writes today's counts as the new budget (say why in the commit).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use cycles_shared::local::free_port;
use cycles_shared::model::Unit;
use cycles_shared::provision::NewBudget;
use cycles_tests::{json, Harness, Tenant};
use serde_json::Value;

/// How far over its budget an operation may go before the check fails.
pub const TOLERANCE: f64 = 0.03;
/// Calls measured per operation (after a warm-up of `WARMUP`), a multiple of 50: Redis runs a
/// step of the Lua garbage collector every 50th script call, whoever makes it, so each window
/// holds a whole number of those steps. Lua's own collector runs a cycle every few dozen calls
/// too, and a window of 50 held one or none of them: the same operation read up to 13% apart
/// depending on what ran before it. 500 calls average over many cycles (runs agree within ~2%).
const CALLS: usize = 500;
const WARMUP: usize = 8;
const ADMIN_KEY: &str = "costs-admin-key";

fn budget_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("costs.json")
}

/// A process under callgrind, with instrumentation off until the first measurement.
struct Counted {
    child: tokio::process::Child,
    dir: PathBuf,
    name: &'static str,
    dumps: usize,
}

impl Counted {
    fn spawn(name: &'static str, dir: &Path, program: &str, args: &[String], env: &[(&str, &str)]) -> Counted {
        let mut cmd = tokio::process::Command::new("valgrind");
        cmd.arg("--tool=callgrind")
            .arg("--instr-atstart=no")
            .arg(format!("--callgrind-out-file={}/{name}.%p", dir.display()))
            .arg(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("valgrind (Debian: apt-get install -y valgrind)");
        Counted { child, dir: dir.to_path_buf(), name, dumps: 0 }
    }

    fn control(&self, args: &[&str]) {
        let pid = self.child.id().expect("running").to_string();
        let status = std::process::Command::new("callgrind_control")
            .args(args)
            .arg(&pid)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("callgrind_control");
        assert!(status.success(), "callgrind_control {args:?} {pid}");
    }

    /// Counting from now on, from zero.
    fn start(&self) {
        self.control(&["-i", "on"]);
        self.control(&["-z"]);
    }

    /// Instructions since the last `start` or `take`; counting goes on from zero. With `keep`,
    /// the profile of the window is kept at that path (for `callgrind_annotate`).
    async fn take(&mut self, keep: Option<PathBuf>) -> u64 {
        self.dumps += 1;
        let label = format!("{}-{}", self.name, self.dumps);
        self.control(&["-d", &label]);
        let trigger = format!("Trigger: dump {label}\n");
        for _ in 0..600 {
            for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                if text.contains(&trigger) {
                    if let Some(total) = text.lines().find_map(|l| l.strip_prefix("totals: ")) {
                        let _ = match &keep {
                            Some(to) => std::fs::rename(entry.path(), to),
                            None => std::fs::remove_file(entry.path()),
                        };
                        self.control(&["-z"]);
                        return total.trim().parse().expect("callgrind totals");
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("callgrind did not dump {label}");
    }
}

fn reserve_body(t: &Tenant, key: &str) -> Value {
    json!({"idempotency_key": key, "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "test-model"},
        "estimate": {"unit": "TOKENS", "amount": 100}, "ttl_ms": 60000, "overage_policy": "REJECT"})
}

/// The operations counted, with how each is called.
const OPERATIONS: [&str; 14] = [
    "reserve",
    "reserve (2 quota rules)",
    "reserve (1 policy)",
    "reserve (agent ledger)",
    "reserve (active-holds cap)",
    "reserve (new template ledger)",
    "commit",
    "release",
    "extend",
    "decide",
    "event",
    "get reservation",
    "list reservations",
    // (last, so its holds grow no set another row works on)
    "reserve (unbudgeted agent)",
];

/// The row of the sweep's visit, per finished reservation (no gateway: the sweep is a job).
const SWEEP_ROW: &str = "sweep visit (per finished reservation)";

/// The tenants of the operations that use a policy: two quota rules (`q`), a cap on active
/// holds (`g`), a budget template for every agent (`p`, whose `agent:known` has a ledger), and
/// a policy that changes nothing a reserve counts (`o`: what any policy costs); and one without
/// a policy whose agents have no ledger (`u`), kept apart so its holds grow no other row's sets.
struct Policed {
    o: Tenant,
    u: Tenant,
    q: Tenant,
    g: Tenant,
    p: Tenant,
}

/// A reserve for agent `agent` of `t`.
fn agent_reserve(t: &Tenant, key: &str, agent: &str) -> Value {
    let mut body = reserve_body(t, key);
    body["subject"]["agent"] = json!(agent);
    body
}

/// One call of operation `op` (its `i`-th); whether it was answered as expected.
async fn call(h: &Harness, t: &Tenant, x: &Policed, held: &mut Vec<String>, op: &str, i: usize) -> bool {
    let (q, g, p) = (&x.q, &x.g, &x.p);
    match op {
        "reserve" => h.post(&t.key, "/v1/reservations", &reserve_body(t, &format!("r-{i}"))).await.status == 200,
        "reserve (unbudgeted agent)" => {
            h.post(&x.u.key, "/v1/reservations", &agent_reserve(&x.u, &format!("u-{i}"), "unbudgeted")).await.status
                == 200
        }
        "reserve (2 quota rules)" => {
            h.post(&q.key, "/v1/reservations", &reserve_body(q, &format!("q-{i}"))).await.status == 200
        }
        "reserve (active-holds cap)" => {
            h.post(&g.key, "/v1/reservations", &reserve_body(g, &format!("g-{i}"))).await.status == 200
        }
        "reserve (1 policy)" => {
            h.post(&x.o.key, "/v1/reservations", &reserve_body(&x.o, &format!("o-{i}"))).await.status == 200
        }
        "reserve (agent ledger)" => {
            h.post(&p.key, "/v1/reservations", &agent_reserve(p, &format!("k-{i}"), "known")).await.status == 200
        }
        "reserve (new template ledger)" => {
            let body = agent_reserve(p, &format!("p-{i}"), &format!("new-{i}"));
            h.post(&p.key, "/v1/reservations", &body).await.status == 200
        }
        "commit" => h.commit(t, &held.pop().unwrap(), 80).await.status == 200,
        "release" => h.release(t, &held.pop().unwrap()).await.status == 200,
        "extend" => h.extend(t, &held.pop().unwrap(), 1_000).await.status == 200,
        "decide" => {
            let body = json!({"idempotency_key": format!("d-{i}"), "subject": {"tenant": t.id},
                "action": {"kind": "llm.completion", "name": "test-model"}, "estimate": {"unit": "TOKENS", "amount": 100}});
            h.post(&t.key, "/v1/decide", &body).await.status == 200
        }
        "event" => {
            let body = json!({"idempotency_key": format!("ev-{i}"), "subject": {"tenant": t.id},
                "action": {"kind": "llm.completion", "name": "test-model"}, "actual": {"unit": "TOKENS", "amount": 50}});
            h.post(&t.key, "/v1/events", &body).await.status == 201
        }
        "get reservation" => {
            let id = held.last().unwrap().clone();
            h.get(&t.key, &format!("/v1/reservations/{id}")).await.status == 200
        }
        "list reservations" => h.get(&t.key, "/v1/reservations?limit=10").await.status == 200,
        other => unreachable!("operation {other}"),
    }
}

/// Redis commands run since the last `CONFIG RESETSTAT` (the stats commands excluded).
async fn commands(h: &Harness) -> u64 {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut h.store.conn()).await.unwrap();
    info.lines()
        .filter(|l| l.starts_with("cmdstat_") && !l.starts_with("cmdstat_config") && !l.starts_with("cmdstat_info"))
        .filter_map(|l| l.split([':', ',']).find_map(|kv| kv.strip_prefix("calls=")))
        .filter_map(|v| v.parse::<u64>().ok())
        .sum()
}

async fn reset_stats(h: &Harness) {
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut h.store.conn()).await.unwrap();
}

/// Counts every operation; checks them against the budget (or, with `update`, writes it).
/// False when an operation is over its budget or a request failed. With `of`, counts the build
/// of that revision instead and only prints (its rows beside today's budget).
/// `without_functions`: the gateway connects as a user whose ACL refuses Redis Functions, so
/// every script runs by EVALSHA (as on Redis 6); the counts are only printed (the budgets are
/// Functions').
pub async fn costs(update: bool, of: Option<&str>, without_functions: bool) -> bool {
    let (measured, failed) = measure(of, without_functions).await;
    report(&measured, failed, update && !without_functions, of.is_some() || without_functions)
}

/// Records the counts of revision `rev` as release `name` under `benches/history/` and draws the
/// chart of every recorded release (`benches/history/costs.svg`).
pub async fn record_history(name: &str, rev: &str) -> bool {
    let (measured, failed) = measure(Some(rev), false).await;
    let sha = super::compare::resolve(rev);
    let out = json!({"release": name, "revision": sha, "calls_per_operation": CALLS, "operations": measured});
    let dir = history_dir();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(format!("{name}.json")), serde_json::to_string_pretty(&out).unwrap() + "\n").unwrap();
    draw_history();
    failed == 0
}

fn history_dir() -> std::path::PathBuf {
    budget_file().parent().unwrap().join("history")
}

/// `benches/history/costs.svg`: Redis and gateway instructions per request of each operation,
/// one bar per recorded release (oldest first), drawn from the JSON files beside it.
pub fn draw_history() {
    let mut releases: Vec<Value> = std::fs::read_dir(history_dir())
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .filter_map(|t| serde_json::from_str(&t).ok())
        .collect();
    releases.sort_by_key(|r| r["release"].as_str().unwrap_or_default().to_string());
    let colors = ["#9aa5b1", "#5b8def", "#1f9d55", "#d97706", "#b91c1c"];
    let (row, bar, left, scale) = (22.0 * releases.len() as f64 + 14.0, 20.0, 190.0, 1_000_000.0 / 560.0);
    let height = 60.0 + row * OPERATIONS.len() as f64;
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <text x=\"10\" y=\"20\" font-size=\"14\">Instructions per request: Redis (solid) and gateway (light), by release \
         (cycles-bench --costs; generated)</text>\n"
    );
    for (i, r) in releases.iter().enumerate() {
        let x = 10.0 + 140.0 * i as f64;
        svg += &format!(
            "<rect x=\"{x}\" y=\"30\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"40\">{}</text>\n",
            colors[i % colors.len()],
            x + 16.0,
            r["release"].as_str().unwrap_or("?")
        );
    }
    for (k, op) in OPERATIONS.iter().enumerate() {
        let y0 = 54.0 + row * k as f64;
        svg += &format!("<text x=\"10\" y=\"{}\">{op}</text>\n", y0 + 14.0);
        for (i, r) in releases.iter().enumerate() {
            let m = &r["operations"][op];
            let (redis, gateway) = (m["redis_instructions"].as_f64(), m["gateway_instructions"].as_f64());
            let (Some(redis), Some(gateway)) = (redis, gateway) else { continue };
            let y = y0 + 22.0 * i as f64;
            let color = colors[i % colors.len()];
            let (w1, w2) = (redis / scale, gateway / scale);
            svg += &format!(
                "<rect x=\"{left}\" y=\"{y}\" width=\"{w1:.1}\" height=\"{bar}\" fill=\"{color}\"/>\
                 <rect x=\"{:.1}\" y=\"{y}\" width=\"{w2:.1}\" height=\"{bar}\" fill=\"{color}\" fill-opacity=\"0.35\"/>\
                 <text x=\"{:.1}\" y=\"{}\">{:.0}k + {:.0}k</text>\n",
                left + w1,
                left + w1 + w2 + 6.0,
                y + 14.0,
                redis / 1000.0,
                gateway / 1000.0
            );
        }
    }
    svg += "</svg>\n";
    std::fs::write(history_dir().join("costs.svg"), svg).unwrap();
}

/// Counts every operation of the working tree's build, or of revision `of`: per operation the
/// instructions per request of Redis and of the gateway and Redis commands per request, and how
/// many measured requests failed.
async fn measure(of: Option<&str>, without_functions: bool) -> (BTreeMap<String, Value>, usize) {
    let binary = match of {
        Some(rev) => super::compare::build_baseline(rev),
        None => super::compare::build_current(),
    };
    // builds older than the flag run their background loops (a little noise in the counts)
    let quiet = super::compare::knows_no_background(&binary);
    let dir = std::env::temp_dir().join(format!("cycles-costs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let redis_port = free_port().unwrap();
    // one cron pass a second and no time-sliced rehashing: the count follows the requests
    let redis_args: Vec<String> = [
        "--port",
        &redis_port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--hz",
        "1",
        "--dynamic-hz",
        "no",
        "--activerehashing",
        "no",
        "--dir",
        dir.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut redis = Counted::spawn("redis", &dir, "redis-server", &redis_args, &[]);
    let mut redis_url = format!("redis://127.0.0.1:{redis_port}");
    wait_for(&format!("127.0.0.1:{redis_port}")).await;
    if without_functions {
        let mut admin =
            redis::Client::open(redis_url.as_str()).unwrap().get_multiplexed_async_connection().await.unwrap();
        let mut acl = redis::cmd("ACL");
        acl.arg(&["SETUSER", "evalsha", "on", ">pw", "~*", "&*", "+@all", "-function", "-fcall", "-fcall_ro"]);
        let _: () = acl.query_async(&mut admin).await.expect("ACL SETUSER");
        redis_url = format!("redis://evalsha:pw@127.0.0.1:{redis_port}");
    }
    let (port, admin_port) = (free_port().unwrap(), free_port().unwrap());
    let gateway_args: Vec<String> =
        ["--port", &port.to_string(), "--admin-port", &admin_port.to_string(), "--redis-url", &redis_url]
            .iter()
            .map(|s| s.to_string())
            .chain(quiet.then(|| "--no-background".to_string()))
            .collect();
    let env = [("ADMIN_API_KEY", ADMIN_KEY), ("RUST_LOG", "error")];
    let mut gateway = Counted::spawn("gateway", &dir, binary.to_str().unwrap(), &gateway_args, &env);
    wait_for(&format!("127.0.0.1:{port}")).await;
    let h = Harness::remote(
        format!("http://127.0.0.1:{port}"),
        format!("http://127.0.0.1:{admin_port}"),
        redis_url,
        ADMIN_KEY.to_string(),
    )
    .await;

    let t = h.tenant().await;
    h.budget_with(NewBudget {
        overdraft_limit: 100_000,
        ..NewBudget::new(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, 1_000_000_000_000)
    })
    .await;
    let q = h.funded(1_000_000_000_000).await;
    let body = json!({"tenant_id": q.id, "name": "quotas", "scope_pattern": format!("tenant:{}", q.id),
        "risk_class_quotas": [{"risk_class": "side_effect", "max_calls": 100_000, "window": "per_hour_tumbling"}],
        "action_quotas": [{"action_kind": "llm.completion", "max_calls": 100_000, "window": "per_day_tumbling"}]});
    // (a build before action quotas has no such row)
    let quotas = h.admin("POST", "/v1/admin/policies", Some(&body)).await.status == 201;
    assert!(quotas || of.is_some(), "quota policy");
    let g = h.funded(1_000_000_000_000).await;
    let body = json!({"tenant_id": g.id, "name": "holds", "scope_pattern": format!("tenant:{}", g.id),
        "rate_limits": {"max_active_reservations": 1_000_000}});
    // (nor one before the runaway-agent guards)
    let guards = h.admin("POST", "/v1/admin/policies", Some(&body)).await.status == 201;
    assert!(guards || of.is_some(), "guard policy");
    let p = h.funded(1_000_000_000_000).await;
    h.budget(&p.id, &format!("tenant:{}/agent:known", p.id), Unit::Tokens, 1_000_000_000_000).await;
    let body = json!({"tenant_id": p.id, "name": "agents", "scope_pattern": "agent:*", "budget_template":
        {"unit": "TOKENS", "allocated": {"unit": "TOKENS", "amount": 1000}, "max_instances": 1_000_000}});
    h.admin("POST", "/v1/admin/policies", Some(&body)).await;
    let o = h.funded(1_000_000_000_000).await;
    let body = json!({"tenant_id": o.id, "name": "ttl", "scope_pattern": format!("tenant:{}", o.id),
        "reservation_ttl_override": {"max_extensions": 10}});
    h.admin("POST", "/v1/admin/policies", Some(&body)).await;
    let u = h.funded(1_000_000_000_000).await;
    let policed = Policed { o, u, q, g, p };
    // CYCLES_COSTS_ONLY=reserve,commit counts those operations only (a quicker loop while
    // taking one apart; never a budget check)
    // and CYCLES_COSTS_CALLS=N (a multiple of 50) counts over N calls instead
    let only = std::env::var("CYCLES_COSTS_ONLY").ok();
    let calls = std::env::var("CYCLES_COSTS_CALLS").ok().and_then(|n| n.parse().ok()).unwrap_or(CALLS);
    let wanted = |op: &str| only.as_deref().is_none_or(|o| o.split(',').any(|w| w == op));
    let holds = ["commit", "release", "extend", "get reservation"].iter().filter(|op| wanted(op)).count();
    let mut held = Vec::new();
    for i in 0..holds * (calls + WARMUP) + 1 {
        let r = h.post(&t.key, "/v1/reservations", &reserve_body(&t, &format!("held-{i}"))).await;
        held.push(r.body["reservation_id"].as_str().expect("reserve").to_string());
    }

    let mut measured: BTreeMap<String, Value> = BTreeMap::new();
    let mut failed = 0;
    // CYCLES_COSTS_PROFILES=DIR keeps each window's profiles there, to take an operation apart:
    // `callgrind_annotate --inclusive=yes DIR/reserve.redis`
    let profiles = std::env::var_os("CYCLES_COSTS_PROFILES").map(PathBuf::from);
    if let Some(d) = &profiles {
        std::fs::create_dir_all(d).unwrap();
    }
    redis.start();
    gateway.start();
    for (k, op) in OPERATIONS.iter().enumerate() {
        let unknown = (*op == "reserve (2 quota rules)" && !quotas)
            || (matches!(*op, "reserve (active-holds cap)" | "reserve (new template ledger)") && !guards);
        if unknown || !wanted(op) {
            continue;
        }
        for i in 0..WARMUP {
            call(&h, &t, &policed, &mut held, op, 1_000_000 * (k + 1) + i).await;
        }
        reset_stats(&h).await;
        redis.take(None).await;
        gateway.take(None).await;
        for i in 0..calls {
            if !call(&h, &t, &policed, &mut held, op, 1_000_000 * (k + 1) + WARMUP + i).await {
                failed += 1;
            }
        }
        let keep = |process: &str| profiles.as_ref().map(|d| d.join(format!("{}.{process}", op.replace(' ', "-"))));
        let redis_ir = redis.take(keep("redis")).await;
        let gateway_ir = gateway.take(keep("gateway")).await;
        let cmds = commands(&h).await;
        let per = |n: u64| (n as f64 / calls as f64).round() as u64;
        measured.insert(
            op.to_string(),
            json!({"redis_instructions": per(redis_ir), "gateway_instructions": per(gateway_ir),
                "redis_commands": cmds as f64 / calls as f64}),
        );
    }
    // The sweep's visit, per finished reservation it meets (writing its listing members from
    // the created stream or compacting them, and folding its usage entry): the work a reserve
    // and commit leave for later, counted so it cannot grow unseen. This build's sweep only (it
    // runs here, with this tree's library: a baseline's records are another build's).
    if of.is_none() && wanted(SWEEP_ROW) {
        let s = h.funded(1_000_000_000_000).await;
        for i in 0..calls {
            let r = h.post(&s.key, "/v1/reservations", &reserve_body(&s, &format!("s-{i}"))).await;
            let id = r.body["reservation_id"].as_str().expect("reserve").to_string();
            failed += usize::from(h.commit(&s, &id, 80).await.status != 200);
        }
        reset_stats(&h).await;
        redis.take(None).await;
        super::settle(&h.store, &s.id).await;
        let redis_ir = redis.take(profiles.as_ref().map(|d| d.join("sweep.redis"))).await;
        let per = |n: u64| (n as f64 / calls as f64).round() as u64;
        measured.insert(
            SWEEP_ROW.to_string(),
            json!({"redis_instructions": per(redis_ir), "gateway_instructions": 0,
                "redis_commands": commands(&h).await as f64 / calls as f64}),
        );
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&dir);
    (measured, failed)
}

/// Prints the counts beside the budget; checks them (or, with `update`, writes the budget).
fn report(measured: &BTreeMap<String, Value>, failed: usize, update: bool, other_build: bool) -> bool {
    let budget: BTreeMap<String, Value> = std::fs::read_to_string(budget_file())
        .ok()
        .and_then(|s| serde_json::from_str::<Value>(&s).ok())
        .and_then(|v| serde_json::from_value(v["operations"].clone()).ok())
        .unwrap_or_default();
    println!("| operation | Redis instructions | budget | gateway instructions | budget | Redis commands | budget |");
    println!("|---|---|---|---|---|---|---|");
    let mut over = Vec::new();
    for (op, m) in measured {
        let b = budget.get(op);
        let mut cell = |field: &str| -> String {
            let now = m[field].as_f64().unwrap_or(0.0);
            match b.and_then(|b| b[field].as_f64()) {
                Some(0.0) => "-".to_string(),
                Some(limit) => {
                    if now > limit * (1.0 + TOLERANCE) {
                        over.push(format!(
                            "{op}: {field} {now} > budget {limit} (+{:.1}%)",
                            (now / limit - 1.0) * 100.0
                        ));
                    }
                    format!("{:.2}", now / limit)
                }
                None => "(none)".to_string(),
            }
        };
        let (r, g, c) = (cell("redis_instructions"), cell("gateway_instructions"), cell("redis_commands"));
        println!(
            "| {op} | {} | {r} | {} | {g} | {} | {c} |",
            m["redis_instructions"], m["gateway_instructions"], m["redis_commands"]
        );
    }
    if failed > 0 {
        eprintln!("{failed} measured requests failed");
    }
    if other_build {
        return failed == 0;
    }
    if update {
        let out = json!({
            "about": "Instructions per request of redis-server and of the gateway (valgrind --tool=callgrind), and Redis \
                      commands per request, for a tenant that uses no optional feature (one policy with two quota rules, \
                      one with a cap on active holds, one with a budget template for the rows that say so). `cargo run --release -p cycles-benches -- --costs` checks them (fails above +3%); \
                      `--update-costs` rewrites this file: say in the commit why a budget rose.",
            "operations": measured,
        });
        std::fs::write(budget_file(), serde_json::to_string_pretty(&out).unwrap() + "\n").expect("write costs.json");
        println!("\nwrote {}", budget_file().display());
        return failed == 0;
    }
    for o in &over {
        eprintln!("over budget: {o}");
    }
    failed == 0 && over.is_empty()
}

async fn wait_for(addr: &str) {
    for _ in 0..600 {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("nothing answered on {addr}");
}
