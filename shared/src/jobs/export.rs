//! The archive and the alert bus (the maintenance function, when configured): each owner's
//! events and audit entries go to S3 as gzipped JSON Lines, partitioned by kind, tenant and
//! date, each entry in exactly one object; alert events go to an EventBridge bus.
//!
//! Exactly once: a batch is first marked pending in the owner's export cursor
//! (`lua/export_mark.lua`), then uploaded under a name made of its first and last entry ids,
//! then marked done. A crash or an overlapping invocation finds the batch pending and uploads
//! the same entries under the same name (S3 replaces the object), so an entry is never in two
//! objects and never skipped. Retention in Redis never trims past what was exported.

use std::io::Write;

use redis::streams::{StreamId, StreamRangeReply};

use crate::aws::{Aws, BusEntry};
use crate::config::ExportConfig;
use crate::domain::format_rfc3339_ms;
use crate::error::{ApiError, ApiResult};
use crate::keys::TenantKeys;
use crate::ops::export::{cursor, mark};
use crate::store::Store;

/// Entries per object at most (an object never spans two dates).
pub const BATCH: usize = 1_000;
/// Objects per stream and owner per invocation.
const MAX_OBJECTS: usize = 20;
/// Alert events read per owner per invocation.
const BUS_SCAN: usize = 500;

/// The event types put on the alert bus: the ones an operator routes to a person.
pub const ALERT_TYPES: [&str; 15] = [
    "budget.threshold_crossed",
    "budget.exhausted",
    "budget.over_limit_entered",
    "budget.debt_incurred",
    "budget.burn_rate_anomaly",
    "reservation.denial_rate_spike",
    "reservation.expiry_rate_spike",
    "quota.threshold_approaching",
    "policy.limit_reached",
    "api_key.auth_failure_rate_spike",
    "webhook.disabled",
    "system.store_connection_lost",
    "system.store_connection_restored",
    "system.high_latency",
    "system.webhook_delivery_failed",
];

/// An archived stream of an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Events,
    Audit,
    Evidence,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Events => "events",
            Kind::Audit => "audit",
            Kind::Evidence => "evidence",
        }
    }

    fn key(self, keys: &TenantKeys) -> String {
        match self {
            Kind::Events => keys.events(),
            Kind::Audit => keys.audit_log(),
            Kind::Evidence => keys.evidence_log(),
        }
    }

    /// The lines of a batch: each Event as the API serves it, each AuditLogEntry, or each
    /// signed CyclesEvidence envelope (read by its id; one gone past its retention is left out).
    async fn lines(self, store: &Store, owner: &str, entries: &[StreamId]) -> ApiResult<String> {
        let mut out = String::new();
        let mut push = |line: String| {
            out.push_str(&line);
            out.push('\n');
        };
        match self {
            Kind::Events => entries.iter().filter_map(|e| e.get::<String>("event")).for_each(&mut push),
            Kind::Audit => {
                for e in entries {
                    let stored = e.get::<String>("entry").and_then(|j| serde_json::from_str(&j).ok());
                    if let Some(stored) = stored {
                        push(crate::ops::audit::wire(owner, &e.id, &stored).to_string());
                    }
                }
            }
            Kind::Evidence => {
                // envelopes live under global keys (every slot): one read each (the maintenance
                // function is not latency-bound)
                for id in entries.iter().filter_map(|e| e.get::<String>("id")) {
                    if let Some(text) = crate::ops::evidence::read(store, &id).await? {
                        push(text);
                    }
                }
            }
        }
        Ok(out)
    }
}

/// Where a step stops: `Done` normally; `AfterUpload` leaves the batch pending, as a crash
/// between the upload and the cursor's move would (for the tests that prove exactly once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    Done,
    AfterUpload,
}

/// The object name of a batch: `<prefix><kind>/tenant=<owner>/date=<YYYY-MM-DD>/<first>_<last>.jsonl.gz`.
pub fn object_name(prefix: &str, kind: Kind, owner: &str, first: &str, last: &str) -> String {
    let date = &format_rfc3339_ms(ms_of(first))[..10];
    format!("{prefix}{}/tenant={owner}/date={date}/{first}_{last}.jsonl.gz", kind.name())
}

/// The time (ms) of a stream entry id "<ms>-<seq>" (0 for '').
pub fn ms_of(id: &str) -> i64 {
    id.split('-').next().and_then(|m| m.parse().ok()).unwrap_or(0)
}

async fn range(store: &Store, key: &str, after: &str, to: &str, count: Option<usize>) -> ApiResult<Vec<StreamId>> {
    let start = if after.is_empty() { "-".to_string() } else { format!("({after}") };
    let mut cmd = redis::cmd("XRANGE");
    cmd.arg(key).arg(start).arg(to);
    if let Some(n) = count {
        cmd.arg("COUNT").arg(n);
    }
    let reply: StreamRangeReply = cmd.query_async(&mut store.conn()).await?;
    Ok(reply.ids)
}

/// What one step did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stepped {
    /// Everything is exported (or no archive is configured).
    UpToDate,
    /// This object was written.
    Wrote(String),
    /// Nothing written this time: the batch pending had no entries left, or an overlapping
    /// run moved the cursor first.
    Skipped,
}

/// One object of `owner`'s `kind`: the batch pending, else the next one.
pub async fn step(
    store: &Store,
    aws: &Aws,
    cfg: &ExportConfig,
    owner: &str,
    kind: Kind,
    stop: Stop,
) -> ApiResult<Stepped> {
    let Some(bucket) = &cfg.bucket else { return Ok(Stepped::UpToDate) };
    let keys = TenantKeys::new(owner);
    let stream = kind.key(&keys);
    let mut cursor = cursor(store, owner, kind.name()).await?;
    let mut entries = Vec::new();
    if cursor.pending.is_empty() {
        let mut next = range(store, &stream, &cursor.done, "+", Some(BATCH)).await?;
        let Some(first) = next.first() else { return Ok(Stepped::UpToDate) };
        // an object holds one date
        let day = ms_of(&first.id).div_euclid(86_400_000);
        next.truncate(next.iter().take_while(|e| ms_of(&e.id).div_euclid(86_400_000) == day).count());
        let last = next.last().expect("the first entry at least").id.clone();
        let from = cursor.done.clone();
        cursor = mark(store, owner, kind.name(), "begin", &from, &last).await?;
        // (our batch, unless an overlapping run's was pending first: then that one is read)
        if cursor.done == from && cursor.pending == last {
            entries = next;
        }
    }
    if cursor.pending.is_empty() {
        // an overlapping run moved the cursor meanwhile: the caller steps again from there
        return Ok(Stepped::Skipped);
    }
    if entries.is_empty() {
        entries = range(store, &stream, &cursor.done, &cursor.pending, None).await?;
    }
    let stepped = match entries.first() {
        Some(first) => {
            let name = object_name(&cfg.prefix, kind, owner, &first.id, &cursor.pending);
            let lines = kind.lines(store, owner, &entries).await?;
            aws.put_object(bucket, &name, gzip(lines.as_bytes()), "application/x-ndjson")
                .await
                .map_err(|e| ApiError::internal(format!("export upload failed: {e}")))?;
            Stepped::Wrote(name)
        }
        None => Stepped::Skipped,
    };
    if stop == Stop::Done {
        mark(store, owner, kind.name(), "finish", "", &cursor.pending).await?;
    }
    Ok(stepped)
}

/// Exports what `owner` has not exported yet (at most `MAX_OBJECTS` objects per stream):
/// how many objects were written.
pub async fn export_owner(store: &Store, aws: &Aws, cfg: &ExportConfig, owner: &str) -> ApiResult<u64> {
    let mut written = 0;
    for kind in [Kind::Events, Kind::Audit, Kind::Evidence] {
        for _ in 0..MAX_OBJECTS {
            match step(store, aws, cfg, owner, kind, Stop::Done).await? {
                Stepped::Wrote(_) => written += 1,
                Stepped::Skipped => {}
                Stepped::UpToDate => break,
            }
        }
    }
    Ok(written)
}

/// The stream id up to which `owner`'s `kind` is exported ('' for none): retention trims no
/// further while an export is configured.
pub async fn exported_up_to(store: &Store, owner: &str, kind: Kind) -> ApiResult<String> {
    Ok(cursor(store, owner, kind.name()).await?.done)
}

/// Puts `owner`'s new alert events on the bus (in order, ten per request), then moves its
/// cursor. At least once: an invocation that dies between the two sends them again. A bus set
/// up later starts at the owner's latest event (no history is replayed).
pub async fn publish_alerts(store: &Store, aws: &Aws, bus: &str, owner: &str) -> ApiResult<u64> {
    let keys = TenantKeys::new(owner);
    let cursor = cursor(store, owner, "bus").await?;
    let done = if cursor.done.is_empty() {
        let latest: StreamRangeReply = redis::cmd("XREVRANGE")
            .arg(keys.events())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut store.conn())
            .await?;
        let Some(last) = latest.ids.first() else { return Ok(0) };
        mark(store, owner, "bus", "advance", "", &last.id).await?;
        return Ok(0);
    } else {
        cursor.done
    };
    let next = range(store, &keys.events(), &done, "+", Some(BUS_SCAN)).await?;
    let Some(last) = next.last() else { return Ok(0) };
    let alerts: Vec<BusEntry> = next
        .iter()
        .filter_map(|e| {
            let (kind, event) = (e.get::<String>("type")?, e.get::<String>("event")?);
            ALERT_TYPES.contains(&kind.as_str()).then(|| BusEntry {
                source: "cycles".into(),
                detail_type: kind,
                detail: event,
                event_bus_name: bus.to_string(),
                time: ms_of(&e.id) / 1000,
            })
        })
        .collect();
    for chunk in alerts.chunks(10) {
        aws.put_events(chunk).await.map_err(|e| ApiError::internal(format!("alert bus: {e}")))?;
    }
    mark(store, owner, "bus", "advance", &done, &last.id).await?;
    Ok(alerts.len() as u64)
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).expect("writing to memory");
    enc.finish().expect("writing to memory")
}
