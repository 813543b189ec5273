//! What every operator-plane handler shares: who is calling (admin key or tenant key, with the
//! key's permissions and scope filter), the request context scripts stamp on events and audit
//! rows, stored-record decoding, and in-memory cursor pagination of listings.

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::{json, Value};

pub use super::auth::{Caller, Grant, TenantKey};
use super::{parse_limit_clamped, parse_query, ApiRequest, App, Ctx};
pub use crate::domain::roles::Role;
pub use crate::domain::Permission;
use crate::error::{ApiError, ApiResult, ErrorCode};

pub use crate::ops::records::{
    csv_list, field, int_field, json_field, read_records, record_from_json, time_field, Record,
};

/// Operator-only operations (an operator key, the bootstrap key or an IAM principal, with the
/// route's role): anything else is 401.
pub async fn require_admin(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<()> {
    if req.headers.get(super::auth::ADMIN_KEY_HEADER).is_none() && req.iam_principal.is_none() {
        let e = ApiError::unauthorized("This operation requires X-Admin-API-Key");
        return Err(super::auth::rejected(e, "ADMIN_KEY_REQUIRED"));
    }
    app.authenticate(ctx, req, true).await.map(|_| ())
}

/// Operations open to both credentials: the admin key wins when present; a tenant key must
/// hold `permission` (or a wildcard that covers it; `None`: any valid key), else 403
/// INSUFFICIENT_PERMISSIONS.
pub async fn dual_auth(
    app: &App,
    ctx: &mut Ctx,
    req: &ApiRequest,
    permission: Option<Permission>,
) -> ApiResult<Caller> {
    auth(app, ctx, req, permission, true).await
}

/// Tenant-key-only operations (the admin key is not honoured: 401 without a tenant key).
pub async fn tenant_auth(app: &App, ctx: &mut Ctx, req: &ApiRequest, permission: Permission) -> ApiResult<TenantKey> {
    match auth(app, ctx, req, Some(permission), false).await? {
        Caller::Tenant(k) => Ok(k),
        Caller::Admin => Err(super::auth::rejected(
            ApiError::unauthorized("This operation requires X-Cycles-API-Key"),
            "API_KEY_REQUIRED",
        )),
    }
}

async fn auth(
    app: &App,
    ctx: &mut Ctx,
    req: &ApiRequest,
    permission: Option<Permission>,
    admin: bool,
) -> ApiResult<Caller> {
    let mut key = match app.authenticate(ctx, req, admin).await? {
        Caller::Admin => return Ok(Caller::Admin),
        Caller::Tenant(k) => k,
    };
    // known before the key check: a refusal (403) is still recorded under the key's tenant
    ctx.act_for(&key.tenant)?;
    ctx.key_id = Some(key.key_id.clone());
    let accepted = permission.map(Permission::accepted).unwrap_or_default();
    let grant = crate::ops::auth::check(&app.store, &key.tenant, &key.key_id, &key.digest, accepted).await.map_err(
        |e| match e.code {
            ErrorCode::Forbidden => ApiError::new(ErrorCode::InsufficientPermissions, e.message),
            _ => e,
        },
    )?;
    key.grant = Some(grant);
    Ok(Caller::Tenant(key))
}

/// The tenant a dual-auth create acts for: named in the body with the admin key (required), never
/// with a tenant key (its own tenant, which must not be suspended).
pub fn body_tenant(caller: &Caller, named: Option<&str>) -> ApiResult<String> {
    match (caller, named) {
        (Caller::Admin, Some(t)) => {
            crate::domain::validate_tenant_id(t)
                .map_err(|_| ApiError::new(ErrorCode::TenantNotFound, "Tenant not found").with_status(400))?;
            Ok(t.to_string())
        }
        (Caller::Admin, None) => Err(ApiError::invalid("tenant_id is required with the admin key")),
        (Caller::Tenant(_), Some(_)) => Err(ApiError::invalid("tenant_id must not be given with a tenant API key")),
        (Caller::Tenant(k), None) => {
            k.check_not_suspended()?;
            Ok(k.tenant.clone())
        }
    }
}

/// The request context a script writes into events and audit entries. A script handed it
/// records the change's audit entry itself, so the dispatcher writes none for a success.
pub fn script_context(ctx: &Ctx, caller: &Caller, on_behalf: bool, correlation_id: Option<&str>) -> String {
    let operator_key = ctx.operator.as_ref().map(|o| o.key_id.as_str()).unwrap_or_default();
    let (actor, key_id) = match caller {
        Caller::Admin if on_behalf => ("admin_on_behalf_of", operator_key),
        Caller::Admin => ("admin", operator_key),
        Caller::Tenant(k) => ("api_key", k.key_id.as_str()),
    };
    ctx.audit_in_script.store(true, std::sync::atomic::Ordering::Relaxed);
    context_json(ctx, actor, key_id, ctx.tenant.as_deref().unwrap_or(""), correlation_id).to_string()
}

/// The context of one row of a bulk action: the row's change writes its event (with the
/// invocation's `correlation_id`) but no audit entry; the invocation has one entry of its own,
/// written by the dispatcher with every row's outcome (`Ctx::audit_metadata`).
pub fn bulk_context(ctx: &Ctx, tenant: &str, correlation_id: &str) -> String {
    let operator_key = ctx.operator.as_ref().map(|o| o.key_id.as_str()).unwrap_or_default();
    let mut v = context_json(ctx, "admin_on_behalf_of", operator_key, tenant, Some(correlation_id));
    v["bulk"] = json!(true);
    v.to_string()
}

fn context_json(ctx: &Ctx, actor: &str, key_id: &str, tenant: &str, correlation_id: Option<&str>) -> Value {
    let mut v = json!({
        "request_id": ctx.request_id,
        "trace_id": ctx.trace.trace_id,
        "actor": actor,
        "key_id": key_id,
        "trace_flags": ctx.trace.inbound_flags.as_deref().unwrap_or(""),
        "operation": ctx.operation,
        "status": crate::ops::audit::success_status(ctx.operation),
        "tenant": tenant,
    });
    for (name, value) in [
        ("correlation_id", correlation_id),
        ("user_agent", ctx.user_agent.as_deref()),
        ("source_ip", ctx.source_ip.as_deref()),
    ] {
        if let Some(x) = value {
            v[name] = json!(x);
        }
    }
    v
}

/// Dashboard capabilities: each flag, the operation whose page it gates (a flag is true only
/// when this deployment serves that operation), and the tenant permissions that turn it on
/// (none: the flag is admin-only, false for every tenant key whatever its admin:* permissions).
const CAPABILITIES: [(&str, &str, &[&str]); 15] = [
    ("view_overview", "getAdminOverview", &[]),
    ("view_budgets", "listBudgets", &["budgets:read", "admin:read", "admin:budgets:read"]),
    ("view_events", "listEvents", &["events:read", "admin:read", "admin:events:read"]),
    ("view_webhooks", "listWebhookSubscriptions", &["webhooks:read", "admin:read", "admin:webhooks:read"]),
    ("view_audit", "listAuditLogs", &[]),
    ("view_tenants", "listTenants", &[]),
    ("view_api_keys", "listApiKeys", &[]),
    ("view_policies", "listPolicies", &["policies:read", "admin:read", "admin:policies:read"]),
    (
        "view_reservations",
        "listReservations",
        &[
            "reservations:list",
            "reservations:create",
            "reservations:commit",
            "reservations:release",
            "reservations:extend",
            "admin:read",
        ],
    ),
    ("manage_budgets", "createBudget", &["budgets:write", "admin:write", "admin:budgets:write"]),
    ("manage_policies", "createPolicy", &["policies:write", "admin:write", "admin:policies:write"]),
    ("manage_webhooks", "createWebhookSubscription", &["webhooks:write", "admin:write", "admin:webhooks:write"]),
    ("manage_tenants", "createTenant", &[]),
    ("manage_api_keys", "createApiKey", &[]),
    (
        "manage_reservations",
        "releaseReservation",
        &["reservations:create", "reservations:commit", "reservations:release", "reservations:extend", "admin:write"],
    ),
];

/// The capability map: a flag is on when the caller is granted it and this deployment serves
/// the operation behind it.
fn capability_map(
    granted: impl Fn(&[&str], &str) -> bool,
    served: impl Fn(&str) -> bool,
) -> serde_json::Map<String, serde_json::Value> {
    CAPABILITIES
        .iter()
        .map(|(name, operation, perms)| (name.to_string(), json!(granted(perms, operation) && served(operation))))
        .collect()
}

/// `GET /v1/auth/introspect`: who the credential is and what it may do here. An operator's flags
/// follow its role (a page's flag is on when the role reaches the route behind it); its `role`
/// and `key_id` are extensions.
pub async fn introspect(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<super::Answer> {
    let caller = dual_auth(app, ctx, req, None).await?;
    let role_reaches = |operation: &str| {
        let need = super::ROUTES.iter().find(|r| r.operation == operation).and_then(|r| r.access.role());
        ctx.operator.as_ref().is_some_and(|o| need.is_some_and(|need| o.role >= need))
    };
    let caps = capability_map(
        |perms, operation| match &caller {
            Caller::Admin => role_reaches(operation),
            Caller::Tenant(k) => perms.iter().any(|p| k.permissions().iter().any(|h| h == p)),
        },
        |operation| super::ROUTES.iter().any(|r| r.operation == operation),
    );
    let body = match (&caller, &ctx.operator) {
        (Caller::Admin, Some(o)) => {
            let permissions = match o.role {
                Role::Owner => vec!["*"],
                Role::Operator => vec!["admin:read", "admin:write"],
                Role::Viewer => vec!["admin:read"],
            };
            let mut b = json!({"authenticated": true, "auth_type": "admin", "permissions": permissions,
                "capabilities": caps, "role": o.role.as_str(), "key_id": o.key_id});
            if let Some(p) = &o.tenant_pattern {
                b["tenant_pattern"] = json!(p);
            }
            b
        }
        (Caller::Admin, None) => return Err(ApiError::fault("an operator was admitted without its identity")),
        (Caller::Tenant(k), _) => {
            let mut b = json!({"authenticated": true, "auth_type": "tenant", "permissions": k.permissions(),
                "capabilities": caps, "tenant_id": k.tenant});
            if !k.scope_filter().is_empty() {
                b["scope_filter"] = json!(k.scope_filter());
            }
            b
        }
    };
    Ok(super::Answer::json(200, &body))
}

/// The most rows an operator list returns per page (a larger `limit` is clamped to it).
pub const MAX_PAGE: usize = 100;

/// The query of a listing: filters stay in `params`; paging and ordering are parsed here.
pub struct ListQuery {
    pub params: HashMap<String, String>,
    pub limit: usize,
    pub sort_by: String,
    pub descending: bool,
    cursor: Option<(String, String)>,
    search: Option<String>,
}

impl ListQuery {
    /// Parses `limit` (default 50; above `MAX_PAGE` clamped to it), `sort_by` (one of `sorts`, default the first),
    /// `sort_dir`, `search` (at most 128 characters) and `cursor`.
    pub fn parse(req: &ApiRequest, sorts: &[&str]) -> ApiResult<ListQuery> {
        let params = parse_query(&req.query)?;
        let limit = parse_limit_clamped(params.get("limit"), MAX_PAGE)?;
        let sort_by = match params.get("sort_by") {
            None => sorts[0].to_string(),
            Some(s) if sorts.contains(&s.as_str()) => s.clone(),
            Some(s) => return Err(ApiError::invalid(format!("sort_by {s:?} is not one of {}", sorts.join(", ")))),
        };
        let descending = match params.get("sort_dir").map(String::as_str) {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(_) => return Err(ApiError::invalid("sort_dir must be asc or desc")),
        };
        let search = params.get("search").filter(|s| !s.is_empty()).cloned();
        if search.as_ref().is_some_and(|s| s.chars().count() > 128) {
            return Err(ApiError::invalid("search must be at most 128 characters"));
        }
        let cursor = match params.get("cursor").filter(|c| !c.is_empty()) {
            None => None,
            Some(c) => {
                let bad = || ApiError::invalid("cursor is malformed or belongs to another sort order");
                let raw = URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
                let (by, key, id): (String, String, String) = serde_json::from_slice(&raw).map_err(|_| bad())?;
                if by != sort_by {
                    return Err(bad());
                }
                Some((key, id))
            }
        };
        Ok(ListQuery { params, limit, sort_by, descending, cursor, search })
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str).filter(|v| !v.is_empty())
    }

    /// An RFC 3339 date-time parameter as epoch ms (blank = absent; malformed = 400).
    pub fn time(&self, name: &str) -> ApiResult<Option<i64>> {
        super::query_time(self.get(name), name)
    }

    /// Case-insensitive substring search over the given fields (true when no search is set).
    pub fn matches_search(&self, fields: &[&str]) -> bool {
        search_matches(self.search.as_deref(), fields)
    }

    /// One page of rows given as (sort key, unique id, item), plus the next cursor.
    pub fn page<T>(&self, mut rows: Vec<(String, String, T)>) -> (Vec<T>, Option<String>) {
        rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        if self.descending {
            rows.reverse();
        }
        let after = |row: &(String, String, T)| match &self.cursor {
            None => true,
            Some((k, id)) => {
                let ord = (&row.0, &row.1).cmp(&(k, id));
                if self.descending {
                    ord.is_lt()
                } else {
                    ord.is_gt()
                }
            }
        };
        let mut rows: Vec<_> = rows.into_iter().filter(after).collect();
        let more = rows.len() > self.limit;
        rows.truncate(self.limit);
        let next = match rows.last() {
            Some((k, id, _)) if more => {
                Some(URL_SAFE_NO_PAD.encode(serde_json::to_vec(&(&self.sort_by, k, id)).expect("strings serialize")))
            }
            _ => None,
        };
        (rows.into_iter().map(|r| r.2).collect(), next)
    }
}

/// The `search` of listings and bulk filters: a case-insensitive substring of one of the fields
/// (true when there is no search).
pub fn search_matches(search: Option<&str>, fields: &[&str]) -> bool {
    search.filter(|s| !s.is_empty()).is_none_or(|s| {
        let s = s.to_lowercase();
        fields.iter().any(|f| f.to_lowercase().contains(&s))
    })
}

/// A `search` is at most 128 characters.
pub fn check_search(search: Option<&str>) -> ApiResult<()> {
    if search.is_some_and(|s| s.chars().count() > 128) {
        return Err(ApiError::invalid("search must be at most 128 characters"));
    }
    Ok(())
}

/// A status filter is one of `allowed`.
pub fn check_status(status: Option<&str>, allowed: &[&str]) -> ApiResult<()> {
    match status {
        Some(s) if !allowed.contains(&s) => {
            Err(ApiError::invalid(format!("status must be one of {}", allowed.join(", "))))
        }
        _ => Ok(()),
    }
}

/// A sortable key for a non-negative integer.
pub fn sort_int(n: i64) -> String {
    format!("{:020}", n.max(0))
}

/// The list wrapper every operator listing answers with.
pub fn list_body(items_name: &str, items: Vec<Value>, next: Option<String>) -> Value {
    let mut body = json!({ items_name: items, "has_more": next.is_some() });
    if let Some(c) = next {
        body["next_cursor"] = json!(c);
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(q: &str) -> ListQuery {
        let req = ApiRequest { query: q.into(), ..Default::default() };
        ListQuery::parse(&req, &["created_at", "name"]).unwrap()
    }

    #[test]
    fn pages_walk_every_row_once_in_order() {
        let rows = || (0..7).map(|i| (sort_int(i % 3), format!("id{i}"), i)).collect::<Vec<_>>();
        let mut seen = vec![];
        let mut q = query("limit=3&sort_dir=asc");
        loop {
            let (items, next) = q.page(rows());
            seen.extend(items);
            match next {
                Some(c) => q = query(&format!("limit=3&sort_dir=asc&cursor={c}")),
                None => break,
            }
        }
        assert_eq!(seen, vec![0, 3, 6, 1, 4, 2, 5]);
    }

    #[test]
    fn cursors_are_bound_to_their_sort() {
        let (_, next) = query("limit=1").page(vec![("a".into(), "1".into(), 1), ("b".into(), "2".into(), 2)]);
        let query = format!("limit=1&sort_by=name&cursor={}", next.unwrap());
        let req = ApiRequest { query, ..Default::default() };
        assert!(ListQuery::parse(&req, &["created_at", "name"]).is_err());
    }

    #[test]
    fn a_capability_is_on_only_where_its_operation_is_served() {
        let all = capability_map(|_, _| true, |_| true);
        assert_eq!(all.len(), 15);
        assert!(all.values().all(|v| v == true));
        let without_policies = capability_map(|_, _| true, |op| op != "listPolicies" && op != "createPolicy");
        assert_eq!(without_policies["view_policies"], false);
        assert_eq!(without_policies["manage_policies"], false);
        assert_eq!(without_policies["view_budgets"], true);
        // Admin-only flags stay off for a tenant key whatever it holds.
        let tenant = capability_map(|perms, _| perms.contains(&"admin:read"), |_| true);
        for flag in ["view_overview", "view_audit", "view_tenants", "view_api_keys", "manage_tenants"] {
            assert_eq!(tenant[flag], false, "{flag}");
        }
        assert_eq!(tenant["view_budgets"], true);
    }

    #[test]
    fn every_capability_names_an_operation_this_build_serves() {
        for (name, operation, _) in CAPABILITIES {
            assert!(super::super::ROUTES.iter().any(|r| r.operation == operation), "{name}: {operation} has no route");
        }
    }
}
