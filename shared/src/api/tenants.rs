//! Tenants: create, get, list, update (status machine), and the close cascade.

use redis::AsyncCommands;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::{rules, validate_tenant_id};
use crate::error::{ApiError, ApiResult};
use crate::keys::{self, TenantKeys};
use crate::model::{parse_json, OveragePolicy, TTL_MS};
use crate::ops;
use crate::store::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ExpiryPolicy {
    AutoRelease,
    ManualCleanup,
    GraceOnly,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TenantStatus {
    Active,
    Suspended,
    Closed,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantCreateRequest {
    pub tenant_id: String,
    pub name: String,
    #[serde(default)]
    pub parent_tenant_id: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub default_commit_overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    pub default_reservation_ttl_ms: Option<i64>,
    #[serde(default)]
    pub max_reservation_ttl_ms: Option<i64>,
    #[serde(default)]
    pub max_reservation_extensions: Option<i64>,
    #[serde(default)]
    pub reservation_expiry_policy: Option<ExpiryPolicy>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantUpdateRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    status: Option<TenantStatus>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    #[serde(default)]
    default_commit_overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    default_reservation_ttl_ms: Option<i64>,
    #[serde(default)]
    max_reservation_ttl_ms: Option<i64>,
    #[serde(default)]
    max_reservation_extensions: Option<i64>,
}

fn check_name(name: &str) -> ApiResult<()> {
    if name.trim().is_empty() || name.chars().count() > 256 {
        return Err(ApiError::invalid("name must be 1 to 256 characters"));
    }
    Ok(())
}

fn check_metadata(m: &Option<Map<String, Value>>) -> ApiResult<Option<String>> {
    match m {
        None => Ok(None),
        Some(m) if m.len() > 32 => Err(ApiError::invalid("metadata may hold at most 32 entries")),
        Some(m) if m.values().any(|v| !v.is_string()) => Err(ApiError::invalid("metadata values must be strings")),
        Some(m) => Ok(Some(Value::Object(m.clone()).to_string())),
    }
}

/// The reservation settings shared by create and update, as record fields.
fn settings(
    policy: Option<OveragePolicy>,
    default_ttl: Option<i64>,
    max_ttl: Option<i64>,
    max_ext: Option<i64>,
) -> ApiResult<Vec<(&'static str, String)>> {
    for (name, v) in [("default_reservation_ttl_ms", default_ttl), ("max_reservation_ttl_ms", max_ttl)] {
        if v.is_some_and(|v| !(TTL_MS.0..=TTL_MS.1).contains(&v)) {
            return Err(ApiError::invalid(format!("{name} must be from {} to {}", TTL_MS.0, TTL_MS.1)));
        }
    }
    if max_ext.is_some_and(|v| v < 0) {
        return Err(ApiError::invalid("max_reservation_extensions must be >= 0"));
    }
    let mut out = vec![];
    if let Some(p) = policy {
        out.push(("default_commit_overage_policy", p.as_str().to_string()));
    }
    for (name, v) in [
        ("default_reservation_ttl_ms", default_ttl),
        ("max_reservation_ttl_ms", max_ttl),
        ("max_reservation_extensions", max_ext),
    ] {
        if let Some(v) = v {
            out.push((name, v.to_string()));
        }
    }
    Ok(out)
}

/// The wire `Tenant` of a stored record.
pub fn tenant_json(r: &Record) -> Value {
    let mut t = json!({
        "tenant_id": field(r, "tenant_id").unwrap_or_default(),
        "name": field(r, "name").unwrap_or_default(),
        "status": field(r, "status").unwrap_or("ACTIVE"),
        "default_commit_overage_policy": field(r, "default_commit_overage_policy").unwrap_or(rules::DEFAULT_OVERAGE_POLICY.as_str()),
        "default_reservation_ttl_ms": int_field(r, "default_reservation_ttl_ms").unwrap_or(rules::DEFAULT_TTL_MS),
        "max_reservation_ttl_ms": int_field(r, "max_reservation_ttl_ms").unwrap_or(rules::MAX_TTL_MS),
        "max_reservation_extensions": int_field(r, "max_reservation_extensions").unwrap_or(rules::MAX_EXTENSIONS),
        "reservation_expiry_policy": field(r, "reservation_expiry_policy").unwrap_or("AUTO_RELEASE"),
        "created_at": time_field(r, "created_at").unwrap_or_else(|| crate::domain::format_rfc3339_ms(0)),
    });
    if let Some(p) = field(r, "parent_tenant_id") {
        t["parent_tenant_id"] = json!(p);
    }
    if let Some(m) = json_field(r, "metadata") {
        t["metadata"] = m;
    }
    for name in ["updated_at", "suspended_at", "closed_at"] {
        if let Some(ts) = time_field(r, name) {
            t[name] = json!(ts);
        }
    }
    t
}

/// Creates a tenant (the library entry point `--seed-demo` and the HTTP handler share).
/// Returns the record and whether it was new.
pub async fn create_tenant(store: &Store, context: &str, r: &TenantCreateRequest) -> ApiResult<(Record, bool)> {
    validate_tenant_id(&r.tenant_id)?;
    if r.tenant_id == "bulk-action" || r.tenant_id == "__system__" {
        return Err(ApiError::invalid("tenant_id is reserved"));
    }
    check_name(&r.name)?;
    let mut fields = Map::new();
    fields.insert("tenant_id".into(), json!(r.tenant_id));
    fields.insert("name".into(), json!(r.name));
    if let Some(p) = &r.parent_tenant_id {
        fields.insert("parent_tenant_id".into(), json!(p));
    }
    if let Some(m) = check_metadata(&r.metadata)? {
        fields.insert("metadata".into(), json!(m));
    }
    let policy = r.default_commit_overage_policy.or(Some(rules::DEFAULT_OVERAGE_POLICY));
    let s = settings(
        policy,
        r.default_reservation_ttl_ms.or(Some(rules::DEFAULT_TTL_MS)),
        r.max_reservation_ttl_ms.or(Some(rules::MAX_TTL_MS)),
        r.max_reservation_extensions.or(Some(rules::MAX_EXTENSIONS)),
    )?;
    for (k, v) in s {
        fields.insert(k.into(), json!(v));
    }
    let expiry = match r.reservation_expiry_policy.unwrap_or(ExpiryPolicy::AutoRelease) {
        ExpiryPolicy::AutoRelease => "AUTO_RELEASE",
        ExpiryPolicy::ManualCleanup => "MANUAL_CLEANUP",
        ExpiryPolicy::GraceOnly => "GRACE_ONLY",
    };
    fields.insert("reservation_expiry_policy".into(), json!(expiry));
    ops::tenants::create(store, context, &r.tenant_id, Value::Object(fields).to_string()).await
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, req).await?;
    let (r, _) = parse_json::<TenantCreateRequest>(&req.body)?;
    ctx.tenant = Some(r.tenant_id.clone());
    let context = script_context(ctx, &Caller::Admin, false, None);
    let (record, created) = create_tenant(&app.store, &context, &r).await?;
    Ok(Answer::json(if created { 201 } else { 200 }, &tenant_json(&record)))
}

async fn load(app: &App, tenant_id: &str) -> ApiResult<Record> {
    let record: Record = app.store.conn().hgetall(TenantKeys::new(tenant_id).tenant()).await?;
    if record.is_empty() {
        return Err(ApiError::new(crate::error::ErrorCode::TenantNotFound, crate::domain::messages::TENANT_NOT_FOUND));
    }
    Ok(record)
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, req).await?;
    let id = req.param("tenant_id");
    ctx.tenant = Some(id.to_string());
    Ok(Answer::json(200, &tenant_json(&load(app, id).await?)))
}

/// Every registered tenant's record (one round trip per tenant; operator listings only).
pub async fn all_tenants(app: &App) -> ApiResult<Vec<Record>> {
    let ids: Vec<String> = app.store.conn().smembers(keys::TENANT_REGISTRY).await?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        let r: Record = app.store.conn().hgetall(TenantKeys::new(&id).tenant()).await?;
        if !r.is_empty() {
            out.push(r);
        }
    }
    Ok(out)
}

pub async fn list(app: &App, _ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, req).await?;
    let q = ListQuery::parse(req, &["created_at", "tenant_id", "name", "status"])?;
    if let Some(s) = q.get("status") {
        if !["ACTIVE", "SUSPENDED", "CLOSED"].contains(&s) {
            return Err(ApiError::invalid("status must be ACTIVE, SUSPENDED or CLOSED"));
        }
    }
    let mut rows = vec![];
    for r in all_tenants(app).await? {
        let t = tenant_json(&r);
        let id = t["tenant_id"].as_str().unwrap_or_default().to_string();
        let name = t["name"].as_str().unwrap_or_default().to_string();
        if q.get("status").is_some_and(|s| t["status"] != s)
            || q.get("parent_tenant_id").is_some_and(|p| field(&r, "parent_tenant_id") != Some(p))
            || !q.matches_search(&[&id, &name])
        {
            continue;
        }
        let key = match q.sort_by.as_str() {
            "tenant_id" => id.clone(),
            "name" => name.to_lowercase(),
            "status" => t["status"].as_str().unwrap_or_default().to_string(),
            _ => sort_int(int_field(&r, "created_at_ms").unwrap_or(0)),
        };
        rows.push((key, id, t));
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("tenants", items, next)))
}

pub async fn update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, req).await?;
    let id = req.param("tenant_id").to_string();
    ctx.tenant = Some(id.clone());
    let (r, _) = parse_json::<TenantUpdateRequest>(&req.body)?;
    let mut patch = Map::new();
    if let Some(n) = &r.name {
        check_name(n)?;
        patch.insert("name".into(), json!(n));
    }
    if let Some(m) = check_metadata(&r.metadata)? {
        patch.insert("metadata".into(), json!(m));
    }
    let s = settings(
        r.default_commit_overage_policy,
        r.default_reservation_ttl_ms,
        r.max_reservation_ttl_ms,
        r.max_reservation_extensions,
    )?;
    for (k, v) in s {
        patch.insert(k.into(), json!(v));
    }
    let closing = r.status == Some(TenantStatus::Closed);
    if let Some(s) = r.status {
        let s = match s {
            TenantStatus::Active => "ACTIVE",
            TenantStatus::Suspended => "SUSPENDED",
            TenantStatus::Closed => "CLOSED",
        };
        patch.insert("status".into(), json!(s));
    }
    let correlation = closing.then(|| format!("tenant_close_cascade:{id}:{}", ctx.request_id));
    let context = script_context(ctx, &Caller::Admin, false, correlation.as_deref());
    let patch = Value::Object(patch).to_string();
    let record = ops::tenants::update(&app.store, app.config.retention, &id, &context, patch, closing).await?;
    Ok(Answer::json(200, &tenant_json(&record)))
}
