//! The Redis store: one connection type over standalone and cluster deployments, and the
//! script runner every operation goes through: FCALL of the operation's function in its
//! library (loaded on "Function not found"), or EVALSHA of the script where the server has no
//! Redis Functions (NOSCRIPT -> load and retry). Scripts are declared by their callers (`ops`):
//! this module knows their contract (`Script`, `Call`), not their meaning.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use serde::de::DeserializeOwned;

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

impl Conn {
    /// Runs `cmd` (a write; none when only waiting) and then the durability wait `wait` in one
    /// round trip on the node that serves `key` (a standalone server is that node), so the wait
    /// covers the write: the command's reply and the copies the wait confirmed.
    async fn then_wait<T: redis::FromRedisValue>(
        &mut self,
        cmd: Option<&Cmd>,
        wait: &Cmd,
        key: &str,
    ) -> redis::RedisResult<(T, u32)> {
        use redis::cluster_routing::{Route, SingleNodeRoutingInfo, SlotAddr};
        let mut pipe = redis::pipe();
        if let Some(cmd) = cmd {
            pipe.add_command(cmd.clone());
        }
        pipe.add_command(wait.clone());
        let mut replies = match self {
            Conn::Single(c) => c.req_packed_commands(&pipe, 0, pipe.len()).await?,
            Conn::Cluster(c) => {
                let node = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
                c.route_pipeline(pipe.clone(), 0, pipe.len(), node).await?
            }
        };
        let copies = copies_of(replies.pop().ok_or_else(malformed_wait)?)?;
        let answer = replies.pop().unwrap_or(Value::Nil).extract_error()?;
        Ok((redis::from_redis_value(answer).map_err(redis::RedisError::from)?, copies))
    }
}

/// How far a state-changing script's writes must have travelled before its answer goes out
/// (`CYCLES_DURABILITY`). Redis acknowledges a write once its primary has it in memory, and
/// replicates afterwards: a failover can lose the last acknowledged writes unless the answer
/// waits for replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The primary has it (`none`): what Redis acknowledges.
    Primary,
    /// `replicas` replicas have it too (`replica`: WAIT after the script, in the same round
    /// trip and on the same connection).
    Replica { replicas: u32, timeout: Duration },
    /// As `Replica`, and the primary's append-only file has it on disk (`fsync`: WAITAOF 1,
    /// Redis 7.2+; a server without WAITAOF is waited on with WAIT, and the start says so).
    Fsync { replicas: u32, timeout: Duration },
}

impl Durability {
    /// The longest a write's answer may wait for its copies.
    pub fn wait(&self) -> Duration {
        match self {
            Durability::Primary => Duration::ZERO,
            Durability::Replica { timeout, .. } | Durability::Fsync { timeout, .. } => *timeout,
        }
    }

    /// The command that waits for the copies, and how to read how many there are.
    fn command(&self) -> Option<(Cmd, u32)> {
        match *self {
            Durability::Primary => None,
            Durability::Replica { replicas, timeout } => {
                let mut wait = redis::cmd("WAIT");
                wait.arg(replicas).arg(timeout.as_millis() as u64);
                Some((wait, replicas))
            }
            Durability::Fsync { replicas, timeout } => {
                let mut wait = redis::cmd("WAITAOF");
                wait.arg(1).arg(replicas).arg(timeout.as_millis() as u64);
                Some((wait, replicas))
            }
        }
    }
}

/// The answer to a write whose copies did not all arrive in time: it may or may not have
/// taken effect, and a retry with the same idempotency key settles which (it replays the
/// stored answer and waits again, so nothing is charged twice).
pub const NOT_DURABLE: &str = "The write was not confirmed by the store's replicas in time, so its outcome is \
    unknown; retry with the same idempotency_key (a retry replays it if it took effect)";

#[derive(Clone)]
pub struct Store {
    conn: Conn,
    cluster: bool,
    /// Whether scripts are called as Redis Functions now, or by EVALSHA until a retry time.
    functions: Arc<Functions>,
    durability: Durability,
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

/// Keeps one timer of this runtime pending at all times, due within half of `timeout`. Every
/// Redis call sets a response timer of `timeout`; when no timer is pending (a Lambda, or a
/// server without background loops), tokio wakes its I/O driver for each new one: an eventfd
/// write and one more `epoll_wait`, two of a request's eight system calls. With an earlier
/// timer pending, a new one needs no wake. The task ends with its runtime (none outside one).
fn keep_timers_pending(timeout: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
    let period = (timeout / 2).max(Duration::from_millis(10));
    runtime.spawn(async move {
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
        }
    });
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
        keep_timers_pending(timeout);
        Ok(Store { conn, cluster, functions: Arc::new(Functions::new()), durability: Durability::Primary })
    }

    /// This store, its state-changing scripts answering only once their writes have the copies
    /// `durability` asks for. A store without WAIT cannot give `replica` (the start stops
    /// saying so); `fsync` on one without WAITAOF (before Redis 7.2) waits for the replicas
    /// alone, and the log says so.
    pub async fn durable(mut self, durability: Durability) -> redis::RedisResult<Store> {
        self.durability = durability;
        if let Durability::Fsync { replicas, timeout } = durability {
            if !self.knows("WAITAOF").await? {
                tracing::warn!("CYCLES_DURABILITY=fsync: this Redis has no WAITAOF; answers wait for replicas only");
                self.durability = Durability::Replica { replicas, timeout };
            }
        }
        if self.durability != Durability::Primary && !self.knows("WAIT").await? {
            let why = "CYCLES_DURABILITY needs the WAIT command, which this store does not offer";
            return Err(redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, why)));
        }
        Ok(self)
    }

    /// Whether the server has `command`.
    async fn knows(&self, command: &str) -> redis::RedisResult<bool> {
        let info: Value = redis::cmd("COMMAND").arg("INFO").arg(command).query_async(&mut self.conn()).await?;
        Ok(matches!(info, Value::Array(ref v) if v.first().is_some_and(|c| *c != Value::Nil)))
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

    /// The eviction policies of the nodes that may delete keys to make room (a `maxmemory`
    /// limit with a `maxmemory-policy` other than `noeviction`), one per such node (every master
    /// of a cluster is asked); empty when none may. A ledger's keys must never be evicted: a
    /// budget, a quota counter or an idempotency record would vanish without a trace.
    pub async fn evicting_policies(&self) -> redis::RedisResult<Vec<String>> {
        let info: Value = redis::cmd("INFO").arg("memory").query_async(&mut self.conn()).await?;
        // (a cluster answers a map of each master's text)
        let texts = match info {
            Value::Map(nodes) => nodes.into_iter().map(|(_, text)| text).collect(),
            one => vec![one],
        };
        let mut policies = Vec::new();
        for text in texts {
            let info: redis::InfoDict = redis::from_redis_value(text)?;
            let limited = info.get::<u64>("maxmemory").is_some_and(|m| m > 0);
            match info.get::<String>("maxmemory_policy") {
                Some(policy) if limited && policy != "noeviction" => policies.push(policy),
                _ => {}
            }
        }
        Ok(policies)
    }

    /// A handle for ad-hoc commands (single-key reads and writes outside scripts).
    pub fn conn(&self) -> Conn {
        self.conn.clone()
    }

    /// Runs one typed script call (one round trip when warm) and decodes its reply. A script
    /// that may write answers only once the durability wait confirms its copies: 503 with
    /// `NOT_DURABLE` when they fall short.
    pub async fn run<C: Call>(&self, call: C) -> ApiResult<Reply<C::Reply>> {
        let (keys, args) = call.into_parts();
        let library = C::library();
        let wait = if C::SCRIPT.read_only { None } else { self.durability.command() };
        // (a script whose first key handed over before: its successor, directly)
        let script = library.successor(&C::SCRIPT, &keys).unwrap_or(C::SCRIPT);
        let (mut raw, mut copies) = self.call(library, &script, &keys, &args, wait.as_ref()).await?;
        let mut ran = script;
        // (`HANDOVER to`: from now on for this first key; `HANDOVER to once`: this call only)
        let handover = match raw.as_slice() {
            [tag, to] if tag == "HANDOVER" => Some((to.clone(), true)),
            [tag, to, once] if tag == "HANDOVER" && once == "once" => Some((to.clone(), false)),
            _ => None,
        };
        if let Some((to, lasting)) = handover.filter(|_| ran.name == C::SCRIPT.name) {
            ran = library.hand_over(&C::SCRIPT, &to, &keys, lasting)?;
            (raw, copies) = self.call(library, &ran, &keys, &args, wait.as_ref()).await?;
        }
        confirmed(wait.as_ref(), copies, ran.name)?;
        Reply::decode(ran.name, raw)
    }

    /// Runs one state-changing command outside the scripts (the owner of a new id, a registry
    /// entry) with the durability wait a script's write gets: one round trip to the node of
    /// `key`, 503 when the replicas do not confirm it.
    pub async fn write<T: redis::FromRedisValue>(&self, cmd: Cmd, key: &str) -> ApiResult<T> {
        let Some(wait) = self.durability.command() else { return Ok(cmd.query_async(&mut self.conn()).await?) };
        let (answer, copies) = self.conn().then_wait(Some(&cmd), &wait.0, key).await?;
        confirmed(Some(&wait), Some(copies), "write")?;
        Ok(answer)
    }

    /// Runs a call for its effect alone and keeps the store's own error, for a probe that tells
    /// kinds of refusal apart (`write_refusal`).
    pub async fn probe<C: Call>(&self, call: C) -> redis::RedisResult<()> {
        let (keys, args) = call.into_parts();
        self.call(C::library(), &C::SCRIPT, &keys, &args, None).await.map(|_| ())
    }

    /// Runs one script and hands back its raw reply: FCALL of its function in `library`
    /// (loading the library where it is missing), else EVALSHA. With `wait` (a durability wait
    /// and the copies it asks for), the wait follows the script on the node and connection
    /// that ran it, and the copies it confirmed come back beside the reply.
    async fn call(
        &self,
        library: &Library,
        script: &Script,
        keys: &[String],
        args: &[String],
        wait: Option<&(Cmd, u32)>,
    ) -> redis::RedisResult<(Vec<String>, Option<u32>)> {
        let node = keys.first().map(String::as_str).unwrap_or_default();
        if self.functions.usable() {
            // (made at its size: a reserve's forty-odd arguments grew it a dozen times)
            let size = keys.iter().chain(args).map(String::len).sum::<usize>() + 64;
            let mut fcall = Cmd::with_capacity(keys.len() + args.len() + 3, size);
            fcall.arg("FCALL").arg(library.function(script)).arg(keys.len()).arg(keys).arg(args);
            let call = |mut conn: Conn| {
                let fcall = &fcall;
                async move {
                    match wait {
                        None => Ok((fcall.query_async::<Vec<String>>(&mut conn).await?, None)),
                        Some((wait, _)) => {
                            let (answer, copies) = conn.then_wait(Some(fcall), wait, node).await?;
                            Ok((answer, Some(copies)))
                        }
                    }
                }
            };
            match self.patiently(call).await {
                Err(e) if function_missing(&e) && self.load_library(library).await => {
                    match self.patiently(call).await {
                        Err(e) if function_missing(&e) => {} // a node that lost it again: EVALSHA this once
                        answer => return answer,
                    }
                }
                Err(e) if function_missing(&e) => {}
                Err(e) if functions_refused(&e) => self.functions.failed(&e, true),
                answer => {
                    self.functions.worked();
                    return answer;
                }
            }
        }
        let mut inv = library.evalsha(script).prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        let inv = &inv;
        let answer = self.patiently(|mut conn| async move { inv.invoke_async::<Vec<String>>(&mut conn).await }).await?;
        let Some((wait, _)) = wait else { return Ok((answer, None)) };
        // (servers without Functions: the wait is a round trip of its own, on the same node)
        let ((), copies) = self.conn().then_wait(None, wait, node).await?;
        Ok((answer, Some(copies)))
    }

    /// Loads a library (on every master of a cluster). False when it is not there afterwards;
    /// a refusal makes the scripts run by EVALSHA until the next retry.
    async fn load_library(&self, library: &Library) -> bool {
        let loaded: redis::RedisResult<Value> =
            redis::cmd("FUNCTION").arg("LOAD").arg(&library.code).query_async(&mut self.conn()).await;
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
    async fn patiently<F, Fut, T>(&self, call: F) -> redis::RedisResult<T>
    where
        F: Fn(Conn) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<T>>,
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

/// 503 (`NOT_DURABLE`) when a durability wait confirmed fewer copies than it asked for.
fn confirmed(wait: Option<&(Cmd, u32)>, copies: Option<u32>, what: &str) -> ApiResult<()> {
    if let (Some((_, wanted)), Some(copies)) = (wait, copies) {
        if copies < *wanted {
            let mut e = ApiError::internal(NOT_DURABLE);
            e.status = Some(503);
            e.cause = Some(format!("{copies} of {wanted} replicas confirmed the {what}"));
            return Err(e);
        }
    }
    Ok(())
}

/// The copies a durability wait confirmed: WAIT answers the replicas that have the write,
/// WAITAOF the local fsyncs and the replicas' (a primary that did not fsync confirms nothing).
fn copies_of(reply: Value) -> redis::RedisResult<u32> {
    let n = match reply.extract_error()? {
        Value::Int(n) => n,
        Value::Array(v) => match v.as_slice() {
            [Value::Int(local), Value::Int(n)] => {
                if *local >= 1 {
                    *n
                } else {
                    0
                }
            }
            _ => return Err(malformed_wait()),
        },
        _ => return Err(malformed_wait()),
    };
    Ok(n.max(0) as u32)
}

fn malformed_wait() -> redis::RedisError {
    redis::RedisError::from((redis::ErrorKind::UnexpectedReturnType, "malformed durability wait reply"))
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

/// What a script answered: its result (JSON, decoded into the call's reply type), the
/// record's status where it has one, Redis's clock, and whether it is a replay of an earlier
/// answer. Scripts answer `"OK|REPLAY\x1f<status>\x1f<now>\x1f<result json>"` (one string:
/// Redis converts a table field by field), `{'OK', result json, status, now, attachment}` or
/// `{'ERR', code, message, details, http status}` (`lua/lib/reply.lua`: `ok`, `replayed`, `err`).
#[derive(Debug, Clone)]
pub struct Reply<T> {
    pub value: T,
    pub status: String,
    pub now_ms: i64,
    pub replay: bool,
    /// What a script hands over beside its answer, as stored (e.g. a record: inside the answer's
    /// JSON its quotes would be escaped by the script and unescaped here).
    pub attachment: Option<String>,
}

impl<T: DeserializeOwned> Reply<T> {
    fn decode(script: &str, parts: Vec<String>) -> ApiResult<Reply<T>> {
        let malformed = |why: &str| ApiError::fault(format!("the {script} script answered malformed ({why})"));
        let parts: Vec<&str> = match parts.as_slice() {
            [one] => unjoined(one),
            parts => parts.iter().map(String::as_str).collect(),
        };
        let mut parts = parts.into_iter();
        match parts.next() {
            Some("ERR") => {
                let (code, message) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                let (details, status) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
                let Some(code) = ErrorCode::parse(code) else { return Err(ApiError::fault(message)) };
                let mut e = ApiError::new(code, message);
                e.status = status.parse().ok();
                if code == ErrorCode::Unauthorized {
                    // the reason is for the log only: every key failure answers alike
                    e.cause = Some(format!("api key rejected: {details}"));
                } else if !details.is_empty() {
                    e.details = serde_json::from_str(details).ok();
                }
                Err(e)
            }
            Some(tag @ ("OK" | "REPLAY")) => {
                let replay = tag == "REPLAY";
                let result = parts.next().ok_or_else(|| malformed("no result"))?;
                let value = serde_json::from_str(result).map_err(|e| malformed(&e.to_string()))?;
                let status = parts.next().unwrap_or_default().to_owned();
                let now_ms = parts.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                Ok(Reply { value, status, now_ms, replay, attachment: parts.next().map(str::to_owned) })
            }
            _ => Err(malformed("no tag")),
        }
    }
}

/// A script's answer given as one string (`ok`, `replayed`) in the parts of one given as a
/// table: tag, result, status, clock (borrowed: nothing is copied).
fn unjoined(one: &str) -> Vec<&str> {
    let mut it = one.splitn(4, '\x1f');
    match (it.next(), it.next(), it.next(), it.next()) {
        (Some(tag), Some(status), Some(now), Some(result)) => vec![tag, result, status, now],
        _ => vec![one],
    }
}

/// One script's contract with its Lua body: its keys and arguments by name, in the order the
/// call passes them; a name ending in `..` takes all the rest as a list. The library gives the
/// body these names as the tables `K` and `A` (`K.tenant`, `A.digest`, `K.budgets[1]`).
#[derive(Debug, Clone, Copy)]
pub struct Script {
    pub name: &'static str,
    pub body: &'static str,
    pub keys: &'static [&'static str],
    pub args: &'static [&'static str],
    /// Registered `no-writes`: it keeps working while Redis refuses writes for memory.
    pub read_only: bool,
}

impl Script {
    /// Each key's or argument's name and the Lua that reads it from `from` (the call's array):
    /// one element, or (a name ending in `..`) the rest as a list.
    fn named<'a>(names: &[&'a str], from: &str) -> Vec<(&'a str, String)> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| match n.strip_suffix("..") {
                Some(list) => (list, format!("{{unpack({from}, {})}}", i + 1)),
                None => (*n, format!("{from}[{}]", i + 1)),
            })
            .collect()
    }

    /// The Lua that names the keys and arguments (`keys`/`args` are the call's arrays).
    pub(crate) fn prologue(&self, keys: &str, args: &str) -> String {
        let table = |names, from| {
            let fields: Vec<String> = Self::named(names, from).iter().map(|(n, e)| format!("{n} = {e}")).collect();
            format!("{{{}}}", fields.join(", "))
        };
        format!(
            "{}local K = {}\nlocal A = {}\n",
            self.slot_check(keys, true),
            table(self.keys, keys),
            table(self.args, args)
        )
    }

    /// The prologue's first line: a call whose slot is leaving this node answers TRYAGAIN before
    /// the script touches anything (`SLOT.moving` in `lua/lib/reply.lua` says why); on a
    /// server known not to be a cluster node, one field read. A script whose memos last one
    /// call (`per_call`: EVALSHA) reads at once: one read costs less than asking each time
    /// whether the server is a cluster node, and a server that is none answers it all the same.
    fn slot_check(&self, keys: &str, per_call: bool) -> String {
        if self.keys.is_empty() {
            return String::new();
        }
        let moving = if per_call {
            format!("SLOT.clustered = true local moving = SLOT.moving({keys}[1])")
        } else {
            format!("local moving = SLOT.clustered ~= false and SLOT.moving({keys}[1])")
        };
        format!("do {moving} if moving then return moving end end\n")
    }

    /// The same naming for a library function, whose `K` and `A` tables outlive a call (made
    /// once, by the function's block: `local K, A = {}, {}`): each call sets every name anew
    /// (lists are new tables), so no call sees another's values, and allocates no table for
    /// them. Scripts never write into `K` or `A` (`tests::scripts_never_write_into_k_or_a`).
    pub(crate) fn kept_prologue(&self) -> String {
        let mut out = self.slot_check("keys", false);
        out.push_str("local K, A = K, A\n");
        for (table, names, from) in [("K", self.keys, "keys"), ("A", self.args, "args")] {
            for (n, e) in Self::named(names, from) {
                out.push_str(&format!("{table}.{n} = {e}\n"));
            }
        }
        out
    }
}

/// A typed call of one script: its arguments by name, and the type its result decodes into.
pub trait Call: Sized {
    const SCRIPT: Script;
    type Reply: DeserializeOwned;
    /// The library the script belongs to.
    fn library() -> &'static Library;
    /// Keys and arguments in the order of `SCRIPT.keys` and `SCRIPT.args`.
    fn into_parts(self) -> (Vec<String>, Vec<String>);
}

/// A Redis Functions library: shared helpers once, then every script as a function. Loaded
/// once per server, it spares each call the helpers' definitions that EVALSHA re-runs (about a
/// tenth of a reserve's instructions in Redis). Names carry a hash of the code, so containers of
/// two deployments never call each other's version. Where a server has no Functions, each
/// script runs by EVALSHA of its own text (the helpers it uses, its prologue, its body).
pub struct Library {
    pub name: String,
    pub version: String,
    pub code: String,
    helpers: String,
    scripts: Vec<Script>,
    evalsha: std::sync::Mutex<std::collections::HashMap<&'static str, &'static redis::Script>>,
    /// The scripts that may answer `HANDOVER` (their bodies say so).
    handing_over: Vec<&'static str>,
    /// The first keys (a tenant's record) of calls that were handed over, with the script that
    /// handed them and its successor: calls with the same first key go to the successor directly.
    handed_over: std::sync::Mutex<std::collections::HashMap<String, (&'static str, Script)>>,
}

/// How many first keys a library remembers as handed over (then it starts over: a forgotten
/// one costs its next call one more round trip, nothing else).
const HANDED_OVER_KEPT: usize = 10_000;

impl Library {
    /// `helpers` is Lua of top-level `local` definitions shared by every script (a generated
    /// header of constants may open it).
    pub fn new(name: &str, helpers: String, scripts: &[Script]) -> Library {
        use sha2::{Digest, Sha256};
        let mut hash = Sha256::new();
        hash.update(&helpers);
        // (every part of the generated code: two builds whose functions differ never share a name)
        for s in scripts {
            hash.update(s.name);
            hash.update(s.kept_prologue());
            hash.update([u8::from(s.read_only)]);
            hash.update(s.body);
        }
        let version = hex::encode(&hash.finalize()[..6]);
        let mut code = format!("#!lua name={name}_{version}\n{helpers}\n");
        for s in scripts {
            // Read-only functions carry `no-writes`, so they keep running while Redis refuses
            // writes for memory (functions without flags are refused outright then).
            let flags = if s.read_only { "{'no-writes'}" } else { "{}" };
            code.push_str(&format!(
                "do\nlocal K, A = {{}}, {{}}\nredis.register_function{{function_name='{}_{version}', flags={flags}, \
                 callback=function(keys, args)\n{}{}\nend}}\nend\n",
                s.name,
                s.kept_prologue(),
                s.body
            ));
        }
        Library {
            name: name.to_string(),
            version,
            code,
            helpers,
            scripts: scripts.to_vec(),
            handing_over: scripts.iter().filter(|s| s.body.contains("'HANDOVER'")).map(|s| s.name).collect(),
            evalsha: Default::default(),
            handed_over: Default::default(),
        }
    }

    /// The script a call of `script` with `keys` goes to: its successor when a call with the
    /// same first key handed over to one before.
    fn successor(&self, script: &Script, keys: &[String]) -> Option<Script> {
        if !self.handing_over.contains(&script.name) {
            return None;
        }
        let handed = self.handed_over.lock().expect("handed over");
        handed.get(keys.first()?).filter(|(from, _)| *from == script.name).map(|(_, to)| *to)
    }

    /// `script` answered `HANDOVER` to the script named `to` (with the same keys and
    /// arguments: a plain tenant's reserve to the governed one), remembered for its first key
    /// when `lasting` (else for this call only: what it met will be up to date after it).
    fn hand_over(&self, script: &Script, to: &str, keys: &[String], lasting: bool) -> ApiResult<Script> {
        let Some(next) = self.scripts.iter().find(|s| s.name == to && s.keys == script.keys && s.args == script.args)
        else {
            return Err(ApiError::fault(format!(
                "the {} script handed over to {to}, which takes other keys",
                script.name
            )));
        };
        if let Some(first) = keys.first().filter(|_| lasting) {
            let mut handed = self.handed_over.lock().expect("handed over");
            if handed.len() >= HANDED_OVER_KEPT {
                handed.clear();
            }
            handed.insert(first.clone(), (script.name, *next));
        }
        Ok(*next)
    }

    pub fn function(&self, script: &Script) -> String {
        [script.name, "_", &self.version].concat()
    }

    /// The EVALSHA form of a script, linked the first time a server without Functions needs it.
    fn evalsha(&self, script: &Script) -> &'static redis::Script {
        let mut cache = self.evalsha.lock().expect("script cache");
        cache.entry(script.name).or_insert_with(|| {
            let body = format!("{}{}", script.prologue("KEYS", "ARGV"), script.body);
            Box::leak(Box::new(redis::Script::new(&link(&self.helpers, &body))))
        })
    }
}

/// `body` preceded by the helpers of `lib` it uses, directly or through other helpers, in
/// their original order. Redis runs a script's whole text on every call, so each script
/// carries only what it needs. A helper is a top-level `local` definition of `lib`.
pub fn link(lib: &str, body: &str) -> String {
    let items = definitions(lib);
    let mut needed = identifiers(body);
    let mut kept = vec![false; items.len()];
    while let Some(i) = (0..items.len()).find(|&i| !kept[i] && items[i].0.iter().any(|n| needed.contains(n))) {
        kept[i] = true;
        needed.extend(identifiers(&items[i].1));
    }
    let kept: Vec<&str> = items.iter().zip(&kept).filter(|(_, k)| **k).map(|(item, _)| item.1.as_str()).collect();
    let users = format!("{}{body}", kept.concat());
    let mut out: String = kept.iter().map(|text| keyed_by_use(text, &users)).collect();
    out.push_str(body);
    out
}

/// The generated `KEY` table (one key function per line, `keys::lua_table`) with only the
/// entries `users` calls: a script run by EVALSHA builds the table on every call, and most use
/// a handful of its sixty keys. Any other definition is kept whole.
fn keyed_by_use(text: &str, users: &str) -> String {
    if !text.starts_with("local KEY = {\n") {
        return text.to_string();
    }
    let used = |field: &str| {
        users.match_indices("KEY.").any(|(at, _)| {
            let rest = &users[at + 4..];
            rest.starts_with(field) && !rest[field.len()..].starts_with(|c: char| c.is_alphanumeric() || c == '_')
        })
    };
    text.lines()
        .filter(|line| match line.strip_prefix("  ").and_then(|l| l.split_once(" = function")) {
            Some((field, _)) => used(field),
            None => true,
        })
        .flat_map(|line| [line, "\n"])
        .collect()
}

/// The top-level definitions of a piece of Lua, in order: the names each `local` definition
/// defines, and its text (with the comment lines that precede it). Text before the first
/// definition is not part of any.
pub fn definitions(lib: &str) -> Vec<(Vec<&str>, String)> {
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
    items
}

/// The identifiers a piece of Lua uses outside comments and string literals (not fields, not
/// the keys of table constructors).
pub fn identifiers(code: &str) -> std::collections::HashSet<&str> {
    let mut out = std::collections::HashSet::new();
    for line in code.lines() {
        let bytes = line.as_bytes();
        let (mut i, mut start, mut quote) = (0, None::<usize>, None::<u8>);
        while i <= bytes.len() {
            let c = bytes.get(i).copied().unwrap_or(b' ');
            if let Some(q) = quote {
                if c == b'\\' {
                    i += 1;
                } else if c == q {
                    quote = None;
                }
            } else if c.is_ascii_alphanumeric() || c == b'_' {
                start.get_or_insert(i);
            } else {
                if let Some(s) = start.take() {
                    // a field (`t.name`, `t:name`) or a table constructor's key (`name = v`) is no use
                    let before = line[..s].trim_end();
                    let field = (before.ends_with('.') && !before.ends_with("..")) || before.ends_with(':');
                    let after = line[i..].trim_start();
                    let key = after.starts_with('=') && !after.starts_with("==");
                    if !bytes[s].is_ascii_digit() && !field && !key {
                        out.insert(&line[s..i]);
                    }
                }
                if c == b'\'' || c == b'"' {
                    quote = Some(c);
                } else if c == b'-' && bytes.get(i + 1) == Some(&b'-') {
                    break;
                }
            }
            i += 1;
        }
    }
    out
}

/// The trivial script of the benchmark floors.
pub static PING: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new("return 1"));

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = "-- header\nlocal A, B = 1, 2\n\n-- uses A\nlocal function f(x)\n  return x + A\nend\n\
                       local function unused() return 0 end\nlocal T = {\n  g = function() return f(1) end,\n}\n";

    #[test]
    fn link_keeps_what_the_body_needs_transitively_in_order() {
        let out = link(LIB, "return T.g()");
        assert_eq!(out, "local A, B = 1, 2\n\n-- uses A\nlocal function f(x)\n  return x + A\nend\nlocal T = {\n  g = function() return f(1) end,\n}\nreturn T.g()");
    }

    /// A script run by EVALSHA carries the `KEY` entries it calls, directly or through the
    /// helpers it links, and no other (a name that merely starts with a used one is not kept).
    #[test]
    fn link_keeps_the_key_entries_a_script_calls() {
        let lib = "local KEY = {\n  budget = function(p) return p .. ':b' end,\n  budget_by_code = function(p, c) \
                   return p .. ':b:' .. c end,\n  tenant = function(p) return p .. ':tenant' end,\n}\n\
                   local function t(p) return KEY.tenant(p) end\n";
        let out = link(lib, "return KEY.budget_by_code(P, 'x') .. t(P)");
        assert!(out.contains("  budget_by_code = function") && out.contains("  tenant = function"), "{out}");
        assert!(!out.contains("  budget = function"), "{out}");
        assert!(out.starts_with("local KEY = {\n") && out.contains("\n}\n"), "{out}");
        // the whole library (Functions) keeps the table as generated
        assert!(crate::ops::LIBRARY.code.matches(" = function(p").count() > 40);
    }

    /// A call that was handed over goes to the successor directly from then on, for its first
    /// key only (not after a handover for one call); a successor must take the same keys and
    /// arguments; the memory is bounded.
    #[test]
    fn a_handover_is_remembered_by_first_key_and_bounded() {
        let plain =
            Script { name: "plain", body: "return {'HANDOVER', 'full'}", keys: &["t"], args: &["a"], read_only: false };
        let full = Script { name: "full", body: "return 1", ..plain };
        let other = Script { name: "other", body: "return 2", keys: &["t", "u"], ..plain };
        let lib = Library::new("test", String::new(), &[plain, full, other]);
        let keys = |t: &str| vec![t.to_string()];
        assert!(lib.successor(&plain, &keys("t1")).is_none());
        assert_eq!(lib.hand_over(&plain, "full", &keys("t1"), false).unwrap().name, "full");
        assert!(lib.successor(&plain, &keys("t1")).is_none(), "handed over for one call only");
        assert_eq!(lib.hand_over(&plain, "full", &keys("t1"), true).unwrap().name, "full");
        assert_eq!(lib.successor(&plain, &keys("t1")).map(|s| s.name), Some("full"));
        assert!(lib.successor(&plain, &keys("t2")).is_none(), "another tenant still starts plain");
        assert!(lib.successor(&full, &keys("t1")).is_none(), "only the script that handed over");
        assert!(lib.hand_over(&plain, "other", &keys("t2"), true).is_err(), "other keys: a fault");
        assert!(lib.hand_over(&plain, "missing", &keys("t2"), true).is_err());
        for i in 0..HANDED_OVER_KEPT {
            lib.hand_over(&plain, "full", &keys(&format!("k{i}")), true).unwrap();
        }
        assert!(lib.handed_over.lock().unwrap().len() <= HANDED_OVER_KEPT);
        assert!(lib.successor(&plain, &keys("t1")).is_none(), "started over when full");
    }

    /// A library's name carries a hash of all its generated code: functions that differ only in
    /// what is generated around their bodies (a flag, a prologue) never share a name, so two
    /// builds never call each other's functions.
    #[test]
    fn a_library_is_named_by_all_its_code() {
        let s = Script { name: "s", body: "return 1", keys: &["t"], args: &["a"], read_only: false };
        let named = |s: Script| Library::new("test", String::new(), &[s]).version;
        assert_eq!(named(s), named(s));
        assert_ne!(named(s), named(Script { read_only: true, ..s }), "flags");
        assert_ne!(named(s), named(Script { keys: &[], ..s }), "prologue");
        assert_ne!(named(s), named(Script { body: "return 2", ..s }), "body");
    }

    #[test]
    fn link_ignores_names_in_comments() {
        assert_eq!(link(LIB, "-- unused f\nreturn B"), "local A, B = 1, 2\n\n-- uses A\n-- unused f\nreturn B");
    }

    #[test]
    fn prologues_name_keys_and_arguments() {
        let s = Script { name: "x", body: "", keys: &["tenant", "budgets.."], args: &["digest"], read_only: false };
        let check = |moving: &str| format!("do {moving} if moving then return moving end end\n");
        assert_eq!(
            s.prologue("KEYS", "ARGV"),
            check("SLOT.clustered = true local moving = SLOT.moving(KEYS[1])")
                + "local K = {tenant = KEYS[1], budgets = {unpack(KEYS, 2)}}\nlocal A = {digest = ARGV[1]}\n"
        );
        assert_eq!(
            s.kept_prologue(),
            check("local moving = SLOT.clustered ~= false and SLOT.moving(keys[1])")
                + "local K, A = K, A\nK.tenant = keys[1]\nK.budgets = {unpack(keys, 2)}\nA.digest = args[1]\n"
        );
    }

    fn parts(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn replies_decode_into_answers_replays_client_errors_and_faults() {
        let ok =
            Reply::<serde_json::Value>::decode("x", parts(&["OK", r#"{"a":1}"#, "ACTIVE", "1700000000000"])).unwrap();
        assert_eq!(
            (ok.value["a"].as_i64(), ok.status.as_str(), ok.now_ms, ok.replay),
            (Some(1), "ACTIVE", 1_700_000_000_000, false)
        );
        assert_eq!(ok.attachment, None);
        let again = Reply::<serde_json::Value>::decode("x", parts(&["REPLAY", "{}", "", "0"])).unwrap();
        assert!(again.replay);
        // one string (`ok`, `replayed`): tag, status, clock, then the result
        let one = Reply::<serde_json::Value>::decode("x", parts(&["REPLAY\x1fACTIVE\x1f17\x1f{\"a\":[1,2]}"])).unwrap();
        assert_eq!(
            (one.value["a"][1].as_i64(), one.status.as_str(), one.now_ms, one.replay, one.attachment),
            (Some(2), "ACTIVE", 17, true, None)
        );
        let e = Reply::<serde_json::Value>::decode("x", parts(&["OK\x1fACTIVE"])).unwrap_err();
        assert_eq!(e.status(), 500);
        // a fifth part is handed over as it is, quotes and separators unescaped
        let raw = "2\x1fA\x1f{\"tenant\":\"t\"}";
        let with = Reply::<serde_json::Value>::decode("x", parts(&["OK", "{}", "ACTIVE", "0", raw])).unwrap();
        assert_eq!(with.attachment.as_deref(), Some(raw));
        // a code the Rust side knows: the client's error, with its details and status
        let e = Reply::<serde_json::Value>::decode(
            "x",
            parts(&["ERR", "UNIT_MISMATCH", "wrong unit", r#"{"requested_unit":"CREDITS"}"#, ""]),
        )
        .unwrap_err();
        assert_eq!(
            (e.status(), e.code.as_str(), e.details.unwrap()["requested_unit"].as_str()),
            (400, "UNIT_MISMATCH", Some("CREDITS"))
        );
        // the reason of a key failure goes to the log, never to the caller
        let e = Reply::<serde_json::Value>::decode("x", parts(&["ERR", "UNAUTHORIZED", "no", "KEY_REVOKED", ""]))
            .unwrap_err();
        assert!(e.details.is_none() && e.cause.unwrap().contains("KEY_REVOKED"));
        // anything else is an internal fault: 500, no advice to retry
        let e = Reply::<serde_json::Value>::decode("x", parts(&["ERR", "SOMETHING_ELSE", "boom", "", ""])).unwrap_err();
        assert_eq!(
            (e.status(), e.code.as_str(), e.message.as_str()),
            (500, "INTERNAL_ERROR", crate::error::INTERNAL_FAULT)
        );
        assert!(!e.message.contains("retry") && e.cause.as_deref() == Some("boom"));
        let e = Reply::<serde_json::Value>::decode("x", parts(&["OK", "not json"])).unwrap_err();
        assert_eq!(e.status(), 500);
        assert!(Reply::<serde_json::Value>::decode("x", parts(&[])).is_err());
    }

    /// WAIT answers the replicas that have the write; WAITAOF (Redis 7.2+) the local fsyncs and
    /// the replicas' fsyncs: without the local one nothing counts as confirmed.
    #[test]
    fn durability_waits_read_their_confirmations() {
        use redis::Value::{Array, Int, Nil};
        assert_eq!(copies_of(Int(2)).unwrap(), 2);
        assert_eq!(copies_of(Int(0)).unwrap(), 0);
        assert_eq!(copies_of(Array(vec![Int(1), Int(2)])).unwrap(), 2);
        assert_eq!(copies_of(Array(vec![Int(0), Int(2)])).unwrap(), 0);
        assert!(copies_of(Array(vec![Int(1)])).is_err());
        assert!(copies_of(Nil).is_err());
        let waits =
            |d: Durability| d.command().map(|(c, n)| (String::from_utf8_lossy(&c.get_packed_command()).to_string(), n));
        assert!(waits(Durability::Primary).is_none());
        let ms = Duration::from_millis(250);
        let (wait, n) = waits(Durability::Replica { replicas: 2, timeout: ms }).unwrap();
        assert_eq!((wait.contains("WAIT\r\n$1\r\n2\r\n$3\r\n250"), n), (true, 2));
        let (wait, n) = waits(Durability::Fsync { replicas: 1, timeout: ms }).unwrap();
        assert_eq!((wait.contains("WAITAOF\r\n$1\r\n1\r\n$1\r\n1\r\n$3\r\n250"), n), (true, 1));
    }
}
