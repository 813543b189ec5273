//! Operator keys (an extension of the governance spec, in the style of its API keys): named
//! `X-Admin-API-Key` credentials with a role (`viewer`, `operator`, `owner`), optionally limited
//! to tenants matching a pattern; the secret is answered once, on create and on rotate. Only
//! owners manage them.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::api_keys::{check_texts, fresh_key_id, fresh_secret, revocation_reason, rotation_grace};
use super::auth::key_digest;
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::roles::{validate_tenant_pattern, Role};
use crate::domain::{format_rfc3339_ms, messages, now_ms, parse_rfc3339_ms, rules};
use crate::error::{ApiError, ApiResult};
use crate::model::parse_json;
use crate::ops::operators::{self, OperatorKey};

/// What an operator key secret starts with.
const SECRET_PREFIX: &str = "cyo_";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorKeyCreateRequest {
    name: String,
    role: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    tenant_pattern: Option<String>,
    #[serde(default)]
    expires_at: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct OperatorKeyUpdateRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    role: Option<String>,
    /// "" lifts the limit.
    #[serde(default)]
    tenant_pattern: Option<String>,
    #[serde(default)]
    expires_at: Option<String>,
}

fn role(name: &str) -> ApiResult<Role> {
    Role::parse(name).ok_or_else(|| ApiError::invalid("role must be viewer, operator or owner"))
}

fn pattern(p: &str) -> ApiResult<String> {
    if p.is_empty() {
        return Ok(String::new());
    }
    validate_tenant_pattern(p).map_err(ApiError::invalid)?;
    Ok(p.to_string())
}

fn expiry(at: &str) -> ApiResult<i64> {
    match parse_rfc3339_ms(at) {
        Some(ms) if ms > now_ms() => Ok(ms),
        Some(_) => Err(ApiError::invalid("expires_at must be in the future")),
        None => Err(ApiError::invalid("expires_at must be an RFC 3339 date-time")),
    }
}

/// The wire `OperatorKey` (never the secret or its digest). A key past its expiry reads EXPIRED.
fn operator_key_json(k: &OperatorKey) -> Value {
    let now = now_ms();
    let mut out = json!({
        "key_id": k.key_id,
        "key_prefix": k.key_prefix,
        "name": k.name,
        "role": k.role.as_str(),
        "status": k.effective_status(now),
        "created_at": format_rfc3339_ms(k.created_at_ms),
    });
    let texts = [
        ("description", &k.description),
        ("tenant_pattern", &k.tenant_pattern),
        ("revoked_reason", &k.revoked_reason),
        ("created_by", &k.created_by),
    ];
    for (name, v) in texts {
        if let Some(v) = v {
            out[name] = json!(v);
        }
    }
    let grace = k.previous_until_ms.filter(|until| *until > now);
    let times = [
        ("updated_at", k.updated_at_ms),
        ("expires_at", k.expires_at_ms),
        ("last_used_at", k.last_used_at_ms),
        ("revoked_at", k.revoked_at_ms),
        ("rotated_at", k.rotated_at_ms),
        ("previous_key_valid_until", grace),
    ];
    for (name, at) in times {
        if let Some(ms) = at {
            out[name] = json!(format_rfc3339_ms(ms));
        }
    }
    out
}

/// The operator key of the path, 404 when unknown.
fn key_id(req: &ApiRequest) -> &str {
    req.param("key_id")
}

/// Runs one change of the path's operator key (see `operators::Change`).
async fn change(app: &App, ctx: &mut Ctx, req: &ApiRequest, mode: &str, arg: String) -> ApiResult<OperatorKey> {
    let context = script_context(ctx, &Caller::Admin, false, None);
    let bootstrap_on = app.config.bootstrap_admin_key && app.config.admin_api_key.is_some();
    operators::change(&app.store, key_id(req), &context, operators::Change { mode, change: arg, bootstrap_on }).await
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<OperatorKeyCreateRequest>(&req.body)?;
    check_texts(Some(&r.name), r.description.as_deref())?;
    let role = role(&r.role)?;
    let tenant_pattern = pattern(r.tenant_pattern.as_deref().unwrap_or_default())?;
    if role == Role::Owner && !tenant_pattern.is_empty() {
        return Err(ApiError::invalid(messages::OWNER_UNLIMITED));
    }
    let expires_at_ms = match &r.expires_at {
        None => now_ms() + rules::DEFAULT_KEY_LIFETIME_MS,
        Some(at) => expiry(at)?,
    };
    let key_id = fresh_key_id();
    let secret = fresh_secret(SECRET_PREFIX, &key_id);
    let mut fields = json!({
        "key_id": key_id,
        "name": r.name,
        "role": role.as_str(),
        "digest": key_digest(&app.config.key_pepper, &secret),
        "key_prefix": &secret[..SECRET_PREFIX.len() + 6],
        "expires_at_ms": expires_at_ms.to_string(),
        "created_by": ctx.key_id.clone().unwrap_or_default(),
    });
    if let Some(d) = &r.description {
        fields["description"] = json!(d);
    }
    if !tenant_pattern.is_empty() {
        fields["tenant_pattern"] = json!(tenant_pattern);
    }
    let context = script_context(ctx, &Caller::Admin, false, None);
    let key = operators::create(&app.store, &key_id, &context, fields.to_string()).await?;
    let mut body = operator_key_json(&key);
    body["key_secret"] = json!(secret);
    Ok(Answer::json(201, &body))
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = ListQuery::parse(req, &["created_at", "key_id", "name", "role", "status", "expires_at", "last_used_at"])?;
    if let Some(s) = q.get("status").filter(|s| !["ACTIVE", "REVOKED", "EXPIRED"].contains(s)) {
        return Err(ApiError::invalid(format!("status {s:?} must be ACTIVE, REVOKED or EXPIRED")));
    }
    let wanted_role = q.get("role").map(role).transpose()?;
    let now = now_ms();
    let mut rows = vec![];
    for k in operators::all(&app.store).await? {
        let status = k.effective_status(now);
        if q.get("status").is_some_and(|s| s != status)
            || wanted_role.is_some_and(|r| r != k.role)
            || !q.matches_search(&[&k.key_id, &k.name])
        {
            continue;
        }
        let key = match q.sort_by.as_str() {
            "key_id" => k.key_id.clone(),
            "name" => k.name.to_lowercase(),
            "role" => k.role.as_str().to_string(),
            "status" => status.to_string(),
            "expires_at" => sort_int(k.expires_at_ms.unwrap_or(i64::MAX)),
            "last_used_at" => sort_int(k.last_used_at_ms.unwrap_or(0)),
            _ => sort_int(k.created_at_ms),
        };
        rows.push((key, k.key_id.clone(), operator_key_json(&k)));
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("keys", items, next)))
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let key = operators::get(&app.store, key_id(req)).await?;
    let key = key.ok_or_else(|| ApiError::not_found(messages::OPERATOR_KEY_NOT_FOUND))?;
    Ok(Answer::json(200, &operator_key_json(&key)))
}

pub async fn update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<OperatorKeyUpdateRequest>(&req.body)?;
    check_texts(r.name.as_deref(), r.description.as_deref())?;
    let mut patch = Map::new();
    for (name, v) in [("name", &r.name), ("description", &r.description)] {
        if let Some(v) = v {
            patch.insert(name.into(), json!(v));
        }
    }
    if let Some(name) = &r.role {
        patch.insert("role".into(), json!(role(name)?.as_str()));
    }
    if let Some(p) = &r.tenant_pattern {
        patch.insert("tenant_pattern".into(), json!(pattern(p)?));
    }
    if let Some(at) = &r.expires_at {
        patch.insert("expires_at_ms".into(), json!(expiry(at)?.to_string()));
    }
    let key = change(app, ctx, req, "update", Value::Object(patch).to_string()).await?;
    Ok(Answer::json(200, &operator_key_json(&key)))
}

pub async fn revoke(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let key = change(app, ctx, req, "revoke", revocation_reason(req)?).await?;
    Ok(Answer::json(200, &operator_key_json(&key)))
}

/// A new secret for the same key id, answered once; the previous secret keeps working
/// `grace_period_ms` (24 h by default, 0 to 30 days), then stops in every container within
/// `CYCLES_AUTH_CACHE_MS`.
pub async fn rotate(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let grace = rotation_grace(req)?;
    let secret = fresh_secret(SECRET_PREFIX, key_id(req));
    let rotation = json!({"digest": key_digest(&app.config.key_pepper, &secret),
        "prefix": &secret[..SECRET_PREFIX.len() + 6], "grace_ms": grace});
    let key = change(app, ctx, req, "rotate", rotation.to_string()).await?;
    let mut body = operator_key_json(&key);
    body["key_secret"] = json!(secret);
    body["previous_key_valid_until"] = json!(format_rfc3339_ms(key.previous_until_ms.unwrap_or_default()));
    Ok(Answer::json(200, &body))
}
