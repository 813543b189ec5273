//! Test harness: a real Redis (`REDIS_URL` when set — e.g. a 3-master cluster as
//! `redis://127.0.0.1:7101,redis://...` — else a `redis-server` child on a free port), the
//! real handlers behind the local gateway on a free port, and helpers to provision tenants and
//! read ledgers straight from the store.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use cycles_shared::api::Plane;
use cycles_shared::config::{Config, DEV_PEPPER};
use cycles_shared::keys::TenantKeys;
use cycles_shared::local::{self, EmbeddedRedis};
use cycles_shared::model::Unit;
pub use cycles_shared::provision::{NewBudget, NewTenant};
use cycles_shared::store::Store;
use cycles_shared::App;
use redis::AsyncCommands;
use serde_json::Value;

pub use serde_json::json;

pub mod receiver;

pub struct Harness {
    /// The webhook dispatcher, driven explicitly by the tests (`deliver`).
    pub dispatcher: Arc<cycles_shared::jobs::dispatch::Dispatcher>,
    /// The runtime plane.
    pub base: String,
    /// The operator plane (tenants, keys, budgets, admin balances).
    pub admin_base: String,
    pub store: Store,
    pub http: reqwest::Client,
    pub admin_key: String,
    /// Present when this harness started its own redis-server.
    pub embedded: Option<EmbeddedRedis>,
    /// Keeps a Docker container (the testcontainers fallback) alive for the harness's life.
    _container: Option<Container>,
    /// Stops an isolated gateway's thread when the harness is dropped.
    _stop_gateway: Option<tokio::sync::oneshot::Sender<()>>,
    pub redis_url: String,
}

pub const ADMIN_KEY: &str = "test-admin-key";

type Container = Box<dyn std::any::Any + Send + Sync>;

/// Where the harness's Redis comes from: `REDIS_URL` if set, else a fresh `redis-server` child,
/// else (with the `docker` feature, when a Docker engine answers) a container through
/// testcontainers, else a panic that says how to get one.
pub async fn redis_for_tests() -> (String, Option<EmbeddedRedis>, Option<Container>) {
    if let Ok(url) = std::env::var("REDIS_URL") {
        if !url.is_empty() {
            return (url, None, None);
        }
    }
    let local_error = match EmbeddedRedis::start(&[]).await {
        Ok(r) => return (r.url(), Some(r), None),
        Err(e) => e,
    };
    match docker_redis().await {
        Ok((url, container)) => (url, None, Some(container)),
        Err(docker_error) => panic!(
            "no Redis for the tests: set REDIS_URL, or install redis-server \
             (Debian/Ubuntu: apt-get install -y redis-server), or build the tests with \
             `--features docker` on a machine with a Docker engine. \
             redis-server: {local_error}; docker: {docker_error}"
        ),
    }
}

#[cfg(feature = "docker")]
async fn docker_redis() -> Result<(String, Container), String> {
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::GenericImage;
    let container = GenericImage::new("redis", "7-alpine")
        .with_exposed_port(6379.tcp())
        .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
        .start()
        .await
        .map_err(|e| e.to_string())?;
    let port = container.get_host_port_ipv4(6379).await.map_err(|e| e.to_string())?;
    Ok((format!("redis://127.0.0.1:{port}"), Box::new(container)))
}

#[cfg(not(feature = "docker"))]
async fn docker_redis() -> Result<(String, Container), String> {
    Err("built without the `docker` feature".to_string())
}

/// Unique ids so tests sharing one Redis never see each other's data.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid_like()[..12])
}

fn uuid_like() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{:016x}", t ^ (n << 40) ^ (std::process::id() as u64) << 20).chars().rev().collect()
}

/// One HTTP response: status, headers, parsed JSON body.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: Value,
    pub raw: String,
}

impl Resp {
    pub fn error(&self) -> &str {
        self.body["error"].as_str().unwrap_or("")
    }
    /// Asserts an error answer: status, code, and the ErrorResponse shape.
    #[track_caller]
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!((self.status, self.error()), (status, code), "unexpected answer: {}", self.raw);
        assert_error_shape(self);
    }
    /// Asserts a 200 whose body carries no `null` (optional properties are omitted).
    #[track_caller]
    pub fn assert_ok(&self) -> &Value {
        assert_eq!(self.status, 200, "unexpected answer: {}", self.raw);
        assert_no_nulls(&self.body, &self.raw);
        &self.body
    }
    /// Asserts a 201 whose body carries no `null`.
    #[track_caller]
    pub fn assert_created(&self) -> &Value {
        assert_eq!(self.status, 201, "unexpected answer: {}", self.raw);
        assert_no_nulls(&self.body, &self.raw);
        &self.body
    }
}

/// No property of a response is `null` (client-supplied free-form maps excepted).
#[track_caller]
pub fn assert_no_nulls(v: &Value, raw: &str) {
    match v {
        Value::Null => panic!("null in response: {raw}"),
        Value::Array(items) => items.iter().for_each(|i| assert_no_nulls(i, raw)),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| !matches!(k.as_str(), "metadata" | "committed_metadata" | "custom"))
            .for_each(|(_, v)| assert_no_nulls(v, raw)),
        _ => {}
    }
}

/// Only the allowed properties, ids equal to the headers.
#[track_caller]
pub fn assert_error_shape(r: &Resp) {
    let obj = r.body.as_object().expect("error body is an object");
    for k in obj.keys() {
        assert!(
            ["error", "message", "request_id", "trace_id", "details", "cycles_evidence"].contains(&k.as_str()),
            "unexpected property {k} in {}",
            r.raw
        );
    }
    assert!(obj["message"].is_string());
    assert_eq!(obj["request_id"].as_str(), r.headers.get("x-request-id").map(String::as_str));
    assert_eq!(obj["trace_id"].as_str(), r.headers.get("x-cycles-trace-id").map(String::as_str));
}

/// A key as createApiKey returned it (the secret is never retrievable again).
#[derive(Debug, Clone)]
pub struct CreatedKey {
    pub key_id: String,
    pub secret: String,
}

/// A provisioned tenant with one API key.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub id: String,
    pub key: String,
    pub key_id: String,
}

/// A ledger as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ledger {
    pub allocated: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub spent: i64,
    pub debt: i64,
    pub overdraft_limit: i64,
    pub is_over_limit: bool,
}

/// Binds both planes of `app` on free loopback ports: their base URLs, and the future serving them.
async fn gateway(app: Arc<App>) -> ((String, String), impl std::future::Future<Output = ()>) {
    let listener = local::bind("127.0.0.1:0".parse().unwrap()).await.expect("bind gateway");
    let admin_listener = local::bind("127.0.0.1:0".parse().unwrap()).await.expect("bind admin gateway");
    let bases = (
        format!("http://{}", listener.local_addr().unwrap()),
        format!("http://{}", admin_listener.local_addr().unwrap()),
    );
    let serving = async move {
        let _ = tokio::join!(
            local::serve(app.clone(), listener, Plane::Runtime),
            local::serve(app, admin_listener, Plane::Admin)
        );
    };
    (bases, serving)
}

impl Harness {
    pub async fn start() -> Harness {
        Self::start_configured(|_| {}).await
    }

    /// Calls of one command the harness's server has served so far (`command_calls`).
    pub async fn command_calls(&self, command: &str) -> u64 {
        command_calls(&mut self.store.conn(), command).await
    }

    /// Like `start`, with the server's configuration adjusted by `configure` (applied after the
    /// harness's own test settings).
    pub async fn start_configured(configure: impl FnOnce(&mut Config)) -> Harness {
        let (url, embedded, container) = redis_for_tests().await;
        let mut h = Self::start_with(url, embedded, false, configure).await;
        h._container = container;
        h
    }

    /// Like `start`, but the gateway runs apart from the caller: on its own thread, with its own
    /// single-threaded runtime and Redis connection, as one Lambda container would (`lambda::start`).
    /// The benchmarks use it, so the load generator and the server never share a scheduler.
    pub async fn start_isolated() -> Harness {
        Self::start_isolated_configured(|_| {}).await
    }

    /// `start_isolated` with the server's configuration adjusted by `configure`.
    pub async fn start_isolated_configured(configure: impl FnOnce(&mut Config) + Send + 'static) -> Harness {
        let (url, embedded, container) = redis_for_tests().await;
        let mut h = Self::start_with(url, embedded, true, configure).await;
        h._container = container;
        h
    }

    /// A harness for a server running elsewhere (another process, another build): its two
    /// planes' base URLs, its Redis and its admin key. The helpers work as on a harness-started
    /// server; the dispatcher is this harness's own.
    pub async fn remote(base: String, admin_base: String, redis_url: String, admin_key: String) -> Harness {
        let store = Store::connect(&redis_url, Duration::from_secs(5)).await.expect("connect to the server's redis");
        let webhooks = Config::from_env(Some(&redis_url)).webhooks;
        Harness {
            dispatcher: Arc::new(cycles_shared::jobs::dispatch::Dispatcher::new(store.clone(), webhooks)),
            base,
            admin_base,
            store,
            http: reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap(),
            admin_key,
            embedded: None,
            _container: None,
            _stop_gateway: None,
            redis_url,
        }
    }

    pub async fn start_on(url: String, embedded: Option<EmbeddedRedis>) -> Harness {
        Self::start_with(url, embedded, false, |_| {}).await
    }

    /// A server (configured by `configure`) on the Redis at `url`, which the caller runs.
    pub async fn start_on_configured(url: String, configure: impl FnOnce(&mut Config)) -> Harness {
        Self::start_with(url, None, false, configure).await
    }

    /// A server on a Redis of its own (configured by `configure`).
    pub async fn start_with_redis(redis: EmbeddedRedis, configure: impl FnOnce(&mut Config)) -> Harness {
        Self::start_with(redis.url(), Some(redis), false, configure).await
    }

    /// A second server (configured by `configure`) on the Redis of `other`, as a redeploy
    /// with new settings would run.
    pub async fn start_beside(other: &Harness, configure: impl FnOnce(&mut Config)) -> Harness {
        Self::start_on_configured(other.redis_url.clone(), configure).await
    }

    async fn start_with(
        url: String,
        embedded: Option<EmbeddedRedis>,
        isolated: bool,
        configure: impl FnOnce(&mut Config),
    ) -> Harness {
        // CYCLES_TEST_LOG=<filter> shows the server's log (the causes of 500s) while debugging
        if let Ok(filter) = std::env::var("CYCLES_TEST_LOG") {
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        }
        let mut config = Config::from_env(Some(&url));
        config.redis_url = url.clone();
        config.admin_api_key = Some(ADMIN_KEY.to_string());
        config.key_pepper = DEV_PEPPER.to_string();
        config.redis_timeout = Duration::from_secs(5);
        // webhook receivers are local http servers; attempts time out fast, leases end fast
        config.webhooks.egress = cycles_shared::egress::EgressRules::development();
        config.webhooks.timeout = Duration::from_millis(1500);
        config.webhooks.lease = Duration::from_millis(500);
        // every test calls from 127.0.0.1, and many fail authentication on purpose: the throttle
        // is tested on its own (tests/tests/alerts.rs, from source addresses of its own)
        config.auth_failure_limit = 0;
        configure(&mut config);
        let store = config.open_store().await.expect("connect to test redis");
        let webhooks = config.webhooks.clone();
        let ((base, admin_base), stop_gateway) = if isolated {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let (bases_tx, bases) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                runtime.block_on(async move {
                    let store = config.open_store().await.expect("connect to test redis");
                    let (bases, serving) = gateway(Arc::new(App::new(store, config))).await;
                    let _ = bases_tx.send(bases);
                    tokio::select! { _ = serving => {}, _ = stopped => {} }
                });
            });
            (bases.await.expect("isolated gateway started"), Some(stop))
        } else {
            let (bases, serving) = gateway(Arc::new(App::new(store.clone(), config))).await;
            tokio::spawn(serving);
            (bases, None)
        };
        let http = reqwest::Client::builder().pool_max_idle_per_host(64).build().unwrap();
        let dispatcher = Arc::new(cycles_shared::jobs::dispatch::Dispatcher::new(store.clone(), webhooks));
        Harness {
            dispatcher,
            base,
            admin_base,
            store,
            http,
            admin_key: ADMIN_KEY.to_string(),
            embedded,
            _container: None,
            _stop_gateway: stop_gateway,
            redis_url: url,
        }
    }

    /// A fresh ACTIVE tenant with a default-permission key.
    pub async fn tenant(&self) -> Tenant {
        self.tenant_with(NewTenant::default()).await
    }

    /// Provisions a tenant (with a fresh id) and a default key over the operator API.
    pub async fn tenant_with(&self, mut spec: NewTenant) -> Tenant {
        spec.tenant_id = unique("t");
        spec.name = format!("Tenant {}", spec.tenant_id);
        let mut body = json!({"tenant_id": spec.tenant_id, "name": spec.name});
        let settings = [
            ("default_commit_overage_policy", spec.default_commit_overage_policy.map(|p| json!(p.as_str()))),
            ("default_reservation_ttl_ms", spec.default_reservation_ttl_ms.map(|v| json!(v))),
            ("max_reservation_ttl_ms", spec.max_reservation_ttl_ms.map(|v| json!(v))),
            ("max_reservation_extensions", spec.max_reservation_extensions.map(|v| json!(v))),
        ];
        for (name, v) in settings {
            if let Some(v) = v {
                body[name] = v;
            }
        }
        let r = self.admin("POST", "/v1/admin/tenants", Some(&body)).await;
        assert_eq!(r.status, 201, "create tenant: {}", r.raw);
        let key = self.key(&spec.tenant_id, None).await;
        Tenant { id: spec.tenant_id, key: key.secret, key_id: key.key_id }
    }

    /// A tenant with one TOKENS budget of `allocated` at its tenant scope.
    pub async fn funded(&self, allocated: i64) -> Tenant {
        let t = self.tenant().await;
        self.budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, allocated).await;
        t
    }

    /// The tenant-scope TOKENS ledger of `t`.
    pub async fn root(&self, t: &Tenant) -> Ledger {
        self.ledger(&t.id, &format!("tenant:{}", t.id), Unit::Tokens).await
    }

    /// Asserts that an API key's record keeps the packed copy of its checked fields (`auth`,
    /// read by the key check of every script) equal to those fields; answers the copy.
    pub async fn key_check_copy_is_current(&self, tenant: &str, key_id: &str) -> String {
        let record = cycles_shared::keys::TenantKeys::new(tenant).api_key(key_id);
        let (auth, fields): (Option<String>, Vec<Option<String>>) = redis::pipe()
            .hget(&record, "auth")
            .cmd("HMGET")
            .arg(&record)
            .arg(&["digest", "status", "expires_at_ms", "permissions", "scope_filter"])
            .query_async(&mut self.store.conn())
            .await
            .unwrap();
        let fields: Vec<String> = fields.into_iter().map(Option::unwrap_or_default).collect();
        let fields = fields.join("\u{1f}");
        assert_eq!(auth.as_deref(), Some(fields.as_str()), "the key check's copy of {key_id}");
        fields
    }

    /// Asserts that a tenant record counts its policy rules and keeps their digest in its
    /// runtime copy (what `refresh_tenant` in lua/lib/tenant.lua writes: SHA-1 of the stored
    /// texts sorted, joined by NUL): the scripts know the rules in force by it without reading
    /// them. Answers the digest.
    pub async fn rules_digest_is_current(&self, tenant: &str) -> String {
        let keys = cycles_shared::keys::TenantKeys::new(tenant);
        let (count, expected): (i64, String) = redis::cmd("EVAL")
            .arg(
                "local r = redis.call('HVALS', KEYS[1]) table.sort(r) \
                  return {#r, #r > 0 and redis.sha1hex(table.concat(r, '\\0')) or ''}",
            )
            .arg(1)
            .arg(keys.policy_rules())
            .query_async(&mut self.store.conn())
            .await
            .unwrap();
        let (stored_count, runtime): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(keys.tenant())
            .arg(&["policies", "runtime"])
            .query_async(&mut self.store.conn())
            .await
            .unwrap();
        assert_eq!(stored_count, Some(count.to_string()), "the record counts its rules");
        let runtime = runtime.expect("the record's runtime copy");
        assert!(runtime.ends_with(&format!("\u{1f}{expected}")), "the runtime copy's digest: {runtime:?}");
        expected
    }

    /// Creates an API key over the operator API.
    pub async fn key(&self, tenant: &str, permissions: Option<Vec<String>>) -> CreatedKey {
        let mut body = json!({"tenant_id": tenant, "name": "test"});
        if let Some(p) = permissions {
            body["permissions"] = json!(p);
        }
        let r = self.admin("POST", "/v1/admin/api-keys", Some(&body)).await;
        assert_eq!(r.status, 201, "create key: {}", r.raw);
        CreatedKey {
            key_id: r.body["key_id"].as_str().unwrap().to_string(),
            secret: r.body["key_secret"].as_str().unwrap().to_string(),
        }
    }

    pub async fn budget(&self, tenant: &str, scope: &str, unit: Unit, allocated: i64) {
        self.budget_with(NewBudget::new(tenant, scope, unit, allocated)).await
    }

    /// Creates a budget over the operator API (caps, an extension outside the spec's body,
    /// are staged straight into the record).
    pub async fn budget_with(&self, b: NewBudget) {
        let unit = b.unit.as_str();
        let mut body = json!({
            "tenant_id": b.tenant_id, "scope": b.scope, "unit": unit,
            "allocated": {"unit": unit, "amount": b.allocated},
            "overdraft_limit": {"unit": unit, "amount": b.overdraft_limit},
        });
        if let Some(p) = b.commit_overage_policy {
            body["commit_overage_policy"] = json!(p.as_str());
        }
        let r = self.admin("POST", "/v1/admin/budgets", Some(&body)).await;
        assert_eq!(r.status, 201, "create budget: {}", r.raw);
        if let Some(caps) = &b.caps {
            let scope = b.scope.to_ascii_lowercase();
            self.set_budget(&b.tenant_id, &scope, b.unit, &[("caps", &caps.to_string())]).await;
        }
    }

    /// One dispatcher pass over the given tenants (and the system-wide subscriptions).
    pub async fn deliver(&self, tenants: &[&str]) -> cycles_shared::jobs::dispatch::DeliveryReport {
        let tenants: Vec<String> = tenants.iter().map(|t| t.to_string()).collect();
        self.dispatcher.pass_tenants(&tenants).await.expect("dispatcher pass")
    }

    /// Every event in a tenant's stream, oldest first.
    pub async fn all_events(&self, tenant: &str) -> Vec<Value> {
        let entries: redis::streams::StreamRangeReply =
            self.store.conn().xrange_all(TenantKeys::new(tenant).events()).await.unwrap();
        entries.ids.iter().map(|e| serde_json::from_str(&e.get::<String>("event").unwrap()).unwrap()).collect()
    }

    /// A tenant's runtime transition events: neither operator changes nor threshold alerts
    /// (`events_of`).
    pub async fn events(&self, tenant: &str) -> Vec<Value> {
        let transition = |e: &Value| e["source"] != "cycles-admin" && e["event_type"] != "budget.threshold_crossed";
        self.all_events(tenant).await.into_iter().filter(transition).collect()
    }

    /// A tenant's events of one type, oldest first.
    pub async fn events_of(&self, tenant: &str, event_type: &str) -> Vec<Value> {
        self.all_events(tenant).await.into_iter().filter(|e| e["event_type"] == event_type).collect()
    }

    /// A tenant's events of one type through the operator API (`GET /v1/admin/events`), oldest
    /// first.
    pub async fn admin_events(&self, tenant: &str, event_type: &str) -> Vec<Value> {
        let path = format!("/v1/admin/events?tenant_id={tenant}&event_type={event_type}&limit=100");
        let r = self.admin("GET", &path, None).await;
        let mut events = r.assert_ok()["events"].as_array().unwrap().clone();
        events.reverse();
        events
    }

    /// One tenant's maintenance, as the sweep does it (`jobs::sweep::sweep_tenant`).
    pub async fn sweep_tenant(
        &self,
        t: &Tenant,
        opts: &cycles_shared::jobs::sweep::SweepOptions,
    ) -> cycles_shared::jobs::sweep::SweepReport {
        let mut report = Default::default();
        cycles_shared::jobs::sweep::sweep_tenant(&self.store, &t.id, opts, &mut report).await.unwrap();
        report
    }

    /// A request to the operator plane with the admin key.
    pub async fn admin(&self, method: &str, path: &str, body: Option<&Value>) -> Resp {
        let body = body.map(Value::to_string);
        self.send_to(&self.admin_base, method, path, &[("x-admin-api-key", &self.admin_key)], body.as_deref()).await
    }

    /// A request to the operator plane with an operator key (or any `X-Admin-API-Key` value).
    pub async fn admin_with(&self, operator_key: &str, method: &str, path: &str, body: Option<&Value>) -> Resp {
        let body = body.map(Value::to_string);
        self.send_to(&self.admin_base, method, path, &[("x-admin-api-key", operator_key)], body.as_deref()).await
    }

    /// Creates an operator key of `role` (limited to `tenant_pattern` when given) with the
    /// bootstrap key: (key id, secret).
    pub async fn operator_key(&self, role: &str, tenant_pattern: Option<&str>) -> (String, String) {
        let mut body = json!({"name": format!("{role} {}", unique("op")), "role": role});
        if let Some(p) = tenant_pattern {
            body["tenant_pattern"] = json!(p);
        }
        let r = self.admin("POST", "/v1/admin/operator-keys", Some(&body)).await;
        let b = r.assert_created();
        (b["key_id"].as_str().unwrap().to_string(), b["key_secret"].as_str().unwrap().to_string())
    }

    /// A request to the operator plane with a tenant key.
    pub async fn admin_as(&self, key: &str, method: &str, path: &str, body: Option<&Value>) -> Resp {
        let body = body.map(Value::to_string);
        self.send_to(&self.admin_base, method, path, &[("x-cycles-api-key", key)], body.as_deref()).await
    }

    pub async fn overdraft_budget(&self, tenant: &str, scope: &str, allocated: i64, limit: i64) {
        let mut b = NewBudget::new(tenant, scope, Unit::Tokens, allocated);
        b.overdraft_limit = limit;
        self.budget_with(b).await
    }

    /// Reads a ledger straight from Redis and checks the balance identity on it.
    pub async fn ledger(&self, tenant: &str, scope: &str, unit: Unit) -> Ledger {
        let key = TenantKeys::new(tenant).budget(scope, unit);
        let stored: HashMap<String, String> = self.store.conn().hgetall(&key).await.unwrap();
        let h = cycles_shared::ops::ledgers::with_view(&stored).expect("a well-formed ledger view");
        let n = |f: &str| h.get(f).map(|v| v.parse::<i64>().unwrap()).unwrap_or(0);
        let l = Ledger {
            allocated: n("allocated"),
            remaining: n("remaining"),
            reserved: n("reserved"),
            spent: n("spent"),
            debt: n("debt"),
            overdraft_limit: n("overdraft_limit"),
            is_over_limit: h.get("is_over_limit").map(String::as_str) == Some("true"),
        };
        assert_eq!(
            l.remaining,
            l.allocated - l.spent - l.reserved - l.debt,
            "balance identity broken on {scope}: {l:?}"
        );
        l
    }

    /// Overwrites ledger fields (to stage debt, over-limit or status for a test), in the ledger's
    /// view as the scripts keep it.
    pub async fn set_budget(&self, tenant: &str, scope: &str, unit: Unit, fields: &[(&str, &str)]) {
        use cycles_shared::ops::ledgers::{view_of, with_view};
        let key = TenantKeys::new(tenant).budget(scope, unit);
        let stored: HashMap<String, String> = self.store.conn().hgetall(&key).await.unwrap();
        if !stored.contains_key("v") {
            let _: () = self.store.conn().hset_multiple(&key, fields).await.unwrap();
            return;
        }
        let mut spread = with_view(&stored).expect("a well-formed ledger view");
        for (f, v) in fields {
            spread.insert(f.to_string(), v.to_string());
        }
        let _: () = self.store.conn().hset(&key, "v", view_of(&spread)).await.unwrap();
    }

    /// Writes fields of a tenant record as a raw write would (no script): its packed runtime
    /// copy is dropped too, so the scripts read the fields as written (and fold them again).
    pub async fn set_tenant(&self, tenant: &str, fields: &[(&str, &str)]) {
        let key = TenantKeys::new(tenant).tenant();
        let _: () = self.store.conn().hset_multiple(&key, fields).await.unwrap();
        let _: () = self.store.conn().hdel(&key, "runtime").await.unwrap();
    }

    pub async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> Resp {
        self.send_to(&self.base, method, path, headers, body).await
    }

    pub async fn send_to(
        &self,
        base: &str,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Resp {
        send_with(&self.http, base, method, path, headers, body).await
    }

    pub async fn post(&self, key: &str, path: &str, body: &Value) -> Resp {
        self.send("POST", path, &[("x-cycles-api-key", key)], Some(&body.to_string())).await
    }

    pub async fn get(&self, key: &str, path: &str) -> Resp {
        self.send("GET", path, &[("x-cycles-api-key", key)], None).await
    }

    pub async fn admin_post(&self, path: &str, body: &Value) -> Resp {
        self.send("POST", path, &[("x-admin-api-key", &self.admin_key)], Some(&body.to_string())).await
    }

    /// Reserve with sensible defaults merged with `extra`.
    pub async fn reserve(&self, t: &Tenant, amount: i64, extra: Value) -> Resp {
        let mut body = json!({
            "idempotency_key": unique("rk"),
            "subject": {"tenant": t.id},
            "action": {"kind": "llm.completion", "name": "test-model"},
            "estimate": {"unit": "TOKENS", "amount": amount},
        });
        merge(&mut body, extra);
        self.post(&t.key, "/v1/reservations", &body).await
    }

    /// Reserve that must succeed; returns the reservation id.
    pub async fn reserve_ok(&self, t: &Tenant, amount: i64, extra: Value) -> String {
        let r = self.reserve(t, amount, extra).await;
        r.assert_ok()["reservation_id"].as_str().unwrap().to_string()
    }

    pub async fn commit(&self, t: &Tenant, rid: &str, actual: i64) -> Resp {
        let body = json!({"idempotency_key": unique("ck"), "actual": {"unit": "TOKENS", "amount": actual}});
        self.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &body).await
    }

    pub async fn release(&self, t: &Tenant, rid: &str) -> Resp {
        let body = json!({"idempotency_key": unique("rl")});
        self.post(&t.key, &format!("/v1/reservations/{rid}/release"), &body).await
    }

    pub async fn extend(&self, t: &Tenant, rid: &str, by: i64) -> Resp {
        let body = json!({"idempotency_key": unique("ex"), "extend_by_ms": by});
        self.post(&t.key, &format!("/v1/reservations/{rid}/extend"), &body).await
    }
}

/// A reservation record of today's layout (`lua/lib/record.lua`) by field name, its empty
/// fields left out, the status spelled out.
pub fn record_fields(raw: &str) -> HashMap<String, String> {
    assert!(raw.starts_with("2\x1f"), "a record of today's layout: {raw}");
    let mut out: HashMap<String, String> = cycles_shared::ops::reservations::RECORD_FIELDS
        .iter()
        .zip(raw.split('\x1f'))
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let status = match out["status"].as_str() {
        "A" => "ACTIVE",
        "C" => "COMMITTED",
        "R" => "RELEASED",
        _ => "EXPIRED",
    };
    out.insert("status".into(), status.into());
    out
}

/// A record of today's layout as the first layout stored it (a JSON object, its stored answers
/// nested objects), for the tests that such records still work.
pub fn first_layout(raw: &str) -> Value {
    let f = record_fields(raw);
    let get = |k: &str| f.get(k).cloned();
    let balances = |k: &str| -> Value {
        let text = get(k).unwrap_or_default();
        Value::Array(
            text.split(',').filter(|l| !l.is_empty()).map(|l| Value::from(l.split(' ').collect::<Vec<_>>())).collect(),
        )
    };
    let mut rec = serde_json::Map::new();
    for k in ["codes", "status", "ph", "unit", "estimate", "subject", "scope", "action", "created", "expires"] {
        if let Some(v) = get(k) {
            rec.insert(k.into(), v.into());
        }
    }
    for k in ["policy", "grace", "max_ext", "ext", "m", "charged", "metrics"] {
        if let Some(v) = get(k) {
            rec.insert(k.into(), v.into());
        }
    }
    // client text was stored as such
    let text = |k: &str| get(k).map(|v| cycles_shared::ops::reservations::from_stored_text(&v));
    for k in ["ik", "reason"] {
        if let Some(v) = text(k) {
            rec.insert(k.into(), v.into());
        }
    }
    if let Some(q) = get("qrun") {
        rec.insert("qrun".into(), serde_json::from_str(&q).unwrap());
    }
    let mut result = json!({"decision": get("decision").unwrap_or_else(|| "ALLOW".into()),
        "expires_at_ms": get("first_expires").or(get("expires")), "balances": balances("balances")});
    if let Some(c) = get("caps") {
        result["caps"] = c.into();
    }
    rec.insert("result".into(), result);
    match f["status"].as_str() {
        "COMMITTED" => {
            let mut cr = json!({"charged": get("charged"), "balances": balances("fbalances")});
            let (e, c): (i64, i64) = (f["estimate"].parse().unwrap(), f["charged"].parse().unwrap());
            if c < e {
                cr["released"] = (e - c).to_string().into();
            }
            rec.insert("ck".into(), text("fkey").into());
            rec.insert("ch".into(), get("fhash").into());
            rec.insert("cr".into(), cr);
            rec.insert("finalized".into(), get("finished").into());
        }
        "RELEASED" => {
            rec.insert("rk".into(), text("fkey").into());
            rec.insert("rh".into(), get("fhash").into());
            rec.insert("rr".into(), json!({"released": get("estimate"), "balances": balances("fbalances")}));
            rec.insert("finalized".into(), get("finished").into());
        }
        "EXPIRED" => {
            rec.insert("expired".into(), get("finished").into());
        }
        _ => {}
    }
    Value::Object(rec)
}

/// Shallow-merges `extra` (an object) into `body`; a `null` value removes the field.
/// Waits out the last `margin_ms` of the current calendar window of `period_ms` (a minute, an
/// hour), so a test's requests all fall in one window of a quota or rate limit.
pub async fn early_in_a_window(period_ms: i64, margin_ms: i64) {
    let into = cycles_shared::domain::now_ms() % period_ms;
    if into > period_ms - margin_ms {
        tokio::time::sleep(std::time::Duration::from_millis((period_ms - into + 100) as u64)).await;
    }
}

pub fn merge(body: &mut Value, extra: Value) {
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            if v.is_null() {
                body.as_object_mut().unwrap().remove(&k);
            } else {
                body[k] = v;
            }
        }
    }
}

/// A client whose requests come from 127.0.0.<last_octet>, so that what is counted per source
/// address is counted apart from every other test.
pub fn client_from(last_octet: u8) -> reqwest::Client {
    reqwest::Client::builder().local_address(std::net::IpAddr::from([127, 0, 0, last_octet])).build().unwrap()
}

/// A request through `client` (say, one bound to a source address of its own).
pub async fn send_with(
    client: &reqwest::Client,
    base: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Resp {
    let url = format!("{base}{path}");
    let mut req = client.request(method.parse().unwrap(), url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b.to_string());
    }
    let res = req.send().await.expect("request");
    let status = res.status().as_u16();
    let headers =
        res.headers().iter().map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string())).collect();
    let raw = res.text().await.unwrap();
    let body = serde_json::from_str(&raw).unwrap_or(Value::Null);
    Resp { status, headers, body, raw }
}

/// A real S3 and EventBridge emulator (moto in server mode) on a free port, stopped when
/// dropped: `moto_server` from PATH (`scripts/test` installs it from PyPI).
pub struct Moto {
    pub url: String,
    child: std::process::Child,
}

impl Moto {
    pub async fn start() -> Moto {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = std::process::Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)");
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if reqwest::get(format!("{url}/moto-api/")).await.is_ok() {
                return Moto { url, child };
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("moto_server did not answer on {url}");
    }

    /// Credentials and endpoint for it (moto accepts any credentials).
    pub fn aws(&self) -> cycles_shared::aws::Aws {
        cycles_shared::aws::Aws::new(
            "testing".into(),
            "testing".into(),
            None,
            "us-east-1".into(),
            Some(self.url.clone()),
        )
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A master of a test cluster: its address and node id.
#[derive(Clone, Debug)]
pub struct Node {
    pub host: String,
    pub port: u16,
    pub id: String,
}

/// A connection to one node of the cluster.
pub async fn connect(node: &Node) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(format!("redis://{}:{}", node.host, node.port)).unwrap();
    client.get_multiplexed_async_connection().await.unwrap()
}

/// The masters, and the one serving `slot`, read from `CLUSTER SLOTS` on a seed node.
pub async fn topology(seed: &str, slot: u16) -> (Vec<Node>, Node) {
    let mut c = redis::Client::open(seed).unwrap().get_multiplexed_async_connection().await.unwrap();
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut c).await.unwrap();
    let (mut masters, mut owner) = (Vec::new(), None);
    for range in ranges {
        let redis::Value::Array(parts) = range else { panic!("CLUSTER SLOTS shape") };
        let int = |v: &redis::Value| -> i64 { redis::from_redis_value_ref(v).unwrap() };
        let (start, end) = (int(&parts[0]), int(&parts[1]));
        let redis::Value::Array(master) = &parts[2] else { panic!("CLUSTER SLOTS node shape") };
        let text = |v: &redis::Value| -> String { redis::from_redis_value_ref(v).unwrap() };
        let (host, port, id) = (text(&master[0]), int(&master[1]) as u16, text(&master[2]));
        let node = Node { host, port, id };
        if (start..=end).contains(&i64::from(slot)) {
            owner = Some(node.clone());
        }
        if !masters.iter().any(|m: &Node| m.id == node.id) {
            masters.push(node);
        }
    }
    (masters, owner.expect("the slot has an owner"))
}

/// Calls of one command a Redis node has served so far, inside scripts included (`INFO
/// commandstats`; `conn` reaches one node).
pub async fn command_calls(conn: &mut impl redis::aio::ConnectionLike, command: &str) -> u64 {
    let info: redis::InfoDict = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    let stat = info.get::<String>(&format!("cmdstat_{command}")).unwrap_or_default();
    stat.strip_prefix("calls=").and_then(|rest| rest.split(',').next()?.parse().ok()).unwrap_or(0)
}

/// The commands that reached Redis from a client while `request` ran, in order, each as the
/// words MONITOR prints (quoted). Futures are lazy: nothing is sent before MONITOR listens.
/// Commands scripts run (`[0 lua]`) are inside their round trip and not listed. Needs a harness
/// on a server of its own (`embedded`): other tests must not show up in its MONITOR.
pub async fn monitored(h: &Harness, name: &str, request: impl std::future::Future<Output = Resp>) -> Vec<Vec<String>> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let port = h.embedded.as_ref().expect("a server of its own").port;
    let mut monitor = BufReader::new(tokio::net::TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    monitor.get_mut().write_all(b"MONITOR\r\n").await.unwrap();
    let mut line = String::new();
    monitor.read_line(&mut line).await.unwrap();
    assert_eq!(line.trim(), "+OK");
    request.await.assert_ok();
    let sentinel = format!("sentinel-{name}");
    let _: String = redis::cmd("ECHO").arg(&sentinel).query_async(&mut h.store.conn()).await.unwrap();
    let mut client_commands = Vec::new();
    loop {
        line.clear();
        monitor.read_line(&mut line).await.unwrap();
        if line.contains(&sentinel) {
            break;
        }
        if !line.contains(" lua] ") {
            let words = line.trim_end().split("] ").nth(1).unwrap_or(&line);
            client_commands.push(words.split(' ').map(String::from).collect());
        }
    }
    client_commands
}
