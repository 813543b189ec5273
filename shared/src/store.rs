//! The Redis store: one connection type over standalone and cluster deployments, and the
//! script runner every operation goes through: FCALL of the operation's function in the
//! Cycles library (loaded on "Function not found"), or EVALSHA of the script where the server
//! has no Redis Functions (NOSCRIPT -> load and retry).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Script, Value};

use crate::error::{ApiError, ApiResult, ErrorCode};

/// A connection to standalone Redis or to a Redis Cluster; both reconnect by themselves and
/// are cheap to clone (multiplexed), so one is made per container at init and shared.
#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }
    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

#[derive(Clone)]
pub struct Store {
    conn: Conn,
    cluster: bool,
    /// Whether scripts are called as Redis Functions now, or by EVALSHA until a retry time.
    functions: Arc<Functions>,
}

/// When FCALL is tried again after the library could not be loaded or called. A server that
/// refuses Functions outright (Redis before 7, an ACL without FUNCTION or FCALL) is asked again
/// every 10 minutes; a load refused for a passing reason (out of memory, a read-only replica
/// after a failover, a failed save) is retried after 1 s, doubling up to a minute. Meanwhile
/// every script runs by EVALSHA.
struct Functions {
    started: Instant,
    /// Milliseconds since `started` before which EVALSHA is used (0: FCALL now).
    retry_at: AtomicU64,
    /// The wait after the next passing failure.
    backoff: AtomicU64,
}

const FIRST_BACKOFF_MS: u64 = 1_000;
const MAX_BACKOFF_MS: u64 = 60_000;
const REFUSED_BACKOFF_MS: u64 = 600_000;

impl Functions {
    fn new() -> Functions {
        Functions { started: Instant::now(), retry_at: AtomicU64::new(0), backoff: AtomicU64::new(FIRST_BACKOFF_MS) }
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn usable(&self) -> bool {
        let at = self.retry_at.load(Ordering::Relaxed);
        at == 0 || self.elapsed_ms() >= at
    }

    /// FCALL answered: Functions are in use (again).
    fn worked(&self) {
        if self.retry_at.swap(0, Ordering::Relaxed) != 0 {
            self.backoff.store(FIRST_BACKOFF_MS, Ordering::Relaxed);
            tracing::info!("Redis Functions in use again");
        }
    }

    /// The library could not be loaded or called: EVALSHA until the next retry.
    fn failed(&self, e: &redis::RedisError, refused: bool) {
        let wait = if refused {
            REFUSED_BACKOFF_MS
        } else {
            let wait = self.backoff.load(Ordering::Relaxed);
            self.backoff.store((wait * 2).min(MAX_BACKOFF_MS), Ordering::Relaxed);
            wait
        };
        self.retry_at.store(self.elapsed_ms() + wait, Ordering::Relaxed);
        tracing::warn!(error = %e, retry_in_ms = wait, "Redis Functions unavailable; running scripts by EVALSHA");
    }
}

impl Store {
    /// Connects to `url` (`redis://` or `rediss://`, with optional credentials). A
    /// comma-separated list of URLs, or a single node that reports `cluster_enabled:1`, selects
    /// cluster mode, so an ElastiCache cluster endpoint works as is.
    pub async fn connect(url: &str, timeout: Duration) -> redis::RedisResult<Store> {
        let seeds: Vec<&str> = url.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
        let cluster = seeds.len() > 1 || Self::reports_cluster(seeds[0], timeout).await?;
        let conn = if cluster {
            let client = ClusterClientBuilder::new(seeds)
                .connection_timeout(timeout)
                .response_timeout(timeout)
                // Resharding answers ASK/MOVED (followed at once) and TRYAGAIN while a multi-key
                // script's keys are split across two nodes: retry after short waits (the
                // client's default first wait alone is 1.28 s); `run` covers longer moves.
                .retries(8)
                .min_retry_wait(5)
                .max_retry_wait(250)
                .retry_wait_formula(10, 2)
                .build()?;
            Conn::Cluster(client.get_async_connection().await?)
        } else {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout))
                .set_number_of_retries(2);
            let client = redis::Client::open(seeds[0])?;
            Conn::Single(client.get_connection_manager_with_config(config).await?)
        };
        Ok(Store { conn, cluster, functions: Arc::new(Functions::new()) })
    }

    async fn reports_cluster(url: &str, timeout: Duration) -> redis::RedisResult<bool> {
        let client = redis::Client::open(url)?;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut c = client.get_multiplexed_async_connection_with_config(&config).await?;
        let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut c).await?;
        Ok(info.contains("cluster_enabled:1"))
    }

    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// A handle for ad-hoc commands (single-key reads and writes outside scripts).
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Runs one script (one round trip when warm) and decodes its reply.
    pub async fn run(&self, script: &scripts::Lua, keys: &[String], args: &[String]) -> ApiResult<Reply> {
        Reply::decode(self.call(script, keys, args).await?)
    }

    /// Runs one script and hands back its raw reply: FCALL of its function in the library
    /// (loading the library where it is missing), else EVALSHA.
    pub async fn call(
        &self,
        script: &scripts::Lua,
        keys: &[String],
        args: &[String],
    ) -> redis::RedisResult<Vec<String>> {
        if self.functions.usable() {
            let mut fcall = redis::cmd("FCALL");
            fcall.arg(&script.function).arg(keys.len()).arg(keys).arg(args);
            let call = |mut conn: Conn| {
                let fcall = &fcall;
                async move { fcall.query_async::<Vec<String>>(&mut conn).await }
            };
            match self.patiently(call).await {
                Err(e) if function_missing(&e) && self.load_library().await => match self.patiently(call).await {
                    Err(e) if function_missing(&e) => {} // a node that lost it again: EVALSHA this once
                    answer => return answer,
                },
                Err(e) if function_missing(&e) => {}
                Err(e) if functions_refused(&e) => self.functions.failed(&e, true),
                answer => {
                    self.functions.worked();
                    return answer;
                }
            }
        }
        let mut inv = script.script().prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let inv = &inv;
        self.patiently(|mut conn| async move { inv.invoke_async::<Vec<String>>(&mut conn).await }).await
    }

    /// Loads the Cycles library (on every master of a cluster). False when it is not there
    /// afterwards; a refusal makes the scripts run by EVALSHA until the next retry.
    async fn load_library(&self) -> bool {
        let loaded: redis::RedisResult<Value> =
            redis::cmd("FUNCTION").arg("LOAD").arg(&scripts::LIBRARY.code).query_async(&mut self.conn()).await;
        match loaded {
            Ok(_) => true,
            // Another container loaded it first (on some or all masters).
            Err(e) if e.to_string().contains("already exists") => true,
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => false,
            Err(e) => {
                self.functions.failed(&e, functions_refused(&e));
                false
            }
        }
    }

    /// Calls `call` until it is answered, retrying while a cluster slot moves: a command can be
    /// refused then (TRYAGAIN while its keys are split across two nodes, or a redirect the
    /// client ran out of retries for). Refused means not run, so it is retried until the move
    /// is over, within a bound.
    async fn patiently<F, Fut>(&self, call: F) -> redis::RedisResult<Vec<String>>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<Vec<String>>>,
    {
        let patience = Instant::now() + Duration::from_secs(3);
        let mut wait = Duration::from_millis(10);
        loop {
            match call(self.conn.clone()).await {
                Err(e) if self.cluster && slot_in_motion(&e) && Instant::now() + wait < patience => {
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_millis(200));
                }
                answer => return answer,
            }
        }
    }
}

/// The answer to FCALL of a function the server does not have (never loaded, or flushed).
fn function_missing(e: &redis::RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// FCALL itself refused: a server without Functions (before Redis 7) or an ACL without it.
fn functions_refused(e: &redis::RedisError) -> bool {
    e.code() == Some("NOPERM") || e.to_string().contains("unknown command")
}

/// Why a store refuses writes while it still answers: `OOM` (out of memory under `noeviction`),
/// `READONLY` (a replica), `MISCONF` (a failed save), `NOREPLICAS`; None for other failures.
pub fn write_refusal(e: &redis::RedisError) -> Option<&'static str> {
    let text = e.to_string();
    ["OOM", "READONLY", "MISCONF", "NOREPLICAS"]
        .into_iter()
        .find(|code| e.code() == Some(code) || text.contains(&format!("{code} ")))
}

/// Cluster answers that mean the command was not executed: its slot is moving (TRYAGAIN, or a
/// redirect left over once the client's own retries are spent) or the cluster is briefly down.
fn slot_in_motion(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("TRYAGAIN" | "ASK" | "MOVED" | "CLUSTERDOWN"))
}

/// What a script answered: its stored result (a JSON array of strings) plus the record's
/// current status and the server time, or an error. A reserve may instead answer status
/// `RECLAIM` with the ids of overdue reservations to expire before it is retried.
#[derive(Debug, Clone)]
pub struct Reply {
    pub result: Vec<String>,
    pub status: String,
    pub now_ms: i64,
    pub replay: bool,
    /// Further values some scripts return (commit/release: the reservation's subject and unit).
    pub context: Vec<String>,
}

impl Reply {
    fn decode(mut parts: Vec<String>) -> ApiResult<Reply> {
        let bad = || ApiError::internal("Malformed reply from the budget store");
        match parts.first().map(String::as_str) {
            Some("ERR") => {
                let code = parts.get(1).and_then(|c| ErrorCode::parse(c));
                let message = parts.get(2).cloned().unwrap_or_default();
                let extra = parts.get(3).cloned().unwrap_or_default();
                let Some(code) = code else {
                    return Err(ApiError::internal(message));
                };
                let mut e = ApiError::new(code, message);
                e.status = parts.get(4).and_then(|s| s.parse().ok());
                if code == ErrorCode::Unauthorized {
                    tracing::info!(reason = %extra, "api key rejected");
                } else if !extra.is_empty() {
                    e.details = serde_json::from_str(&extra).ok();
                }
                Err(e)
            }
            Some(tag @ ("OK" | "REPLAY" | "RECLAIM")) if parts.len() >= 4 => {
                let replay = tag == "REPLAY";
                let now_ms = parts[3].parse().map_err(|_| bad())?;
                let status = if tag == "RECLAIM" { tag.to_string() } else { std::mem::take(&mut parts[2]) };
                let result = serde_json::from_str(&parts[1]).map_err(|_| bad())?;
                let context = parts.split_off(4);
                Ok(Reply { result, status, now_ms, replay, context })
            }
            _ => Err(bad()),
        }
    }
}

/// The Lua scripts: one per atomic operation, sharing the helpers of `lua/lib.lua`.
pub mod scripts {
    use super::*;

    const LIB: &str = include_str!("../../lua/lib.lua");

    /// One operation's script. `Store::run` calls it as the function `function` of the
    /// library, or by EVALSHA of its own text (the helpers it needs, then its body), which is
    /// linked only on a server without Functions.
    pub struct Lua {
        pub function: String,
        body: &'static str,
        script: std::sync::OnceLock<Script>,
    }

    impl Lua {
        fn new(name: &str) -> Lua {
            let body = SOURCES.iter().find(|(n, _)| *n == name).expect("a listed script").1;
            Lua { function: format!("{name}_{}", LIBRARY.version), body, script: Default::default() }
        }

        /// The EVALSHA form.
        pub fn script(&self) -> &Script {
            self.script.get_or_init(|| Script::new(&link(LIB, self.body)))
        }
    }

    /// The Redis Functions library: the helpers once, then every script as a function. Loaded
    /// once per server, it spares each call the helpers' definitions that EVALSHA re-runs
    /// (about a tenth of a reserve's instructions in Redis). Names carry a hash of the code,
    /// so containers of two deployments never call each other's version.
    pub struct Library {
        pub version: String,
        pub code: String,
    }

    pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(LIB);
        for (name, body) in SOURCES {
            hash.update(name);
            hash.update(body);
        }
        let version = hex::encode(&hash.finalize()[..6]);
        // Helpers refer to KEYS and ARGV; in a library those are the upvalues each function
        // sets from its arguments (functions have no such globals).
        let mut code = format!("#!lua name=cycles_{version}\nlocal KEYS, ARGV\n{LIB}\n");
        for (name, body) in SOURCES {
            // Read-only functions carry `no-writes`, so they keep running while Redis refuses
            // writes for memory (functions without flags are refused outright then).
            let flags = if READ_ONLY.contains(name) { "{'no-writes'}" } else { "{}" };
            code.push_str(&format!(
                "redis.register_function{{function_name='{name}_{version}', flags={flags}, \
                 callback=function(keys, args)\nKEYS, ARGV = keys, args\n{body}\nend}}\n"
            ));
        }
        Library { version, code }
    });

    /// `body` preceded by the helpers of `lib` it uses, directly or through other helpers, in
    /// their original order. Redis runs a script's whole text on every call, so each script
    /// carries only what it needs. A helper is a top-level `local` definition of `lib`.
    pub fn link(lib: &str, body: &str) -> String {
        let mut items: Vec<(Vec<&str>, String)> = Vec::new();
        for line in lib.lines() {
            if let Some(def) = line.strip_prefix("local ") {
                let names = def.strip_prefix("function ").unwrap_or(def);
                let names = names.split(['=', '(']).next().unwrap_or_default();
                items.push((names.split(',').map(str::trim).collect(), String::new()));
            }
            if let Some((_, text)) = items.last_mut() {
                text.push_str(line);
                text.push('\n');
            }
        }
        let mut needed = identifiers(body);
        let mut kept = vec![false; items.len()];
        while let Some(i) = (0..items.len()).find(|&i| !kept[i] && items[i].0.iter().any(|n| needed.contains(n))) {
            kept[i] = true;
            needed.extend(identifiers(&items[i].1));
        }
        let mut out: String = items.iter().zip(&kept).filter(|(_, k)| **k).map(|(item, _)| item.1.as_str()).collect();
        out.push_str(body);
        out
    }

    /// The identifiers a piece of Lua mentions outside comments.
    fn identifiers(code: &str) -> std::collections::HashSet<&str> {
        code.lines()
            .map(|l| l.split("--").next().unwrap_or_default())
            .flat_map(|l| l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')))
            .filter(|w| w.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_'))
            .collect()
    }

    /// Declares each script and lists it for the library.
    macro_rules! scripts {
        ($($name:ident = $file:literal;)*) => {
            const SOURCES: &[(&str, &str)] = &[$(($file, include_str!(concat!("../../lua/", $file, ".lua")))),*];
            $(pub static $name: LazyLock<Lua> = LazyLock::new(|| Lua::new($file));)*
        };
    }

    /// The scripts that never write (registered `no-writes`).
    const READ_ONLY: [&str; 8] = [
        "get_reservation",
        "balances",
        "read_budgets",
        "list",
        "read_records",
        "read_metadata",
        "authenticate",
        "read_hashes",
    ];

    scripts! {
        HEALTH = "health";
        RESERVE = "reserve";
        COMMIT = "commit";
        RELEASE = "release";
        EXTEND = "extend";
        GET_RESERVATION = "get_reservation";
        PROVISION = "provision";
        EVALUATE = "evaluate";
        EXPIRE = "expire";
        SWEEP_SCHEDULE = "sweep_schedule";
        TRIM = "trim";
        EVENT = "event";
        BALANCES = "balances";
        READ_BUDGETS = "read_budgets";
        LIST = "list";
        READ_RECORDS = "read_records";
        READ_METADATA = "read_metadata";
        LIST_BACKFILL = "list_backfill";
        AUTHENTICATE = "authenticate";
        TENANT_CREATE = "tenant_create";
        TENANT_UPDATE = "tenant_update";
        TENANT_CASCADE = "tenant_cascade";
        API_KEY_CREATE = "api_key_create";
        API_KEY_UPDATE = "api_key_update";
        BUDGET_CREATE = "budget_create";
        BUDGET_UPDATE = "budget_update";
        BUDGET_FUND = "budget_fund";
        READ_HASHES = "read_hashes";
        WEBHOOK_WRITE = "webhook_write";
        DELIVERY_ENQUEUE = "delivery_enqueue";
        DELIVERY_CLAIM = "delivery_claim";
        DELIVERY_RECORD = "delivery_record";
        SYSTEM_EVENT = "system_event";
    }

    /// The trivial script of the benchmark floors.
    pub static PING: LazyLock<Script> = LazyLock::new(|| Script::new("return 1"));
}

#[cfg(test)]
mod tests {
    use super::scripts::link;

    const LIB: &str = "-- header\nlocal A, B = 1, 2\n\n-- uses A\nlocal function f(x)\n  return x + A\nend\n\
                       local function unused() return 0 end\nlocal T = {\n  g = function() return f(1) end,\n}\n";

    #[test]
    fn link_keeps_what_the_body_needs_transitively_in_order() {
        let out = link(LIB, "return T.g()");
        assert_eq!(out, "local A, B = 1, 2\n\n-- uses A\nlocal function f(x)\n  return x + A\nend\nlocal T = {\n  g = function() return f(1) end,\n}\nreturn T.g()");
    }

    #[test]
    fn link_ignores_names_in_comments() {
        assert_eq!(link(LIB, "-- unused f\nreturn B"), "local A, B = 1, 2\n\n-- uses A\n-- unused f\nreturn B");
    }
}
