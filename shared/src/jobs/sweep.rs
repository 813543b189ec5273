//! Scheduled maintenance: the expiry sweep and retention. It finds due work without visiting
//! idle tenants: every reserve lowers its tenant's due time in a per-slot due index (in the
//! tenant's own slot, in the reserve's script), and a pass reads the due indexes of the slots
//! that hold tenants, then expires only the due tenants' due reservations, in bounded batches of
//! one tenant (one slot) per script. Retention is a bounded crawl over the tenant registry that
//! resumes where the last pass stopped (it also re-checks each visited tenant's due time, so
//! nothing is ever missed for longer than one crawl). Safe to run concurrently with itself or
//! to be killed at any point: every expiry re-checks status and time inside its script, so
//! nothing is refunded twice or lost.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde::Serialize;

pub use crate::config::SweepOptions;
use crate::domain::now_ms;
use crate::error::{ApiError, ApiResult};
use crate::jobs::export::{self, Kind};
use crate::keys::{TenantKeys, SWEEP_SLOTS, TENANT_REGISTRY, TRIM_CURSOR};
use crate::ops::listing::Backfill;
use crate::ops::maintenance::{expire_reservations, roll_periods, schedule, Trim};
use crate::ops::tenants::redrive_closes;
use crate::store::Store;

/// Counters of one sweep (logged per run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    /// Tenants with due work this pass.
    pub tenants: u64,
    /// Tenants the retention crawl visited.
    pub trimmed_tenants: u64,
    pub expired: u64,
    /// Budget periods rolled over (`ops::maintenance::roll_periods`).
    pub rolled: u64,
    /// API keys found past their expiry by the crawl (`ops::auth::expire_keys`).
    pub keys_expired: u64,
    /// Index entries of reservations already finalized or gone.
    pub dropped: u64,
    /// Finished reservations whose listing members moved into the compact chunks.
    pub compacted: u64,
    pub quarantined: u64,
    /// Created-index entries of reservations whose records are gone.
    pub trimmed_index: u64,
    /// Events past their retention.
    pub trimmed_events: u64,
    /// Audit entries past their retention.
    pub trimmed_audit: u64,
    /// Tenant-close cascades an interrupted close left behind, converged by this sweep.
    pub closes_converged: u64,
    /// Idle ledgers made by budget templates, reclaimed.
    pub reclaimed_ledgers: u64,
    /// Usage entries folded into the spend rollups (`ops::usage::fold`).
    pub usage_folded: u64,
    /// Objects written to the S3 archive and alerts put on the bus (`jobs::export`).
    pub exported_objects: u64,
    pub alerts_published: u64,
    pub duration_ms: u64,
}

impl SweepReport {
    /// One structured log line with every counter (CloudWatch Logs Insights can aggregate it).
    pub fn log(&self, message: &str) {
        tracing::info!(
            tenants = self.tenants,
            trimmed_tenants = self.trimmed_tenants,
            expired = self.expired,
            rolled = self.rolled,
            keys_expired = self.keys_expired,
            dropped = self.dropped,
            quarantined = self.quarantined,
            trimmed_index = self.trimmed_index,
            trimmed_events = self.trimmed_events,
            trimmed_audit = self.trimmed_audit,
            closes_converged = self.closes_converged,
            reclaimed_ledgers = self.reclaimed_ledgers,
            usage_folded = self.usage_folded,
            exported_objects = self.exported_objects,
            alerts_published = self.alerts_published,
            duration_ms = self.duration_ms,
            "{message}"
        );
    }

    fn add(&mut self, other: &SweepReport) {
        self.tenants += other.tenants;
        self.reclaimed_ledgers += other.reclaimed_ledgers;
        self.usage_folded += other.usage_folded;
        self.exported_objects += other.exported_objects;
        self.alerts_published += other.alerts_published;
        self.trimmed_tenants += other.trimmed_tenants;
        self.expired += other.expired;
        self.rolled += other.rolled;
        self.keys_expired += other.keys_expired;
        self.dropped += other.dropped;
        self.compacted += other.compacted;
        self.quarantined += other.quarantined;
        self.trimmed_index += other.trimmed_index;
        self.trimmed_events += other.trimmed_events;
        self.trimmed_audit += other.trimmed_audit;
        self.closes_converged += other.closes_converged;
        self.duration_ms += other.duration_ms;
    }
}

/// One pass: interrupted closes, then the due tenants, then a bounded stretch of the
/// retention crawl.
pub async fn sweep(store: &Store, opts: &SweepOptions) -> ApiResult<SweepReport> {
    let started = Instant::now();
    let closes_converged = redrive_closes(store, opts.retention).await?;
    let mut report = SweepReport { closes_converged, ..Default::default() };
    for tenant in due_tenants(store).await? {
        report.tenants += 1;
        expire_tenant(store, &tenant, opts, &mut report).await?;
    }
    let archive = Archive::for_pass(opts, started);
    crawl(store, opts, &mut report, &archive).await?;
    // system events and system-wide subscriptions' deliveries age out too
    let system = crate::ops::events::SYSTEM_TENANT;
    archive.owner(store, system, &mut report).await;
    trim_tenant(store, system, opts, &mut report).await?;
    // and so do the audit entries of admin-key and unauthenticated requests
    for owner in [crate::ops::audit::ADMIN_OWNER, crate::ops::audit::UNAUTH_OWNER] {
        archive.owner(store, owner, &mut report).await;
        let horizon =
            kept_from(store, opts, owner, Kind::Audit, now_ms() - opts.audit_retention.as_millis() as i64).await?;
        report.trimmed_audit += crate::ops::audit::trim(store, owner, horizon).await?;
    }
    // the operator's overview stays fresh without a request paying for its rebuild
    crate::ops::overview::refresh_if_older(store, opts.overview_refresh.as_millis() as i64).await?;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Slots read at once when looking for due tenants.
const SLOTS_AT_ONCE: usize = 256;

/// The tenants whose due time has come, from the due indexes of the slots that hold tenants
/// (at most 16,384 small reads, issued `SLOTS_AT_ONCE` at a time, whatever the number of
/// tenants).
/// The expiry backlog: tenants with a reservation due now (after a pass that kept up: none).
pub async fn backlog(store: &Store) -> ApiResult<u64> {
    Ok(due_tenants(store).await?.len() as u64)
}

async fn due_tenants(store: &Store) -> ApiResult<Vec<String>> {
    let slots: Vec<u16> = store.conn().smembers(SWEEP_SLOTS).await?;
    let now = now_ms();
    let mut due = Vec::new();
    for group in slots.chunks(SLOTS_AT_ONCE) {
        let mut reads = tokio::task::JoinSet::new();
        for slot in group {
            let (mut conn, key) = (store.conn(), crate::keys::due_index(*slot));
            reads.spawn(async move {
                redis::cmd("ZRANGE")
                    .arg(key)
                    .arg("-inf")
                    .arg(now)
                    .arg("BYSCORE")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(1000)
                    .query_async::<Vec<String>>(&mut conn)
                    .await
            });
        }
        while let Some(read) = reads.join_next().await {
            due.extend(read.map_err(|e| ApiError::internal(format!("sweep task failed: {e}")))??);
        }
    }
    Ok(due)
}

/// The retention crawl: up to `opts.trim_tenants` tenants of the registry, from where the
/// last pass stopped; each is trimmed, its due time re-checked and its slot registered.
async fn crawl(store: &Store, opts: &SweepOptions, report: &mut SweepReport, archive: &Archive<'_>) -> ApiResult<()> {
    let mut conn = store.conn();
    let cursor: Option<u64> = conn.get(TRIM_CURSOR).await?;
    let (next, tenants): (u64, Vec<String>) = redis::cmd("SSCAN")
        .arg(TENANT_REGISTRY)
        .arg(cursor.unwrap_or(0))
        .arg("COUNT")
        .arg(opts.trim_tenants)
        .query_async(&mut conn)
        .await?;
    for tenant in tenants {
        report.trimmed_tenants += 1;
        backfill_listing(store, &tenant).await?;
        compact_listing(store, &tenant, opts, report).await?;
        archive.owner(store, &tenant, report).await;
        trim_tenant(store, &tenant, opts, report).await?;
        report.keys_expired += crate::ops::auth::expire_keys(store, &tenant).await?;
        schedule(store, &tenant, "ensure").await?;
        let _: () = conn.sadd(SWEEP_SLOTS, TenantKeys::new(&tenant).slot()).await?;
    }
    let _: () = conn.set(TRIM_CURSOR, next).await?;
    Ok(())
}

/// Rolls one tenant's recurring ledgers whose period has ended, batch by batch.
async fn roll_tenant(store: &Store, tenant: &str, opts: &SweepOptions, report: &mut SweepReport) -> ApiResult<()> {
    let periods = TenantKeys::new(tenant).periods();
    loop {
        let due: Vec<String> =
            store.conn().zrangebyscore_limit(&periods, "-inf", now_ms(), 0, opts.batch as isize).await?;
        let full = due.len() == opts.batch;
        if due.is_empty() {
            return Ok(());
        }
        let rolled = roll_periods(store, tenant, due).await?.rolled;
        report.rolled += rolled;
        if !full || rolled == 0 {
            return Ok(());
        }
    }
}

/// Rolls one tenant's ended budget periods, expires its due reservations batch by batch, folds
/// its usage log, then sets its next due time.
pub async fn expire_tenant(
    store: &Store,
    tenant: &str,
    opts: &SweepOptions,
    report: &mut SweepReport,
) -> ApiResult<()> {
    roll_tenant(store, tenant, opts, report).await?;
    let keys = TenantKeys::new(tenant);
    let mut conn = store.conn();
    let mut batches = 0;
    loop {
        // Selection uses this host's clock; the script decides with Redis TIME.
        let due: Vec<String> =
            conn.zrangebyscore_limit(keys.expiry_index(), "-inf", now_ms(), 0, opts.batch as isize).await?;
        if due.is_empty() {
            break;
        }
        let batch = expire_reservations(store, tenant, &due, opts.retention).await?;
        report.expired += batch.expired;
        report.dropped += batch.dropped;
        report.quarantined += batch.quarantined;
        batches += 1;
        let progressed = batch.expired + batch.dropped + batch.quarantined > 0;
        if opts.max_batches_per_tenant.is_some_and(|m| batches >= m) {
            return Ok(());
        }
        if due.len() < opts.batch || !progressed {
            break;
        }
    }
    // its spend since the last visit, into the rollups (a tenant that charged is due now)
    report.usage_folded += crate::ops::usage::fold(store, tenant, opts.usage).await?;
    schedule(store, tenant, "reset").await
}

/// All of one tenant's maintenance at once: its due periods and reservations, its retention
/// and its keys past their expiry.
pub async fn sweep_tenant(store: &Store, tenant: &str, opts: &SweepOptions, report: &mut SweepReport) -> ApiResult<()> {
    expire_tenant(store, tenant, opts, report).await?;
    trim_tenant(store, tenant, opts, report).await?;
    compact_listing(store, tenant, opts, report).await?;
    report.keys_expired += crate::ops::auth::expire_keys(store, tenant).await?;
    Ok(())
}

/// Most compaction calls for one tenant per visit (`ops::listing::compact`: 2,000 finished
/// reservations, ~50 ms of Redis time, so a pass over 200 tenants stays well inside the
/// maintenance function's minute; more wait for the next visit, costing only memory until then).
const MAX_COMPACT_BATCHES: usize = 10;

/// Most listing flush calls for one tenant per visit (`ops::listing::flush`: 20,000 reservations
/// created since the last visit; a listing that walks the index writes any left over first).
const MAX_FLUSH_BATCHES: usize = 100;

/// Writes the listing members of one tenant's reservations created since the last visit (a
/// reserve writes none), then compacts those of its finished reservations, unless switched off.
async fn compact_listing(store: &Store, tenant: &str, opts: &SweepOptions, report: &mut SweepReport) -> ApiResult<()> {
    crate::ops::listing::flush(store, tenant, MAX_FLUSH_BATCHES, opts.compact_listing).await?;
    if opts.compact_listing {
        report.compacted += crate::ops::listing::compact(store, tenant, MAX_COMPACT_BATCHES).await? as u64;
    }
    Ok(())
}

/// Most created-index batches one tenant's trim walks per sweep (bounds a sweep's work).
const MAX_TRIM_BATCHES: usize = 50;

/// Retention: drops events older than their retention, and deletes finished reservations past
/// their retention with their index entries (`trim.lua`). Walks the part of the created stream
/// (and of the created index of before it) old enough to hold such reservations, batch by
/// batch, past records that stay (a long reservation never blocks the trim behind it).
async fn trim_tenant(store: &Store, tenant: &str, opts: &SweepOptions, report: &mut SweepReport) -> ApiResult<()> {
    let keys = TenantKeys::new(tenant);
    let horizon_ms = (now_ms() - opts.retention.as_millis() as i64).max(0);
    let event_horizon =
        kept_from(store, opts, tenant, Kind::Events, now_ms() - opts.event_retention.as_millis() as i64).await?;
    let event_horizon = event_horizon.max(0).to_string();
    let trim = |source: &str| Trim {
        created_stream: keys.created_stream(),
        created_index: keys.created_index(),
        events: keys.events(),
        listing_index: keys.listing_index(),
        oldest_event_ms: event_horizon.clone(),
        retention_ms: opts.retention.as_millis().to_string(),
        source: source.to_string(),
        ..Default::default()
    };
    // the created index of before the stream: members "<13-digit ms><token>"
    let mut start = "-".to_string();
    for _ in 0..MAX_TRIM_BATCHES {
        let old: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.created_index())
            .arg(&start)
            .arg(format!("({horizon_ms:013}"))
            .arg("BYLEX")
            .arg("LIMIT")
            .arg(0)
            .arg(opts.batch)
            .query_async(&mut store.conn())
            .await?;
        if old.is_empty() {
            break;
        }
        let mut call = trim("index");
        for member in &old {
            let token = member.get(13..).unwrap_or("-");
            call.candidates.extend([keys.reservation(token), keys.reservation_metadata(token)]);
            call.entries.extend([member.clone(), token.to_string()]);
        }
        let trimmed = store.run(call).await?.value;
        report.trimmed_index += trimmed.removed;
        report.trimmed_events += trimmed.events;
        match old.last() {
            Some(last) if old.len() == opts.batch => start = format!("({last}"),
            _ => break,
        }
    }
    // the created stream: entry ids "<ms>-<seq>", each with its token
    let mut start = "-".to_string();
    for _ in 0..MAX_TRIM_BATCHES {
        let old: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(keys.created_stream())
            .arg(&start)
            .arg(format!("{}", horizon_ms.saturating_sub(1)))
            .arg("COUNT")
            .arg(opts.batch)
            .query_async(&mut store.conn())
            .await?;
        let mut call = trim("stream");
        for entry in &old.ids {
            let token: String = entry.get("t").unwrap_or_else(|| "-".to_string());
            call.candidates.extend([keys.reservation(&token), keys.reservation_metadata(&token)]);
            call.entries.extend([entry.id.clone(), token]);
        }
        // events are trimmed by the last call even when no reservation is old enough
        let trimmed = store.run(call).await?.value;
        report.trimmed_index += trimmed.removed;
        report.trimmed_events += trimmed.events;
        match old.ids.last() {
            Some(last) if old.ids.len() == opts.batch => start = format!("({}", last.id),
            _ => break,
        }
    }
    trim_deliveries(store, tenant, report).await?;
    report.reclaimed_ledgers +=
        crate::ops::maintenance::reclaim_template_ledgers(store, tenant, opts.template_idle, MAX_TRIM_BATCHES).await?;
    let audit_horizon =
        kept_from(store, opts, tenant, Kind::Audit, now_ms() - opts.audit_retention.as_millis() as i64).await?;
    report.trimmed_audit += crate::ops::audit::trim(store, tenant, audit_horizon).await?;
    // the evidence log (kept only while an archive is configured) lives as long as the envelopes
    let evidence_horizon =
        kept_from(store, opts, tenant, Kind::Evidence, now_ms() - opts.evidence_retention.as_millis() as i64).await?;
    crate::ops::trim_stream(store, &keys.evidence_log(), evidence_horizon).await?;
    Ok(())
}

/// How long into a pass the archive may still start an owner's work: the rest waits for the
/// next pass (a pass must end well within the maintenance function's timeout).
const ARCHIVE_BUDGET: Duration = Duration::from_secs(20);

/// The archive and the alert bus of one pass: where their calls go (resolved once per pass),
/// and when the pass started.
struct Archive<'a> {
    opts: &'a SweepOptions,
    aws: Option<crate::aws::Aws>,
    started: Instant,
}

impl<'a> Archive<'a> {
    fn for_pass(opts: &'a SweepOptions, started: Instant) -> Archive<'a> {
        let aws = opts.export.enabled().then(|| opts.aws.clone().or_else(crate::aws::Aws::from_env)).flatten();
        if opts.export.enabled() && aws.is_none() {
            tracing::warn!("CYCLES_EXPORT_BUCKET or CYCLES_ALERT_EVENT_BUS is set but no AWS credentials are");
        }
        Archive { opts, aws, started }
    }

    /// One owner's archive and alerts, when configured and the pass has time left. A failure
    /// (S3 or EventBridge unreachable) is logged and retried next pass: it never stops the
    /// expiry sweep.
    async fn owner(&self, store: &Store, owner: &str, report: &mut SweepReport) {
        let Some(aws) = self.aws.as_ref().filter(|_| self.started.elapsed() <= ARCHIVE_BUDGET) else { return };
        match export::export_owner(store, aws, &self.opts.export, owner).await {
            Ok(n) => report.exported_objects += n,
            Err(e) => tracing::warn!(owner, error = %e.message, "export failed; retried next pass"),
        }
        if let Some(bus) = &self.opts.export.alert_bus {
            match export::publish_alerts(store, aws, bus, owner).await {
                Ok(n) => report.alerts_published += n,
                Err(e) => tracing::warn!(owner, error = %e.message, "alert bus failed; retried next pass"),
            }
        }
    }
}

/// Where retention may trim an owner's stream to: `horizon`, or earlier when an archive is
/// configured and has not exported that far (nothing is trimmed before it is archived).
async fn kept_from(store: &Store, opts: &SweepOptions, owner: &str, kind: Kind, horizon: i64) -> ApiResult<i64> {
    if opts.export.bucket.is_none() {
        return Ok(horizon);
    }
    let done = export::exported_up_to(store, owner, kind).await?;
    // entries up to `done` are exported: trim below done's ms (an entry of that ms may follow it)
    Ok(horizon.min(export::ms_of(&done)))
}

/// Reservations backfilled into a tenant's listing index per crawl visit.
const BACKFILL_BATCH: usize = 500;

/// Puts a bounded batch of a tenant's reservations written before the listing index existed
/// into it, resuming where the last visit stopped, until the created index is done.
async fn backfill_listing(store: &Store, tenant: &str) -> ApiResult<()> {
    let keys = TenantKeys::new(tenant);
    let mut conn = store.conn();
    let progress: Option<String> = conn.get(keys.listing_backfill()).await?;
    if progress.as_deref() == Some("done") {
        return Ok(());
    }
    let start = progress.map(|p| format!("({p}")).unwrap_or_else(|| "-".to_string());
    let members: Vec<String> = redis::cmd("ZRANGE")
        .arg(keys.created_index())
        .arg(&start)
        .arg("+")
        .arg("BYLEX")
        .arg("LIMIT")
        .arg(0)
        .arg(BACKFILL_BATCH)
        .query_async(&mut conn)
        .await?;
    if !members.is_empty() {
        let records = members.iter().map(|m| keys.reservation(m.get(13..).unwrap_or("-"))).collect();
        let call = Backfill { listing_index: keys.listing_index(), records, members: members.clone() };
        store.run(call).await?;
    }
    let next = match members.last() {
        Some(last) if members.len() == BACKFILL_BATCH => last.clone(),
        _ => "done".to_string(),
    };
    let _: () = conn.set(keys.listing_backfill(), next).await?;
    Ok(())
}

/// Drops delivery-index entries past the delivery retention (the rows expire by TTL).
async fn trim_deliveries(store: &Store, owner: &str, report: &mut SweepReport) -> ApiResult<()> {
    let keys = TenantKeys::new(owner);
    let subscriptions: Vec<String> = store.conn().smembers(keys.webhook_index()).await?;
    let horizon = now_ms() - crate::ops::webhooks::DELIVERY_RETENTION.as_millis() as i64;
    for id in subscriptions {
        let n: u64 = store.conn().zrembyscore(keys.subscription_deliveries(&id), "-inf", horizon).await?;
        report.trimmed_index += n;
    }
    Ok(())
}

/// Sweeps every `interval` until `deadline` (a Lambda invocation) or forever (local gateway).
pub async fn sweep_loop(
    store: &Store,
    opts: &SweepOptions,
    interval: Duration,
    deadline: Option<Instant>,
) -> SweepReport {
    let mut total = SweepReport::default();
    loop {
        match sweep(store, opts).await {
            Ok(r) => {
                if r.expired
                    + r.rolled
                    + r.keys_expired
                    + r.quarantined
                    + r.trimmed_index
                    + r.trimmed_events
                    + r.trimmed_audit
                    + r.closes_converged
                    > 0
                {
                    r.log("sweep");
                }
                if r.quarantined > 0 {
                    tracing::warn!(
                        quarantined = r.quarantined,
                        "corrupt reservations quarantined; see each tenant's quarantine hash"
                    );
                }
                total.add(&r);
            }
            Err(e) => tracing::error!(error = %e.message, "expiry sweep failed"),
        }
        match deadline {
            Some(d) if Instant::now() + interval >= d => return total,
            _ => tokio::time::sleep(interval).await,
        }
    }
}
