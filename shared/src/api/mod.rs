//! The HTTP surface: one route table, a transport-neutral request/response pair, and the
//! dispatcher every front end (Lambda, the local gateway) calls.

mod action_kinds;
pub mod admin;
mod alarms;
pub mod api_keys;
pub mod audit;
pub mod auth;
mod balances;
pub mod budgets;
mod bulk;
pub mod cors;
pub mod events;
mod evidence;
mod list;
pub mod operator_keys;
pub mod overview;
pub mod policies;
mod quotas;
mod reservations;
pub mod tenants;
pub mod usage;
pub mod webhook_security;
pub mod webhooks;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use bytes::Bytes;
use http::{HeaderMap, Method};
use serde::Serialize;

use crate::config::Config;
use crate::domain::roles::Access;
use crate::error::{ApiError, ApiResult};
use crate::ids::{new_request_id, trace_from_headers, Trace};
use crate::store::Store;

/// Everything a handler needs, created once per container.
pub struct App {
    pub store: Store,
    pub config: Config,
    key_tenants: Mutex<HashMap<String, String>>,
    /// Operator keys this container checked, by the digest of the presented key, and when
    /// (trusted for `CYCLES_AUTH_CACHE_MS`).
    operator_keys: Mutex<HashMap<String, (auth::Operator, std::time::Instant)>>,
    alarms: alarms::Alarms,
    /// Each tenant's evidence switch as last read, and when (`evidence::enabled_for`).
    evidence_switches: Mutex<HashMap<String, (Option<bool>, std::time::Instant)>>,
}

impl App {
    pub fn new(store: Store, config: Config) -> App {
        App {
            store,
            config,
            key_tenants: Mutex::new(HashMap::new()),
            operator_keys: Mutex::new(HashMap::new()),
            alarms: Default::default(),
            evidence_switches: Mutex::new(HashMap::new()),
        }
    }

    /// Connects to Redis as configured by the environment (the Lambda init path).
    pub async fn from_env() -> Result<App, Box<dyn std::error::Error + Send + Sync>> {
        let config = Config::load(None).await?;
        let store = config.open_store().await?;
        Ok(App::new(store, config))
    }
}

/// A request as every front end hands it over.
#[derive(Debug, Clone, Default)]
pub struct ApiRequest {
    pub method: Method,
    pub path: String,
    pub query: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    /// Path parameters of the matched route template.
    pub params: Params,
    /// The caller's address as the front end saw it (API Gateway's `sourceIp`, the peer).
    pub source_ip: Option<String>,
    /// The IAM principal (ARN) API Gateway verified when the operator plane is called with IAM
    /// (SigV4) authorization; never taken from a header.
    pub iam_principal: Option<String>,
}

impl ApiRequest {
    /// A path parameter of the route template (empty when the template has none of that name).
    pub fn param(&self, name: &str) -> &str {
        self.params.get(name).map(String::as_str).unwrap_or_default()
    }
}

#[derive(Debug, Clone)]
pub struct ApiResponse {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Vec<u8>,
}

/// The two API hosts: `GET /v1/balances` has a different contract on each (the runtime's
/// tenant balances, the operator's cross-tenant view), so they are served on separate ports /
/// API Gateway APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Plane {
    Runtime,
    Admin,
}

/// What a handler returns: its answer, produced asynchronously.
pub type Handled<'a> = Pin<Box<dyn Future<Output = ApiResult<Answer>> + Send + 'a>>;

/// Every handler has this shape: authenticate, parse, call one op, answer.
pub type Handler = for<'a> fn(&'a App, &'a mut Ctx, &'a ApiRequest) -> Handled<'a>;

/// One endpoint: where it is served, the Lambda function (binary) that serves it, and its handler.
pub struct Route {
    pub plane: Plane,
    pub method: Method,
    pub template: &'static str,
    pub function: &'static str,
    /// The spec's operationId (the operational routes have their own).
    pub operation: &'static str,
    /// What an operator credential needs to call it (`domain::roles`).
    pub access: Access,
    pub handler: Handler,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.method, self.template, self.function)
    }
}

macro_rules! routes {
    ($($plane:ident $method:ident $template:literal => $function:literal ($operation:ident) [$access:ident], $handler:path;)*) => {
        /// The single source of truth for plane + method + path -> function and handler. Adding an
        /// endpoint is one line here, its handler and the op it calls.
        pub static ROUTES: &[Route] = &[$(Route {
            plane: Plane::$plane,
            method: Method::$method,
            template: $template,
            function: $function,
            operation: stringify!($operation),
            access: Access::$access,
            handler: |app, ctx, req| Box::pin($handler(app, ctx, req)),
        }),*];
    };
}

routes! {
    Runtime GET "/v1/reservations" => "list-reservations" (listReservations) [Viewer], list::list;
    Runtime GET "/v1/balances" => "get-balances" (getBalances) [Tenant], balances::get;
    Runtime GET "/v1/usage" => "get-usage" (getUsage) [Tenant], usage::tenant_get;
    Runtime GET "/v1/action-kinds" => "list-action-kinds" (listActionKinds) [Open], action_kinds::list;
    Runtime GET "/v1/action-kinds/{kind}" => "get-action-kind" (getActionKind) [Open], action_kinds::get;
    Runtime GET "/v1/evidence/{evidence_id}" => "get-evidence" (getEvidence) [Open], evidence::get;
    Runtime GET "/v1/.well-known/cycles-jwks.json" => "get-evidence-jwks" (getEvidenceJwks) [Open], evidence::jwks;
    Runtime POST "/v1/decide" => "decide" (decide) [Tenant], reservations::decide;
    Runtime POST "/v1/events" => "create-event" (createEvent) [Tenant], reservations::create_event;
    Runtime POST "/v1/reservations" => "create-reservation" (createReservation) [Tenant], reservations::create;
    Runtime GET "/v1/reservations/{reservation_id}" => "get-reservation" (getReservation) [Viewer], reservations::get;
    Runtime POST "/v1/reservations/{reservation_id}/commit" => "commit-reservation" (commitReservation) [Tenant], reservations::commit;
    Runtime POST "/v1/reservations/{reservation_id}/release" => "release-reservation" (releaseReservation) [Operator], reservations::release;
    Runtime POST "/v1/reservations/{reservation_id}/extend" => "extend-reservation" (extendReservation) [Tenant], reservations::extend;
    Admin POST "/v1/admin/tenants" => "create-tenant" (createTenant) [Operator], tenants::create;
    Admin GET "/v1/admin/tenants" => "list-tenants" (listTenants) [Viewer], tenants::list;
    Admin POST "/v1/admin/tenants/bulk-action" => "bulk-action-tenants" (bulkActionTenants) [Operator], bulk::tenants;
    Admin GET "/v1/admin/tenants/{tenant_id}" => "get-tenant" (getTenant) [Viewer], tenants::get;
    Admin PATCH "/v1/admin/tenants/{tenant_id}" => "update-tenant" (updateTenant) [Operator], tenants::update;
    Admin POST "/v1/admin/api-keys" => "create-api-key" (createApiKey) [Operator], api_keys::create;
    Admin GET "/v1/admin/api-keys" => "list-api-keys" (listApiKeys) [Viewer], api_keys::list;
    Admin PATCH "/v1/admin/api-keys/{key_id}" => "update-api-key" (updateApiKey) [Operator], api_keys::update;
    Admin DELETE "/v1/admin/api-keys/{key_id}" => "revoke-api-key" (revokeApiKey) [Operator], api_keys::revoke;
    Admin POST "/v1/admin/api-keys/{key_id}/rotate" => "rotate-api-key" (rotateApiKey) [Operator], api_keys::rotate;
    Admin POST "/v1/admin/operator-keys" => "create-operator-key" (createOperatorKey) [Owner], operator_keys::create;
    Admin GET "/v1/admin/operator-keys" => "list-operator-keys" (listOperatorKeys) [Owner], operator_keys::list;
    Admin GET "/v1/admin/operator-keys/{key_id}" => "get-operator-key" (getOperatorKey) [Owner], operator_keys::get;
    Admin PATCH "/v1/admin/operator-keys/{key_id}" => "update-operator-key" (updateOperatorKey) [Owner], operator_keys::update;
    Admin DELETE "/v1/admin/operator-keys/{key_id}" => "revoke-operator-key" (revokeOperatorKey) [Owner], operator_keys::revoke;
    Admin POST "/v1/admin/operator-keys/{key_id}/rotate" => "rotate-operator-key" (rotateOperatorKey) [Owner], operator_keys::rotate;
    Admin POST "/v1/admin/budgets" => "create-budget" (createBudget) [Operator], budgets::create;
    Admin GET "/v1/admin/budgets" => "list-budgets" (listBudgets) [Viewer], budgets::list;
    Admin GET "/v1/admin/budgets/lookup" => "lookup-budget" (lookupBudget) [Viewer], budgets::lookup;
    Admin PATCH "/v1/admin/budgets" => "update-budget" (updateBudget) [Operator], budgets::update;
    Admin POST "/v1/admin/budgets/freeze" => "freeze-budget" (freezeBudget) [Operator], budgets::freeze;
    Admin POST "/v1/admin/budgets/unfreeze" => "unfreeze-budget" (unfreezeBudget) [Operator], budgets::unfreeze;
    Admin POST "/v1/admin/budgets/fund" => "fund-budget" (fundBudget) [Operator], budgets::fund;
    Admin POST "/v1/admin/budgets/bulk-action" => "bulk-action-budgets" (bulkActionBudgets) [Operator], bulk::budgets;
    Admin POST "/v1/admin/policies" => "create-policy" (createPolicy) [Operator], policies::create;
    Admin GET "/v1/admin/policies" => "list-policies" (listPolicies) [Viewer], policies::list;
    Admin PATCH "/v1/admin/policies/{policy_id}" => "update-policy" (updatePolicy) [Operator], policies::update;
    Admin GET "/v1/admin/action-quota-counters" => "list-action-quota-counters" (listActionQuotaCounters) [Viewer], quotas::list;
    Admin POST "/v1/admin/action-quota-counters/reset" => "reset-action-quota-counter" (resetActionQuotaCounter) [Operator], quotas::reset;
    Admin GET "/v1/auth/introspect" => "introspect-auth" (introspectAuth) [Viewer], admin::introspect;
    Admin POST "/v1/auth/validate" => "validate-api-key" (validateApiKey) [Viewer], api_keys::validate;
    Admin GET "/v1/admin/overview" => "get-admin-overview" (getAdminOverview) [Viewer], overview::get;
    Admin GET "/v1/admin/usage" => "get-admin-usage" (getAdminUsage) [Viewer], usage::admin_get;
    Admin GET "/v1/admin/audit/logs" => "list-audit-logs" (listAuditLogs) [Viewer], audit::list;
    Admin GET "/v1/balances" => "get-admin-balances" (getBalances) [Tenant], budgets::balances;
    Admin GET "/v1/admin/events" => "list-events" (listEvents) [Viewer], events::admin_list;
    Admin GET "/v1/admin/events/{event_id}" => "get-event" (getEvent) [Viewer], events::admin_get;
    Admin GET "/v1/events" => "list-tenant-events" (listTenantEvents) [Tenant], events::tenant_list;
    Admin POST "/v1/admin/webhooks" => "create-webhook" (createWebhookSubscription) [Operator], webhooks::admin_create;
    Admin GET "/v1/admin/webhooks" => "list-webhooks" (listWebhookSubscriptions) [Viewer], webhooks::admin_list;
    Admin POST "/v1/admin/webhooks/bulk-action" => "bulk-action-webhooks" (bulkActionWebhooks) [Operator], bulk::webhooks;
    Admin GET "/v1/admin/webhooks/{subscription_id}" => "get-webhook" (getWebhookSubscription) [Viewer], webhooks::admin_get;
    Admin PATCH "/v1/admin/webhooks/{subscription_id}" => "update-webhook" (updateWebhookSubscription) [Operator], webhooks::admin_update;
    Admin DELETE "/v1/admin/webhooks/{subscription_id}" => "delete-webhook" (deleteWebhookSubscription) [Operator], webhooks::admin_delete;
    Admin POST "/v1/admin/webhooks/{subscription_id}/test" => "test-webhook" (testWebhookSubscription) [Operator], webhooks::admin_test;
    Admin GET "/v1/admin/webhooks/{subscription_id}/deliveries" => "list-webhook-deliveries" (listWebhookDeliveries) [Viewer], webhooks::admin_deliveries;
    Admin POST "/v1/admin/webhooks/{subscription_id}/replay" => "replay-events" (replayEvents) [Operator], webhooks::admin_replay;
    Admin GET "/v1/admin/config/webhook-security" => "get-webhook-security" (getWebhookSecurityConfig) [Viewer], webhook_security::get;
    Admin PUT "/v1/admin/config/webhook-security" => "update-webhook-security" (updateWebhookSecurityConfig) [Owner], webhook_security::put;
    Admin POST "/v1/webhooks" => "create-tenant-webhook" (createTenantWebhook) [Tenant], webhooks::tenant_create;
    Admin GET "/v1/webhooks" => "list-tenant-webhooks" (listTenantWebhooks) [Viewer], webhooks::tenant_list;
    Admin GET "/v1/webhooks/{subscription_id}" => "get-tenant-webhook" (getTenantWebhook) [Viewer], webhooks::tenant_get;
    Admin PATCH "/v1/webhooks/{subscription_id}" => "update-tenant-webhook" (updateTenantWebhook) [Operator], webhooks::tenant_update;
    Admin DELETE "/v1/webhooks/{subscription_id}" => "delete-tenant-webhook" (deleteTenantWebhook) [Operator], webhooks::tenant_delete;
    Admin POST "/v1/webhooks/{subscription_id}/test" => "test-tenant-webhook" (testTenantWebhook) [Operator], webhooks::tenant_test;
    Admin GET "/v1/webhooks/{subscription_id}/deliveries" => "list-tenant-webhook-deliveries" (listTenantWebhookDeliveries) [Viewer], webhooks::tenant_deliveries;
    // Operational routes (outside /v1: not part of the protocol; last, so the protocol's
    // requests are matched without passing them).
    Runtime GET "/health/live" => "health-live" (healthLive) [Open], liveness;
    Runtime GET "/health/ready" => "health-ready" (healthReady) [Open], readiness;
    // The reference server's health paths (Spring Boot actuator), for tooling made for it.
    Runtime GET "/actuator/health" => "health-ready" (actuatorHealth) [Open], actuator_readiness;
    Runtime GET "/actuator/health/liveness" => "health-live" (actuatorLiveness) [Open], actuator_liveness;
    Runtime GET "/actuator/health/readiness" => "health-ready" (actuatorReadiness) [Open], actuator_readiness;
    Runtime GET "/version" => "health-live" (getVersion) [Open], version;
}

/// The routes a Lambda function serves, by function (binary) name: one, or an endpoint and its
/// aliases (the reference's health paths).
pub fn routes_of(function: &str) -> Vec<&'static Route> {
    ROUTES.iter().filter(|r| r.function == function).collect()
}

pub type Params = HashMap<String, String>;

/// The name of a template segment that is a parameter (`{name}`).
fn param(segment: &str) -> Option<&str> {
    segment.strip_prefix('{').and_then(|s| s.strip_suffix('}'))
}

/// The segments of a request path (no leading or trailing `/`).
fn segments(path: &str) -> Vec<&str> {
    path.trim_end_matches('/').trim_start_matches('/').split('/').collect()
}

/// The segments of a route template (`{name}` for a parameter).
fn template_segments(template: &str) -> Vec<&str> {
    template.trim_matches('/').split('/').collect()
}

/// Every route's template, split once (a request is tried against the routes before its own).
static ROUTE_SEGMENTS: std::sync::LazyLock<Vec<Vec<&'static str>>> =
    std::sync::LazyLock::new(|| ROUTES.iter().map(|r| template_segments(r.template)).collect());

/// The parameters of the template `want` (its segments) when it matches the path segments
/// `given`, all of them. A miss allocates nothing.
fn matched(want: &[&str], given: &[&str]) -> Option<Params> {
    if want.len() != given.len()
        || want.iter().zip(given).any(|(w, g)| match param(w) {
            Some(_) => g.is_empty(),
            None => w != g,
        })
    {
        return None;
    }
    let mut params = Params::new();
    for (w, g) in want.iter().zip(given) {
        if let Some(name) = param(w) {
            params.insert(name.to_string(), percent_decode(g)?);
        }
    }
    Some(params)
}

/// Matches a template against the trailing segments of `path` (so a path behind a prefix such
/// as `cargo lambda watch`'s `/lambda-url/<fn>` still matches); `exact` requires no prefix.
pub fn match_template(template: &str, path: &str, exact: bool) -> Option<Params> {
    let given = segments(path);
    let want = template_segments(template);
    if given.len() < want.len() || (exact && given.len() != want.len()) {
        return None;
    }
    matched(&want, &given[given.len() - want.len()..])
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

/// The `limit` query parameter of the runtime lists: 1..=max, default 50 (above max is 400).
pub fn parse_limit(value: Option<&String>, max: usize) -> ApiResult<usize> {
    match parse_limit_clamped(value, max)? {
        n if value.is_some_and(|v| v.parse::<usize>().ok() != Some(n)) => {
            Err(ApiError::invalid(format!("limit must be an integer between 1 and {max}")))
        }
        n => Ok(n),
    }
}

/// The `limit` query parameter of the operator lists: default 50, above `max` clamped to
/// `max` (as consoles expect), below 1 or not an integer 400.
pub fn parse_limit_clamped(value: Option<&String>, max: usize) -> ApiResult<usize> {
    match value.map(String::as_str) {
        None => Ok(50.min(max)),
        Some(v) => match v.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n.min(max as u64) as usize),
            _ => Err(ApiError::invalid(format!("limit must be an integer of at least 1 (at most {max} are returned)"))),
        },
    }
}

/// An RFC 3339 date-time query parameter as epoch ms (absent is `None`; malformed is 400).
pub fn query_time(value: Option<&str>, name: &str) -> ApiResult<Option<i64>> {
    value
        .map(|v| {
            crate::domain::parse_rfc3339_ms(v)
                .ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 date-time")))
        })
        .transpose()
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
pub fn route(plane: Plane, method: &Method, path: &str) -> Option<(&'static Route, Params)> {
    let given = segments(path);
    ROUTES
        .iter()
        .zip(ROUTE_SEGMENTS.iter())
        .filter(|(r, _)| r.plane == plane && r.method == *method)
        .find_map(|(r, want)| matched(want, &given).map(|p| (r, p)))
}

/// Per-request context: correlation ids, the operation and caller details the audit log
/// records, and, once known, the effective tenant.
pub struct Ctx {
    pub request_id: String,
    pub trace: Trace,
    pub tenant: Option<String>,
    /// The spec operationId being served.
    pub operation: &'static str,
    pub user_agent: Option<String>,
    pub source_ip: Option<String>,
    /// The key that authenticated the request (or was presented and refused), once known: a
    /// tenant key id, an operator key id, `ADMIN_API_KEY` or `iam:<principal ARN>`.
    pub key_id: Option<String>,
    /// What the route asks of an operator credential.
    pub access: Access,
    /// The operator calling, once admitted (`App::authenticate`).
    pub operator: Option<auth::Operator>,
    /// Set when a script was handed the request context: a successful change writes its own
    /// audit entry in the same step.
    pub audit_in_script: std::sync::atomic::AtomicBool,
    /// What the dispatcher's audit entry of this request adds to its metadata (a bulk
    /// action's per-row outcome), and the actor it names when not the plain key type.
    pub audit_metadata: serde_json::Map<String, serde_json::Value>,
    pub audit_actor: Option<&'static str>,
}

impl Ctx {
    fn new(req: &ApiRequest, operation: &'static str, access: Access) -> Ctx {
        let user_agent = req.headers.get(http::header::USER_AGENT).and_then(|v| v.to_str().ok()).map(String::from);
        Ctx {
            request_id: new_request_id(),
            trace: trace_from_headers(&req.headers),
            tenant: None,
            operation,
            user_agent,
            source_ip: req.source_ip.clone(),
            key_id: None,
            access,
            operator: None,
            audit_in_script: Default::default(),
            audit_metadata: Default::default(),
            audit_actor: None,
        }
    }
}

impl Ctx {
    /// Admits an accepted operator to this request: its role must reach the route's (else 403
    /// INSUFFICIENT_PERMISSIONS naming both), and an operator limited to some tenants must name
    /// one of them (`tenant_id` in the path, query or body; else 403 FORBIDDEN; introspection
    /// excepted). A handler that learns the tenant from a resource checks it again (`act_for`).
    fn admit(&mut self, operator: auth::Operator, req: &ApiRequest) -> ApiResult<()> {
        self.key_id = Some(operator.key_id.clone());
        if let Some(need) = self.access.role().filter(|need| operator.role < *need) {
            return Err(ApiError::new(
                crate::error::ErrorCode::InsufficientPermissions,
                format!(
                    "This operation needs the {} role; this operator credential has the {} role",
                    need.as_str(),
                    operator.role.as_str()
                ),
            ));
        }
        // introspection is about the credential itself, not any tenant
        let limited = operator.tenant_pattern.is_some() && self.operation != "introspectAuth";
        self.operator = Some(operator);
        if limited {
            let named = named_tenant(req).ok_or_else(|| {
                ApiError::forbidden("This operator key is limited to some tenants: name the tenant (tenant_id)")
            })?;
            self.act_for(&named)?;
        }
        Ok(())
    }

    /// Whether the operator calling is limited to some tenants (its by-id calls then check the
    /// resource's tenant with `act_for`; nobody else pays for that read).
    pub fn limited(&self) -> bool {
        self.operator.as_ref().is_some_and(|o| o.tenant_pattern.is_some())
    }

    /// Records the tenant this request acts for; 403 when the operator calling is limited to
    /// tenants this one does not match.
    pub fn act_for(&mut self, tenant: &str) -> ApiResult<()> {
        if let Some(pattern) = self.operator.as_ref().and_then(|o| o.tenant_pattern.as_deref()) {
            if !crate::domain::roles::glob_matches(pattern, tenant) {
                return Err(ApiError::forbidden(format!("This operator key is limited to tenants matching {pattern}")));
            }
        }
        self.tenant = Some(tenant.to_string());
        Ok(())
    }
}

/// The tenant a request names: the path's `tenant_id`, else the query's `tenant_id` (or
/// `tenant`), else the body's `tenant_id` (or a bulk action's `filter.tenant_id`).
fn named_tenant(req: &ApiRequest) -> Option<String> {
    if let Some(t) = req.params.get("tenant_id") {
        return Some(t.clone());
    }
    let query = parse_query(&req.query).unwrap_or_default();
    if let Some(t) = query.get("tenant_id").or_else(|| query.get("tenant")).filter(|t| !t.is_empty()) {
        return Some(t.clone());
    }
    let body: serde_json::Value = serde_json::from_slice(&req.body).ok()?;
    let t = body.get("tenant_id").or_else(|| body.get("filter").and_then(|f| f.get("tenant_id")))?;
    t.as_str().map(String::from)
}

/// A successful answer: status, body (JSON unless `content_type` says otherwise), and whether
/// it replays an earlier request's answer.
pub struct Answer {
    pub status: u16,
    pub body: Vec<u8>,
    pub content_type: &'static str,
    pub replayed: bool,
    /// Headers of this answer beyond the ones every answer carries.
    pub headers: Vec<(&'static str, String)>,
}

impl Answer {
    pub fn json(status: u16, value: &impl Serialize) -> Answer {
        // (made at a size most answers fit: growing from empty copies a body three or four times)
        let mut body = Vec::with_capacity(1024);
        serde_json::to_writer(&mut body, value).expect("response types always serialize");
        Answer { status, body, content_type: JSON, replayed: false, headers: vec![] }
    }

    /// A body of another content type (a CSV report).
    pub fn text(status: u16, content_type: &'static str, body: String) -> Answer {
        Answer { status, body: body.into_bytes(), content_type, replayed: false, headers: vec![] }
    }

    /// An answer without a body (204, 304).
    pub fn empty(status: u16) -> Answer {
        Answer { status, body: Vec::new(), content_type: JSON, replayed: false, headers: vec![] }
    }

    pub fn with_header(mut self, name: &'static str, value: String) -> Answer {
        self.headers.push((name, value));
        self
    }

    /// Marks the answer as the replay of an earlier identical request (counted apart in metrics).
    pub fn replayed(self, replayed: bool) -> Answer {
        Answer { replayed, ..self }
    }
}

/// Runs one route's handler and turns its outcome into a response with the correlation headers.
pub async fn handle(app: &App, route: &Route, req: ApiRequest) -> ApiResponse {
    let started = std::time::Instant::now();
    let mut ctx = Ctx::new(&req, route.operation, route.access);
    // the operator plane may be restricted to source ranges (CYCLES_ADMIN_ALLOWED_CIDRS)
    let outcome = if route.plane == Plane::Admin && !app.config.admin_source_allowed(req.source_ip.as_deref()) {
        Err(ApiError::forbidden("The operator API does not accept requests from this address"))
    } else {
        (route.handler)(app, &mut ctx, &req).await
    };
    // a failed authentication (401, or 429 once throttled) is audited under `__unauth__`
    let unauthenticated = outcome.as_ref().is_err_and(|e| e.code == crate::error::ErrorCode::Unauthorized);
    let outcome = match outcome {
        Err(e) if unauthenticated => Err(app.auth_failed(&ctx, &req.headers, e).await),
        other => other,
    };
    let replayed = outcome.as_ref().is_ok_and(|a| a.replayed);
    let store_down = outcome.as_ref().is_err_and(|e| e.message == crate::error::STORE_UNAVAILABLE);
    let in_script = ctx.audit_in_script.load(std::sync::atomic::Ordering::Relaxed);
    // changes, refusals and failures always; successful reads only with CYCLES_AUDIT_READS=on
    let read = route.method == Method::GET && outcome.is_ok();
    let audit = (route.plane == Plane::Admin && !(outcome.is_ok() && in_script) && (!read || app.config.audit_reads))
        .then(|| audit_entry(&ctx, &req, &outcome, unauthenticated));
    let changed = route.plane == Plane::Admin && route.method != Method::GET && outcome.is_ok();
    let res = respond(&ctx, outcome);
    if changed {
        // the operator sees the change on the overview's next read (ops::overview)
        if let Err(e) = crate::ops::overview::mark_stale(&app.store).await {
            tracing::warn!(request_id = %ctx.request_id, error = %e.message, "could not mark the overview stale");
        }
    }
    if let Some((owner, entry)) = audit {
        // the answer stands whatever happens to its audit entry; a failure is logged
        if let Err(e) = record_audit(app, owner, entry).await {
            tracing::warn!(request_id = %ctx.request_id, error = %e.message, cause = e.cause.as_deref().unwrap_or(""),
                "could not write an audit entry");
        }
    }
    let latency_ms = started.elapsed().as_secs_f64() * 1000.0;
    crate::metrics::request(route.function, res.status, latency_ms, &res.body, replayed);
    alarms::observe(app, &ctx, res.status, store_down, latency_ms).await;
    res
}

/// Appends a dispatcher-written entry. A tenant the admin key named that does not exist owns
/// nothing: its entry goes to `__admin__` (the retention crawl only visits real tenants).
async fn record_audit(app: &App, mut owner: String, mut entry: crate::ops::audit::AuditRecord) -> ApiResult<()> {
    use crate::ops::audit::{ADMIN_OWNER, UNAUTH_OWNER};
    if owner != ADMIN_OWNER && owner != UNAUTH_OWNER && crate::ops::tenants::status(&app.store, &owner).await?.is_none()
    {
        owner = ADMIN_OWNER.to_string();
        entry.metadata.insert("named_tenant".into(), serde_json::json!(entry.tenant_id));
        entry.tenant_id = owner.clone();
    }
    crate::ops::audit::append(&app.store, &owner, entry).await
}

/// The audit entry of an operator-plane request the dispatcher records (reads, refusals,
/// failures), and its owner: the tenant it concerned, `__admin__` for other admin-key
/// requests, `__unauth__` when authentication failed.
fn audit_entry(
    ctx: &Ctx,
    req: &ApiRequest,
    outcome: &ApiResult<Answer>,
    unauthenticated: bool,
) -> (String, crate::ops::audit::AuditRecord) {
    use crate::ops::audit::{resource_type, AuditRecord, ADMIN_OWNER, UNAUTH_OWNER};
    let (status, error_code) = match outcome {
        Ok(a) => (a.status, None),
        Err(e) => (e.status(), Some(e.code.as_str().to_string())),
    };
    let admin_key = req.headers.contains_key(auth::ADMIN_KEY_HEADER) || ctx.operator.is_some();
    let owner = match (&ctx.tenant, status) {
        _ if unauthenticated => UNAUTH_OWNER.to_string(),
        (Some(t), _) if crate::domain::validate_tenant_id(t).is_ok() => t.clone(),
        _ if admin_key => ADMIN_OWNER.to_string(),
        _ => UNAUTH_OWNER.to_string(),
    };
    let resource_id = ["tenant_id", "key_id", "subscription_id", "policy_id", "event_id"]
        .iter()
        .find_map(|p| req.params.get(*p))
        .cloned()
        .unwrap_or_default();
    let entry = AuditRecord {
        tenant_id: owner.clone(),
        operation: ctx.operation.to_string(),
        status,
        key_id: ctx.key_id.clone().unwrap_or_default(),
        resource_type: resource_type(ctx.operation).to_string(),
        resource_id,
        request_id: ctx.request_id.clone(),
        trace_id: ctx.trace.trace_id.clone(),
        user_agent: ctx.user_agent.clone(),
        source_ip: ctx.source_ip.clone(),
        error_code,
        actor_type: ctx.audit_actor.unwrap_or(if admin_key { "admin" } else { "api_key" }).to_string(),
        metadata: ctx.audit_metadata.clone(),
        ..Default::default()
    };
    (owner, entry)
}

async fn liveness(_: &App, _: &mut Ctx, _: &ApiRequest) -> ApiResult<Answer> {
    Ok(Answer::json(200, &serde_json::json!({"status": "ok"})))
}

/// Readiness: Redis accepts a write through the script path every operation takes and will not
/// evict keys (200), else 503 saying whether the store is unreachable, refuses writes (out of
/// memory under `noeviction`, a read-only replica, a failed save: reads still work then, writes
/// do not) or may evict keys (a `maxmemory` limit with an evicting `maxmemory-policy`).
async fn readiness(app: &App, _: &mut Ctx, _: &ApiRequest) -> ApiResult<Answer> {
    Ok(match store_state(app).await {
        Ok(()) => Answer::json(200, &serde_json::json!({"status": "ready", "store": "ok"})),
        Err(mut body) => {
            body["status"] = serde_json::json!("unavailable");
            Answer::json(503, &body)
        }
    })
}

/// `GET /version`: the running server's version and the protocol version it serves (no key,
/// never touches Redis).
async fn version(_: &App, _: &mut Ctx, _: &ApiRequest) -> ApiResult<Answer> {
    Ok(Answer::json(
        200,
        &serde_json::json!({"name": "cycles-serverless", "version": crate::VERSION,
            "protocol_version": crate::PROTOCOL_VERSION, "evidence_schema": crate::evidence::SCHEMA_VERSION}),
    ))
}

/// `/actuator/health/liveness`, as the reference server (Spring Boot) answers it, for probes
/// and clients written for it.
async fn actuator_liveness(_: &App, _: &mut Ctx, _: &ApiRequest) -> ApiResult<Answer> {
    Ok(Answer::json(200, &serde_json::json!({"status": "UP"})))
}

/// `/actuator/health` and `/actuator/health/readiness`: readiness in the reference's shape,
/// `{"status":"UP"}`, else 503 `{"status":"DOWN"}` with the same `store` and `reason`.
async fn actuator_readiness(app: &App, _: &mut Ctx, _: &ApiRequest) -> ApiResult<Answer> {
    Ok(match store_state(app).await {
        Ok(()) => Answer::json(200, &serde_json::json!({"status": "UP"})),
        Err(mut body) => {
            body["status"] = serde_json::json!("DOWN");
            Answer::json(503, &body)
        }
    })
}

/// Whether Redis takes writes and keeps them: Err holds `store` (and `reason` when it answers
/// but refuses writes, or may evict keys while `CYCLES_STORE_EVICTION` is not `allow`).
async fn store_state(app: &App) -> Result<(), serde_json::Value> {
    let probe = crate::ops::maintenance::probe(&app.store).await;
    probe.map_err(|e| {
        let refusal = crate::store::write_refusal(&e);
        tracing::warn!(error = %e, "readiness probe failed");
        let store = if refusal.is_some() { "refusing_writes" } else { "unreachable" };
        let mut body = serde_json::json!({"store": store});
        if let Some(reason) = refusal {
            body["reason"] = serde_json::json!(reason);
        }
        body
    })?;
    if app.config.allow_evicting_store {
        return Ok(());
    }
    match app.store.evicting_policies().await {
        Ok(policies) if policies.is_empty() => Ok(()),
        Ok(policies) => {
            tracing::error!(?policies, "readiness: the store may evict keys");
            Err(serde_json::json!({"store": "evicting", "reason": "EVICTION_POLICY", "policies": policies}))
        }
        // (the probe's write went through: a store that does not tell its policy is not refused)
        Err(e) => {
            tracing::warn!(error = %e, "readiness: the store's eviction policy could not be read");
            Ok(())
        }
    }
}

/// The answer for a path no route matches (404 in the spec's error shape).
pub fn not_found(req: &ApiRequest) -> ApiResponse {
    error_response(req, ApiError::not_found(format!("No route for {} {}", req.method, req.path)))
}

/// An error answered before any handler runs, with fresh correlation ids.
pub fn error_response(req: &ApiRequest, error: ApiError) -> ApiResponse {
    respond(&Ctx::new(req, "none", Access::Open), Err(error))
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
    let ctx = Ctx::new(req, "none", Access::Open);
    let message = format!("{} is not allowed on {}; allowed: {}", req.method, req.path, allowed.join(", "));
    let mut res = respond(&ctx, Err(ApiError::invalid(message).with_status(405)));
    res.headers.push(("allow", allowed.join(", ")));
    res
}

const JSON: &str = "application/json";

/// An answer as an `http` response, for both front ends (`body` makes their body type). The
/// headers every answer has are named by constants (no name parsed per request); a value no
/// header can carry is dropped with a log line, never a panic.
pub fn into_http<B>(res: ApiResponse, body: impl FnOnce(Vec<u8>) -> B) -> http::Response<B> {
    use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
    const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
    const X_CYCLES_TRACE_ID: HeaderName = HeaderName::from_static("x-cycles-trace-id");
    const X_CYCLES_TENANT: HeaderName = HeaderName::from_static("x-cycles-tenant");
    let mut out = http::Response::new(body(res.body));
    *out.status_mut() = http::StatusCode::from_u16(res.status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    let headers = out.headers_mut();
    headers.reserve(res.headers.len());
    for (name, value) in res.headers {
        let name = match name {
            "content-type" => CONTENT_TYPE,
            "x-request-id" => X_REQUEST_ID,
            "x-cycles-trace-id" => X_CYCLES_TRACE_ID,
            "x-cycles-tenant" => X_CYCLES_TENANT,
            other => match HeaderName::from_bytes(other.as_bytes()) {
                Ok(name) => name,
                Err(_) => {
                    tracing::warn!(header = other, "a response header with an invalid name was dropped");
                    continue;
                }
            },
        };
        match HeaderValue::try_from(value) {
            Ok(value) => {
                headers.append(name, value);
            }
            // (a tenant id from a path can be anything: not worth a warning)
            Err(_) => tracing::debug!(header = %name, "a response header value no header can carry was dropped"),
        }
    }
    out
}

fn respond(ctx: &Ctx, outcome: ApiResult<Answer>) -> ApiResponse {
    let mut throttle = None;
    let mut own = vec![];
    let mut content_type = JSON;
    let (status, body) = match outcome {
        Ok(a) => {
            own = a.headers;
            content_type = a.content_type;
            (a.status, a.body)
        }
        Err(e) => {
            throttle = retry_headers(&e);
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
        ("content-type", content_type.to_string()),
        ("x-request-id", ctx.request_id.clone()),
        ("x-cycles-trace-id", ctx.trace.trace_id.clone()),
    ];
    // (a tenant id taken from a path may hold bytes no header can carry: `into_http` drops it)
    if let Some(t) = &ctx.tenant {
        headers.push(("x-cycles-tenant", t.clone()));
    }
    headers.extend(throttle.into_iter().flatten());
    headers.extend(own);
    ApiResponse { status, headers, body }
}

/// A 429's `Retry-After` (delta seconds) and `X-RateLimit-Reset` (Unix seconds), from the
/// details the rate check put in the error.
fn retry_headers(e: &ApiError) -> Option<[(&'static str, String); 2]> {
    let d = e.details.as_ref().filter(|_| e.code == crate::error::ErrorCode::LimitExceeded)?;
    let (after, reset) = (d["retry_after_seconds"].as_i64()?, d["reset_at"].as_i64()?);
    Some([("retry-after", after.max(0).to_string()), ("x-ratelimit-reset", reset.to_string())])
}

/// One more request of the caller's address this minute to a public route (the registry, the
/// evidence routes); 429 beyond the limit.
pub(crate) async fn throttle_public(app: &App, ctx: &Ctx) -> ApiResult<()> {
    let limit = app.config.public_rate_limit;
    if limit == 0 {
        return Ok(());
    }
    let now = crate::domain::now_ms();
    let source = ctx.source_ip.as_deref().unwrap_or("unknown");
    let count = crate::ops::auth::count_public(&app.store, source, now / 60_000).await?;
    if count <= limit {
        return Ok(());
    }
    Err(ApiError::minute_limit(limit, "Too many requests from this address", now))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An answer becomes an `http` response with its status, body and headers in order; a header
    /// no response can carry (a value with a line break, a name with a space) is dropped, never
    /// a panic, and the rest still go out.
    #[test]
    fn answers_become_http_responses_and_unusable_headers_are_dropped() {
        let res = ApiResponse {
            status: 409,
            headers: vec![
                ("content-type", "application/json".into()),
                ("x-request-id", "r-1".into()),
                ("x-cycles-tenant", "bad\nvalue".into()),
                ("bad name", "v".into()),
                ("retry-after", "3".into()),
            ],
            body: b"{}".to_vec(),
        };
        let out = into_http(res, |b| b);
        assert_eq!((out.status().as_u16(), out.body().as_slice()), (409, &b"{}"[..]));
        let names: Vec<&str> = out.headers().keys().map(|n| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-request-id", "retry-after"]);
        assert_eq!(out.headers()["x-request-id"], "r-1");
    }

    #[test]
    fn routes_match_exactly_and_by_suffix() {
        let (r, p) = route(Plane::Runtime, &Method::POST, "/v1/reservations/abc/commit").unwrap();
        assert_eq!(r.function, "commit-reservation");
        assert_eq!(p["reservation_id"], "abc");
        assert!(route(Plane::Runtime, &Method::GET, "/v1/reservations/abc/commit").is_none());
        assert!(route(Plane::Runtime, &Method::POST, "/x/v1/reservations").is_none());
        assert_eq!(route(Plane::Admin, &Method::GET, "/v1/balances").unwrap().0.function, "get-admin-balances");
        assert_eq!(route(Plane::Runtime, &Method::GET, "/v1/balances").unwrap().0.function, "get-balances");
        assert!(route(Plane::Runtime, &Method::POST, "/v1/admin/tenants").is_none());
        let (r, p) = route(Plane::Admin, &Method::GET, "/v1/admin/budgets/lookup").unwrap();
        assert_eq!((r.function, p.len()), ("lookup-budget", 0));
        let p = match_template(
            "/v1/reservations/{reservation_id}/extend",
            "/lambda-url/extend-reservation/v1/reservations/r%2E1/extend",
            false,
        )
        .unwrap();
        assert_eq!(p["reservation_id"], "r.1");
        // an empty parameter, a literal that differs, a malformed escape: no match
        assert!(match_template("/v1/reservations/{id}/commit", "/v1/reservations//commit", true).is_none());
        assert!(match_template("/v1/reservations/{id}/commit", "/v1/reservations/a/extend", true).is_none());
        assert!(match_template("/v1/reservations/{id}", "/v1/reservations/%zz", true).is_none());
        assert!(match_template("/v1/reservations/{id}", "/v1/reservations/a/b", true).is_none());
        assert_eq!(match_template("/v1/reservations/{id}", "/v1/reservations/a/", true).unwrap()["id"], "a");
    }
}
