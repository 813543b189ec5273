//! Maintenance: expiring due reservations, retention, the per-slot due index, readiness.

use std::time::Duration;

use redis::AsyncCommands;
use serde::Deserialize;

use super::{script, Nothing};
use crate::error::ApiResult;
use crate::ids::ReservationId;
use crate::keys::{TenantKeys, SWEEP_SLOTS, TENANT_REGISTRY};
use crate::store::Store;

script! {
    /// Expires a batch of one tenant's due reservations (`lua/expire.lua`): `reservation_keys`
    /// holds per reservation its record, then its budget keys; `reservations` its
    /// id and its number of budget keys.
    pub struct Expire = expire -> Expired {
        keys: [expiry_index, events, quarantine, listing_index; reservation_keys],
        args: [record_ttl_ms; reservations],
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Expired {
    pub expired: u64,
    pub dropped: u64,
    pub quarantined: u64,
}

script! {
    /// Retention of one tenant (`lua/trim.lua`): `candidates` holds per candidate its record and
    /// metadata keys, `entries` its created entry (a created-stream id, or with `source` `index`
    /// a member of the created index of before the stream) and its token.
    pub struct Trim = trim -> Trimmed {
        keys: [created_stream, created_index, events, listing_index; candidates],
        args: [oldest_event_ms, retention_ms, source; entries],
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Trimmed {
    pub removed: u64,
    pub events: u64,
}

script! {
    /// Sets a tenant's due time in its slot's due index (`lua/sweep_schedule.lua`): `mode` is
    /// `reset` or `ensure`.
    pub struct Schedule = sweep_schedule -> Nothing {
        keys: [due_index, expiry_index, periods, usage_log],
        args: [tenant, mode],
    }
}

script! {
    /// Rolls a batch of one tenant's recurring ledgers whose period has ended
    /// (`lua/period_roll.lua`).
    pub struct RollPeriods = period_roll -> Rolled {
        keys: [events, periods; budgets],
        args: [tenant],
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Rolled {
    pub rolled: u64,
}

script! {
    /// Reclaims the idle ledgers among a batch of one tenant's template-made ones
    /// (`lua/template_reclaim.lua`): `codes` are their budget codes.
    pub struct ReclaimTemplateLedgers = template_reclaim -> Reclaimed {
        keys: [events, audit_log, periods, scope_units, template_ledgers, template_counts; budgets],
        args: [tenant, idle_ms; codes],
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Reclaimed {
    pub reclaimed: u64,
}

script! {
    /// A write the store must accept (`lua/health.lua`).
    pub struct Health = health -> Nothing {
        keys: [probe],
        args: [],
    }
}

/// Whether the store takes a write through the script path every operation takes (the
/// readiness probe; the raw Redis error tells why not).
pub async fn probe(store: &Store) -> redis::RedisResult<()> {
    store.probe(Health { probe: crate::keys::HEALTH_PROBE.to_string() }).await
}

/// How long the keys of a finished reservation live: the retention, plus a week in which the
/// retention crawl deletes them with their index entries (the TTL is only the safety net).
pub fn record_ttl(retention: Duration) -> Duration {
    retention + Duration::from_secs(7 * 86_400)
}

/// Registers a tenant: the registry (listings, the retention crawl) and its slot among those
/// the sweep looks at.
pub async fn register_tenant(store: &Store, tenant: &str) -> ApiResult<()> {
    let slot = TenantKeys::new(tenant).slot();
    let _: () = store.write(redis::cmd("SADD").arg(TENANT_REGISTRY).arg(tenant).to_owned(), TENANT_REGISTRY).await?;
    store.write(redis::cmd("SADD").arg(SWEEP_SLOTS).arg(slot).to_owned(), SWEEP_SLOTS).await
}

/// Expires the given reservations of one tenant where they are overdue (one script, one slot;
/// ids are re-checked inside it). The sweep's batches, and the lazy reclaim a reserve runs when
/// dead holds block it.
pub async fn expire_reservations(
    store: &Store,
    tenant: &str,
    ids: &[String],
    retention: Duration,
) -> ApiResult<Expired> {
    let keys = TenantKeys::new(tenant);
    let mut call = Expire {
        expiry_index: keys.expiry_index(),
        events: keys.events(),
        quarantine: keys.quarantine(),
        listing_index: keys.listing_index(),
        record_ttl_ms: record_ttl(retention).as_millis().to_string(),
        ..Default::default()
    };
    for id in ids {
        match ReservationId::parse(id).filter(|r| r.tenant == tenant) {
            Some(rid) => {
                call.reservation_keys.push(keys.reservation(&rid.token));
                call.reservation_keys.extend(rid.budget_codes.iter().map(|c| keys.budget_by_code(c)));
                call.reservations.extend([id.clone(), rid.budget_codes.len().to_string()]);
            }
            // Not one of ours: the script finds no record under it and drops the entry.
            None => {
                call.reservation_keys.push(keys.reservation("-"));
                call.reservations.extend([id.clone(), "0".to_string()]);
            }
        }
    }
    Ok(store.run(call).await?.value)
}

/// Sets a tenant's due time from its expiry index: `reset` after its due work was swept,
/// `ensure` to keep any earlier time.
pub async fn schedule(store: &Store, tenant: &str, mode: &str) -> ApiResult<()> {
    let keys = TenantKeys::new(tenant);
    let call = Schedule {
        due_index: keys.due_index(),
        expiry_index: keys.expiry_index(),
        periods: keys.periods(),
        usage_log: keys.usage_log(),
        tenant: tenant.to_string(),
        mode: mode.to_string(),
    };
    store.run(call).await.map(|_| ())
}

/// Ledgers made by budget templates looked at per script call.
const RECLAIM_BATCH: isize = 100;

/// Reclaims one tenant's template-made ledgers untouched for `idle` with nothing held or owed,
/// batch by batch (at most `max_batches`): how many were.
pub async fn reclaim_template_ledgers(
    store: &Store,
    tenant: &str,
    idle: Duration,
    max_batches: usize,
) -> ApiResult<u64> {
    let keys = TenantKeys::new(tenant);
    let idle_ms = idle.as_millis() as i64;
    let mut reclaimed = 0;
    for _ in 0..max_batches {
        let horizon = crate::domain::now_ms() - idle_ms;
        let codes: Vec<String> =
            store.conn().zrangebyscore_limit(keys.template_ledgers(), "-inf", horizon, 0, RECLAIM_BATCH).await?;
        if codes.is_empty() {
            break;
        }
        let call = ReclaimTemplateLedgers {
            events: keys.events(),
            audit_log: keys.audit_log(),
            periods: keys.periods(),
            scope_units: keys.scope_units(),
            template_ledgers: keys.template_ledgers(),
            template_counts: keys.template_counts(),
            budgets: codes.iter().map(|c| keys.budget_by_code(c)).collect(),
            tenant: tenant.to_string(),
            idle_ms: idle_ms.to_string(),
            codes: codes.clone(),
        };
        reclaimed += store.run(call).await?.value.reclaimed;
        if codes.len() < RECLAIM_BATCH as usize {
            break;
        }
    }
    Ok(reclaimed)
}

/// Rolls the given ledgers of one tenant where their period has ended (one script, one slot).
pub async fn roll_periods(store: &Store, tenant: &str, budgets: Vec<String>) -> ApiResult<Rolled> {
    let keys = TenantKeys::new(tenant);
    let call = RollPeriods { events: keys.events(), periods: keys.periods(), budgets, tenant: tenant.to_string() };
    Ok(store.run(call).await?.value)
}
