//! Webhook subscriptions over HTTP: admin CRUD (`/v1/admin/webhooks`), tenant self-service
//! (`/v1/webhooks`), the `/test` probe, delivery listings and replay. Both subscription
//! invariants are checked on the resulting state of every write.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::events::{tenant_events, CATEGORIES, EVENT_TYPES, SYSTEM_TENANT};
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::validate_tenant_id;
use crate::domain::{format_rfc3339_ms, parse_rfc3339_ms};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::model::parse_json;
use crate::ops;
use crate::ops::webhooks::{check_invariants, delivery_json, RetryPolicy, Subscription};
use crate::webhooks::{self, check_url, encrypt};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookCreateRequest {
    url: String,
    event_types: Vec<String>,
    #[serde(default)]
    event_categories: Option<Vec<String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    scope_filter: Option<String>,
    #[serde(default)]
    thresholds: Option<Map<String, Value>>,
    #[serde(default)]
    signing_secret: Option<String>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    retry_policy: Option<RetryPolicy>,
    #[serde(default)]
    disable_after_failures: Option<i64>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookUpdateRequest {
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    event_types: Option<Vec<String>>,
    #[serde(default)]
    event_categories: Option<Vec<String>>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    scope_filter: Option<String>,
    #[serde(default)]
    thresholds: Option<Map<String, Value>>,
    #[serde(default)]
    signing_secret: Option<String>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    retry_policy: Option<RetryPolicy>,
    #[serde(default)]
    disable_after_failures: Option<i64>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayRequest {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    event_types: Option<Vec<String>>,
    #[serde(default)]
    max_events: Option<i64>,
}

const RESERVED_HEADERS: [&str; 5] = ["content-type", "user-agent", "traceparent", "host", "content-length"];

fn not_found() -> ApiError {
    ApiError::new(ErrorCode::WebhookNotFound, "Webhook subscription not found")
}

fn check_lists(types: &[String], categories: &[String]) -> ApiResult<()> {
    if let Some(t) = types.iter().find(|t| !EVENT_TYPES.contains(&t.as_str())) {
        return Err(ApiError::invalid(format!("event_types: {t:?} is not a known EventType")));
    }
    if let Some(c) = categories.iter().find(|c| !CATEGORIES.contains(&c.as_str())) {
        return Err(ApiError::invalid(format!("event_categories: {c:?} is not a known EventCategory")));
    }
    Ok(())
}

fn check_texts(name: Option<&str>, description: Option<&str>) -> ApiResult<()> {
    if name.is_some_and(|n| n.chars().count() > 256) {
        return Err(ApiError::invalid("name must be at most 256 characters"));
    }
    if description.is_some_and(|d| d.chars().count() > 1024) {
        return Err(ApiError::invalid("description must be at most 1024 characters"));
    }
    Ok(())
}

/// Custom headers: never ours to override; values encrypted at rest.
fn sealed_headers(app: &App, headers: &BTreeMap<String, String>) -> ApiResult<String> {
    let mut out = Map::new();
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("x-cycles-") {
            return Err(ApiError::invalid(format!("headers: {name} cannot be overridden")));
        }
        if http::HeaderName::from_bytes(name.as_bytes()).is_err() || http::HeaderValue::from_str(value).is_err() {
            return Err(ApiError::invalid(format!("headers: {name} is not a valid header")));
        }
        out.insert(name.clone(), json!(encrypt(&app.config.webhooks.encryption_key, value)));
    }
    Ok(Value::Object(out).to_string())
}

fn check_disable_after(v: Option<i64>) -> ApiResult<()> {
    if v.is_some_and(|v| v < 1) {
        return Err(ApiError::invalid("disable_after_failures must be >= 1"));
    }
    Ok(())
}

/// The wire `WebhookSubscription`: no secret, header values masked.
pub fn subscription_json(s: &Subscription) -> Value {
    let mut w = json!({
        "subscription_id": s.id,
        "tenant_id": s.owner,
        "url": s.url,
        "event_types": s.event_types,
        "status": s.status,
        "retry_policy": s.retry,
        "disable_after_failures": s.disable_after,
        "consecutive_failures": s.consecutive_failures,
        "created_at": format_rfc3339_ms(s.created_at_ms),
    });
    for (name, v) in [("name", &s.name), ("description", &s.description), ("scope_filter", &s.scope_filter)] {
        if let Some(v) = v {
            w[name] = json!(v);
        }
    }
    if !s.event_categories.is_empty() {
        w["event_categories"] = json!(s.event_categories);
    }
    for (name, v) in [("thresholds", &s.thresholds), ("metadata", &s.metadata)] {
        if let Some(v) = v {
            w[name] = v.clone();
        }
    }
    if !s.sealed_headers.is_empty() {
        w["headers"] = Value::Object(s.sealed_headers.keys().map(|k| (k.clone(), json!("********"))).collect());
    }
    for (name, at) in [
        ("updated_at", s.updated_at_ms),
        ("last_triggered_at", s.last_triggered_at_ms),
        ("last_success_at", s.last_success_at_ms),
        ("last_failure_at", s.last_failure_at_ms),
    ] {
        if let Some(ms) = at {
            w[name] = json!(format_rfc3339_ms(ms));
        }
    }
    w
}

/// A subscription written by a tenant key with a scope filter receives only events of the
/// scopes that filter admits (the key cannot read more through a webhook than it may read
/// directly); the filter is stored with the subscription, and a later write by such a key
/// narrows it to that key's filter.
fn key_scope_bound(caller: &Caller) -> Option<String> {
    match caller {
        Caller::Tenant(k) if !k.scope_filter().is_empty() => Some(json!(k.scope_filter()).to_string()),
        _ => None,
    }
}

async fn create_for(app: &App, ctx: &mut Ctx, caller: &Caller, owner: &str, req: &ApiRequest) -> ApiResult<Answer> {
    let (r, _) = parse_json::<WebhookCreateRequest>(&req.body)?;
    if r.event_types.is_empty() {
        return Err(ApiError::invalid("event_types must list at least one event type"));
    }
    let categories = r.event_categories.clone().unwrap_or_default();
    check_lists(&r.event_types, &categories)?;
    check_invariants(owner, &r.event_types, &categories)?;
    check_texts(r.name.as_deref(), r.description.as_deref())?;
    check_disable_after(r.disable_after_failures)?;
    let retry = r.retry_policy.unwrap_or_default();
    retry.validate()?;
    check_url(&egress_rules(app).await?, &r.url).await?;
    let id = format!("whsub_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let secret = r.signing_secret.clone().unwrap_or_else(|| {
        use base64::Engine;
        let mut b = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
        format!("whsec_{}", base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
    });
    let mut f = json!({
        "subscription_id": id,
        "tenant_id": owner,
        "url": r.url,
        "event_types": json!(r.event_types).to_string(),
        "retry_policy": json!(retry).to_string(),
        "disable_after_failures": r.disable_after_failures.unwrap_or(10).to_string(),
        "secret": encrypt(&app.config.webhooks.encryption_key, &secret),
    });
    if let Some(c) = &r.event_categories {
        f["event_categories"] = json!(json!(c).to_string());
    }
    for (name, v) in [("name", &r.name), ("description", &r.description), ("scope_filter", &r.scope_filter)] {
        if let Some(v) = v {
            f[name] = json!(v);
        }
    }
    for (name, v) in [("thresholds", &r.thresholds), ("metadata", &r.metadata)] {
        if let Some(v) = v {
            f[name] = json!(Value::Object(v.clone()).to_string());
        }
    }
    if let Some(h) = &r.headers {
        f["headers"] = json!(sealed_headers(app, h)?);
    }
    if let Some(bound) = key_scope_bound(caller) {
        f["key_scope_filter"] = json!(bound);
    }
    ops::webhooks::publish_owner(&app.store, &id, owner).await?;
    let on_behalf = matches!(caller, Caller::Admin) && owner != SYSTEM_TENANT && req.path.starts_with("/v1/webhooks");
    let context = script_context(ctx, caller, on_behalf, None);
    let created =
        ops::webhooks::create(&app.store, context, owner, &id, f, app.config.webhooks.max_subscriptions).await?;
    Ok(Answer::json(201, &json!({"subscription": subscription_json(&created), "signing_secret": secret})))
}

/// The owner and stored record of a subscription id; `tenant` limits it to one tenant (404
/// for any other, so existence does not leak).
async fn resolve(app: &App, id: &str, tenant: Option<&str>) -> ApiResult<(String, Subscription)> {
    let owner = ops::webhooks::owner(&app.store, id).await?.ok_or_else(not_found)?;
    if tenant.is_some_and(|t| t != owner) {
        return Err(not_found());
    }
    let subscription = ops::webhooks::read(&app.store, &owner, id).await?.ok_or_else(not_found)?;
    Ok((owner, subscription))
}

async fn update_for(
    app: &App,
    ctx: &mut Ctx,
    caller: &Caller,
    tenant: Option<&str>,
    id: &str,
    req: &ApiRequest,
) -> ApiResult<Answer> {
    let (r, _) = parse_json::<WebhookUpdateRequest>(&req.body)?;
    if let Some(s) = &r.status {
        if s != "ACTIVE" && s != "PAUSED" {
            return Err(ApiError::invalid("status must be ACTIVE or PAUSED (DISABLED is set by the system only)"));
        }
    }
    check_texts(r.name.as_deref(), r.description.as_deref())?;
    check_disable_after(r.disable_after_failures)?;
    if let Some(p) = &r.retry_policy {
        p.validate()?;
    }
    let mut url_checked = false;
    for _ in 0..3 {
        let (owner, current) = resolve(app, id, tenant).await?;
        let types = r.event_types.clone().unwrap_or(current.event_types.clone());
        let categories = r.event_categories.clone().unwrap_or(current.event_categories.clone());
        check_lists(&types, &categories)?;
        check_invariants(&owner, &types, &categories)?;
        // the URL does not depend on the record: checked (rules read, name resolved) once
        if let Some(url) = r.url.as_ref().filter(|_| !url_checked) {
            check_url(&egress_rules(app).await?, url).await?;
            url_checked = true;
        }
        let mut patch = Map::new();
        if let Some(u) = &r.url {
            patch.insert("url".into(), json!(u));
        }
        if let Some(t) = &r.event_types {
            patch.insert("event_types".into(), json!(json!(t).to_string()));
        }
        if let Some(c) = &r.event_categories {
            patch.insert("event_categories".into(), json!(json!(c).to_string()));
        }
        for (name, v) in [
            ("name", &r.name),
            ("description", &r.description),
            ("scope_filter", &r.scope_filter),
            ("status", &r.status),
        ] {
            if let Some(v) = v {
                patch.insert(name.into(), json!(v));
            }
        }
        for (name, v) in [("thresholds", &r.thresholds), ("metadata", &r.metadata)] {
            if let Some(v) = v {
                patch.insert(name.into(), json!(Value::Object(v.clone()).to_string()));
            }
        }
        if let Some(p) = &r.retry_policy {
            patch.insert("retry_policy".into(), json!(json!(p).to_string()));
        }
        if let Some(d) = r.disable_after_failures {
            patch.insert("disable_after_failures".into(), json!(d.to_string()));
        }
        if let Some(h) = &r.headers {
            patch.insert("headers".into(), json!(sealed_headers(app, h)?));
        }
        if let Some(s) = &r.signing_secret {
            patch.insert("secret".into(), json!(encrypt(&app.config.webhooks.encryption_key, s)));
        }
        if let Some(bound) = key_scope_bound(caller) {
            patch.insert("key_scope_filter".into(), json!(bound));
        }
        let expected = current.updated_at_ms.map(|ms| ms.to_string()).unwrap_or_default();
        let on_behalf = matches!(caller, Caller::Admin) && tenant.is_none() && req.path.starts_with("/v1/webhooks");
        let context = script_context(ctx, caller, on_behalf, None);
        // None: another write came first; start over from the record as it is now
        if let Some(updated) =
            ops::webhooks::update(&app.store, context, &owner, id, Value::Object(patch), &expected).await?
        {
            return Ok(Answer::json(200, &subscription_json(&updated)));
        }
    }
    Err(ApiError::internal("The subscription kept changing; retry"))
}

async fn delete_for(app: &App, ctx: &mut Ctx, caller: &Caller, tenant: Option<&str>, id: &str) -> ApiResult<Answer> {
    let (owner, _) = resolve(app, id, tenant).await?;
    ops::webhooks::delete(&app.store, script_context(ctx, caller, false, None), &owner, id).await?;
    Ok(Answer::empty(204))
}

/// 409 TENANT_CLOSED when the owner is a closed tenant (the system owner never is).
async fn refuse_closed_owner(app: &App, owner: &str) -> ApiResult<()> {
    if owner != SYSTEM_TENANT && ops::tenants::status(&app.store, owner).await?.as_deref() == Some("CLOSED") {
        return Err(ApiError::new(ErrorCode::TenantClosed, crate::domain::messages::TENANT_CLOSED));
    }
    Ok(())
}

/// The `/test` probe: a synthetic `system.webhook_test` event sent now, never queued; one
/// finished delivery row records it. It never counts as a failure.
async fn test_for(app: &App, ctx: &mut Ctx, tenant: Option<&str>, id: &str) -> ApiResult<Answer> {
    let (owner, sub) = resolve(app, id, tenant).await?;
    refuse_closed_owner(app, &owner).await?;
    let event_id = format!("evt_test_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    let event = json!({
        "event_id": event_id, "event_type": "system.webhook_test", "category": "system",
        "timestamp": format_rfc3339_ms(crate::domain::now_ms()), "tenant_id": owner,
        "actor": {"type": "admin"}, "source": "cycles-admin",
        "data": {"subscription_id": id, "test": true},
        "request_id": ctx.request_id, "trace_id": ctx.trace.trace_id,
    });
    // The dispatcher's own path: the egress guard checks the URL and every address it
    // connects to. A target that gives no HTTP answer (blocked, refused, filtered, a banner
    // that is not HTTP, or one that accepts and never answers) gets one answer after one fixed
    // time, the connect timeout: the attempt is cut there, and an earlier failure waits for it,
    // so neither the answer nor its timing tells a port's state (this is no port scanner).
    let started = std::time::Instant::now();
    let fixed = app.config.webhooks.connect_timeout();
    let sender = webhooks::Sender::new(&app.config.webhooks, egress_rules(app).await?);
    let send = sender.post(&sub.url, &event, ctx.trace.inbound_flags.as_deref(), &sub);
    let attempt = tokio::time::timeout(fixed, send).await.unwrap_or_else(|_| webhooks::Attempt::unreachable());
    let mut body = json!({"success": attempt.error.is_none(), "event_id": event_id});
    if attempt.status > 0 {
        body["response_status"] = json!(attempt.status);
        body["response_time_ms"] = json!(attempt.ms);
    } else {
        tokio::time::sleep_until((started + fixed).into()).await;
    }
    if let Some(e) = &attempt.error {
        body["error_message"] = json!(e);
    }
    Ok(Answer::json(200, &body))
}

/// Deliveries of one subscription, newest first.
async fn deliveries_for(app: &App, tenant: Option<&str>, id: &str, req: &ApiRequest) -> ApiResult<Answer> {
    let (owner, _) = resolve(app, id, tenant).await?;
    let q = ListQuery::parse(req, &["attempted_at"])?;
    if q.get("status").is_some_and(|s| !["PENDING", "SUCCESS", "FAILED", "RETRYING"].contains(&s)) {
        return Err(ApiError::invalid("status must be PENDING, SUCCESS, FAILED or RETRYING"));
    }
    let (from, to) = (q.time("from")?, q.time("to")?);
    let ids = ops::webhooks::delivery_ids(&app.store, &owner, id, 10_000).await?;
    let records = crate::ops::webhooks::read_deliveries(&app.store, &owner, &ids).await?;
    let rows = records
        .into_iter()
        .filter(|r| {
            let at = int_field(r, "attempted_at_ms").unwrap_or(0);
            q.get("status").is_none_or(|s| field(r, "status") == Some(s))
                && from.is_none_or(|f| at >= f)
                && to.is_none_or(|t| at <= t)
        })
        .map(|r| {
            (
                sort_int(int_field(&r, "attempted_at_ms").unwrap_or(0)),
                field(&r, "delivery_id").unwrap_or_default().to_string(),
                delivery_json(&r),
            )
        })
        .collect();
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("deliveries", items, next)))
}

/// Lists subscriptions of the given owners.
/// The subscription selection of listWebhookSubscriptions (query) and bulkActionWebhooks
/// (body): every given property must hold (`tenant_id` picks the owner).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookFilter {
    #[serde(default)]
    pub tenant_id: Option<String>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub event_type: Option<String>,
    #[serde(default)]
    pub search: Option<String>,
}

impl WebhookFilter {
    fn from_query(q: &ListQuery) -> ApiResult<WebhookFilter> {
        let f = WebhookFilter {
            tenant_id: None,
            status: q.get("status").map(String::from),
            event_type: q.get("event_type").map(String::from),
            search: q.get("search").map(String::from),
        };
        f.check()?;
        Ok(f)
    }

    pub fn check(&self) -> ApiResult<()> {
        check_status(self.status.as_deref(), &["ACTIVE", "PAUSED", "DISABLED"])?;
        check_search(self.search.as_deref())
    }

    pub fn matches(&self, sub: &Subscription) -> bool {
        self.status.as_ref().is_none_or(|s| sub.status == *s)
            && self.event_type.as_ref().is_none_or(|t| sub.event_types.iter().any(|x| x == t))
            && search_matches(self.search.as_deref(), &[&sub.id, &sub.url])
    }
}

async fn list_for(app: &App, owners: Vec<String>, req: &ApiRequest) -> ApiResult<Answer> {
    let q = ListQuery::parse(req, &["consecutive_failures", "url", "tenant_id", "status"])?;
    let filter = WebhookFilter::from_query(&q)?;
    let mut rows = vec![];
    for owner in owners {
        for sub in crate::ops::webhooks::subscriptions(&app.store, &owner).await? {
            let w = subscription_json(&sub);
            if !filter.matches(&sub) {
                continue;
            }
            let key = match q.sort_by.as_str() {
                "url" => sub.url.clone(),
                "tenant_id" => sub.owner.clone(),
                "status" => sub.status.clone(),
                _ => sort_int(sub.consecutive_failures),
            };
            rows.push((key, sub.id.clone(), w));
        }
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("subscriptions", items, next)))
}

// ---------------------------------------------------------------------------------------------
// Admin routes

/// An operator's call on one subscription: authenticated, and, for an operator key limited to
/// some tenants, acting for the subscription's owner (403 for another's).
async fn admin_subscription(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<()> {
    require_admin(app, ctx, req).await?;
    if ctx.limited() {
        let (owner, _) = resolve(app, req.param("subscription_id"), None).await?;
        ctx.act_for(&owner)?;
    }
    Ok(())
}

pub async fn admin_create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = super::parse_query(&req.query)?;
    let owner = match q.get("tenant_id").filter(|t| !t.is_empty()) {
        None => SYSTEM_TENANT.to_string(),
        Some(t) if t == SYSTEM_TENANT => t.clone(),
        Some(t) => {
            if validate_tenant_id(t).is_err() || ops::tenants::status(&app.store, t).await?.is_none() {
                return Err(ApiError::new(ErrorCode::TenantNotFound, "Tenant not found"));
            }
            t.clone()
        }
    };
    ctx.act_for(&owner)?;
    create_for(app, ctx, &Caller::Admin, &owner, req).await
}

pub async fn admin_list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = super::parse_query(&req.query)?;
    let owners = match q.get("tenant_id").filter(|t| !t.is_empty()) {
        Some(t) => {
            ctx.act_for(t)?;
            vec![t.clone()]
        }
        None => ops::events::owners(&app.store).await?,
    };
    list_for(app, owners, req).await
}

pub async fn admin_get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    admin_subscription(app, ctx, req).await?;
    let (_, sub) = resolve(app, req.param("subscription_id"), None).await?;
    Ok(Answer::json(200, &subscription_json(&sub)))
}

pub async fn admin_update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    admin_subscription(app, ctx, req).await?;
    update_for(app, ctx, &Caller::Admin, None, req.param("subscription_id"), req).await
}

pub async fn admin_delete(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    admin_subscription(app, ctx, req).await?;
    delete_for(app, ctx, &Caller::Admin, None, req.param("subscription_id")).await
}

pub async fn admin_test(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    admin_subscription(app, ctx, req).await?;
    test_for(app, ctx, None, req.param("subscription_id")).await
}

pub async fn admin_deliveries(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    admin_subscription(app, ctx, req).await?;
    deliveries_for(app, None, req.param("subscription_id"), req).await
}

/// Replay: every deliverable event of the window becomes a new delivery, or 400 and nothing.
pub async fn admin_replay(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    admin_subscription(app, ctx, req).await?;
    if req.body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid("a JSON body is required ({} replays everything the subscription selects)"));
    }
    let (r, _) = parse_json::<ReplayRequest>(&req.body)?;
    let max = r.max_events.unwrap_or(100);
    if !(1..=1000).contains(&max) {
        return Err(ApiError::invalid("max_events must be from 1 to 1000"));
    }
    let time = |name: &str, v: &Option<String>| -> ApiResult<Option<i64>> {
        v.as_ref()
            .map(|s| {
                parse_rfc3339_ms(s).ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 date-time")))
            })
            .transpose()
    };
    let (from, to) = (time("from", &r.from)?, time("to", &r.to)?);
    let types = r.event_types.clone().unwrap_or_default();
    check_lists(&types, &[])?;
    let id = req.param("subscription_id").to_string();
    let (owner, sub) = resolve(app, &id, None).await?;
    refuse_closed_owner(app, &owner).await?;
    let replay_id = format!("replay_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    if sub.status != "ACTIVE" {
        return Ok(Answer::json(
            202,
            &json!({"replay_id": replay_id, "events_queued": 0, "estimated_completion_seconds": 0}),
        ));
    }
    if !ops::webhooks::lock_replay(&app.store, &owner, &id, &replay_id).await? {
        return Err(ApiError::new(ErrorCode::ReplayInProgress, "A replay of this subscription is in progress"));
    }
    let outcome = replay(app, &owner, &sub, from, to, &types, max as usize).await;
    ops::webhooks::unlock_replay(&app.store, &owner, &id, &replay_id).await?;
    let queued = outcome?;
    let estimate = if queued == 0 { 0 } else { (queued / 10).max(1) };
    Ok(Answer::json(
        202,
        &json!({"replay_id": replay_id, "events_queued": queued, "estimated_completion_seconds": estimate}),
    ))
}

async fn replay(
    app: &App,
    owner: &str,
    sub: &Subscription,
    from: Option<i64>,
    to: Option<i64>,
    types: &[String],
    max: usize,
) -> ApiResult<u64> {
    let sources = if owner == SYSTEM_TENANT { ops::events::owners(&app.store).await? } else { vec![owner.to_string()] };
    let keep = |e: &Value| {
        let ts = e["timestamp"].as_str().and_then(parse_rfc3339_ms).unwrap_or(0);
        from.is_none_or(|f| ts >= f)
            && to.is_none_or(|t| ts <= t)
            && (types.is_empty() || types.iter().any(|t| e["event_type"] == t.as_str()))
            && sub.selects(e)
    };
    let mut selected = vec![];
    for source in sources {
        selected.extend(tenant_events(&app.store, &source, &keep).await?);
        if selected.len() > max {
            return Err(ApiError::invalid(format!(
                "the window holds more than max_events ({max}) deliverable events; narrow it or raise max_events"
            )));
        }
    }
    // chronological: stream position (ms, seq), then tenant for the system-wide merge
    selected.sort_by_key(|e| {
        let id = e["event_id"].as_str().unwrap_or_default();
        let (tenant, entry) = super::events::parse_event_id(id).unwrap_or_default();
        let (ms, seq) = entry.split_once('-').unwrap_or_default();
        (ms.parse::<i64>().unwrap_or(0), seq.parse::<i64>().unwrap_or(0), tenant.to_string())
    });
    let mut queued = 0;
    for event in &selected {
        let delivery_id = format!("del_{}", &uuid::Uuid::new_v4().simple().to_string()[..16]);
        queued += crate::ops::webhooks::enqueue(&app.store, owner, event, None, &[(sub, delivery_id)]).await?;
    }
    Ok(queued)
}

// ---------------------------------------------------------------------------------------------
// Tenant self-service routes (`/v1/webhooks`); cross-tenant ids answer 404.

/// The tenant a self-service call acts for: the key's, or (admin key) the one named in `tenant`.
async fn self_service(
    app: &App,
    ctx: &mut Ctx,
    req: &ApiRequest,
    permission: Permission,
) -> ApiResult<(Caller, Option<String>)> {
    let caller = dual_auth(app, ctx, req, Some(permission)).await?;
    let q = super::parse_query(&req.query)?;
    let named = q.get("tenant").filter(|t| !t.is_empty()).cloned();
    let tenant = match &caller {
        Caller::Tenant(k) => {
            if named.as_ref().is_some_and(|t| *t != k.tenant) {
                return Err(ApiError::forbidden("tenant does not match the tenant of the API key"));
            }
            Some(k.tenant.clone())
        }
        Caller::Admin => named,
    };
    Ok((caller, tenant))
}

pub async fn tenant_create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let key = tenant_auth(app, ctx, req, Permission::WebhooksWrite).await?;
    key.check_not_suspended()?;
    let tenant = key.tenant.clone();
    create_for(app, ctx, &Caller::Tenant(key), &tenant, req).await
}

pub async fn tenant_list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let (_, tenant) = self_service(app, ctx, req, Permission::WebhooksRead).await?;
    let tenant = tenant
        .ok_or_else(|| ApiError::invalid("tenant query parameter is required when using admin key authentication"))?;
    list_for(app, vec![tenant], req).await
}

pub async fn tenant_get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let (caller, tenant) = self_service(app, ctx, req, Permission::WebhooksRead).await?;
    let scope = if matches!(caller, Caller::Admin) { None } else { tenant.as_deref() };
    let (owner, sub) = resolve(app, req.param("subscription_id"), scope).await?;
    if owner == SYSTEM_TENANT {
        return Err(not_found());
    }
    Ok(Answer::json(200, &subscription_json(&sub)))
}

pub async fn tenant_update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let (caller, tenant) = self_service(app, ctx, req, Permission::WebhooksWrite).await?;
    let scope = own_scope(app, &caller, tenant.as_deref(), req.param("subscription_id")).await?;
    update_for(app, ctx, &caller, Some(&scope), req.param("subscription_id"), req).await
}

pub async fn tenant_delete(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let (caller, tenant) = self_service(app, ctx, req, Permission::WebhooksWrite).await?;
    let scope = own_scope(app, &caller, tenant.as_deref(), req.param("subscription_id")).await?;
    delete_for(app, ctx, &caller, Some(&scope), req.param("subscription_id")).await
}

pub async fn tenant_test(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let (caller, tenant) = self_service(app, ctx, req, Permission::WebhooksWrite).await?;
    let scope = own_scope(app, &caller, tenant.as_deref(), req.param("subscription_id")).await?;
    test_for(app, ctx, Some(&scope), req.param("subscription_id")).await
}

pub async fn tenant_deliveries(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let (caller, tenant) = self_service(app, ctx, req, Permission::WebhooksRead).await?;
    let scope = own_scope(app, &caller, tenant.as_deref(), req.param("subscription_id")).await?;
    deliveries_for(app, Some(&scope), req.param("subscription_id"), req).await
}

/// The tenant a self-service call may touch: the key's own; under the admin key, the
/// subscription's owner (never `__system__`, which is not reachable on these routes).
async fn own_scope(app: &App, caller: &Caller, tenant: Option<&str>, id: &str) -> ApiResult<String> {
    let scope = match (caller, tenant) {
        (Caller::Tenant(_), Some(t)) => t.to_string(),
        _ => resolve(app, id, None).await?.0,
    };
    if scope == SYSTEM_TENANT {
        return Err(not_found());
    }
    Ok(scope)
}

/// The SSRF rules in force now: the stored configuration, else the environment's.
async fn egress_rules(app: &App) -> ApiResult<crate::egress::EgressRules> {
    crate::ops::settings::egress_rules(&app.store, &app.config.webhooks.egress).await
}
