//! Configuration from the environment (read once per container at init).

use std::time::Duration;

use crate::domain::action_kinds::{parse_custom_kinds, CustomKind};
use crate::domain::roles::Role;
use crate::egress;
use crate::store::{Durability, Store};

/// Default pepper for local development only; deployments must set `CYCLES_KEY_PEPPER`.
pub const DEV_PEPPER: &str = "cycles-local-development-pepper";

#[derive(Debug, Clone)]
pub struct Config {
    pub redis_url: String,
    pub redis_timeout: Duration,
    /// `X-Admin-API-Key` secret; admin calls answer 500 when it is not configured.
    pub admin_api_key: Option<String>,
    /// Server-side secret mixed into API-key digests (peppered HMAC-SHA256).
    pub key_pepper: String,
    /// How long finished reservations (and their idempotency records) are kept.
    pub retention: Duration,
    /// How long events are kept.
    pub event_retention: Duration,
    /// How long audit entries are kept.
    pub audit_retention: Duration,
    /// How long a ledger made by a budget template may stay untouched before the sweep reclaims
    /// it (when nothing is held or owed).
    pub template_idle: Duration,
    /// Spend analytics: how long rollups are kept and how many groups a bucket holds.
    pub usage: UsageOptions,
    /// The S3 archive and the EventBridge alert bus.
    pub export: ExportConfig,
    /// Pause between expiry sweeps (maintenance function and local gateway).
    pub sweep_interval: Duration,
    /// Reservations per sweep script call.
    pub sweep_batch: usize,
    /// Tenants the retention crawl visits per sweep pass.
    pub sweep_trim_tenants: usize,
    /// Whether the sweep compacts the listing index of finished reservations.
    pub sweep_compact_listing: bool,
    /// Reservations made since the sweep's last visit that a listing walking the listing index
    /// indexes first, at most (`CYCLES_LISTING_CATCH_UP`); with more waiting it answers 503.
    pub listing_catch_up: usize,
    /// Webhook delivery settings.
    pub webhooks: WebhookConfig,
    /// How old the overview snapshot may be before a request rebuilds it (the sweep rebuilds it
    /// at half this age).
    pub overview_max_age: Duration,
    /// When not empty, the operator plane answers only requests from these source ranges
    /// (`CYCLES_ADMIN_ALLOWED_CIDRS`, comma-separated CIDRs; 403 for any other address).
    pub admin_allowed_cidrs: Vec<String>,
    /// Origins allowed cross-origin access to both planes (`CYCLES_CORS_ORIGINS`, comma-separated
    /// `scheme://host[:port]`); empty: none.
    pub cors_origins: Vec<String>,
    /// Failed authentications per minute from one key id or one source address after which
    /// further failures answer 429 (`CYCLES_AUTH_FAILURE_LIMIT`; 0: never).
    pub auth_failure_limit: u64,
    /// Requests per minute one source address may make to the public action-kind registry
    /// (`CYCLES_PUBLIC_RATE_LIMIT`; 0: unlimited).
    pub public_rate_limit: u64,
    /// An operation's p99 latency (ms) over a window above which a container writes
    /// system.high_latency (`CYCLES_HIGH_LATENCY_MS`; 0: never).
    pub high_latency_ms: f64,
    /// That window (`CYCLES_HIGH_LATENCY_WINDOW_MS`, a minute by default).
    pub high_latency_window: Duration,
    /// The operator's `custom.*` action kinds (`CYCLES_CUSTOM_ACTION_KINDS`, a JSON array of
    /// declarations), or why they do not load (the start stops with it).
    pub custom_action_kinds: Result<Vec<CustomKind>, String>,
    /// Share of observe-mode ALLOW evaluations that write reservation.observed_allowed
    /// (`CYCLES_OBSERVE_ALLOW_SAMPLE_RATE`, 0 < rate <= 1; 1 by default).
    pub observe_allow_sample_rate: f64,
    /// `deny_detail` on every DENY answer (`CYCLES_DENY_DETAIL=always`), not only where v0.1.26
    /// is in play (see `api::reservations::show_deny_detail`).
    pub deny_detail_always: bool,
    /// Signed decision receipts (CyclesEvidence).
    pub evidence: EvidenceConfig,
    /// How far a write must travel before its answer goes out (`CYCLES_DURABILITY`: `none`,
    /// `replica` or `fsync`; `CYCLES_DURABILITY_REPLICAS`, 1; `CYCLES_DURABILITY_TIMEOUT_MS`,
    /// 1,000), or why the setting does not parse (the start stops with it).
    pub durability: Result<Durability, String>,
    /// Whether readiness accepts a store that may evict keys under memory pressure
    /// (`CYCLES_STORE_EVICTION=allow`); by default (`refuse`) it answers 503 for one.
    pub allow_evicting_store: bool,
    /// Whether the operator plane's successful reads are audited too (`CYCLES_AUDIT_READS=on`;
    /// off by default: the audit log holds changes, refusals and failures).
    pub audit_reads: bool,
    /// How long a container trusts an operator key it checked (`CYCLES_AUTH_CACHE_MS`, 5,000;
    /// 0: every request checks): the bound on a revocation, role change or end of a rotation's
    /// grace reaching every container.
    pub auth_cache: Duration,
    /// Whether `ADMIN_API_KEY` is honoured (as the bootstrap owner): `CYCLES_BOOTSTRAP_ADMIN_KEY`
    /// = `on` (default) | `off`, switched off once owner keys exist.
    pub bootstrap_admin_key: bool,
    /// IAM principals (SigV4 through API Gateway) allowed on the operator plane and their roles
    /// (`CYCLES_IAM_ROLES`: `<principal ARN>=<role>` comma-separated, an ARN may end in `*`), or
    /// why the table does not parse (the start stops with it).
    pub iam_roles: Result<Vec<(String, Role)>, String>,
}

/// Which tenants get CyclesEvidence (`CYCLES_EVIDENCE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvidenceMode {
    /// None (the default): no receipt anywhere, the evidence routes answer 404.
    Off,
    /// Every tenant, except one whose record says `evidence_enabled: false`.
    On,
    /// Only tenants whose record says `evidence_enabled: true`.
    Tenant,
}

/// CyclesEvidence settings: `CYCLES_EVIDENCE`, the signer (`CYCLES_EVIDENCE_SERVER_ID`, and
/// `CYCLES_EVIDENCE_KEYS` from the environment or Secrets Manager), how long envelopes are kept
/// (`CYCLES_EVIDENCE_RETENTION_MS`, 90 days) and how long a container trusts what it read of a
/// tenant's switch (`CYCLES_EVIDENCE_TENANT_CACHE_MS`, 5 s).
#[derive(Debug, Clone)]
pub struct EvidenceConfig {
    pub mode: EvidenceMode,
    pub signer: Option<crate::evidence::Signer>,
    pub retention: Duration,
    pub tenant_cache: Duration,
    /// Why the settings do not hold together (the start stops with it).
    pub problem: Option<String>,
}

impl EvidenceConfig {
    fn from_env() -> EvidenceConfig {
        let mut c = EvidenceConfig {
            mode: EvidenceMode::Off,
            signer: None,
            retention: env_ms("CYCLES_EVIDENCE_RETENTION_MS", 90 * 24 * 3_600_000),
            tenant_cache: env_ms("CYCLES_EVIDENCE_TENANT_CACHE_MS", 5_000),
            problem: None,
        };
        c.mode = match env("CYCLES_EVIDENCE").as_deref().map(str::trim) {
            None | Some("off") => return c,
            Some("on") => EvidenceMode::On,
            Some("tenant") => EvidenceMode::Tenant,
            Some(other) => {
                c.problem = Some(format!("CYCLES_EVIDENCE must be off, on or tenant (got {other:?})"));
                return c;
            }
        };
        match (env("CYCLES_EVIDENCE_SERVER_ID"), env("CYCLES_EVIDENCE_KEYS")) {
            (Some(id), Some(keys)) => match crate::evidence::Signer::from_config(id.trim(), &keys) {
                Ok(s) => c.signer = Some(s),
                Err(e) => c.problem = Some(e),
            },
            (None, _) => c.problem = Some("CYCLES_EVIDENCE is on but CYCLES_EVIDENCE_SERVER_ID is not set".into()),
            (_, None) => c.problem = Some("CYCLES_EVIDENCE is on but CYCLES_EVIDENCE_KEYS is not set".into()),
        }
        c
    }

    /// `cycles-local`: a server id from the local base when none is set, and a fresh signing key
    /// when none is configured. Returns the generated key's `CYCLES_EVIDENCE_KEYS` text (to show
    /// once, so it can be kept), if one was made.
    pub fn complete_for_local(&mut self, runtime_base: &str) -> Option<String> {
        if self.mode == EvidenceMode::Off || self.signer.is_some() {
            return None;
        }
        let server_id = env("CYCLES_EVIDENCE_SERVER_ID").unwrap_or_else(|| format!("{runtime_base}/v1"));
        self.problem = None;
        match env("CYCLES_EVIDENCE_KEYS") {
            Some(keys) => {
                match crate::evidence::Signer::from_config(&server_id, &keys) {
                    Ok(s) => self.signer = Some(s),
                    Err(e) => self.problem = Some(e),
                }
                None
            }
            None => {
                let (signer, text) = crate::evidence::Signer::generate(&server_id, crate::domain::now_ms());
                self.signer = Some(signer);
                Some(text)
            }
        }
    }

    /// Whether any tenant can get evidence.
    pub fn enabled(&self) -> bool {
        self.mode != EvidenceMode::Off && self.signer.is_some()
    }
}

#[derive(Debug, Clone)]
pub struct SweepOptions {
    /// Reservations per script call.
    pub batch: usize,
    /// Stop a tenant after this many batches (None = until its due work is done).
    pub max_batches_per_tenant: Option<usize>,
    /// Retention of finished reservation records.
    pub retention: Duration,
    /// Retention of events.
    pub event_retention: Duration,
    /// Retention of audit entries.
    pub audit_retention: Duration,
    /// Idle time after which a template-made ledger is reclaimed.
    pub template_idle: Duration,
    /// Spend analytics' rollups (folded by the sweep).
    pub usage: UsageOptions,
    /// While an archive is configured, retention trims events, audit entries and the evidence
    /// log only once exported.
    pub export: ExportConfig,
    /// Retention of evidence envelopes (the evidence log follows it).
    pub evidence_retention: Duration,
    /// Where the archive's and the bus's calls go: None for the environment's credentials
    /// and endpoint (`aws::Aws::from_env`), read at each pass.
    pub aws: Option<crate::aws::Aws>,
    /// Tenants the retention crawl visits per pass.
    pub trim_tenants: usize,
    /// Moves finished reservations' listing members into compact chunks (`ops::listing::compact`:
    /// ~300 B less Redis memory per finished reservation for ~250,000 Redis instructions once).
    pub compact_listing: bool,
    /// The overview snapshot is rebuilt when older than this.
    pub overview_refresh: Duration,
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            batch: 200,
            max_batches_per_tenant: None,
            retention: Duration::from_secs(30 * 86_400),
            event_retention: Duration::from_secs(90 * 86_400),
            audit_retention: Duration::from_secs(365 * 86_400),
            template_idle: Duration::from_secs(30 * 86_400),
            usage: UsageOptions::default(),
            export: ExportConfig::default(),
            evidence_retention: Duration::from_secs(90 * 86_400),
            aws: None,
            trim_tenants: 200,
            compact_listing: true,
            overview_refresh: Duration::from_secs(30),
        }
    }
}

/// The archive and the alert bus (`jobs::export`), run by the maintenance function.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExportConfig {
    /// S3 bucket of the archive (`CYCLES_EXPORT_BUCKET`); None: no archive.
    pub bucket: Option<String>,
    /// Prefix of every object name (`CYCLES_EXPORT_PREFIX`, e.g. `cycles/`).
    pub prefix: String,
    /// EventBridge bus (name or ARN) the alert events go to (`CYCLES_ALERT_EVENT_BUS`).
    pub alert_bus: Option<String>,
}

impl ExportConfig {
    pub fn from_env() -> ExportConfig {
        ExportConfig {
            bucket: env("CYCLES_EXPORT_BUCKET"),
            prefix: env("CYCLES_EXPORT_PREFIX").unwrap_or_default(),
            alert_bus: env("CYCLES_ALERT_EVENT_BUS"),
        }
    }

    pub fn enabled(&self) -> bool {
        self.bucket.is_some() || self.alert_bus.is_some()
    }
}

/// Spend analytics (`ops::usage`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageOptions {
    /// How long a rollup bucket is kept after it ends (`CYCLES_USAGE_RETENTION_MS`, 400 days).
    pub retention: Duration,
    /// Distinct groups one bucket holds before the rest land in the unit's `other` group
    /// (`CYCLES_USAGE_MAX_GROUPS`, 1,000).
    pub max_groups: usize,
}

impl Default for UsageOptions {
    fn default() -> Self {
        UsageOptions { retention: Duration::from_secs(400 * 86_400), max_groups: 1_000 }
    }
}

/// Outbound webhooks: the secret-encryption key, the SSRF guard and the dispatcher's pace.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// AES-256-GCM key for signing secrets and custom header values at rest.
    pub encryption_key: [u8; 32],
    /// Which endpoints may be called (the SSRF guard), at create, update and delivery time.
    pub egress: crate::egress::EgressRules,
    /// Whole-request timeout of one delivery attempt.
    pub timeout: Duration,
    /// Pause between dispatcher passes.
    pub interval: Duration,
    /// A claimed delivery not recorded within this time (a crashed dispatcher) is sent again.
    pub lease: Duration,
    /// Sends in flight at once in one dispatcher.
    pub concurrency: usize,
    /// Sends in flight at once per subscription, across all dispatchers.
    pub per_subscription: usize,
    /// Sends in flight at once per owner (a tenant, or the system), across all dispatchers:
    /// one tenant's slow endpoints can hold no more of the send pool than this.
    pub per_tenant: usize,
    /// Subscriptions one owner may have.
    pub max_subscriptions: usize,
}

impl WebhookConfig {
    /// Connect timeout of one attempt: at most 5 s, within the whole-attempt timeout.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs(5).min(self.timeout)
    }

    fn from_env(pepper: &str) -> WebhookConfig {
        use base64::Engine;
        use sha2::Digest;
        let key = env("CYCLES_WEBHOOK_ENCRYPTION_KEY")
            .and_then(|k| base64::engine::general_purpose::STANDARD.decode(k).ok())
            .and_then(|k| <[u8; 32]>::try_from(k.as_slice()).ok());
        let encryption_key = key.unwrap_or_else(|| {
            tracing::warn!(
                "CYCLES_WEBHOOK_ENCRYPTION_KEY is not set (base64 of 32 bytes); deriving one from the pepper"
            );
            sha2::Sha256::digest(format!("cycles-webhook-secrets|{pepper}")).into()
        });
        let blocked = std::env::var("CYCLES_WEBHOOK_BLOCKED_CIDRS").unwrap_or_else(|_| egress::DEFAULT_BLOCKED.into());
        let blocked = egress::parse_cidrs(&blocked).unwrap_or_else(|bad| {
            // Refusing to start would take the whole API down for a webhook setting; block
            // everything the floor blocks plus the valid entries, and say which one is wrong.
            tracing::error!(entry = %bad, "CYCLES_WEBHOOK_BLOCKED_CIDRS has an entry that is not a CIDR; it is ignored");
            blocked.split(',').filter_map(egress::Cidr::parse).collect()
        });
        let allowed_url_patterns = env("CYCLES_WEBHOOK_ALLOWED_URL_PATTERNS")
            .map(|v| v.split(',').map(str::trim).filter(|p| !p.is_empty()).map(String::from).collect())
            .unwrap_or_default();
        let timeout = env_ms("CYCLES_WEBHOOK_TIMEOUT_MS", 30_000);
        WebhookConfig {
            encryption_key,
            egress: egress::EgressRules {
                allow_http: env("CYCLES_WEBHOOK_ALLOW_HTTP").is_some_and(|v| v == "true" || v == "1"),
                blocked,
                allowed_url_patterns,
                private_targets: false,
            },
            timeout,
            interval: env_ms("CYCLES_DELIVERY_INTERVAL_MS", 250),
            // a lease that ends before its send does would let a second dispatcher send it too
            lease: env_ms("CYCLES_DELIVERY_LEASE_MS", 60_000).max(timeout + Duration::from_secs(5)),
            concurrency: env_count("CYCLES_DELIVERY_CONCURRENCY", 32),
            per_subscription: env_count("CYCLES_DELIVERY_PER_SUBSCRIPTION", 2),
            per_tenant: env_count("CYCLES_DELIVERY_PER_TENANT", 8),
            max_subscriptions: env_count("CYCLES_WEBHOOK_MAX_SUBSCRIPTIONS", 50),
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// A positive count from the environment, else the default.
fn env_count(name: &str, default: usize) -> usize {
    env(name).and_then(|v| v.parse().ok()).filter(|n| *n > 0).unwrap_or(default)
}

fn env_ms(name: &str, default_ms: u64) -> Duration {
    Duration::from_millis(env(name).and_then(|v| v.parse().ok()).unwrap_or(default_ms))
}

/// `CYCLES_IAM_ROLES`: `<principal ARN>=<role>` entries, comma-separated (empty: none).
fn parse_iam_roles(text: &str) -> Result<Vec<(String, Role)>, String> {
    let entries = text.split(',').map(str::trim).filter(|e| !e.is_empty());
    entries
        .map(|entry| {
            let (arn, role) = entry.rsplit_once('=').unwrap_or((entry, ""));
            match Role::parse(role.trim()) {
                Some(role) if arn.trim().starts_with("arn:") => Ok((arn.trim().to_string(), role)),
                _ => Err(format!("CYCLES_IAM_ROLES entry {entry:?} is not <principal ARN>=<viewer|operator|owner>")),
            }
        })
        .collect()
}

/// Secrets that may come from AWS Secrets Manager: (environment variable, variable naming the
/// secret's id or ARN). The secret's string value replaces the variable.
pub const SECRET_SOURCES: [(&str, &str); 5] = [
    ("REDIS_URL", "REDIS_URL_SECRET_ID"),
    ("ADMIN_API_KEY", "ADMIN_API_KEY_SECRET_ID"),
    ("CYCLES_KEY_PEPPER", "CYCLES_KEY_PEPPER_SECRET_ID"),
    ("CYCLES_WEBHOOK_ENCRYPTION_KEY", "CYCLES_WEBHOOK_ENCRYPTION_KEY_SECRET_ID"),
    ("CYCLES_EVIDENCE_KEYS", "CYCLES_EVIDENCE_KEYS_SECRET_ID"),
];

impl Config {
    /// `from_env`, after fetching every configured secret once (the Lambda init path). With
    /// the `aws` feature the `*_SECRET_ID` variables name Secrets Manager secrets; without it,
    /// setting one is an error rather than a silently missing secret.
    pub async fn load(default_redis_url: Option<&str>) -> Result<Config, String> {
        let wanted: Vec<(&str, String)> =
            SECRET_SOURCES.iter().filter_map(|(var, id_var)| env(id_var).map(|id| (*var, id))).collect();
        if !wanted.is_empty() {
            for (var, value) in fetch_secrets(&wanted).await? {
                // Set before any other thread reads the environment (single-threaded init).
                unsafe { std::env::set_var(var, value) };
            }
        }
        let config = Config::from_env(default_redis_url);
        config.validate()?;
        Ok(config)
    }

    pub fn sweep_options(&self) -> SweepOptions {
        SweepOptions {
            batch: self.sweep_batch,
            max_batches_per_tenant: None,
            retention: self.retention,
            event_retention: self.event_retention,
            audit_retention: self.audit_retention,
            template_idle: self.template_idle,
            usage: self.usage,
            export: self.export.clone(),
            evidence_retention: self.evidence.retention,
            aws: None,
            trim_tenants: self.sweep_trim_tenants,
            compact_listing: self.sweep_compact_listing,
            overview_refresh: self.overview_max_age / 2,
        }
    }

    /// Reads `REDIS_URL`, `REDIS_TIMEOUT_MS`, `ADMIN_API_KEY`, `CYCLES_KEY_PEPPER`,
    /// `CYCLES_RETENTION_MS`, `CYCLES_EVENT_RETENTION_MS`, `CYCLES_SWEEP_INTERVAL_MS` and
    /// `CYCLES_SWEEP_BATCH`; `redis_url`
    /// falls back to the given default.
    pub fn from_env(default_redis_url: Option<&str>) -> Config {
        let key_pepper = env("CYCLES_KEY_PEPPER").unwrap_or_else(|| {
            tracing::warn!("CYCLES_KEY_PEPPER is not set; using the development pepper");
            DEV_PEPPER.to_string()
        });
        Config {
            redis_url: env("REDIS_URL")
                .or(default_redis_url.map(str::to_string))
                .unwrap_or_else(|| "redis://127.0.0.1:6379".to_string()),
            redis_timeout: env_ms("REDIS_TIMEOUT_MS", 2_000),
            admin_api_key: env("ADMIN_API_KEY"),
            retention: env_ms("CYCLES_RETENTION_MS", 30 * 24 * 3_600_000),
            event_retention: env_ms("CYCLES_EVENT_RETENTION_MS", 90 * 24 * 3_600_000),
            audit_retention: env_ms("CYCLES_AUDIT_RETENTION_MS", 365 * 24 * 3_600_000),
            template_idle: env_ms("CYCLES_TEMPLATE_IDLE_MS", 30 * 24 * 3_600_000),
            usage: UsageOptions {
                retention: env_ms("CYCLES_USAGE_RETENTION_MS", 400 * 24 * 3_600_000),
                max_groups: env_count("CYCLES_USAGE_MAX_GROUPS", 1_000),
            },
            export: ExportConfig::from_env(),
            sweep_interval: env_ms("CYCLES_SWEEP_INTERVAL_MS", 2_000),
            sweep_batch: env_count("CYCLES_SWEEP_BATCH", 200),
            sweep_trim_tenants: env_count("CYCLES_SWEEP_TRIM_TENANTS", 200),
            sweep_compact_listing: env("CYCLES_LISTING_COMPACTION").is_none_or(|v| v != "off"),
            listing_catch_up: env_count("CYCLES_LISTING_CATCH_UP", 50_000),
            webhooks: WebhookConfig::from_env(&key_pepper),
            overview_max_age: env_ms("CYCLES_OVERVIEW_MAX_AGE_MS", 60_000),
            admin_allowed_cidrs: env("CYCLES_ADMIN_ALLOWED_CIDRS")
                .map(|v| v.split(',').map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect())
                .unwrap_or_default(),
            key_pepper,
            cors_origins: env("CYCLES_CORS_ORIGINS")
                .map(|v| v.split(',').map(str::trim).filter(|o| !o.is_empty()).map(String::from).collect())
                .unwrap_or_default(),
            auth_failure_limit: env("CYCLES_AUTH_FAILURE_LIMIT").and_then(|v| v.parse().ok()).unwrap_or(20),
            public_rate_limit: env("CYCLES_PUBLIC_RATE_LIMIT").and_then(|v| v.parse().ok()).unwrap_or(60),
            high_latency_ms: env("CYCLES_HIGH_LATENCY_MS").and_then(|v| v.parse().ok()).unwrap_or(1_000.0),
            high_latency_window: env_ms("CYCLES_HIGH_LATENCY_WINDOW_MS", 60_000),
            custom_action_kinds: env("CYCLES_CUSTOM_ACTION_KINDS")
                .map(|v| parse_custom_kinds(&v))
                .unwrap_or_else(|| Ok(Vec::new())),
            observe_allow_sample_rate: env("CYCLES_OBSERVE_ALLOW_SAMPLE_RATE")
                .and_then(|v| v.parse().ok())
                .filter(|r: &f64| *r > 0.0 && *r <= 1.0)
                .unwrap_or(1.0),
            deny_detail_always: env("CYCLES_DENY_DETAIL").is_some_and(|v| v == "always"),
            evidence: EvidenceConfig::from_env(),
            durability: durability_from(
                env("CYCLES_DURABILITY").as_deref(),
                env("CYCLES_DURABILITY_REPLICAS").as_deref(),
                env_ms("CYCLES_DURABILITY_TIMEOUT_MS", 1_000),
            ),
            allow_evicting_store: env("CYCLES_STORE_EVICTION").is_some_and(|v| v == "allow"),
            audit_reads: env("CYCLES_AUDIT_READS").is_some_and(|v| v == "on"),
            auth_cache: env_ms("CYCLES_AUTH_CACHE_MS", 5_000),
            bootstrap_admin_key: env("CYCLES_BOOTSTRAP_ADMIN_KEY").is_none_or(|v| v != "off"),
            iam_roles: parse_iam_roles(env("CYCLES_IAM_ROLES").as_deref().unwrap_or_default()),
        }
    }

    /// The store of this configuration: connected to `redis_url` (each reply awaited up to
    /// `redis_timeout` beyond the durability wait) with the configured durability.
    pub async fn open_store(&self) -> redis::RedisResult<Store> {
        let durability = self.durability.clone().unwrap_or(Durability::Primary);
        let store = Store::connect(&self.redis_url, self.redis_timeout + durability.wait()).await?;
        match store.evicting_policies().await {
            Ok(p) if !p.is_empty() => tracing::error!(policies = ?p, "the store may evict keys (a maxmemory limit \
                without maxmemory-policy noeviction): ledgers, quota counters and idempotency records could vanish"),
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "the store's eviction policy could not be read"),
        }
        store.durable(durability).await
    }

    /// Settings that must be right before serving: a wrong one stops the start with its reason.
    pub fn validate(&self) -> Result<(), String> {
        self.custom_action_kinds.as_ref().map_err(Clone::clone)?;
        self.durability.as_ref().map_err(Clone::clone)?;
        self.iam_roles.as_ref().map_err(Clone::clone)?;
        if let Some(p) = &self.evidence.problem {
            return Err(p.clone());
        }
        self.cors_origins.iter().try_for_each(|o| check_origin(o))?;
        match self.admin_allowed_cidrs.iter().find(|c| egress::Cidr::parse(c).is_none()) {
            Some(bad) => Err(format!("CYCLES_ADMIN_ALLOWED_CIDRS entry {bad:?} is not a CIDR range")),
            None => Ok(()),
        }
    }

    /// The role of an IAM principal (the first matching entry of `CYCLES_IAM_ROLES`), `None`
    /// when the table does not name it.
    pub fn iam_role(&self, principal: &str) -> Option<Role> {
        let table = self.iam_roles.as_deref().unwrap_or(&[]);
        table.iter().find(|(arn, _)| crate::domain::roles::glob_matches(arn, principal)).map(|(_, role)| *role)
    }

    /// The declared custom action kinds (none when the declarations did not load).
    pub fn custom_kinds(&self) -> &[CustomKind] {
        self.custom_action_kinds.as_deref().unwrap_or(&[])
    }

    /// Whether the operator plane serves a request from `source` (any address when no range is
    /// configured; none that cannot be read when one is).
    pub fn admin_source_allowed(&self, source: Option<&str>) -> bool {
        if self.admin_allowed_cidrs.is_empty() {
            return true;
        }
        let Some(ip) = source.and_then(|s| s.parse::<std::net::IpAddr>().ok()) else { return false };
        let ip = match ip {
            std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map(std::net::IpAddr::V4).unwrap_or(ip),
            v4 => v4,
        };
        self.admin_allowed_cidrs.iter().filter_map(|c| egress::Cidr::parse(c)).any(|c| c.contains(ip))
    }
}

/// `CYCLES_DURABILITY` and its companions: `none` (the default), `replica` or `fsync`, waiting
/// for `replicas` (at least 1) up to `timeout` (at least 1 ms).
pub fn durability_from(level: Option<&str>, replicas: Option<&str>, timeout: Duration) -> Result<Durability, String> {
    let replicas = match replicas.map(|r| r.trim().parse::<u32>()) {
        None => 1,
        Some(Ok(n)) if n >= 1 => n,
        Some(_) => return Err("CYCLES_DURABILITY_REPLICAS must be a whole number of at least 1".to_string()),
    };
    if timeout.is_zero() {
        return Err("CYCLES_DURABILITY_TIMEOUT_MS must be at least 1 (0 would wait forever)".to_string());
    }
    match level.map(str::trim).unwrap_or("none") {
        "" | "none" => Ok(Durability::Primary),
        "replica" => Ok(Durability::Replica { replicas, timeout }),
        "fsync" => Ok(Durability::Fsync { replicas, timeout }),
        other => Err(format!("CYCLES_DURABILITY {other:?} is not one of none, replica, fsync")),
    }
}

/// Checks a configured origin: `scheme://host[:port]`, http or https, nothing after.
pub fn check_origin(origin: &str) -> Result<(), String> {
    let parsed = url::Url::parse(origin).map_err(|e| format!("CORS origin {origin:?} is not a URL: {e}"))?;
    // a host is a name of letters, digits, '-' and '.', or an IP: no wildcard (`*`) passes
    let host_ok = match parsed.host() {
        Some(url::Host::Domain(d)) => d.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.'),
        Some(_) => true,
        None => false,
    };
    let exact = matches!(parsed.scheme(), "http" | "https")
        && host_ok
        && parsed.path() == "/"
        && parsed.query().is_none()
        && parsed.fragment().is_none()
        && !origin.ends_with('/')
        && parsed.username().is_empty();
    if exact {
        Ok(())
    } else {
        Err(format!("CORS origin {origin:?} must be exactly scheme://host[:port] (http or https, no path)"))
    }
}

#[cfg(feature = "aws")]
async fn fetch_secrets(wanted: &[(&str, String)]) -> Result<Vec<(String, String)>, String> {
    let sdk = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let client = aws_sdk_secretsmanager::Client::new(&sdk);
    let mut out = Vec::with_capacity(wanted.len());
    for (var, id) in wanted {
        let secret = client
            .get_secret_value()
            .secret_id(id)
            .send()
            .await
            .map_err(|e| format!("cannot read secret {id} for {var}: {e}"))?;
        let value = secret.secret_string().ok_or_else(|| format!("secret {id} for {var} has no string value"))?;
        out.push((var.to_string(), value.trim().to_string()));
    }
    Ok(out)
}

#[cfg(not(feature = "aws"))]
async fn fetch_secrets(wanted: &[(&str, String)]) -> Result<Vec<(String, String)>, String> {
    let names: Vec<String> = wanted.iter().map(|(var, _)| format!("{var}_SECRET_ID")).collect();
    Err(format!(
        "{} set, but this build has no `aws` feature (build the functions with --features lambda)",
        names.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cors_origins_must_be_exact() {
        assert!(check_origin("https://console.example.com").is_ok());
        assert!(check_origin("http://localhost:3000").is_ok());
        assert!(check_origin("http://[::1]:8080").is_ok() && check_origin("http://127.0.0.1:3000").is_ok());
        for bad in [
            "*",
            "https://*",
            "https://*.example.com",
            "http://*:3000",
            "https://console.*",
            "console.example.com",
            "https://x.com/",
            "https://x.com/app",
            "ftp://x.com",
            "https://u@x.com",
        ] {
            assert!(check_origin(bad).is_err(), "{bad}");
        }
        let mut c = Config::from_env(None);
        c.cors_origins = vec!["https://ok.example".into(), "https://bad.example/path".into()];
        assert!(c.validate().unwrap_err().contains("bad.example"));
        c.cors_origins = vec!["https://ok.example".into(), "https://*.example".into()];
        assert!(c.validate().unwrap_err().contains("*.example"), "a wildcard entry stops the start");
    }

    #[test]
    fn admin_source_ranges() {
        let mut c = Config::from_env(None);
        assert!(c.admin_source_allowed(None), "no ranges: every source");
        c.admin_allowed_cidrs = vec!["10.0.0.0/8".into(), "2001:db8::/32".into()];
        assert!(c.validate().is_ok());
        assert!(c.admin_source_allowed(Some("10.1.2.3")) && c.admin_source_allowed(Some("::ffff:10.1.2.3")));
        assert!(c.admin_source_allowed(Some("2001:db8::1")));
        assert!(!c.admin_source_allowed(Some("192.168.1.1")) && !c.admin_source_allowed(None));
        assert!(!c.admin_source_allowed(Some("not an address")));
        c.admin_allowed_cidrs.push("10.0.0.0/99".into());
        assert!(c.validate().unwrap_err().contains("10.0.0.0/99"));
    }
}
