//! Scheduled maintenance: the expiry sweep. It finds work without a keyspace scan (the tenant
//! registry, then each tenant's expiry index), works in bounded batches of one tenant (one slot)
//! per script, and is safe to run concurrently with itself or to be killed at any point: every
//! expiry re-checks status and time inside its script, so nothing is refunded twice or lost.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde::Serialize;

use crate::error::{ApiError, ApiResult};
use crate::ids::ReservationId;
use crate::keys::{TenantKeys, TENANT_REGISTRY};
use crate::store::{scripts, Store};

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
}

impl Default for SweepOptions {
    fn default() -> Self {
        SweepOptions {
            batch: 200,
            max_batches_per_tenant: None,
            retention: Duration::from_secs(30 * 86_400),
            event_retention: Duration::from_secs(90 * 86_400),
        }
    }
}

/// Counters of one sweep (logged per run).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SweepReport {
    pub tenants: u64,
    pub expired: u64,
    /// Index entries of reservations already finalized or gone.
    pub dropped: u64,
    pub quarantined: u64,
    /// Created-index entries of reservations whose records are gone.
    pub trimmed_index: u64,
    /// Events past their retention.
    pub trimmed_events: u64,
    /// Tenant-close cascades an interrupted close left behind, converged by this sweep.
    pub closes_converged: u64,
    pub duration_ms: u64,
}

impl SweepReport {
    /// One structured log line with every counter (CloudWatch Logs Insights can aggregate it).
    pub fn log(&self, message: &str) {
        tracing::info!(
            tenants = self.tenants,
            expired = self.expired,
            dropped = self.dropped,
            quarantined = self.quarantined,
            trimmed_index = self.trimmed_index,
            trimmed_events = self.trimmed_events,
            closes_converged = self.closes_converged,
            duration_ms = self.duration_ms,
            "{message}"
        );
    }

    fn add(&mut self, other: &SweepReport) {
        self.tenants += other.tenants;
        self.expired += other.expired;
        self.dropped += other.dropped;
        self.quarantined += other.quarantined;
        self.trimmed_index += other.trimmed_index;
        self.trimmed_events += other.trimmed_events;
        self.closes_converged += other.closes_converged;
        self.duration_ms += other.duration_ms;
    }
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// One pass over every registered tenant.
pub async fn sweep(store: &Store, opts: &SweepOptions) -> ApiResult<SweepReport> {
    let started = Instant::now();
    let closes_converged = crate::api::tenants::redrive_closes(store, opts.retention).await?;
    let mut report = SweepReport { closes_converged, ..Default::default() };
    let mut conn = store.conn();
    let mut cursor: u64 = 0;
    loop {
        let (next, tenants): (u64, Vec<String>) =
            redis::cmd("SSCAN").arg(TENANT_REGISTRY).arg(cursor).arg("COUNT").arg(500).query_async(&mut conn).await?;
        for tenant in tenants {
            report.tenants += 1;
            sweep_tenant(store, &tenant, opts, &mut report).await?;
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // system events and system-wide subscriptions' deliveries age out too
    trim_tenant(store, crate::api::events::SYSTEM_TENANT, opts, &mut report).await?;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// Expires one tenant's due reservations, batch by batch.
pub async fn sweep_tenant(store: &Store, tenant: &str, opts: &SweepOptions, report: &mut SweepReport) -> ApiResult<()> {
    let keys = TenantKeys::new(tenant);
    let mut conn = store.conn();
    let mut batches = 0;
    loop {
        // Selection uses this host's clock; the script decides with Redis TIME.
        let due: Vec<String> =
            conn.zrangebyscore_limit(keys.expiry_index(), "-inf", now_ms(), 0, opts.batch as isize).await?;
        if due.is_empty() {
            return trim_tenant(store, tenant, opts, report).await;
        }
        let batch = expire_reservations(store, tenant, &due, opts).await?;
        report.add(&batch);
        batches += 1;
        let progressed = batch.expired + batch.dropped + batch.quarantined > 0;
        if opts.max_batches_per_tenant.is_some_and(|m| batches >= m) {
            return Ok(());
        }
        if due.len() < opts.batch || !progressed {
            return trim_tenant(store, tenant, opts, report).await;
        }
    }
}

/// Most created-index batches one tenant's trim walks per sweep (bounds a sweep's work).
const MAX_TRIM_BATCHES: usize = 50;

/// Retention: drops events older than their retention and the created-index entries (older
/// than the record retention) whose reservation records have expired. Walks the old part of the
/// index batch by batch, past entries whose records still live (a long reservation never
/// blocks the trim behind it).
async fn trim_tenant(store: &Store, tenant: &str, opts: &SweepOptions, report: &mut SweepReport) -> ApiResult<()> {
    let keys = TenantKeys::new(tenant);
    let horizon = format!("({:013}", (now_ms() - opts.retention.as_millis() as i64).max(0));
    let event_horizon = (now_ms() - opts.event_retention.as_millis() as i64).max(0).to_string();
    let mut start = "-".to_string();
    for _ in 0..MAX_TRIM_BATCHES {
        let old: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.created_index())
            .arg(&start)
            .arg(&horizon)
            .arg("BYLEX")
            .arg("LIMIT")
            .arg(0)
            .arg(opts.batch)
            .query_async(&mut store.conn())
            .await?;
        let mut script_keys = vec![keys.created_index(), keys.events()];
        let mut args = vec![event_horizon.clone()];
        for member in &old {
            script_keys.push(keys.reservation(member.get(13..).unwrap_or("-")));
            args.push(member.clone());
        }
        let reply = store.run(&scripts::TRIM, &script_keys, &args).await?;
        let count = |i: usize| reply.result.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        report.trimmed_index += count(0);
        report.trimmed_events += count(1);
        match old.last() {
            Some(last) if old.len() == opts.batch => start = format!("({last}"),
            _ => break,
        }
    }
    trim_deliveries(store, tenant, report).await
}

/// Drops delivery-index entries past the delivery retention (the rows expire by TTL).
async fn trim_deliveries(store: &Store, owner: &str, report: &mut SweepReport) -> ApiResult<()> {
    let keys = TenantKeys::new(owner);
    let subscriptions: Vec<String> = store.conn().smembers(keys.webhook_index()).await?;
    let horizon = now_ms() - crate::webhooks::DELIVERY_RETENTION.as_millis() as i64;
    for id in subscriptions {
        let n: u64 = store.conn().zrembyscore(keys.subscription_deliveries(&id), "-inf", horizon).await?;
        report.trimmed_index += n;
    }
    Ok(())
}

/// Expires the given reservations of one tenant where they are overdue (one script, one slot;
/// ids are re-checked inside it). Also the lazy reclaim a reserve runs when dead holds block it.
pub async fn expire_reservations(
    store: &Store,
    tenant: &str,
    ids: &[String],
    opts: &SweepOptions,
) -> ApiResult<SweepReport> {
    let keys = TenantKeys::new(tenant);
    let mut script_keys = vec![keys.expiry_index(), keys.events(), keys.quarantine()];
    let mut args = vec![opts.retention.as_millis().to_string(), ids.len().to_string()];
    for id in ids {
        match ReservationId::parse(id).filter(|r| r.tenant == tenant) {
            Some(rid) => {
                script_keys.push(keys.reservation(&rid.token));
                script_keys.extend(rid.budget_codes.iter().map(|c| keys.budget_by_code(c)));
                args.extend([id.clone(), rid.budget_codes.len().to_string()]);
            }
            // Not one of ours: the script finds no record under it and drops the entry.
            None => {
                script_keys.push(keys.reservation("-"));
                args.extend([id.clone(), "0".to_string()]);
            }
        }
    }
    let reply = store.run(&scripts::EXPIRE, &script_keys, &args).await?;
    let count = |i: usize| -> ApiResult<u64> {
        reply.result.get(i).and_then(|v| v.parse().ok()).ok_or_else(|| ApiError::internal("Malformed sweep result"))
    };
    Ok(SweepReport { expired: count(0)?, dropped: count(1)?, quarantined: count(2)?, ..Default::default() })
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
                if r.expired + r.quarantined + r.trimmed_index + r.trimmed_events + r.closes_converged > 0 {
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
