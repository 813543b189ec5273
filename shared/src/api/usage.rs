//! Spend reports (an extension, `docs/openapi/usage.yaml`): `GET /v1/usage` (runtime plane, a
//! tenant key with `balances:read`: its own tenant, within the key's scope filter) and
//! `GET /v1/admin/usage` (operator plane: the admin key with `tenant_id`, or a tenant key as
//! on the runtime plane). Rows per bucket and group, JSON or CSV, in pages bounded by the
//! buckets and groups they read (`ops::usage::page`).

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::{parse_limit, parse_query, query_time, Answer, ApiRequest, App, Ctx};
use crate::domain::usage::{csv, Dim, Granularity, Row, Selection};
use crate::domain::{format_rfc3339_ms, now_ms, Permission};
use crate::error::{ApiError, ApiResult};
use crate::keys::digest;
use crate::model::Unit;
use crate::ops::usage::{page, Position, Reader, Report};

/// Buckets one report may span (a page reads at most `ops::usage::PAGE_BUCKETS` of them).
pub const MAX_BUCKETS: i64 = 10_000;

/// `GET /v1/usage`: the calling key's tenant.
pub async fn tenant_get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let key = match app.authenticate(ctx, req, false).await? {
        Caller::Tenant(k) => k,
        Caller::Admin => return Err(super::auth::rejected(super::auth::unauthorized(), "API_KEY_REQUIRED")),
    };
    ctx.act_for(&key.tenant)?;
    report(app, &parse_query(&req.query)?, &key.tenant, Some(&key)).await
}

/// `GET /v1/admin/usage`: the admin key for `tenant_id`, or a tenant key for its own.
pub async fn admin_get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::BalancesRead)).await?;
    let q = parse_query(&req.query)?;
    let tenant = match &caller {
        Caller::Admin => q
            .get("tenant_id")
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::invalid("tenant_id is required with the admin key"))?
            .clone(),
        Caller::Tenant(k) => {
            if q.get("tenant_id").is_some_and(|t| !t.is_empty() && *t != k.tenant) {
                return Err(ApiError::forbidden("tenant_id does not match the tenant of the API key"));
            }
            k.tenant.clone()
        }
    };
    ctx.act_for(&tenant)?;
    let key = match &caller {
        Caller::Tenant(k) => Some(k),
        Caller::Admin => None,
    };
    report(app, &q, &tenant, key).await
}

async fn report(
    app: &App,
    q: &HashMap<String, String>,
    tenant: &str,
    key: Option<&super::auth::TenantKey>,
) -> ApiResult<Answer> {
    let get = |name: &str| q.get(name).map(String::as_str).filter(|v| !v.is_empty());
    let granularity = Granularity::parse(get("granularity").unwrap_or("day"))?;
    let to = query_time(get("to"), "to")?.unwrap_or_else(now_ms);
    let from = query_time(get("from"), "from")?
        .ok_or_else(|| ApiError::invalid("from is required (an RFC 3339 date-time)"))?;
    if from >= to {
        return Err(ApiError::invalid("from must be before to"));
    }
    let (first, last) = (granularity.bucket_of(from), granularity.bucket_of(to - 1));
    if last - first + 1 > MAX_BUCKETS {
        return Err(ApiError::invalid(format!(
            "from..to spans {} {} buckets; at most {MAX_BUCKETS} (use a coarser granularity)",
            last - first + 1,
            granularity.as_str()
        )));
    }
    let dims = Dim::parse_list(get("group_by").unwrap_or(""))?;
    let unit = get("unit")
        .map(|u| {
            Unit::parse(u).map(|u| u.as_str().to_string()).ok_or_else(|| ApiError::invalid("unit is not a known unit"))
        })
        .transpose()?;
    let scope_prefix = get("scope_prefix").map(|p| p.to_ascii_lowercase());
    let format = get("format").unwrap_or("json");
    if !matches!(format, "json" | "csv") {
        return Err(ApiError::invalid("format must be json or csv"));
    }
    let limit = parse_limit(q.get("limit").filter(|v| !v.is_empty()), if format == "csv" { 10_000 } else { 1_000 })?;
    // a cursor is bound to the question it answers
    let question = [
        tenant,
        granularity.as_str(),
        &first.to_string(),
        &last.to_string(),
        &dims.iter().map(|d| d.name()).collect::<Vec<_>>().join(","),
        unit.as_deref().unwrap_or(""),
        scope_prefix.as_deref().unwrap_or(""),
    ];
    let bound = digest(&question);
    let at = match get("cursor") {
        None => Position { bucket: first, skip: 0 },
        Some(c) => decode_cursor(c, &bound, first, last)?,
    };
    let report = Report { granularity, last, dims, selection: Selection { unit, scope_prefix }, limit };
    let reader =
        key.map(|k| Reader { key_id: &k.key_id, digest: &k.digest, accepted: Permission::BalancesRead.accepted() });
    let (rows, next) = page(&app.store, tenant, reader, &report, at, app.config.usage).await?;
    let next_cursor = next.map(|p| URL_SAFE_NO_PAD.encode(format!("{bound}\n{}\n{}", p.bucket, p.skip)));
    if format == "csv" {
        let answer = Answer::text(200, "text/csv; charset=utf-8", csv(granularity, &report.dims, &rows));
        return Ok(match next_cursor {
            Some(c) => answer.with_header("x-cycles-next-cursor", c),
            None => answer,
        });
    }
    let mut body = json!({
        "tenant_id": tenant,
        "granularity": granularity.as_str(),
        "from": format_rfc3339_ms(from),
        "to": format_rfc3339_ms(to),
        "group_by": report.dims.iter().map(|d| d.name()).collect::<Vec<_>>(),
        "rows": rows.iter().map(|r| row_json(granularity, &report.dims, r)).collect::<Vec<_>>(),
        "has_more": next_cursor.is_some(),
    });
    if let Some(c) = next_cursor {
        body["next_cursor"] = json!(c);
    }
    Ok(Answer::json(200, &body))
}

fn row_json(g: Granularity, dims: &[Dim], r: &Row) -> Value {
    let mut m = Map::new();
    m.insert("bucket_start".into(), json!(format_rfc3339_ms(g.start_ms(r.bucket))));
    m.insert("bucket_end".into(), json!(format_rfc3339_ms(g.start_ms(r.bucket + 1))));
    // (a dimension the group does not have, e.g. the agent of a workspace-level charge, is absent)
    for (d, v) in dims.iter().zip(&r.dims).filter(|(_, v)| !v.is_empty()) {
        m.insert(d.name().into(), json!(v));
    }
    m.insert("unit".into(), json!(r.unit));
    let f = &r.figures;
    for (name, v) in [("spent", f.spent), ("estimated", f.estimated)] {
        // (i128 amounts: serde_json writes them as integers)
        m.insert(name.into(), serde_json::to_value(v).unwrap_or(Value::Null));
    }
    m.insert("charges".into(), json!(f.charges));
    m.insert("reservations".into(), json!(f.reservations));
    m.insert("released".into(), json!(f.released));
    Value::Object(m)
}

fn decode_cursor(cursor: &str, bound: &str, first: i64, last: i64) -> ApiResult<Position> {
    let bad = || ApiError::invalid("cursor is malformed or was issued for a different report");
    let text = URL_SAFE_NO_PAD.decode(cursor).ok().and_then(|b| String::from_utf8(b).ok()).ok_or_else(bad)?;
    let mut parts = text.split('\n');
    if parts.next() != Some(bound) {
        return Err(bad());
    }
    let bucket: i64 = parts.next().and_then(|b| b.parse().ok()).ok_or_else(bad)?;
    let skip: usize = parts.next().and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    if parts.next().is_some() || !(first..=last).contains(&bucket) {
        return Err(bad());
    }
    Ok(Position { bucket, skip })
}
