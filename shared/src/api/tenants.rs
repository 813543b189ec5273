//! Tenants: create, get, list, update (status machine), and the close cascade.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::{format_rfc3339_ms, rules, validate_tenant_id};
use crate::error::{ApiError, ApiResult};
use crate::model::{parse_json, ObserveMode, OveragePolicy, TTL_MS};
use crate::ops;
use crate::ops::tenants::Tenant;
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
    /// v0.1.26: the tenant's default observe mode (ENFORCE when absent).
    #[serde(default)]
    pub observe_mode: Option<ObserveMode>,
    /// CyclesEvidence for this tenant (`CYCLES_EVIDENCE=on`: unless false; `tenant`: if true).
    #[serde(default)]
    pub evidence_enabled: Option<bool>,
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
    #[serde(default)]
    observe_mode: Option<ObserveMode>,
    #[serde(default)]
    evidence_enabled: Option<bool>,
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

/// The wire `Tenant`.
pub fn tenant_json(t: &Tenant) -> Value {
    let mut out = json!({
        "tenant_id": t.tenant_id,
        "name": t.name,
        "status": t.status,
        "default_commit_overage_policy": t.default_commit_overage_policy,
        "default_reservation_ttl_ms": t.default_reservation_ttl_ms,
        "max_reservation_ttl_ms": t.max_reservation_ttl_ms,
        "max_reservation_extensions": t.max_reservation_extensions,
        "reservation_expiry_policy": t.reservation_expiry_policy,
        "observe_mode": t.observe_mode,
        "created_at": format_rfc3339_ms(t.created_at_ms),
    });
    if let Some(p) = &t.parent_tenant_id {
        out["parent_tenant_id"] = json!(p);
    }
    if let Some(m) = &t.metadata {
        out["metadata"] = m.clone();
    }
    if let Some(e) = t.evidence_enabled {
        out["evidence_enabled"] = json!(e);
    }
    for (name, at) in
        [("updated_at", t.updated_at_ms), ("suspended_at", t.suspended_at_ms), ("closed_at", t.closed_at_ms)]
    {
        if let Some(ms) = at {
            out[name] = json!(format_rfc3339_ms(ms));
        }
    }
    out
}

/// Creates a tenant (the library entry point `--seed-demo` and the HTTP handler share).
/// Returns the record and whether it was new.
pub async fn create_tenant(store: &Store, context: &str, r: &TenantCreateRequest) -> ApiResult<(Tenant, bool)> {
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
    fields.insert("observe_mode".into(), json!(r.observe_mode.unwrap_or(ObserveMode::Enforce).as_str()));
    if let Some(e) = r.evidence_enabled {
        fields.insert("evidence_enabled".into(), json!(e.to_string()));
    }
    ops::tenants::create(store, context, &r.tenant_id, Value::Object(fields).to_string()).await
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<TenantCreateRequest>(&req.body)?;
    ctx.act_for(&r.tenant_id)?;
    let context = script_context(ctx, &Caller::Admin, false, None);
    let (record, created) = create_tenant(&app.store, &context, &r).await?;
    Ok(Answer::json(if created { 201 } else { 200 }, &tenant_json(&record)))
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let id = req.param("tenant_id");
    ctx.act_for(id)?;
    Ok(Answer::json(200, &tenant_json(&ops::tenants::read(&app.store, id).await?)))
}

/// The tenant selection of listTenants (query) and bulkActionTenants (body): every given
/// property must hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantFilter {
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub parent_tenant_id: Option<String>,
    /// v0.1.26: DISABLED, OBSERVE or ENFORCE.
    #[serde(default)]
    pub observe_mode: Option<String>,
    #[serde(default)]
    pub search: Option<String>,
}

impl TenantFilter {
    pub fn from_query(q: &ListQuery) -> ApiResult<TenantFilter> {
        let f = TenantFilter {
            status: q.get("status").map(String::from),
            parent_tenant_id: q.get("parent_tenant_id").map(String::from),
            observe_mode: q.get("observe_mode").map(String::from),
            search: q.get("search").map(String::from),
        };
        f.check()?;
        Ok(f)
    }

    pub fn check(&self) -> ApiResult<()> {
        check_status(self.status.as_deref(), &["ACTIVE", "SUSPENDED", "CLOSED"])?;
        if self.observe_mode.as_deref().is_some_and(|m| !["DISABLED", "OBSERVE", "ENFORCE"].contains(&m)) {
            return Err(ApiError::invalid("observe_mode must be DISABLED, OBSERVE or ENFORCE"));
        }
        check_search(self.search.as_deref())
    }

    pub fn matches(&self, t: &Tenant) -> bool {
        self.status.as_ref().is_none_or(|s| t.status == *s)
            && self.parent_tenant_id.as_ref().is_none_or(|p| t.parent_tenant_id.as_deref() == Some(p))
            && self.observe_mode.as_ref().is_none_or(|m| t.observe_mode == *m)
            && search_matches(self.search.as_deref(), &[&t.tenant_id, &t.name])
    }
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = ListQuery::parse(req, &["created_at", "tenant_id", "name", "status"])?;
    let filter = TenantFilter::from_query(&q)?;
    let mut rows = vec![];
    for t in ops::tenants::all(&app.store).await? {
        if !filter.matches(&t) {
            continue;
        }
        let key = match q.sort_by.as_str() {
            "tenant_id" => t.tenant_id.clone(),
            "name" => t.name.to_lowercase(),
            "status" => t.status.clone(),
            _ => sort_int(t.created_at_ms),
        };
        rows.push((key, t.tenant_id.clone(), tenant_json(&t)));
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("tenants", items, next)))
}

pub async fn update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let id = req.param("tenant_id").to_string();
    ctx.act_for(&id)?;
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
    if let Some(m) = r.observe_mode {
        patch.insert("observe_mode".into(), json!(m.as_str()));
    }
    if let Some(e) = r.evidence_enabled {
        patch.insert("evidence_enabled".into(), json!(e.to_string()));
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
    let record =
        ops::tenants::update(&app.store, app.config.retention, &id, &context, &context, patch, closing).await?;
    Ok(Answer::json(200, &tenant_json(&record)))
}
