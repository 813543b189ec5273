//! Event queries (normative): `GET /v1/admin/events`, `GET /v1/admin/events/{id}` and the
//! tenant-scoped `GET /v1/events`. Events live in per-tenant streams, written by the same
//! script as the state change that caused them; an event id names its tenant and stream entry.

use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use serde_json::Value;

use super::admin::*;
use super::{Answer, ApiRequest, App, Ctx, Params};
use crate::domain::{parse_rfc3339_ms, scope_admitted};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::keys::{self, TenantKeys};
use crate::store::Store;

/// The owner of system events (and of system-wide webhook subscriptions).
pub const SYSTEM_TENANT: &str = "__system__";

/// Every `EventType` of the spec.
pub const EVENT_TYPES: [&str; 51] = [
    "budget.created",
    "budget.updated",
    "budget.funded",
    "budget.debited",
    "budget.reset",
    "budget.reset_spent",
    "budget.debt_repaid",
    "budget.frozen",
    "budget.unfrozen",
    "budget.closed",
    "budget.closed_via_tenant_cascade",
    "budget.threshold_crossed",
    "budget.exhausted",
    "budget.over_limit_entered",
    "budget.over_limit_exited",
    "budget.debt_incurred",
    "budget.burn_rate_anomaly",
    "reservation.denied",
    "reservation.denial_rate_spike",
    "reservation.expired",
    "reservation.expiry_rate_spike",
    "reservation.commit_overage",
    "reservation.released_via_tenant_cascade",
    "tenant.created",
    "tenant.updated",
    "tenant.suspended",
    "tenant.reactivated",
    "tenant.closed",
    "tenant.settings_changed",
    "webhook.created",
    "webhook.updated",
    "webhook.paused",
    "webhook.resumed",
    "webhook.disabled",
    "webhook.deleted",
    "webhook.disabled_via_tenant_cascade",
    "api_key.created",
    "api_key.revoked",
    "api_key.revoked_via_tenant_cascade",
    "api_key.expired",
    "api_key.permissions_changed",
    "api_key.auth_failed",
    "api_key.auth_failure_rate_spike",
    "policy.created",
    "policy.updated",
    "policy.deleted",
    "system.store_connection_lost",
    "system.store_connection_restored",
    "system.high_latency",
    "system.webhook_delivery_failed",
    "system.webhook_test",
];

pub const CATEGORIES: [&str; 7] = ["budget", "tenant", "api_key", "policy", "reservation", "system", "webhook"];

/// Categories a tenant may see and subscribe to (INVARIANT 2).
pub const TENANT_CATEGORIES: [&str; 3] = ["budget", "reservation", "tenant"];

pub fn category_of(event_type: &str) -> &str {
    event_type.split('.').next().unwrap_or_default()
}

/// At most this many stream entries are read per tenant for one query.
const SCAN_LIMIT: usize = 20_000;

/// `evt_<ms>-<seq>.<tenant>` -> (tenant, stream entry id).
pub fn parse_event_id(id: &str) -> Option<(&str, &str)> {
    let (entry, tenant) = id.strip_prefix("evt_")?.split_once('.')?;
    let (ms, seq) = entry.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(ms) && digits(seq) && !tenant.is_empty()).then_some((tenant, entry))
}

fn decode(reply: StreamRangeReply) -> Vec<(String, Value)> {
    reply
        .ids
        .into_iter()
        .filter_map(|e| {
            let json: String = e.get("event")?;
            Some((e.id, serde_json::from_str(&json).ok()?))
        })
        .collect()
}

/// One event by id (None when unknown or past retention).
pub async fn load_event(store: &Store, event_id: &str) -> ApiResult<Option<Value>> {
    let Some((tenant, entry)) = parse_event_id(event_id) else { return Ok(None) };
    let reply: StreamRangeReply = store.conn().xrange(TenantKeys::new(tenant).events(), entry, entry).await?;
    Ok(decode(reply).into_iter().map(|(_, v)| v).find(|v| v["event_id"] == event_id))
}

/// A tenant's events, newest first, that pass `keep`, reading at most `SCAN_LIMIT` entries.
pub async fn tenant_events(
    store: &Store,
    tenant: &str,
    keep: &(dyn Fn(&Value) -> bool + Sync),
) -> ApiResult<Vec<Value>> {
    let key = TenantKeys::new(tenant).events();
    let mut out = vec![];
    let mut end = "+".to_string();
    let mut read = 0;
    while read < SCAN_LIMIT {
        let reply: StreamRangeReply = store.conn().xrevrange_count(&key, &end, "-", 500).await?;
        let batch = decode(reply);
        let Some((last, _)) = batch.last() else { break };
        end = format!("({last}");
        read += batch.len();
        let full = batch.len() == 500;
        out.extend(batch.into_iter().map(|(_, v)| v).filter(|v| keep(v)));
        if !full {
            break;
        }
    }
    Ok(out)
}

/// The filters both listings share.
struct EventFilter {
    event_type: Option<String>,
    category: Option<String>,
    scope: Option<String>,
    correlation_id: Option<String>,
    trace_id: Option<String>,
    request_id: Option<String>,
    from: Option<i64>,
    to: Option<i64>,
}

impl EventFilter {
    fn parse(q: &ListQuery) -> ApiResult<EventFilter> {
        let event_type = q.get("event_type").map(String::from);
        if event_type.as_deref().is_some_and(|t| !EVENT_TYPES.contains(&t)) {
            return Err(ApiError::invalid("event_type is not a known EventType"));
        }
        let category = q.get("category").map(String::from);
        if category.as_deref().is_some_and(|c| !CATEGORIES.contains(&c)) {
            return Err(ApiError::invalid("category is not a known EventCategory"));
        }
        let trace_id = q.get("trace_id").map(String::from);
        if trace_id
            .as_deref()
            .is_some_and(|t| t.len() != 32 || !t.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        {
            return Err(ApiError::invalid("trace_id must be 32 lowercase hex characters"));
        }
        Ok(EventFilter {
            event_type,
            category,
            scope: q.get("scope").map(String::from),
            correlation_id: q.get("correlation_id").map(String::from),
            trace_id,
            request_id: q.get("request_id").map(String::from),
            from: q.time("from")?,
            to: q.time("to")?,
        })
    }

    fn matches(&self, e: &Value, q: &ListQuery) -> bool {
        let s = |name: &str| e[name].as_str().unwrap_or_default();
        let ts = parse_rfc3339_ms(s("timestamp")).unwrap_or(0);
        self.event_type.as_deref().is_none_or(|t| s("event_type") == t)
            && self.category.as_deref().is_none_or(|c| s("category") == c)
            && self.scope.as_deref().is_none_or(|p| e["scope"].as_str().is_some_and(|sc| sc.starts_with(p)))
            && self.correlation_id.as_deref().is_none_or(|c| s("correlation_id") == c)
            && self.trace_id.as_deref().is_none_or(|t| s("trace_id") == t)
            && self.request_id.as_deref().is_none_or(|r| s("request_id") == r)
            && self.from.is_none_or(|f| ts >= f)
            && self.to.is_none_or(|t| ts <= t)
            && q.matches_search(&[s("correlation_id"), s("scope")])
    }
}

/// The sort key of an event: its stream position (time order) or a field.
fn sort_key(e: &Value, by: &str) -> String {
    let position = e["event_id"].as_str().and_then(parse_event_id).map(|(_, entry)| entry).unwrap_or_default();
    let (ms, seq) = position.split_once('-').unwrap_or(("0", "0"));
    let time = format!("{:0>15}-{:0>10}", ms, seq);
    match by {
        "timestamp" => time,
        field => format!("{}|{time}", e[field].as_str().unwrap_or_default()),
    }
}

fn page(q: &ListQuery, events: Vec<Value>) -> Answer {
    let rows = events
        .into_iter()
        .map(|e| (sort_key(&e, &q.sort_by), e["event_id"].as_str().unwrap_or_default().to_string(), e))
        .collect();
    let (items, next) = q.page(rows);
    Answer::json(200, &list_body("events", items, next))
}

pub async fn admin_list(app: &App, _ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, req).await?;
    let q = ListQuery::parse(req, &["timestamp", "event_type", "category", "scope", "tenant_id"])?;
    let filter = EventFilter::parse(&q)?;
    let tenants = match q.get("tenant_id") {
        Some(t) => vec![t.to_string()],
        None => {
            let mut all: Vec<String> = app.store.conn().smembers(keys::TENANT_REGISTRY).await?;
            all.push(SYSTEM_TENANT.to_string());
            all
        }
    };
    let mut events = vec![];
    for t in tenants {
        events.extend(tenant_events(&app.store, &t, &|e| filter.matches(e, &q)).await?);
    }
    Ok(page(&q, events))
}

pub async fn admin_get(app: &App, _ctx: &mut Ctx, req: &ApiRequest, params: &Params) -> ApiResult<Answer> {
    require_admin(app, req).await?;
    match load_event(&app.store, &params["event_id"]).await? {
        Some(e) => Ok(Answer::json(200, &e)),
        None => Err(ApiError::new(ErrorCode::EventNotFound, "Event not found")),
    }
}

pub async fn tenant_list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let key = tenant_auth(app, ctx, req, "events:read,admin:read,admin:events:read").await?;
    let q = ListQuery::parse(req, &["timestamp"])?;
    let filter = EventFilter::parse(&q)?;
    if filter.event_type.as_deref().is_some_and(|t| !TENANT_CATEGORIES.contains(&category_of(t)))
        || filter.category.as_deref().is_some_and(|c| !TENANT_CATEGORIES.contains(&c))
    {
        return Err(ApiError::invalid("event_type / category is not accessible to tenants"));
    }
    // The tenant's stream also holds admin-only events about it: filter the results too. A key
    // with a scope filter sees only events of the scopes it admits.
    let admitted = |e: &Value| {
        key.scope_filter.is_empty() || e["scope"].as_str().is_some_and(|s| scope_admitted(&key.scope_filter, s))
    };
    let keep = |e: &Value| {
        TENANT_CATEGORIES.contains(&e["category"].as_str().unwrap_or_default()) && admitted(e) && filter.matches(e, &q)
    };
    Ok(page(&q, tenant_events(&app.store, &key.tenant, &keep).await?))
}
