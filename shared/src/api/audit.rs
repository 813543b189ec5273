//! `GET /v1/admin/audit/logs` (listAuditLogs): the audit entries of every operator-plane
//! request and every change, filtered and sorted as the spec says. One owner's stream is read
//! when `tenant_id` names it; otherwise every tenant's and the two sentinels'. Each owner
//! contributes at most `ops::audit::SCAN_LIMIT` entries of the requested window.

use serde_json::Value;

use super::admin::*;
use super::{Answer, ApiRequest, App, Ctx};
use crate::error::{ApiError, ApiResult};
use crate::ops;
use crate::ops::audit::{ADMIN_OWNER, UNAUTH_OWNER};

/// Most members of an IN-list filter.
const MAX_LIST: usize = 25;

/// A comma-separated IN-list parameter (at most 25 members).
fn in_list(q: &ListQuery, name: &str) -> ApiResult<Option<Vec<String>>> {
    let Some(raw) = q.get(name) else { return Ok(None) };
    let items: Vec<String> = raw.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    if items.len() > MAX_LIST {
        return Err(ApiError::invalid(format!("{name} takes at most {MAX_LIST} values")));
    }
    Ok((!items.is_empty()).then_some(items))
}

fn status_param(q: &ListQuery, name: &str, bounded: bool) -> ApiResult<Option<u64>> {
    let Some(raw) = q.get(name) else { return Ok(None) };
    match raw.parse::<u64>() {
        Ok(n) if !bounded || (100..=599).contains(&n) => Ok(Some(n)),
        _ => Err(ApiError::invalid(format!("{name} must be an HTTP status from 100 to 599"))),
    }
}

/// Every filter of the spec, parsed and checked.
struct AuditFilter {
    key_id: Option<String>,
    operations: Option<Vec<String>>,
    status: Option<u64>,
    status_min: Option<u64>,
    status_max: Option<u64>,
    resource_types: Option<Vec<String>>,
    resource_id: Option<String>,
    error_codes: Option<Vec<String>>,
    error_codes_excluded: Option<Vec<String>>,
    trace_id: Option<String>,
    request_id: Option<String>,
}

impl AuditFilter {
    fn parse(q: &ListQuery) -> ApiResult<AuditFilter> {
        let status = status_param(q, "status", false)?;
        let (status_min, status_max) = (status_param(q, "status_min", true)?, status_param(q, "status_max", true)?);
        if status.is_some() && (status_min.is_some() || status_max.is_some()) {
            return Err(ApiError::invalid("status cannot be combined with status_min or status_max"));
        }
        if let (Some(a), Some(b)) = (status_min, status_max) {
            if a > b {
                return Err(ApiError::invalid("status_min must not exceed status_max"));
            }
        }
        let trace_id = q.get("trace_id").map(String::from);
        if trace_id
            .as_deref()
            .is_some_and(|t| t.len() != 32 || !t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        {
            return Err(ApiError::invalid("trace_id must be 32 lowercase hex characters"));
        }
        Ok(AuditFilter {
            key_id: q.get("key_id").map(String::from),
            operations: in_list(q, "operation")?,
            status,
            status_min,
            status_max,
            resource_types: in_list(q, "resource_type")?,
            resource_id: q.get("resource_id").map(String::from),
            error_codes: in_list(q, "error_code")?,
            error_codes_excluded: in_list(q, "error_code_exclude")?,
            trace_id,
            request_id: q.get("request_id").map(String::from),
        })
    }

    fn matches(&self, e: &Value, q: &ListQuery) -> bool {
        let s = |name: &str| e[name].as_str();
        let status = e["status"].as_u64();
        let in_set = |set: &Option<Vec<String>>, v: Option<&str>| {
            set.as_ref().is_none_or(|set| v.is_some_and(|v| set.iter().any(|x| x == v)))
        };
        self.key_id.as_deref().is_none_or(|k| s("key_id") == Some(k))
            && in_set(&self.operations, s("operation"))
            && self.status.is_none_or(|x| status == Some(x))
            && self.status_min.is_none_or(|x| status.is_some_and(|v| v >= x))
            && self.status_max.is_none_or(|x| status.is_some_and(|v| v <= x))
            && in_set(&self.resource_types, s("resource_type"))
            && self.resource_id.as_deref().is_none_or(|r| s("resource_id") == Some(r))
            && in_set(&self.error_codes, s("error_code"))
            // entries without an error code always pass the exclusion
            && self.error_codes_excluded.as_ref().is_none_or(|ex| s("error_code").is_none_or(|c| !ex.iter().any(|x| x == c)))
            && self.trace_id.as_deref().is_none_or(|t| s("trace_id") == Some(t))
            && self.request_id.as_deref().is_none_or(|r| s("request_id") == Some(r))
            && q.matches_search(&[
                s("resource_id").unwrap_or_default(),
                s("log_id").unwrap_or_default(),
                s("error_code").unwrap_or_default(),
                s("operation").unwrap_or_default(),
            ])
    }
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = ListQuery::parse(req, &["timestamp", "operation", "resource_type", "tenant_id", "key_id", "status"])?;
    let filter = AuditFilter::parse(&q)?;
    let (from, to) = (q.time("from")?, q.time("to")?);
    let owners = match q.get("tenant_id") {
        Some(t) => vec![t.to_string()],
        None => {
            let mut all = ops::tenants::registry(&app.store).await?;
            all.extend([ADMIN_OWNER.to_string(), UNAUTH_OWNER.to_string()]);
            all
        }
    };
    let mut rows = vec![];
    for owner in owners {
        for (ms, entry) in ops::audit::entries(&app.store, &owner, from, to).await? {
            if !filter.matches(&entry, &q) {
                continue;
            }
            let time = sort_int(ms);
            let key = match q.sort_by.as_str() {
                "timestamp" => time,
                "status" => format!("{}|{time}", sort_int(entry["status"].as_i64().unwrap_or(0))),
                field => format!("{}|{time}", entry[field].as_str().unwrap_or_default()),
            };
            let id = entry["log_id"].as_str().unwrap_or_default().to_string();
            rows.push((key, id, entry));
        }
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("logs", items, next)))
}
