//! The HTTP surface: one route table, a transport-neutral request/response pair, and the
//! dispatcher every front end (Lambda, the local gateway) calls.

pub mod admin;
pub mod api_keys;
pub mod auth;
mod balances;
pub mod budgets;
pub mod events;
mod list;
mod reservations;
pub mod tenants;
pub mod webhooks;

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde::Serialize;

use crate::config::Config;
use crate::error::{ApiError, ApiResult};
use crate::ids::{new_request_id, trace_from_headers, Trace};
use crate::store::Store;

/// Everything a handler needs, created once per container.
pub struct App {
    pub store: Store,
    pub config: Config,
    key_tenants: Mutex<HashMap<String, String>>,
}

impl App {
    pub fn new(store: Store, config: Config) -> App {
        App { store, config, key_tenants: Mutex::new(HashMap::new()) }
    }

    /// Connects to Redis as configured by the environment (the Lambda init path).
    pub async fn from_env() -> Result<App, Box<dyn std::error::Error + Send + Sync>> {
        let config = Config::load(None).await?;
        let store = Store::connect(&config.redis_url, config.redis_timeout).await?;
        Ok(App::new(store, config))
    }
}

/// A request as every front end hands it over.
#[derive(Debug, Clone)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, Clone)]
pub struct ApiResponse {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// The operations this service exposes; each is one Lambda function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    Liveness,
    Readiness,
    GetBalances,
    ListReservations,
    Decide,
    CreateEvent,
    CreateReservation,
    CommitReservation,
    ReleaseReservation,
    ExtendReservation,
    GetReservation,
    CreateTenant,
    ListTenants,
    GetTenant,
    UpdateTenant,
    CreateApiKey,
    ListApiKeys,
    UpdateApiKey,
    RevokeApiKey,
    CreateBudget,
    ListBudgets,
    LookupBudget,
    UpdateBudget,
    FreezeBudget,
    UnfreezeBudget,
    FundBudget,
    IntrospectAuth,
    GetAdminBalances,
    ListEvents,
    GetEvent,
    ListTenantEvents,
    CreateWebhook,
    ListWebhooks,
    GetWebhook,
    UpdateWebhook,
    DeleteWebhook,
    TestWebhook,
    ListWebhookDeliveries,
    ReplayEvents,
    CreateTenantWebhook,
    ListTenantWebhooks,
    GetTenantWebhook,
    UpdateTenantWebhook,
    DeleteTenantWebhook,
    TestTenantWebhook,
    ListTenantWebhookDeliveries,
}

impl Operation {
    /// The Lambda function (binary) serving this operation.
    pub fn function_name(self) -> &'static str {
        match self {
            Self::Liveness => "health-live",
            Self::Readiness => "health-ready",
            Self::GetBalances => "get-balances",
            Self::ListReservations => "list-reservations",
            Self::Decide => "decide",
            Self::CreateEvent => "create-event",
            Self::CreateReservation => "create-reservation",
            Self::CommitReservation => "commit-reservation",
            Self::ReleaseReservation => "release-reservation",
            Self::ExtendReservation => "extend-reservation",
            Self::GetReservation => "get-reservation",
            Self::CreateTenant => "create-tenant",
            Self::ListTenants => "list-tenants",
            Self::GetTenant => "get-tenant",
            Self::UpdateTenant => "update-tenant",
            Self::CreateApiKey => "create-api-key",
            Self::ListApiKeys => "list-api-keys",
            Self::UpdateApiKey => "update-api-key",
            Self::RevokeApiKey => "revoke-api-key",
            Self::CreateBudget => "create-budget",
            Self::ListBudgets => "list-budgets",
            Self::LookupBudget => "lookup-budget",
            Self::UpdateBudget => "update-budget",
            Self::FreezeBudget => "freeze-budget",
            Self::UnfreezeBudget => "unfreeze-budget",
            Self::FundBudget => "fund-budget",
            Self::IntrospectAuth => "introspect-auth",
            Self::GetAdminBalances => "get-admin-balances",
            Self::ListEvents => "list-events",
            Self::GetEvent => "get-event",
            Self::ListTenantEvents => "list-tenant-events",
            Self::CreateWebhook => "create-webhook",
            Self::ListWebhooks => "list-webhooks",
            Self::GetWebhook => "get-webhook",
            Self::UpdateWebhook => "update-webhook",
            Self::DeleteWebhook => "delete-webhook",
            Self::TestWebhook => "test-webhook",
            Self::ListWebhookDeliveries => "list-webhook-deliveries",
            Self::ReplayEvents => "replay-events",
            Self::CreateTenantWebhook => "create-tenant-webhook",
            Self::ListTenantWebhooks => "list-tenant-webhooks",
            Self::GetTenantWebhook => "get-tenant-webhook",
            Self::UpdateTenantWebhook => "update-tenant-webhook",
            Self::DeleteTenantWebhook => "delete-tenant-webhook",
            Self::TestTenantWebhook => "test-tenant-webhook",
            Self::ListTenantWebhookDeliveries => "list-tenant-webhook-deliveries",
        }
    }
}

/// The two API hosts: `GET /v1/balances` has a different contract on each
/// (admin-and-events.md §3.7), so they are served on separate ports / API Gateway APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    Runtime,
    Admin,
}

pub struct Route {
    pub plane: Plane,
    pub method: Method,
    pub template: &'static str,
    pub op: Operation,
}

const fn runtime(method: Method, template: &'static str, op: Operation) -> Route {
    Route { plane: Plane::Runtime, method, template, op }
}

const fn admin(method: Method, template: &'static str, op: Operation) -> Route {
    Route { plane: Plane::Admin, method, template, op }
}

/// The single source of truth for plane + method + path -> operation.
pub static ROUTES: [Route; 46] = [
    // Operational routes (outside /v1: not part of the protocol).
    runtime(Method::GET, "/health/live", Operation::Liveness),
    runtime(Method::GET, "/health/ready", Operation::Readiness),
    runtime(Method::GET, "/v1/reservations", Operation::ListReservations),
    runtime(Method::GET, "/v1/balances", Operation::GetBalances),
    runtime(Method::POST, "/v1/decide", Operation::Decide),
    runtime(Method::POST, "/v1/events", Operation::CreateEvent),
    runtime(Method::POST, "/v1/reservations", Operation::CreateReservation),
    runtime(Method::GET, "/v1/reservations/{reservation_id}", Operation::GetReservation),
    runtime(Method::POST, "/v1/reservations/{reservation_id}/commit", Operation::CommitReservation),
    runtime(Method::POST, "/v1/reservations/{reservation_id}/release", Operation::ReleaseReservation),
    runtime(Method::POST, "/v1/reservations/{reservation_id}/extend", Operation::ExtendReservation),
    admin(Method::POST, "/v1/admin/tenants", Operation::CreateTenant),
    admin(Method::GET, "/v1/admin/tenants", Operation::ListTenants),
    admin(Method::GET, "/v1/admin/tenants/{tenant_id}", Operation::GetTenant),
    admin(Method::PATCH, "/v1/admin/tenants/{tenant_id}", Operation::UpdateTenant),
    admin(Method::POST, "/v1/admin/api-keys", Operation::CreateApiKey),
    admin(Method::GET, "/v1/admin/api-keys", Operation::ListApiKeys),
    admin(Method::PATCH, "/v1/admin/api-keys/{key_id}", Operation::UpdateApiKey),
    admin(Method::DELETE, "/v1/admin/api-keys/{key_id}", Operation::RevokeApiKey),
    admin(Method::POST, "/v1/admin/budgets", Operation::CreateBudget),
    admin(Method::GET, "/v1/admin/budgets", Operation::ListBudgets),
    admin(Method::GET, "/v1/admin/budgets/lookup", Operation::LookupBudget),
    admin(Method::PATCH, "/v1/admin/budgets", Operation::UpdateBudget),
    admin(Method::POST, "/v1/admin/budgets/freeze", Operation::FreezeBudget),
    admin(Method::POST, "/v1/admin/budgets/unfreeze", Operation::UnfreezeBudget),
    admin(Method::POST, "/v1/admin/budgets/fund", Operation::FundBudget),
    admin(Method::GET, "/v1/auth/introspect", Operation::IntrospectAuth),
    admin(Method::GET, "/v1/balances", Operation::GetAdminBalances),
    admin(Method::GET, "/v1/admin/events", Operation::ListEvents),
    admin(Method::GET, "/v1/admin/events/{event_id}", Operation::GetEvent),
    admin(Method::GET, "/v1/events", Operation::ListTenantEvents),
    admin(Method::POST, "/v1/admin/webhooks", Operation::CreateWebhook),
    admin(Method::GET, "/v1/admin/webhooks", Operation::ListWebhooks),
    admin(Method::GET, "/v1/admin/webhooks/{subscription_id}", Operation::GetWebhook),
    admin(Method::PATCH, "/v1/admin/webhooks/{subscription_id}", Operation::UpdateWebhook),
    admin(Method::DELETE, "/v1/admin/webhooks/{subscription_id}", Operation::DeleteWebhook),
    admin(Method::POST, "/v1/admin/webhooks/{subscription_id}/test", Operation::TestWebhook),
    admin(Method::GET, "/v1/admin/webhooks/{subscription_id}/deliveries", Operation::ListWebhookDeliveries),
    admin(Method::POST, "/v1/admin/webhooks/{subscription_id}/replay", Operation::ReplayEvents),
    admin(Method::POST, "/v1/webhooks", Operation::CreateTenantWebhook),
    admin(Method::GET, "/v1/webhooks", Operation::ListTenantWebhooks),
    admin(Method::GET, "/v1/webhooks/{subscription_id}", Operation::GetTenantWebhook),
    admin(Method::PATCH, "/v1/webhooks/{subscription_id}", Operation::UpdateTenantWebhook),
    admin(Method::DELETE, "/v1/webhooks/{subscription_id}", Operation::DeleteTenantWebhook),
    admin(Method::POST, "/v1/webhooks/{subscription_id}/test", Operation::TestTenantWebhook),
    admin(Method::GET, "/v1/webhooks/{subscription_id}/deliveries", Operation::ListTenantWebhookDeliveries),
];

pub type Params = HashMap<String, String>;

/// Matches a template against the trailing segments of `path` (so a path behind a prefix such
/// as `cargo lambda watch`'s `/lambda-url/<fn>` still matches); `exact` requires no prefix.
pub fn match_template(template: &str, path: &str, exact: bool) -> Option<Params> {
    let want: Vec<&str> = template.trim_matches('/').split('/').collect();
    let got: Vec<&str> = path.trim_end_matches('/').trim_start_matches('/').split('/').collect();
    if got.len() < want.len() || (exact && got.len() != want.len()) {
        return None;
    }
    let got = &got[got.len() - want.len()..];
    let mut params = Params::new();
    for (w, g) in want.iter().zip(got) {
        match w.strip_prefix('{').and_then(|w| w.strip_suffix('}')) {
            Some(name) if !g.is_empty() => {
                params.insert(name.to_string(), percent_decode(g)?);
            }
            Some(_) => return None,
            None if w == g => {}
            None => return None,
        }
    }
    Some(params)
}

/// Query parameters (percent-decoded, `+` as space); a repeated name keeps its first value.
pub fn parse_query(query: &str) -> ApiResult<HashMap<String, String>> {
    let mut out = HashMap::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_decode(&s.replace('+', " "))
                .ok_or_else(|| ApiError::invalid(format!("Malformed query parameter encoding: {pair}")))
        };
        out.entry(decode(k)?).or_insert(decode(v)?);
    }
    Ok(out)
}

/// The `limit` query parameter: 1..=max, default 50.
pub fn parse_limit(value: Option<&String>, max: usize) -> ApiResult<usize> {
    match value.map(String::as_str) {
        None => Ok(50),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(format!("limit must be an integer between 1 and {max}"))),
        },
    }
}

/// A boolean query parameter: exactly `true` or `false` (absent is `None`).
pub fn query_bool(value: Option<&str>, name: &str) -> ApiResult<Option<bool>> {
    match value {
        None => Ok(None),
        Some("true") => Ok(Some(true)),
        Some("false") => Ok(Some(false)),
        Some(_) => Err(ApiError::invalid(format!("{name} must be true or false"))),
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Finds the route for a request path on one plane (exact match, as the local gateway serves it).
pub fn route(plane: Plane, method: &Method, path: &str) -> Option<(Operation, Params)> {
    ROUTES
        .iter()
        .filter(|r| r.plane == plane && r.method == *method)
        .find_map(|r| match_template(r.template, path, true).map(|p| (r.op, p)))
}

/// Per-request context: correlation ids and, once known, the effective tenant.
pub struct Ctx {
    pub request_id: String,
    pub trace: Trace,
    pub tenant: Option<String>,
}

/// A successful answer: status and JSON body.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Answer {
    pub fn json(status: u16, value: &impl Serialize) -> Answer {
        Answer { status, body: serde_json::to_vec(value).expect("response types always serialize") }
    }
}

/// Runs one operation and turns its outcome into a response with the correlation headers.
pub async fn handle(app: &App, op: Operation, req: ApiRequest, params: Params) -> ApiResponse {
    let started = std::time::Instant::now();
    let mut ctx = Ctx { request_id: new_request_id(), trace: trace_from_headers(&req.headers), tenant: None };
    let outcome = match op {
        Operation::Liveness => Ok(Answer::json(200, &serde_json::json!({"status": "ok"}))),
        Operation::Readiness => readiness(app).await,
        Operation::GetBalances => balances::get(app, &mut ctx, &req).await,
        Operation::ListReservations => list::list(app, &mut ctx, &req).await,
        Operation::Decide => reservations::decide(app, &mut ctx, &req).await,
        Operation::CreateEvent => reservations::create_event(app, &mut ctx, &req).await,
        Operation::CreateReservation => reservations::create(app, &mut ctx, &req).await,
        Operation::CommitReservation => reservations::commit(app, &mut ctx, &req, &params).await,
        Operation::ReleaseReservation => reservations::release(app, &mut ctx, &req, &params).await,
        Operation::ExtendReservation => reservations::extend(app, &mut ctx, &req, &params).await,
        Operation::GetReservation => reservations::get(app, &mut ctx, &req, &params).await,
        Operation::CreateTenant => tenants::create(app, &mut ctx, &req).await,
        Operation::ListTenants => tenants::list(app, &mut ctx, &req).await,
        Operation::GetTenant => tenants::get(app, &mut ctx, &req, &params).await,
        Operation::UpdateTenant => tenants::update(app, &mut ctx, &req, &params).await,
        Operation::CreateApiKey => api_keys::create(app, &mut ctx, &req).await,
        Operation::ListApiKeys => api_keys::list(app, &mut ctx, &req).await,
        Operation::UpdateApiKey => api_keys::update(app, &mut ctx, &req, &params).await,
        Operation::RevokeApiKey => api_keys::revoke(app, &mut ctx, &req, &params).await,
        Operation::CreateBudget => budgets::create(app, &mut ctx, &req).await,
        Operation::ListBudgets => budgets::list(app, &mut ctx, &req).await,
        Operation::LookupBudget => budgets::lookup(app, &mut ctx, &req).await,
        Operation::UpdateBudget => budgets::update(app, &mut ctx, &req).await,
        Operation::FreezeBudget => budgets::freeze(app, &mut ctx, &req).await,
        Operation::UnfreezeBudget => budgets::unfreeze(app, &mut ctx, &req).await,
        Operation::FundBudget => budgets::fund(app, &mut ctx, &req).await,
        Operation::IntrospectAuth => admin::introspect(app, &mut ctx, &req).await,
        Operation::GetAdminBalances => budgets::balances(app, &mut ctx, &req).await,
        Operation::ListEvents => events::admin_list(app, &mut ctx, &req).await,
        Operation::GetEvent => events::admin_get(app, &mut ctx, &req, &params).await,
        Operation::ListTenantEvents => events::tenant_list(app, &mut ctx, &req).await,
        Operation::CreateWebhook => webhooks::admin_create(app, &mut ctx, &req).await,
        Operation::ListWebhooks => webhooks::admin_list(app, &mut ctx, &req).await,
        Operation::GetWebhook => webhooks::admin_get(app, &mut ctx, &req, &params).await,
        Operation::UpdateWebhook => webhooks::admin_update(app, &mut ctx, &req, &params).await,
        Operation::DeleteWebhook => webhooks::admin_delete(app, &mut ctx, &req, &params).await,
        Operation::TestWebhook => webhooks::admin_test(app, &mut ctx, &req, &params).await,
        Operation::ListWebhookDeliveries => webhooks::admin_deliveries(app, &mut ctx, &req, &params).await,
        Operation::ReplayEvents => webhooks::admin_replay(app, &mut ctx, &req, &params).await,
        Operation::CreateTenantWebhook => webhooks::tenant_create(app, &mut ctx, &req).await,
        Operation::ListTenantWebhooks => webhooks::tenant_list(app, &mut ctx, &req).await,
        Operation::GetTenantWebhook => webhooks::tenant_get(app, &mut ctx, &req, &params).await,
        Operation::UpdateTenantWebhook => webhooks::tenant_update(app, &mut ctx, &req, &params).await,
        Operation::DeleteTenantWebhook => webhooks::tenant_delete(app, &mut ctx, &req, &params).await,
        Operation::TestTenantWebhook => webhooks::tenant_test(app, &mut ctx, &req, &params).await,
        Operation::ListTenantWebhookDeliveries => webhooks::tenant_deliveries(app, &mut ctx, &req, &params).await,
    };
    let res = respond(&ctx, outcome);
    crate::metrics::request(op.function_name(), res.status, started.elapsed().as_secs_f64() * 1000.0, &res.body);
    res
}

/// Readiness: Redis accepts a write through the script path every operation takes (200), else
/// 503 saying whether the store is unreachable or refuses writes (out of memory under
/// `noeviction`, a read-only replica, a failed save: reads still work then, writes do not).
async fn readiness(app: &App) -> ApiResult<Answer> {
    use crate::ops::maintenance::Health;
    use crate::store::Call;
    let probe = app.store.call(Health::library(), &Health::SCRIPT, &["cy:{health}:probe".to_string()], &[]).await;
    Ok(match probe {
        Ok(_) => Answer::json(200, &serde_json::json!({"status": "ready", "store": "ok"})),
        Err(e) => {
            let refusal = crate::store::write_refusal(&e);
            tracing::warn!(error = %e, "readiness probe failed");
            let store = if refusal.is_some() { "refusing_writes" } else { "unreachable" };
            let mut body = serde_json::json!({"status": "unavailable", "store": store});
            if let Some(reason) = refusal {
                body["reason"] = serde_json::json!(reason);
            }
            Answer::json(503, &body)
        }
    })
}

/// The answer for a path no route matches (404 in the spec's error shape).
pub fn not_found(req: &ApiRequest) -> ApiResponse {
    let ctx = Ctx { request_id: new_request_id(), trace: trace_from_headers(&req.headers), tenant: None };
    respond(&ctx, Err(ApiError::not_found(format!("No route for {} {}", req.method, req.path))))
}

/// The answer when no route of `plane` matches: 405 with `Allow` when the path exists with
/// other methods, else 404.
pub fn no_route(plane: Plane, req: &ApiRequest) -> ApiResponse {
    let allowed: Vec<&str> = ROUTES
        .iter()
        .filter(|r| r.plane == plane && match_template(r.template, &req.path, true).is_some())
        .map(|r| r.method.as_str())
        .collect();
    if allowed.is_empty() {
        return not_found(req);
    }
    let ctx = Ctx { request_id: new_request_id(), trace: trace_from_headers(&req.headers), tenant: None };
    let message = format!("{} is not allowed on {}; allowed: {}", req.method, req.path, allowed.join(", "));
    let mut res = respond(&ctx, Err(ApiError::invalid(message).with_status(405)));
    res.headers.push(("allow", allowed.join(", ")));
    res
}

fn respond(ctx: &Ctx, outcome: ApiResult<Answer>) -> ApiResponse {
    let (status, body) = match outcome {
        Ok(a) => (a.status, a.body),
        Err(e) => {
            // Each failure is logged once, here, with its cause (which the caller never sees).
            let (tenant, cause) = (ctx.tenant.as_deref().unwrap_or(""), e.cause.as_deref().unwrap_or(""));
            if e.status() >= 500 {
                tracing::error!(request_id = %ctx.request_id, trace_id = %ctx.trace.trace_id, tenant,
                    error = %e.message, cause, "request failed");
            } else if !cause.is_empty() {
                tracing::info!(request_id = %ctx.request_id, trace_id = %ctx.trace.trace_id, tenant,
                    code = e.code.as_str(), cause, "request refused");
            }
            let body = e.body(&ctx.request_id, &ctx.trace.trace_id);
            (e.status(), serde_json::to_vec(&body).expect("error bodies always serialize"))
        }
    };
    let mut headers = vec![
        ("content-type", "application/json".to_string()),
        ("x-request-id", ctx.request_id.clone()),
        ("x-cycles-trace-id", ctx.trace.trace_id.clone()),
    ];
    // A tenant id taken from a path may hold bytes no header can carry (it is then unknown anyway).
    if let Some(t) = ctx.tenant.as_ref().filter(|t| http::HeaderValue::from_str(t).is_ok()) {
        headers.push(("x-cycles-tenant", t.clone()));
    }
    ApiResponse { status, headers, body }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_exactly_and_by_suffix() {
        let (op, p) = route(Plane::Runtime, &Method::POST, "/v1/reservations/abc/commit").unwrap();
        assert_eq!(op, Operation::CommitReservation);
        assert_eq!(p["reservation_id"], "abc");
        assert!(route(Plane::Runtime, &Method::GET, "/v1/reservations/abc/commit").is_none());
        assert!(route(Plane::Runtime, &Method::POST, "/x/v1/reservations").is_none());
        assert_eq!(route(Plane::Admin, &Method::GET, "/v1/balances").unwrap().0, Operation::GetAdminBalances);
        assert_eq!(route(Plane::Runtime, &Method::GET, "/v1/balances").unwrap().0, Operation::GetBalances);
        assert!(route(Plane::Runtime, &Method::POST, "/v1/admin/tenants").is_none());
        let (op, p) = route(Plane::Admin, &Method::GET, "/v1/admin/budgets/lookup").unwrap();
        assert_eq!((op, p.len()), (Operation::LookupBudget, 0));
        let p = match_template(
            "/v1/reservations/{reservation_id}/extend",
            "/lambda-url/extend-reservation/v1/reservations/r%2E1/extend",
            false,
        )
        .unwrap();
        assert_eq!(p["reservation_id"], "r.1");
    }
}
