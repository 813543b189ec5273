//! Event queries (normative): `GET /v1/admin/events`, `GET /v1/admin/events/{id}` and the
//! tenant-scoped `GET /v1/events`. Events live in per-tenant streams, written by the same
//! script as the state change that caused them; an event id names its tenant and stream entry.

use serde_json::Value;

use super::admin::*;
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::{parse_rfc3339_ms, scope_admitted};
use crate::error::{ApiError, ApiResult, ErrorCode};
pub use crate::ops::events::*;

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

pub async fn admin_list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let q = ListQuery::parse(req, &["timestamp", "event_type", "category", "scope", "tenant_id"])?;
    let filter = EventFilter::parse(&q)?;
    let tenants = match q.get("tenant_id") {
        Some(t) => {
            ctx.act_for(t)?;
            vec![t.to_string()]
        }
        None => crate::ops::events::owners(&app.store).await?,
    };
    let mut events = vec![];
    for t in tenants {
        events.extend(tenant_events(&app.store, &t, &|e| filter.matches(e, &q)).await?);
    }
    Ok(page(&q, events))
}

pub async fn admin_get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    match load_event(&app.store, req.param("event_id")).await? {
        Some(e) => {
            if ctx.limited() {
                ctx.act_for(e["tenant_id"].as_str().unwrap_or_default())?;
            }
            Ok(Answer::json(200, &e))
        }
        None => Err(ApiError::new(ErrorCode::EventNotFound, "Event not found")),
    }
}

pub async fn tenant_list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let key = tenant_auth(app, ctx, req, Permission::EventsRead).await?;
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
        key.scope_filter().is_empty() || e["scope"].as_str().is_some_and(|s| scope_admitted(&key.scope_filter(), s))
    };
    let keep = |e: &Value| {
        TENANT_CATEGORIES.contains(&e["category"].as_str().unwrap_or_default()) && admitted(e) && filter.matches(e, &q)
    };
    Ok(page(&q, tenant_events(&app.store, &key.tenant, &keep).await?))
}
