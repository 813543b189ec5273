//! Export and import of one tenant: every key of its slot (its record, API keys as digests,
//! budgets, reservations open and finished with their idempotency records, policies, webhook
//! subscriptions and deliveries, counters, events and audit log) as JSON lines read at one
//! point, and their restore into another deployment with the global entries that point at them
//! (the tenant registry, the sweep's slot and due index, the owners of key, subscription and
//! policy ids). Signed receipts live outside the tenant's slot and are not carried.

use std::collections::BTreeSet;

use redis::AsyncCommands;
use serde_json::{json, Value};

use super::audit::AuditRecord;
use super::script;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::keys::{self, TenantKeys};
use crate::store::{Conn, Store};

/// The first line of an export names its format, so an import refuses anything else.
pub const FORMAT: &str = "cycles-tenant-export";
pub const FORMAT_VERSION: u64 = 1;
/// How often an export reads again when the tenant's keys changed while it read.
const ATTEMPTS: usize = 5;

script! {
    /// Reads the listed keys of one tenant at one point (`lua/tenant_export.lua`).
    pub struct ReadTenant = tenant_export read_only -> Vec<Value> {
        keys: [tenant; records],
        args: [],
    }
}

script! {
    /// Writes an exported tenant's keys (`lua/tenant_import.lua`): `keys` holds first the
    /// `existing` keys to delete (with `replace`), then one key per record.
    pub struct WriteTenant = tenant_import -> Written {
        keys: [tenant; keys],
        args: [replace, existing; records],
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct Written {
    pub written: u64,
}

/// Every key of `tenant`'s slot that belongs to it, sorted: SCAN on a standalone server, the
/// slot's own key listing on a cluster (other tenants that share the slot filtered out).
pub async fn tenant_keys(store: &Store, tenant: &str) -> ApiResult<Vec<String>> {
    let tk = TenantKeys::new(tenant);
    let prefix = format!("{}:", tk.prefix());
    let mut found = BTreeSet::new();
    match store.conn() {
        Conn::Cluster(mut c) => {
            use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
            let node = || {
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(tk.slot(), SlotAddr::Master)))
            };
            let mut count = redis::cmd("CLUSTER");
            count.arg("COUNTKEYSINSLOT").arg(tk.slot());
            let n: i64 =
                redis::from_redis_value(c.route_command(count, node()).await?).map_err(redis::RedisError::from)?;
            let mut list = redis::cmd("CLUSTER");
            list.arg("GETKEYSINSLOT").arg(tk.slot()).arg(n.max(1));
            let all: Vec<String> =
                redis::from_redis_value(c.route_command(list, node()).await?).map_err(redis::RedisError::from)?;
            found.extend(all.into_iter().filter(|k| k.starts_with(&prefix)));
        }
        mut conn => {
            let mut cursor = 0u64;
            loop {
                let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("{prefix}*"))
                    .arg("COUNT")
                    .arg(1_000)
                    .query_async(&mut conn)
                    .await?;
                found.extend(batch);
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
    }
    Ok(found.into_iter().collect())
}

/// The export of `tenant`: a header line, then one line per key
/// (`{"key": <suffix after the tenant's prefix>, "type", "ttl_ms", "value"}`), all read by one
/// script. When keys appeared while it read, it reads again (a tenant that keeps changing after
/// `ATTEMPTS` reads is refused: suspend it, or export off-peak).
pub async fn export(store: &Store, tenant: &str, now_ms: i64) -> ApiResult<Vec<Value>> {
    let tk = TenantKeys::new(tenant);
    for _ in 0..ATTEMPTS {
        let listed = tenant_keys(store, tenant).await?;
        if !listed.contains(&tk.tenant()) {
            return Err(ApiError::not_found(format!("Tenant not found: {tenant}")));
        }
        let read = store.run(ReadTenant { tenant: tk.tenant(), records: listed.clone() }).await?.value;
        let after: BTreeSet<String> = tenant_keys(store, tenant).await?.into_iter().collect();
        if !after.is_subset(&listed.iter().cloned().collect()) {
            continue;
        }
        let mut lines = vec![json!({"format": FORMAT, "version": FORMAT_VERSION, "tenant": tenant,
            "exported_at_ms": now_ms})];
        for (key, entry) in listed.iter().zip(read) {
            let (kind, ttl, value) = (&entry[0], entry[1].as_i64().unwrap_or(-1), &entry[2]);
            if kind == "none" {
                continue;
            }
            let suffix = &key[tk.prefix().len()..];
            lines.push(json!({"key": suffix, "type": kind, "ttl_ms": (ttl > 0).then_some(ttl),
                "value": shaped(kind.as_str().unwrap_or_default(), value)}));
        }
        lines[0]["records"] = json!(lines.len() - 1);
        audited(store, tenant, "exportTenant", json!({"records": lines.len() - 1})).await?;
        return Ok(lines);
    }
    Err(ApiError::new(
        ErrorCode::CountMismatch,
        format!("Tenant {tenant} kept changing during {ATTEMPTS} reads; suspend it (or export off-peak) and retry"),
    ))
}

/// A value as the export keeps it: strings as they are, a hash as its field-value list, a
/// sorted set as its member-score list, a stream as its entries ([id, [field, value, ...]]).
/// (The script's JSON encodes an empty list as `{}`; none is empty, as Redis keeps no empty key.)
fn shaped(kind: &str, value: &Value) -> Value {
    match (kind, value) {
        ("string", v) => v.clone(),
        (_, Value::Array(_)) => value.clone(),
        _ => json!([]),
    }
}

/// What an import did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Imported {
    pub tenant: String,
    pub records: u64,
}

/// Restores an export (its lines, header first) into this store, refusing an existing tenant
/// unless `replace` (its keys here are deleted first, in the same script). Then publishes the
/// global entries: registry and sweep slot, the due index when holds are open, and the owners
/// of its key, subscription and policy ids.
pub async fn import(store: &Store, lines: &[Value], replace: bool) -> ApiResult<Imported> {
    let header = lines.first().ok_or_else(|| ApiError::invalid("The export is empty"))?;
    if header["format"] != FORMAT || header["version"] != FORMAT_VERSION {
        return Err(ApiError::invalid(format!("Not a {FORMAT} of version {FORMAT_VERSION}")));
    }
    let tenant = header["tenant"].as_str().ok_or_else(|| ApiError::invalid("The export names no tenant"))?;
    crate::domain::validate_tenant_id(tenant)?;
    let tk = TenantKeys::new(tenant);
    let mut keys = Vec::new();
    let mut records = Vec::new();
    for (i, line) in lines[1..].iter().enumerate() {
        let suffix = line["key"].as_str().filter(|s| s.starts_with(':') && !s.contains(['{', '}']));
        let suffix = suffix.ok_or_else(|| ApiError::invalid(format!("Record {} has no key of this tenant", i + 1)))?;
        keys.push(format!("{}{suffix}", tk.prefix()));
        records.push(json!({"type": line["type"], "ttl_ms": line["ttl_ms"], "value": line["value"]}).to_string());
    }
    if header["records"].as_u64() != Some(keys.len() as u64) {
        return Err(ApiError::invalid("The export is cut short: fewer records than its header says"));
    }
    let existing = if replace { tenant_keys(store, tenant).await? } else { Vec::new() };
    let call = WriteTenant {
        tenant: tk.tenant(),
        replace: if replace { "1" } else { "" }.to_string(),
        existing: existing.len().to_string(),
        keys: existing.into_iter().chain(keys).collect(),
        records,
    };
    let written = store.run(call).await?.value.written;
    publish(store, tenant).await?;
    let details = json!({"records": written, "replace": replace, "exported_at_ms": header["exported_at_ms"]});
    audited(store, tenant, "importTenant", details).await?;
    Ok(Imported { tenant: tenant.to_string(), records: written })
}

/// The global entries an imported tenant needs (each idempotent).
async fn publish(store: &Store, tenant: &str) -> ApiResult<()> {
    let tk = TenantKeys::new(tenant);
    super::maintenance::register_tenant(store, tenant).await?;
    let mut conn = store.conn();
    let api_keys: Vec<String> = conn.smembers(tk.api_key_index()).await?;
    for id in api_keys {
        super::auth::publish_owner(store, &id, tenant).await?;
    }
    let subscriptions: Vec<String> = conn.smembers(tk.webhook_index()).await?;
    for id in subscriptions {
        super::webhooks::publish_owner(store, &id, tenant).await?;
    }
    let policies: Vec<String> = conn.hkeys(tk.policies()).await?;
    for id in policies {
        super::policies::publish_owner(store, &id, tenant).await?;
    }
    let first_due: Vec<(String, f64)> = conn.zrange_withscores(tk.expiry_index(), 0, 0).await?;
    if let Some((_, due)) = first_due.first() {
        let _: () = redis::cmd("ZADD")
            .arg(keys::due_index(tk.slot()))
            .arg("LT")
            .arg(*due as i64)
            .arg(tenant)
            .query_async(&mut conn)
            .await?;
    }
    super::overview::mark_stale(store).await
}

/// An entry in the tenant's audit log for an export or import (run by `cycles-admin`).
async fn audited(store: &Store, tenant: &str, operation: &str, details: Value) -> ApiResult<()> {
    let Value::Object(metadata) = details else { return Ok(()) };
    let entry = AuditRecord {
        tenant_id: tenant.to_string(),
        operation: operation.to_string(),
        status: 200,
        resource_type: "tenant".to_string(),
        resource_id: tenant.to_string(),
        actor_type: "admin".to_string(),
        user_agent: Some("cycles-admin".to_string()),
        metadata,
        ..Default::default()
    };
    super::audit::append(store, tenant, entry).await
}
