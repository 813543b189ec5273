//! Bulk actions (admin key): bulkActionTenants, bulkActionBudgets, bulkActionWebhooks. One
//! engine for the three: the filter is checked, the matches counted (more than `MAX_ROWS`: 400
//! LIMIT_EXCEEDED; not `expected_count`: 409 COUNT_MISMATCH; both with no writes), the matched
//! rows recorded under the idempotency key, then each row changed by its own script, atomically
//! with its event (correlation id `<kind>_bulk_action:<action>:<request_id>`). A row never
//! aborts the others. The invocation has one audit entry with every row's outcome.
//!
//! Crash safety: a row is either changed with its event or untouched. A retry with the same key
//! resumes the recorded rows: rows already changed are skipped (tenants, subscriptions: already
//! in the target state) or answered from their own idempotency record (budgets), so no row is
//! changed twice and the rest are finished. After the end, the key answers the first answer for
//! 15 minutes.

use std::future::Future;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::{bulk_context, require_admin};
use super::budgets::{BudgetFilter, FundOperation};
use super::tenants::TenantFilter;
use super::webhooks::WebhookFilter;
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::payload_hash;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::model::{parse_json, Amount};
use crate::ops;
use crate::ops::ledgers::FundBudget;

/// The most rows one invocation may match.
pub const MAX_ROWS: usize = 500;

/// What happened to one row.
enum Outcome {
    Succeeded,
    Failed(&'static str, String),
    Skipped(&'static str),
}

impl Outcome {
    /// A row's failure from the error its change met (codes of the spec's row vocabulary; the
    /// message of an internal fault is the generic one, never its cause).
    fn failed(e: ApiError) -> Outcome {
        let code = match e.code {
            ErrorCode::NotFound
            | ErrorCode::TenantNotFound
            | ErrorCode::BudgetNotFound
            | ErrorCode::WebhookNotFound => "NOT_FOUND",
            ErrorCode::BudgetExceeded => "BUDGET_EXCEEDED",
            ErrorCode::Forbidden | ErrorCode::InsufficientPermissions => "PERMISSION_DENIED",
            ErrorCode::InternalError => "INTERNAL_ERROR",
            _ => "INVALID_TRANSITION",
        };
        Outcome::Failed(code, e.message)
    }
}

/// The parts of a bulk request the engine needs.
struct Invocation<'a> {
    /// `tenant`, `budget` or `webhook`.
    kind: &'static str,
    action: &'a str,
    idempotency_key: &'a str,
    expected_count: Option<u64>,
    payload_hash: String,
}

fn check_key(key: &str) -> ApiResult<()> {
    if key.is_empty() || key.chars().count() > 128 {
        return Err(ApiError::invalid("idempotency_key must be 1 to 128 characters"));
    }
    Ok(())
}

/// An invocation's answer, and the metadata of its audit entry (none for a replayed answer).
type Ran = (Answer, Option<Map<String, Value>>);

/// Sets the invocation's audit entry and gives its answer.
fn finish_audit(ctx: &mut Ctx, (answer, audit): Ran) -> ApiResult<Answer> {
    if let Some(meta) = audit {
        ctx.audit_metadata = meta;
        ctx.audit_actor = Some("admin_on_behalf_of");
    }
    Ok(answer)
}

/// Runs an invocation: `matched` lists the rows (id, handle) when the key is new; `apply`
/// changes one row (id, handle, correlation id).
async fn run<M, MF, A, AF>(app: &App, ctx: &Ctx, inv: Invocation<'_>, matched: M, apply: A) -> ApiResult<Ran>
where
    M: FnOnce() -> MF,
    MF: Future<Output = ApiResult<Vec<(String, String)>>>,
    A: Fn(String, String, String) -> AF,
    AF: Future<Output = Outcome>,
{
    let store = &app.store;
    let rows = match ops::bulk::recorded(store, inv.kind, inv.idempotency_key, &inv.payload_hash).await? {
        Some(ops::bulk::Invocation::Done { answer, .. }) => {
            return Ok((Answer::json(200, &answer).replayed(true), None))
        }
        Some(ops::bulk::Invocation::Running { rows, .. }) => rows,
        None => {
            let rows: Vec<String> =
                matched().await?.into_iter().map(|(id, handle)| format!("{id}\t{handle}")).collect();
            if rows.len() > MAX_ROWS {
                return Err(ApiError::new(
                    ErrorCode::LimitExceeded,
                    format!("The filter matches {} rows; at most {MAX_ROWS} per invocation", rows.len()),
                )
                .with_status(400)
                .with_details(json!({"total_matched": rows.len(), "max_rows": MAX_ROWS})));
            }
            if let Some(expected) = inv.expected_count.filter(|n| *n != rows.len() as u64) {
                return Err(ApiError::new(
                    ErrorCode::CountMismatch,
                    format!("The filter matches {} rows, not the expected {expected}; nothing was changed", rows.len()),
                )
                .with_details(json!({"expected_count": expected, "total_matched": rows.len()})));
            }
            if ops::bulk::start(store, inv.kind, inv.idempotency_key, &inv.payload_hash, &rows).await? {
                rows
            } else {
                // a twin submit started first: answer or resume as it recorded
                match ops::bulk::recorded(store, inv.kind, inv.idempotency_key, &inv.payload_hash).await? {
                    Some(ops::bulk::Invocation::Done { answer, .. }) => {
                        return Ok((Answer::json(200, &answer).replayed(true), None))
                    }
                    Some(ops::bulk::Invocation::Running { rows, .. }) => rows,
                    None => rows,
                }
            }
        }
    };
    let correlation = format!("{}_bulk_action:{}:{}", inv.kind, inv.action.to_ascii_lowercase(), ctx.request_id);
    let (mut succeeded, mut failed, mut skipped) = (vec![], vec![], vec![]);
    for row in &rows {
        let (id, handle) = row.split_once('\t').unwrap_or((row.as_str(), ""));
        match apply(id.to_string(), handle.to_string(), correlation.clone()).await {
            Outcome::Succeeded => succeeded.push(json!({"id": id})),
            Outcome::Failed(code, message) => failed.push(json!({"id": id, "error_code": code, "message": message})),
            Outcome::Skipped(reason) => skipped.push(json!({"id": id, "reason": reason})),
        }
    }
    let answer = json!({"action": inv.action, "total_matched": rows.len(), "succeeded": succeeded, "failed": failed,
        "skipped": skipped, "idempotency_key": inv.idempotency_key});
    ops::bulk::finish(store, inv.kind, inv.idempotency_key, &inv.payload_hash, &answer).await?;
    // the invocation's one audit entry (the dispatcher writes it) carries every row's outcome
    let mut meta = Map::new();
    for (k, v) in [("correlation_id", json!(correlation)), ("outcome", answer.clone())] {
        meta.insert(k.to_string(), v);
    }
    Ok((Answer::json(200, &answer), Some(meta)))
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum TenantAction {
    Suspend,
    Reactivate,
    Close,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantBulkRequest {
    filter: TenantFilter,
    action: TenantAction,
    #[serde(default)]
    expected_count: Option<u64>,
    idempotency_key: String,
}

/// `POST /v1/admin/tenants/bulk-action` (bulkActionTenants): SUSPEND, REACTIVATE or CLOSE
/// (with the full cascade) every matching tenant.
pub async fn tenants(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, raw) = parse_json::<TenantBulkRequest>(&req.body)?;
    check_key(&r.idempotency_key)?;
    r.filter.check()?;
    let f = &r.filter;
    if f.status.is_none() && f.parent_tenant_id.is_none() && f.observe_mode.is_none() && f.search.is_none() {
        return Err(ApiError::invalid(
            "filter must have at least one property (an empty filter would match every tenant)",
        ));
    }
    let (action, target) = match r.action {
        TenantAction::Suspend => ("SUSPEND", "SUSPENDED"),
        TenantAction::Reactivate => ("REACTIVATE", "ACTIVE"),
        TenantAction::Close => ("CLOSE", "CLOSED"),
    };
    let inv = Invocation {
        kind: "tenant",
        action,
        idempotency_key: &r.idempotency_key,
        expected_count: r.expected_count,
        payload_hash: payload_hash(&raw, &[]),
    };
    let matched = || async {
        let tenants = ops::tenants::all(&app.store).await?;
        Ok(tenants.into_iter().filter(|t| f.matches(t)).map(|t| (t.tenant_id, String::new())).collect())
    };
    let ctx_view: &Ctx = ctx;
    let request_id = ctx_view.request_id.clone();
    let contexts = |id: &str, correlation: &str| {
        (
            bulk_context(ctx_view, id, correlation),
            bulk_context(ctx_view, id, &format!("tenant_close_cascade:{id}:{request_id}")),
        )
    };
    let apply = |id: String, _: String, correlation: String| {
        let (context, cascade) = contexts(&id, &correlation);
        async move {
            let current = match ops::tenants::read(&app.store, &id).await {
                Ok(t) => t,
                Err(e) => return Outcome::failed(e),
            };
            if current.status == target {
                return Outcome::Skipped("ALREADY_IN_TARGET_STATE");
            }
            if current.status == "CLOSED" {
                return Outcome::Failed("INVALID_TRANSITION", "The tenant is CLOSED".into());
            }
            let patch = json!({"status": target}).to_string();
            let closing = target == "CLOSED";
            match ops::tenants::update(&app.store, app.config.retention, &id, &context, &cascade, patch, closing).await
            {
                Ok(_) => Outcome::Succeeded,
                Err(e) => Outcome::failed(e),
            }
        }
    };
    let answer = run(app, ctx_view, inv, matched, apply).await?;
    finish_audit(ctx, answer)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetBulkRequest {
    filter: BudgetFilter,
    action: FundOperation,
    #[serde(default)]
    amount: Option<Amount>,
    #[serde(default)]
    spent: Option<Amount>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    expected_count: Option<u64>,
    idempotency_key: String,
}

/// `POST /v1/admin/budgets/bulk-action` (bulkActionBudgets): one funding operation on every
/// matching ledger of one tenant, with fundBudget's math, event and per-ledger idempotency.
pub async fn budgets(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, raw) = parse_json::<BudgetBulkRequest>(&req.body)?;
    check_key(&r.idempotency_key)?;
    r.filter.check()?;
    let amount = r.amount.ok_or_else(|| ApiError::invalid(format!("amount is required for {}", r.action.as_str())))?;
    if amount.amount < 0 || r.spent.as_ref().is_some_and(|s| s.amount < 0) {
        return Err(ApiError::invalid("amount and spent must be >= 0"));
    }
    if let Some(s) = &r.spent {
        if s.unit != amount.unit {
            return Err(ApiError::invalid("spent.unit must equal amount.unit"));
        }
    }
    if r.reason.as_ref().is_some_and(|s| s.chars().count() > 512) {
        return Err(ApiError::invalid("reason must be at most 512 characters"));
    }
    let tenant = r.filter.tenant_id.clone().ok_or_else(|| ApiError::invalid("filter.tenant_id is required"))?;
    if crate::domain::validate_tenant_id(&tenant).is_err() || ops::tenants::status(&app.store, &tenant).await?.is_none()
    {
        return Err(ApiError::new(ErrorCode::TenantNotFound, "Tenant not found"));
    }
    ctx.act_for(&tenant)?;
    let hash = payload_hash(&raw, &[]);
    let inv = Invocation {
        kind: "budget",
        action: r.action.as_str(),
        idempotency_key: &r.idempotency_key,
        expected_count: r.expected_count,
        payload_hash: hash.clone(),
    };
    let f = &r.filter;
    let matched = || async {
        let ledgers = ops::ledgers::of_tenant(&app.store, &tenant).await?;
        Ok(ledgers
            .into_iter()
            .filter(|l| f.matches(&tenant, l))
            .map(|l| (l.ledger_id.clone(), format!("{}\t{}", l.scope, l.unit)))
            .collect())
    };
    let ctx_view: &Ctx = ctx;
    let row_key = format!("bulk-action:{}", r.idempotency_key);
    let spent = match (r.action, &r.spent) {
        (FundOperation::ResetSpent, Some(s)) => s.amount.to_string(),
        _ => String::new(),
    };
    let apply = |_id: String, handle: String, correlation: String| {
        let context = bulk_context(ctx_view, &tenant, &correlation);
        let (tenant, row_key, hash, spent, reason) =
            (tenant.clone(), row_key.clone(), hash.clone(), spent.clone(), r.reason.clone().unwrap_or_default());
        async move {
            let (scope, unit) = handle.split_once('\t').unwrap_or((handle.as_str(), ""));
            let Some(unit) = crate::model::Unit::parse(unit) else {
                return Outcome::Failed("INTERNAL_ERROR", "The ledger's unit is unreadable".into());
            };
            if unit != amount.unit {
                return Outcome::Failed(
                    "INVALID_TRANSITION",
                    format!("amount.unit {} does not match the budget unit {}", amount.unit.as_str(), unit.as_str()),
                );
            }
            let call = FundBudget {
                context,
                operation: r.action.as_str().to_string(),
                amount: amount.amount.to_string(),
                spent,
                reason,
                payload_hash: hash,
                ..FundBudget::on(&tenant, scope, unit, Some(&row_key))
            };
            match app.store.run(call).await {
                Ok(_) => Outcome::Succeeded,
                Err(e) => Outcome::failed(e),
            }
        }
    };
    let answer = run(app, ctx_view, inv, matched, apply).await?;
    finish_audit(ctx, answer)
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum WebhookAction {
    Pause,
    Resume,
    Delete,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WebhookBulkRequest {
    filter: WebhookFilter,
    action: WebhookAction,
    #[serde(default)]
    expected_count: Option<u64>,
    idempotency_key: String,
}

/// `POST /v1/admin/webhooks/bulk-action` (bulkActionWebhooks): PAUSE, RESUME or DELETE every
/// matching subscription (tenant-owned and system-wide alike).
pub async fn webhooks(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (r, raw) = parse_json::<WebhookBulkRequest>(&req.body)?;
    check_key(&r.idempotency_key)?;
    r.filter.check()?;
    let f = &r.filter;
    if f.tenant_id.is_none() && f.status.is_none() && f.event_type.is_none() && f.search.is_none() {
        return Err(ApiError::invalid(
            "filter must have at least one property (an empty filter would match everything)",
        ));
    }
    if let Some(t) = f.event_type.as_deref().filter(|t| !ops::events::EVENT_TYPES.contains(t)) {
        return Err(ApiError::invalid(format!("filter.event_type {t:?} is not a known event type")));
    }
    let action = match r.action {
        WebhookAction::Pause => "PAUSE",
        WebhookAction::Resume => "RESUME",
        WebhookAction::Delete => "DELETE",
    };
    let inv = Invocation {
        kind: "webhook",
        action,
        idempotency_key: &r.idempotency_key,
        expected_count: r.expected_count,
        payload_hash: payload_hash(&raw, &[]),
    };
    let matched = || async {
        let owners = match &f.tenant_id {
            Some(t) => vec![t.clone()],
            None => ops::events::owners(&app.store).await?,
        };
        let mut rows = vec![];
        for owner in owners {
            for sub in ops::webhooks::subscriptions(&app.store, &owner).await? {
                if f.matches(&sub) {
                    rows.push((sub.id, owner.clone()));
                }
            }
        }
        Ok(rows)
    };
    let ctx_view: &Ctx = ctx;
    let apply = |id: String, owner: String, correlation: String| {
        let context = bulk_context(ctx_view, &owner, &correlation);
        async move { webhook_row(app, r.action, &id, &owner, context).await }
    };
    let answer = run(app, ctx_view, inv, matched, apply).await?;
    finish_audit(ctx, answer)
}

async fn webhook_row(app: &App, action: WebhookAction, id: &str, owner: &str, context: String) -> Outcome {
    for _ in 0..3 {
        let current = match ops::webhooks::read(&app.store, owner, id).await {
            Ok(Some(s)) => s,
            Ok(None) if matches!(action, WebhookAction::Delete) => return Outcome::Skipped("ALREADY_DELETED"),
            Ok(None) => return Outcome::Failed("NOT_FOUND", "The subscription no longer exists".into()),
            Err(e) => return Outcome::failed(e),
        };
        let target = match (action, current.status.as_str()) {
            (WebhookAction::Delete, _) => {
                return match ops::webhooks::delete(&app.store, context, owner, id).await {
                    Ok(()) => Outcome::Succeeded,
                    Err(e) => Outcome::failed(e),
                }
            }
            (WebhookAction::Pause, "PAUSED" | "DISABLED") | (WebhookAction::Resume, "ACTIVE") => {
                return Outcome::Skipped("ALREADY_IN_TARGET_STATE")
            }
            (WebhookAction::Resume, "DISABLED") => {
                return Outcome::Failed(
                    "INVALID_TRANSITION",
                    "A DISABLED subscription is re-enabled by updating its status to ACTIVE".into(),
                )
            }
            (WebhookAction::Pause, _) => "PAUSED",
            (WebhookAction::Resume, _) => "ACTIVE",
        };
        let expected = current.updated_at_ms.map(|ms| ms.to_string()).unwrap_or_default();
        let fields = json!({"status": target});
        match ops::webhooks::update(&app.store, context.clone(), owner, id, fields, &expected).await {
            Ok(Some(_)) => return Outcome::Succeeded,
            Ok(None) => continue, // changed meanwhile: read it again
            Err(e) => return Outcome::failed(e),
        }
    }
    Outcome::Failed("INTERNAL_ERROR", "The subscription kept changing; retry the invocation".into())
}
