//! The public action-kind registry (protocol v0.1.26, `cycles-action-kinds-v0.1.26.yaml`):
//! `GET /v1/action-kinds` and `GET /v1/action-kinds/{kind}`, open without a key. Abuse
//! protection: at most `CYCLES_PUBLIC_RATE_LIMIT` (60) requests per source address and minute,
//! then 429 with Retry-After; a conditional request answered 304 is not counted.

use serde_json::json;

use super::{parse_limit, parse_query, query_bool, throttle_public, Answer, ApiRequest, App, Ctx};
use crate::domain::action_kinds::{registry, RISK_CLASSES};
use crate::error::{ApiError, ApiResult, ErrorCode};

const PAGE_MAX: usize = 100;

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let r = registry();
    let q = parse_query(&req.query)?;
    let risk_class = q.get("risk_class").map(String::as_str);
    if let Some(c) = risk_class.filter(|c| !RISK_CLASSES.contains(c)) {
        return Err(ApiError::invalid(format!("risk_class {c:?} must be one of {}", RISK_CLASSES.join(", "))));
    }
    let deprecated = query_bool(q.get("deprecated").map(String::as_str), "deprecated")?.unwrap_or(false);
    let limit = parse_limit(q.get("limit"), PAGE_MAX)?;
    let start = match q.get("cursor") {
        None => 0,
        Some(c) => c.parse::<usize>().map_err(|_| ApiError::invalid("cursor is not one this server issued"))?,
    };
    if req.headers.get("if-none-match").and_then(|v| v.to_str().ok()).is_some_and(|v| matches_etag(v, &r.etag)) {
        return Ok(Answer::empty(304).with_header("etag", r.etag.clone()));
    }
    throttle_public(app, ctx).await?;
    let kinds = r.select(risk_class, deprecated);
    let page: Vec<_> = kinds.iter().skip(start).take(limit).collect();
    let mut body = json!({"version": r.version, "kinds": page, "has_more": start + limit < kinds.len()});
    if start + limit < kinds.len() {
        body["next_cursor"] = json!((start + limit).to_string());
    }
    Ok(Answer::json(200, &body)
        .with_header("etag", r.etag.clone())
        .with_header("cache-control", "public, max-age=3600".to_string()))
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    throttle_public(app, ctx).await?;
    match registry().get(req.param("kind")) {
        Some(kind) => Ok(Answer::json(200, kind).with_header("cache-control", "public, max-age=3600".to_string())),
        None => Err(ApiError::new(
            ErrorCode::NotFound,
            format!("Action kind {:?} is not in the registry", req.param("kind")),
        )),
    }
}

/// `If-None-Match`: `*`, or a list of entity tags (weak or strong) one of which is ours.
fn matches_etag(header: &str, etag: &str) -> bool {
    header.split(',').map(str::trim).any(|t| t == "*" || t.trim_start_matches("W/") == etag)
}
