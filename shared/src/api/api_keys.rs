//! API keys: create (the secret is returned exactly once), list, update, revoke.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::{Rng, RngCore};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::auth::key_digest;
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::{format_rfc3339_ms, messages, now_ms, parse_rfc3339_ms, rules, DEFAULT_PERMISSIONS};
use crate::error::{ApiError, ApiResult};
use crate::model::parse_json;
use crate::ops;
use crate::ops::auth::ApiKey;
use crate::ops::records::RecordAnswer;
use crate::store::Store;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyCreateRequest {
    pub tenant_id: String,
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub permissions: Option<Vec<String>>,
    #[serde(default)]
    pub scope_filter: Option<Vec<String>>,
    #[serde(default)]
    pub expires_at: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
}

/// rotateApiKey's (and rotateOperatorKey's) body (optional).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeyRotateRequest {
    grace_period_ms: Option<i64>,
}

/// The grace period a rotation asks for: the body's `grace_period_ms` (24 h when the body or
/// the field is absent), 0 to 30 days.
pub(super) fn rotation_grace(req: &ApiRequest) -> ApiResult<i64> {
    let r = if req.body.trim_ascii().is_empty() {
        ApiKeyRotateRequest::default()
    } else {
        parse_json::<ApiKeyRotateRequest>(&req.body)?.0
    };
    let grace = r.grace_period_ms.unwrap_or(ROTATION_GRACE_MS);
    if !(0..=MAX_ROTATION_GRACE_MS).contains(&grace) {
        return Err(ApiError::invalid(format!("grace_period_ms must be from 0 to {MAX_ROTATION_GRACE_MS}")));
    }
    Ok(grace)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApiKeyUpdateRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    permissions: Option<Vec<String>>,
    #[serde(default)]
    scope_filter: Option<Vec<String>>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// A freshly created key: `secret` is the full key and is never retrievable again.
#[derive(Debug, Clone)]
pub struct CreatedKey {
    pub key_id: String,
    pub secret: String,
    pub key: ApiKey,
}

fn check_permissions(p: &[String]) -> ApiResult<String> {
    if let Some(bad) = p.iter().find(|p| Permission::parse(p).is_none()) {
        return Err(ApiError::invalid(format!("permissions: unknown permission {bad:?}")));
    }
    Ok(format!(",{},", p.join(",")))
}

fn check_scope_filter(f: &[String]) -> ApiResult<String> {
    for entry in f {
        let ok = entry.split_once(':').is_some_and(|(kind, value)| {
            ["tenant", "workspace", "app", "workflow", "agent", "toolset"].contains(&kind.to_ascii_lowercase().as_str())
                && !value.is_empty()
                && !entry.contains('/')
        });
        if !ok {
            return Err(ApiError::invalid(format!("scope_filter: {entry:?} is not a kind:value or kind:* segment")));
        }
    }
    Ok(if f.is_empty() { String::new() } else { json!(f).to_string() })
}

pub(super) fn check_texts(name: Option<&str>, description: Option<&str>) -> ApiResult<()> {
    if name.is_some_and(|n| n.trim().is_empty() || n.chars().count() > 256) {
        return Err(ApiError::invalid("name must be 1 to 256 characters"));
    }
    if description.is_some_and(|d| d.chars().count() > 1024) {
        return Err(ApiError::invalid("description must be at most 1024 characters"));
    }
    Ok(())
}

/// The wire `ApiKey` (never the secret or its digest). A key past its expiry reads EXPIRED.
pub fn api_key_json(k: &ApiKey) -> Value {
    let mut out = json!({
        "key_id": k.key_id,
        "tenant_id": k.tenant_id,
        "key_prefix": k.key_prefix,
        "status": k.effective_status(now_ms()),
        "permissions": k.permissions,
        "created_at": format_rfc3339_ms(k.created_at_ms),
        "expires_at": format_rfc3339_ms(k.expires_at_ms),
    });
    for (name, v) in [("name", &k.name), ("description", &k.description), ("revoked_reason", &k.revoked_reason)] {
        if let Some(v) = v {
            out[name] = json!(v);
        }
    }
    for (name, v) in [("scope_filter", &k.scope_filter), ("metadata", &k.metadata)] {
        if let Some(v) = v {
            out[name] = v.clone();
        }
    }
    for (name, at) in [("revoked_at", k.revoked_at_ms), ("last_used_at", k.last_used_at_ms)] {
        if let Some(ms) = at {
            out[name] = json!(format_rfc3339_ms(ms));
        }
    }
    out
}

/// A new secret for key `key_id`: `<prefix><key id>_<32 random bytes, base64url>` (`cyc_live_`
/// for tenant keys, `cyo_` for operator keys).
pub(super) fn fresh_secret(prefix: &str, key_id: &str) -> String {
    let mut random = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut random);
    format!("{prefix}{key_id}_{}", URL_SAFE_NO_PAD.encode(random))
}

/// A new key id: 16 lower-case letters and digits.
pub(super) fn fresh_key_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..16).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char).collect()
}

/// Creates a key (shared by the HTTP handler and `--seed-demo`).
pub async fn create_api_key(
    store: &Store,
    pepper: &str,
    context: &str,
    r: &ApiKeyCreateRequest,
) -> ApiResult<CreatedKey> {
    check_texts(Some(&r.name), r.description.as_deref())?;
    let permissions =
        r.permissions.clone().unwrap_or_else(|| DEFAULT_PERMISSIONS.iter().map(|p| p.as_str().to_string()).collect());
    let permissions = check_permissions(&permissions)?;
    let scope_filter = check_scope_filter(r.scope_filter.as_deref().unwrap_or_default())?;
    let expires_at_ms = match &r.expires_at {
        None => now_ms() + rules::DEFAULT_KEY_LIFETIME_MS,
        Some(s) => match parse_rfc3339_ms(s) {
            Some(ms) if ms > now_ms() => ms,
            Some(_) => return Err(ApiError::invalid("expires_at must be in the future")),
            None => return Err(ApiError::invalid("expires_at must be an RFC 3339 date-time")),
        },
    };
    let key_id = fresh_key_id();
    let secret = fresh_secret("cyc_live_", &key_id);
    let mut fields = json!({
        "key_id": key_id,
        "tenant_id": r.tenant_id,
        "name": r.name,
        "digest": key_digest(pepper, &secret),
        "permissions": permissions,
        "expires_at_ms": expires_at_ms.to_string(),
        "key_prefix": &secret[..14],
    });
    if let Some(d) = &r.description {
        fields["description"] = json!(d);
    }
    if !scope_filter.is_empty() {
        fields["scope_filter"] = json!(scope_filter);
    }
    if let Some(m) = &r.metadata {
        fields["metadata"] = json!(Value::Object(m.clone()).to_string());
    }
    let key = ApiKey::decoded(ops::auth::create(store, &r.tenant_id, &key_id, context, fields.to_string()).await?)?;
    ops::auth::publish_owner(store, &key_id, &r.tenant_id).await?;
    Ok(CreatedKey { key_id, secret, key })
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<ApiKeyCreateRequest>(&req.body)?;
    if crate::domain::validate_tenant_id(&r.tenant_id).is_err() {
        return Err(ApiError::new(crate::error::ErrorCode::TenantNotFound, messages::TENANT_NOT_FOUND).with_status(400));
    }
    ctx.act_for(&r.tenant_id)?;
    let created =
        create_api_key(&app.store, &app.config.key_pepper, &script_context(ctx, &Caller::Admin, false, None), &r)
            .await?;
    let k = api_key_json(&created.key);
    Ok(Answer::json(
        201,
        &json!({
            "key_id": created.key_id,
            "key_secret": created.secret,
            "key_prefix": k["key_prefix"],
            "tenant_id": k["tenant_id"],
            "permissions": k["permissions"],
            "created_at": k["created_at"],
            "expires_at": k["expires_at"],
        }),
    ))
}

/// The API key record after `mode` (update, revoke, rotate) changed it.
async fn changed(app: &App, ctx: &mut Ctx, key_id: &str, mode: &str, arg: String) -> ApiResult<RecordAnswer> {
    let tenant =
        ops::auth::owner(&app.store, key_id).await?.ok_or_else(|| ApiError::not_found(messages::API_KEY_NOT_FOUND))?;
    ctx.act_for(&tenant)?;
    let context = script_context(ctx, &Caller::Admin, false, None);
    ops::auth::change(&app.store, &tenant, key_id, &context, mode, arg).await
}

async fn mutate(app: &App, ctx: &mut Ctx, key_id: &str, mode: &str, arg: String) -> ApiResult<Answer> {
    let record = changed(app, ctx, key_id, mode, arg).await?;
    Ok(Answer::json(200, &api_key_json(&ApiKey::decoded(record)?)))
}

/// How long a rotated key's previous secret keeps working unless the request says otherwise,
/// and the longest it may.
const ROTATION_GRACE_MS: i64 = 86_400_000;
const MAX_ROTATION_GRACE_MS: i64 = 30 * 86_400_000;

/// rotateApiKey (an extension): a new secret for the same key id, answered once; the previous
/// secret keeps working `grace_period_ms` (24 h by default, 0 to 30 days) and then stops.
pub async fn rotate(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let grace = rotation_grace(req)?;
    let key_id = req.param("key_id");
    let secret = fresh_secret("cyc_live_", key_id);
    let change =
        json!({"digest": key_digest(&app.config.key_pepper, &secret), "prefix": &secret[..14], "grace_ms": grace});
    let record = changed(app, ctx, key_id, "rotate", change.to_string()).await?;
    let until = record.0.get("previous_until_ms").and_then(|v| v.parse::<i64>().ok()).unwrap_or_default();
    let k = api_key_json(&ApiKey::decoded(record)?);
    Ok(Answer::json(
        200,
        &json!({
            "key_id": key_id,
            "key_secret": secret,
            "key_prefix": k["key_prefix"],
            "tenant_id": k["tenant_id"],
            "permissions": k["permissions"],
            "expires_at": k["expires_at"],
            "previous_key_valid_until": format_rfc3339_ms(until),
        }),
    ))
}

pub async fn update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<ApiKeyUpdateRequest>(&req.body)?;
    check_texts(r.name.as_deref(), r.description.as_deref())?;
    let mut patch = Map::new();
    if let Some(n) = &r.name {
        patch.insert("name".into(), json!(n));
    }
    if let Some(d) = &r.description {
        patch.insert("description".into(), json!(d));
    }
    if let Some(p) = &r.permissions {
        patch.insert("permissions".into(), json!(check_permissions(p)?));
    }
    if let Some(f) = &r.scope_filter {
        patch.insert("scope_filter".into(), json!(check_scope_filter(f)?));
    }
    if let Some(m) = &r.metadata {
        patch.insert("metadata".into(), json!(Value::Object(m.clone()).to_string()));
    }
    mutate(app, ctx, req.param("key_id"), "update", Value::Object(patch).to_string()).await
}

/// A revocation's `?reason=` (at most 512 characters; '' when absent).
pub(super) fn revocation_reason(req: &ApiRequest) -> ApiResult<String> {
    let reason = super::parse_query(&req.query)?.remove("reason").unwrap_or_default();
    if reason.chars().count() > 512 {
        return Err(ApiError::invalid("reason must be at most 512 characters"));
    }
    Ok(reason)
}

pub async fn revoke(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let reason = revocation_reason(req)?;
    mutate(app, ctx, req.param("key_id"), "revoke", reason).await
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = ListQuery::parse(req, &["created_at", "key_id", "name", "tenant_id", "status", "expires_at"])?;
    if let Some(s) = q.get("status") {
        if !["ACTIVE", "REVOKED", "EXPIRED"].contains(&s) {
            return Err(ApiError::invalid("status must be ACTIVE, REVOKED or EXPIRED"));
        }
    }
    let tenants = match q.get("tenant_id") {
        Some(t) => {
            ctx.act_for(t)?;
            vec![t.to_string()]
        }
        None => ops::tenants::registry(&app.store).await?,
    };
    let now = now_ms();
    let mut rows = vec![];
    for tenant in tenants {
        for k in ops::auth::of_tenant(&app.store, &tenant).await? {
            let (status, name) = (k.effective_status(now), k.name.clone().unwrap_or_default());
            if q.get("status").is_some_and(|s| status != s) || !q.matches_search(&[&k.key_id, &name]) {
                continue;
            }
            let key = match q.sort_by.as_str() {
                "key_id" => k.key_id.clone(),
                "tenant_id" => k.tenant_id.clone(),
                "status" => status.to_string(),
                "name" => name.to_lowercase(),
                "expires_at" => sort_int(k.expires_at_ms),
                _ => sort_int(k.created_at_ms),
            };
            rows.push((key, k.key_id.clone(), api_key_json(&k)));
        }
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("keys", items, next)))
}

#[derive(Debug, Deserialize)]
struct ValidationRequest {
    key_secret: String,
}

/// `POST /v1/auth/validate` (validateApiKey, admin key): whether a full key is usable now, and
/// for what. An unknown key and a wrong secret answer alike (`INVALID`).
pub async fn validate(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, _) = parse_json::<ValidationRequest>(&req.body)?;
    let invalid = || Answer::json(200, &json!({"valid": false, "tenant_id": "", "reason": "INVALID"}));
    let Some(key_id) = super::auth::key_id_of(&r.key_secret) else { return Ok(invalid()) };
    let Some(tenant) = ops::auth::owner(&app.store, key_id).await? else { return Ok(invalid()) };
    let v = ops::auth::validate(&app.store, &tenant, key_id, key_digest(&app.config.key_pepper, &r.key_secret)).await?;
    if v.reason.as_deref() == Some("INVALID") {
        return Ok(invalid());
    }
    ctx.act_for(&tenant)?;
    let mut body = json!({"valid": v.valid, "tenant_id": tenant, "key_id": key_id, "permissions": v.permissions,
        "scope_filter": v.scope_filter});
    if let Some(ms) = v.expires_at_ms.as_deref().and_then(|m| m.parse().ok()) {
        body["expires_at"] = json!(format_rfc3339_ms(ms));
    }
    if let Some(reason) = v.reason {
        body["reason"] = json!(reason);
    }
    Ok(Answer::json(200, &body))
}
