//! v0.1.26 action-quota counters for operators: `GET /v1/admin/action-quota-counters` (admin
//! key for any tenant, or a tenant key with `action_quotas:read`, `balances:read` accepted as
//! its deprecated fallback) and `POST /v1/admin/action-quota-counters/reset` (admin key only).

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::Deserialize;
use serde_json::json;

use super::admin::*;
use super::{parse_limit, parse_query, query_bool, Answer, ApiRequest, App, Ctx};
use crate::domain::action_kinds::RISK_CLASSES;
use crate::domain::Permission;
use crate::error::{ApiError, ApiResult};
use crate::model::parse_json;
use crate::ops::policies::QUOTA_WINDOWS;
use crate::ops::quotas::{member, CounterFilter};

/// The most index members one listing request examines (a page may come back short, with a
/// cursor, when filters skip many): the bound on what one request reads.
pub const MAX_EXAMINED: usize = 1_000;

fn check_window(w: Option<&str>) -> ApiResult<()> {
    match w {
        Some(w) if !QUOTA_WINDOWS.contains(&w) => {
            Err(ApiError::invalid(format!("window must be one of {}", QUOTA_WINDOWS.join(", "))))
        }
        _ => Ok(()),
    }
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::ActionQuotasRead)).await?;
    let q = parse_query(&req.query)?;
    let get = |name: &str| q.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let (tenant, fallback) = match &caller {
        Caller::Admin => (
            get("tenant_id").ok_or_else(|| ApiError::invalid("tenant_id is required with the admin key"))?.to_string(),
            false,
        ),
        Caller::Tenant(k) => {
            let held = k.permissions();
            let primary = held.iter().any(|p| p == "action_quotas:read" || p == "admin:read");
            (k.tenant.clone(), !primary)
        }
    };
    ctx.act_for(&tenant)?;
    check_window(get("window"))?;
    let limit = parse_limit(q.get("limit").filter(|v| !v.is_empty()), 200)?;
    let include_zero = query_bool(get("include_zero"), "include_zero")?.unwrap_or(false);
    if get("run_id").is_some_and(|r| r.chars().count() > 256) {
        return Err(ApiError::invalid("run_id must be at most 256 characters"));
    }
    let after = match get("cursor") {
        None => String::new(),
        Some(c) => URL_SAFE_NO_PAD
            .decode(c)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| ApiError::invalid("cursor is malformed"))?,
    };
    let filter = CounterFilter {
        after,
        scope: get("scope").unwrap_or("").to_ascii_lowercase(),
        kind: get("action_kind").unwrap_or("").to_string(),
        window: get("window").unwrap_or("").to_string(),
        run: get("run_id").unwrap_or("").to_string(),
        include_zero,
        limit,
        examine: MAX_EXAMINED,
    };
    let page = crate::ops::quotas::page(&app.store, &tenant, filter).await?;
    let mut rows = page.rows;
    // more follow when a row beyond the page was found, or the walk stopped at its bound
    let next = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| member(&r.scope, &r.label, &r.window, &r.bucket))
    } else {
        (!page.last.is_empty()).then_some(page.last)
    };
    let counters: Vec<_> = rows.iter().map(|r| r.state()).collect();
    let body = list_body("counters", counters, next.map(|m| URL_SAFE_NO_PAD.encode(m)));
    let answer = Answer::json(200, &body).with_header("x-cycles-tenant", tenant);
    Ok(if fallback { answer.with_header("x-cycles-permission-deprecated", "balances:read".into()) } else { answer })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetRequest {
    #[serde(default)]
    tenant_id: Option<String>,
    scope: String,
    action_kind: String,
    #[serde(default)]
    risk_class: Option<String>,
    window: String,
    window_key: String,
    #[serde(default)]
    reason: Option<String>,
}

pub async fn reset(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<ResetRequest>(&req.body)?;
    let tenant =
        r.tenant_id.filter(|t| !t.is_empty()).ok_or_else(|| ApiError::invalid("missing_required_field: tenant_id"))?;
    crate::domain::validate_tenant_id(&tenant)?;
    ctx.act_for(&tenant)?;
    check_window(Some(&r.window))?;
    if r.reason.as_ref().is_some_and(|x| x.chars().count() > 512) {
        return Err(ApiError::invalid("reason must be at most 512 characters"));
    }
    let label = match (r.action_kind.as_str(), r.risk_class.as_deref()) {
        ("__risk__", Some(c)) if RISK_CLASSES.contains(&c) => format!("__risk__:{c}"),
        ("__risk__", _) => {
            return Err(ApiError::invalid("risk_class (a valid ActionRiskClass) is required with __risk__"))
        }
        (kind, _) if kind.is_empty() || kind.chars().count() > 64 => {
            return Err(ApiError::invalid("action_kind must be 1 to 64 characters"))
        }
        (kind, _) => kind.to_string(),
    };
    let m = member(&r.scope.to_ascii_lowercase(), &label, &r.window, &r.window_key);
    let context = script_context(ctx, &Caller::Admin, true, None);
    let row = crate::ops::quotas::reset(&app.store, &tenant, m, context, r.reason.unwrap_or_default()).await?;
    let previous = row.previous.as_deref().and_then(|p| p.parse::<i64>().ok()).unwrap_or(0);
    Ok(Answer::json(200, &json!({"counter": row.state(), "previous_used": previous})))
}
