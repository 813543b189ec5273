//! Export and import of one tenant: every key of its slot (its record, API keys as digests,
//! budgets, reservations open and finished with their idempotency records, policies, webhook
//! subscriptions and deliveries, counters, events and audit log) as JSON lines, listed and read
//! by one script (one point in time), and their restore into another deployment with the
//! global entries that point at them (the tenant registry, the sweep's slot and due index, the
//! owners of key, subscription and policy ids). Signed receipts live outside the tenant's slot
//! and are not carried.

use redis::AsyncCommands;
use serde_json::{json, Value};

use super::audit::AuditRecord;
use super::script;
use crate::error::{ApiError, ApiResult};
use crate::keys::{self, TenantKeys};
use crate::store::Store;

/// The first line of an export names its format, so an import refuses anything else.
pub const FORMAT: &str = "cycles-tenant-export";
pub const FORMAT_VERSION: u64 = 1;

script! {
    /// Reads every key of one tenant at one point (`lua/tenant_export.lua`): `prefix` is the
    /// tenant's key prefix, `slot` its slot on a cluster ('' on a standalone server).
    pub struct ReadTenant = tenant_export read_only -> Vec<Value> {
        keys: [tenant],
        args: [prefix, slot],
    }
}

script! {
    /// Writes an exported tenant's keys (`lua/tenant_import.lua`), one key per record; with
    /// `replace`, the tenant's keys here (found by `prefix` and `slot`) go first.
    pub struct WriteTenant = tenant_import -> Written {
        keys: [tenant; keys],
        args: [replace, prefix, slot; records],
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct Written {
    pub written: u64,
}

/// The prefix of every key of `tenant` and (on a cluster) its slot, as the scripts take them.
fn where_keys_are(store: &Store, tk: &TenantKeys) -> (String, String) {
    let slot = if store.is_cluster() { tk.slot().to_string() } else { String::new() };
    (format!("{}:", tk.prefix()), slot)
}

/// The export of `tenant`: a header line, then one line per key
/// (`{"key": <suffix after the tenant's prefix>, "type", "ttl_ms", "value"}`), all listed and
/// read by one script, so at one point in time.
pub async fn export(store: &Store, tenant: &str, now_ms: i64) -> ApiResult<Vec<Value>> {
    let tk = TenantKeys::new(tenant);
    let (prefix, slot) = where_keys_are(store, &tk);
    let read = store.run(ReadTenant { tenant: tk.tenant(), prefix, slot }).await?.value;
    let mut lines = vec![json!({"format": FORMAT, "version": FORMAT_VERSION, "tenant": tenant,
        "exported_at_ms": now_ms, "records": read.len()})];
    for entry in &read {
        let (key, kind, ttl, value) = (entry[0].as_str().unwrap_or_default(), &entry[1], entry[2].as_i64(), &entry[3]);
        let suffix = key.strip_prefix(tk.prefix()).ok_or_else(|| ApiError::fault(format!("export read {key}")))?;
        lines.push(json!({"key": suffix, "type": kind, "ttl_ms": ttl.filter(|t| *t > 0),
            "value": shaped(kind.as_str().unwrap_or_default(), value)}));
    }
    audited(store, tenant, "exportTenant", json!({"records": read.len()})).await?;
    Ok(lines)
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
    let (prefix, slot) = where_keys_are(store, &tk);
    let replace = if replace { "1" } else { "" }.to_string();
    let call = WriteTenant { tenant: tk.tenant(), keys, replace: replace.clone(), prefix, slot, records };
    let written = store.run(call).await?.value.written;
    publish(store, tenant).await?;
    let details = json!({"records": written, "replace": replace == "1", "exported_at_ms": header["exported_at_ms"]});
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
        let due_index = keys::due_index(tk.slot());
        let _: () = store
            .write(redis::cmd("ZADD").arg(&due_index).arg("LT").arg(*due as i64).arg(tenant).to_owned(), &due_index)
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
