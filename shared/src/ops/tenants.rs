//! Tenants: create, update (the status machine), and the close cascade.

use std::time::Duration;

use redis::AsyncCommands;

use super::maintenance::{record_ttl, register_tenant};
use super::records::{field, int_field, json_field, Record, RecordAnswer};
use super::{script, Nothing};
use crate::domain::{messages, now_ms, rules};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::ids::ReservationId;
use crate::keys::{self, TenantKeys};
use crate::store::Store;

/// A tenant as stored (the hash `cy:{<tenant>}:tenant`), each setting at its default where the
/// record has none.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    pub tenant_id: String,
    pub name: String,
    pub status: String,
    pub parent_tenant_id: Option<String>,
    pub metadata: Option<serde_json::Value>,
    pub default_commit_overage_policy: String,
    pub default_reservation_ttl_ms: i64,
    pub max_reservation_ttl_ms: i64,
    pub max_reservation_extensions: i64,
    pub reservation_expiry_policy: String,
    /// v0.1.26 observe mode (ENFORCE for tenants that never set one).
    pub observe_mode: String,
    /// The tenant's CyclesEvidence switch, when it set one.
    pub evidence_enabled: Option<bool>,
    pub created_at_ms: i64,
    pub updated_at_ms: Option<i64>,
    pub suspended_at_ms: Option<i64>,
    pub closed_at_ms: Option<i64>,
}

impl Tenant {
    /// The tenant of a stored hash; `None` when the hash is empty (no such tenant).
    pub fn from_record(r: &Record) -> Option<Tenant> {
        if r.is_empty() {
            return None;
        }
        Some(Tenant {
            tenant_id: field(r, "tenant_id").unwrap_or_default().to_string(),
            name: field(r, "name").unwrap_or_default().to_string(),
            status: field(r, "status").unwrap_or("ACTIVE").to_string(),
            parent_tenant_id: field(r, "parent_tenant_id").map(String::from),
            metadata: json_field(r, "metadata"),
            default_commit_overage_policy: field(r, "default_commit_overage_policy")
                .unwrap_or(rules::DEFAULT_OVERAGE_POLICY.as_str())
                .to_string(),
            default_reservation_ttl_ms: int_field(r, "default_reservation_ttl_ms").unwrap_or(rules::DEFAULT_TTL_MS),
            max_reservation_ttl_ms: int_field(r, "max_reservation_ttl_ms").unwrap_or(rules::MAX_TTL_MS),
            max_reservation_extensions: int_field(r, "max_reservation_extensions").unwrap_or(rules::MAX_EXTENSIONS),
            reservation_expiry_policy: field(r, "reservation_expiry_policy").unwrap_or("AUTO_RELEASE").to_string(),
            observe_mode: field(r, "observe_mode").unwrap_or("ENFORCE").to_string(),
            evidence_enabled: field(r, "evidence_enabled").map(|v| v == "true"),
            created_at_ms: int_field(r, "created_at_ms").unwrap_or(0),
            updated_at_ms: int_field(r, "updated_at_ms"),
            suspended_at_ms: int_field(r, "suspended_at_ms"),
            closed_at_ms: int_field(r, "closed_at_ms"),
        })
    }

    fn decoded(r: Record) -> ApiResult<Tenant> {
        Tenant::from_record(&r).ok_or_else(|| ApiError::fault("a tenant script answered no record"))
    }
}

/// A tenant by id: 404 TENANT_NOT_FOUND when there is none.
pub async fn read(store: &Store, tenant_id: &str) -> ApiResult<Tenant> {
    let record: Record = store.conn().hgetall(TenantKeys::new(tenant_id).tenant()).await?;
    Tenant::from_record(&record).ok_or_else(|| ApiError::new(ErrorCode::TenantNotFound, messages::TENANT_NOT_FOUND))
}

/// A tenant's status, `None` when it has no record.
pub async fn status(store: &Store, tenant_id: &str) -> ApiResult<Option<String>> {
    Ok(store.conn().hget(TenantKeys::new(tenant_id).tenant(), "status").await?)
}

/// The ids of every registered tenant.
pub async fn registry(store: &Store) -> ApiResult<Vec<String>> {
    Ok(store.conn().smembers(keys::TENANT_REGISTRY).await?)
}

/// Every registered tenant (one round trip per tenant; operator listings only).
pub async fn all(store: &Store) -> ApiResult<Vec<Tenant>> {
    let mut out = vec![];
    for id in registry(store).await? {
        let record: Record = store.conn().hgetall(TenantKeys::new(&id).tenant()).await?;
        out.extend(Tenant::from_record(&record));
    }
    Ok(out)
}

script! {
    /// createTenant (`lua/tenant_create.lua`): `fields` is the record (JSON). Status CREATED,
    /// or EXISTING for a retry with the same id and name.
    pub struct CreateTenant = tenant_create -> RecordAnswer {
        keys: [tenant, events, audit_log],
        args: [context, fields],
    }
}

script! {
    /// updateTenant (`lua/tenant_update.lua`): `patch` is a JSON object of strings.
    pub struct UpdateTenant = tenant_update -> RecordAnswer {
        keys: [tenant, events, audit_log],
        args: [context, patch],
    }
}

script! {
    /// One bounded step of a closed tenant's cascade (`lua/tenant_cascade.lua`): status DONE or
    /// MORE. `children` holds the batch's reservation records, then `budgets`
    /// ledgers, `api_keys` keys and the tenant's subscriptions.
    pub struct CascadeStep = tenant_cascade -> Nothing {
        keys: [tenant, events, audit_log, expiry_index, listing_index; children],
        args: [context, reservations, budgets, record_ttl_ms, api_keys; reservation_ids],
    }
}

/// Global sorted set of tenants whose close cascade has not finished (the durable close
/// intent, scored by when it was written: before the CLOSED flip, removed once the cascade
/// is done).
pub const CLOSING: &str = "cy:closing";

/// Creates a tenant from its record's fields (a JSON object of strings). Returns the tenant
/// and whether it was new.
pub async fn create(store: &Store, context: &str, tenant_id: &str, fields: String) -> ApiResult<(Tenant, bool)> {
    // The registry first: a listed id whose record never got written is simply skipped.
    register_tenant(store, tenant_id).await?;
    let keys = TenantKeys::new(tenant_id);
    let call = CreateTenant {
        tenant: keys.tenant(),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context: context.to_string(),
        fields,
    };
    let reply = store.run(call).await?;
    let created = reply.status == "CREATED";
    if created {
        // A new tenant has no reservations from before the listing index to backfill.
        let _: () = store.conn().set_nx(keys.listing_backfill(), "done").await?;
    }
    Ok((Tenant::decoded(reply.value.0)?, created))
}

/// Updates a tenant (`patch`: a JSON object of strings, `status` optional). A change to CLOSED
/// writes the durable close intent first and drives the cascade to its end (its steps under
/// `cascade_context`). Returns the record.
pub async fn update(
    store: &Store,
    retention: Duration,
    tenant_id: &str,
    context: &str,
    cascade_context: &str,
    patch: String,
    closing: bool,
) -> ApiResult<Tenant> {
    let keys = TenantKeys::new(tenant_id);
    if closing {
        // The durable close intent comes first, so an interrupted cascade is always re-driven.
        let _: () =
            store.write(redis::cmd("ZADD").arg(CLOSING).arg(now_ms()).arg(tenant_id).to_owned(), CLOSING).await?;
    }
    let call = UpdateTenant {
        tenant: keys.tenant(),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context: context.to_string(),
        patch,
    };
    let reply = match store.run(call).await {
        Ok(r) => r,
        Err(e) if e.code == crate::error::ErrorCode::TenantNotFound && closing => {
            let _: () = store.conn().zrem(CLOSING, tenant_id).await?;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    if reply.status != "CLOSED" {
        return Tenant::decoded(reply.value.0);
    }
    close_cascade(store, retention, tenant_id, cascade_context).await?;
    read(store, tenant_id).await
}

/// Drives a CLOSED tenant's cascade to completion in bounded steps (idempotent; also run by
/// the maintenance sweep for closes a crash interrupted), then clears the close intent.
pub async fn close_cascade(store: &Store, retention: Duration, tenant_id: &str, context: &str) -> ApiResult<()> {
    let keys = TenantKeys::new(tenant_id);
    loop {
        let mut conn = store.conn();
        let rids: Vec<String> = conn.zrange(keys.expiry_index(), 0, 199).await?;
        let key_ids: Vec<String> = conn.smembers(keys.api_key_index()).await?;
        let subscriptions: Vec<String> = conn.smembers(keys.webhook_index()).await?;
        let mut step = CascadeStep {
            tenant: keys.tenant(),
            events: keys.events(),
            audit_log: keys.audit_log(),
            expiry_index: keys.expiry_index(),
            listing_index: keys.listing_index(),
            context: context.to_string(),
            reservations: rids.len().to_string(),
            record_ttl_ms: record_ttl(retention).as_millis().to_string(),
            api_keys: key_ids.len().to_string(),
            reservation_ids: rids.clone(),
            ..Default::default()
        };
        for rid in &rids {
            // Unparseable ids cannot be finalized here; the sweep quarantines them.
            let token = ReservationId::parse(rid).map(|r| r.token).unwrap_or_else(|| rid.clone());
            step.children.push(keys.reservation(&token));
        }
        let budgets = super::ledgers::ledger_keys(store, tenant_id).await?;
        step.budgets = budgets.len().to_string();
        step.children.extend(budgets);
        step.children.extend(key_ids.iter().map(|k| keys.api_key(k)));
        step.children.extend(subscriptions.iter().map(|w| keys.webhook(w)));
        if store.run(step).await?.status == "DONE" {
            break;
        }
    }
    let _: () = store.conn().zrem(CLOSING, tenant_id).await?;
    Ok(())
}

/// Re-drives every close whose cascade has not finished (maintenance).
pub async fn redrive_closes(store: &Store, retention: Duration) -> ApiResult<u64> {
    let pending: Vec<(String, i64)> = store.conn().zrange_withscores(CLOSING, 0, 99).await?;
    let mut done = 0;
    for (id, since) in pending {
        if status(store, &id).await?.as_deref() != Some("CLOSED") {
            // An intent whose flip never happened (the update failed); a young one may still
            // be in flight, so only stale intents are dropped.
            if now_ms() - since > 300_000 {
                let _: () = store.conn().zrem(CLOSING, &id).await?;
            }
            continue;
        }
        let context = serde_json::json!({"request_id": crate::ids::new_request_id(), "trace_id": "", "actor": "system",
            "correlation_id": format!("tenant_close_cascade:{id}:redrive")})
        .to_string();
        close_cascade(store, retention, &id, &context).await?;
        done += 1;
    }
    Ok(done)
}
