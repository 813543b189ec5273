//! Budgets on the operator plane: create, lookup, list, update, freeze/unfreeze, fund, and
//! the admin-plane `GET /v1/balances` (full `BudgetLedger` items).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::admin::*;
use super::{query_bool, Answer, ApiRequest, App, Ctx};
use crate::domain::{format_rfc3339_ms, parse_rfc3339_ms, payload_hash};
use crate::domain::{validate_scope, validate_tenant_id};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::model::{parse_json, Amount, OveragePolicy, Unit};
use crate::ops;
use crate::ops::ledgers::{CreateBudget, FundBudget, Ledger, UpdateBudget};
use crate::ops::maintenance::register_tenant;
use crate::store::Store;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RolloverPolicy {
    None,
    CarryForward,
    CapAtAllocated,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetCreateRequest {
    #[serde(default)]
    pub tenant_id: Option<String>,
    pub scope: String,
    pub unit: Unit,
    pub allocated: Amount,
    #[serde(default)]
    pub overdraft_limit: Option<Amount>,
    #[serde(default)]
    pub commit_overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    pub rollover_policy: Option<RolloverPolicy>,
    #[serde(default)]
    pub period_start: Option<String>,
    #[serde(default)]
    pub period_end: Option<String>,
    /// How the period recurs (an extension; docs/operator-guide.md "Budget periods").
    #[serde(default)]
    pub period_recurrence: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    /// Operator caps returned with ALLOW_WITH_CAPS (an extension; not part of the spec body,
    /// so only the library entry point sets it).
    #[serde(skip)]
    pub caps: Option<Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetUpdateRequest {
    #[serde(default)]
    overdraft_limit: Option<Amount>,
    #[serde(default)]
    commit_overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
    // The period fields are an extension of updateBudget (docs/operator-guide.md "Budget periods").
    #[serde(default)]
    rollover_policy: Option<RolloverPolicy>,
    #[serde(default)]
    period_start: Option<String>,
    #[serde(default)]
    period_end: Option<String>,
    #[serde(default)]
    period_recurrence: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StatusChangeRequest {
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<Map<String, Value>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FundOperation {
    Credit,
    Debit,
    Reset,
    RepayDebt,
    ResetSpent,
}

impl FundOperation {
    pub fn as_str(self) -> &'static str {
        match self {
            FundOperation::Credit => "CREDIT",
            FundOperation::Debit => "DEBIT",
            FundOperation::Reset => "RESET",
            FundOperation::RepayDebt => "REPAY_DEBT",
            FundOperation::ResetSpent => "RESET_SPENT",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct FundRequest {
    operation: FundOperation,
    amount: Amount,
    #[serde(default)]
    spent: Option<Amount>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    metadata: Option<Map<String, Value>>,
}

fn check_amount(a: &Amount, unit: Unit, name: &str) -> ApiResult<()> {
    if a.unit != unit {
        return Err(ApiError::new(
            ErrorCode::UnitMismatch,
            format!("{name}.unit must equal the budget unit {}", unit.as_str()),
        )
        .with_details(json!({"field": name, "expected_unit": unit.as_str(), "given_unit": a.unit.as_str()})));
    }
    if a.amount < 0 {
        return Err(ApiError::invalid(format!("{name}.amount must be >= 0")));
    }
    Ok(())
}

impl RolloverPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            RolloverPolicy::None => "NONE",
            RolloverPolicy::CarryForward => "CARRY_FORWARD",
            RolloverPolicy::CapAtAllocated => "CAP_AT_ALLOCATED",
        }
    }
}

/// The stored fields of a period as given: `period_start_ms` and `period_end_ms` (with
/// `period_day`, a monthly period's anchor), `period_recurrence` and its `period_every`
/// (`domain::periods`; both "" when the recurrence is `NONE`, which removes it).
fn period_fields(
    start: &Option<String>,
    end: &Option<String>,
    recurrence: &Option<String>,
) -> ApiResult<Map<String, Value>> {
    let mut f = Map::new();
    let mut at = |name: &str, v: &Option<String>| -> ApiResult<Option<i64>> {
        let Some(s) = v else { return Ok(None) };
        let ms =
            parse_rfc3339_ms(s).ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 date-time")))?;
        f.insert(format!("{name}_ms"), json!(ms.to_string()));
        Ok(Some(ms))
    };
    let (start_ms, end_ms) = (at("period_start", start)?, at("period_end", end)?);
    if let Some(end_ms) = end_ms {
        f.insert("period_day".into(), json!(crate::domain::periods::day_of_month(end_ms).to_string()));
    }
    match recurrence.as_deref() {
        None => {}
        Some("NONE") => {
            f.insert("period_recurrence".into(), json!(""));
            f.insert("period_every".into(), json!(""));
        }
        Some(text) => {
            let every = crate::domain::periods::Recurrence::parse(text)?;
            if let (Some(s), Some(e)) = (start_ms, end_ms) {
                if e <= s {
                    return Err(ApiError::invalid("period_end must be after period_start"));
                }
            }
            f.insert("period_recurrence".into(), json!(text));
            f.insert("period_every".into(), json!(every.code()));
        }
    }
    Ok(f)
}

/// The wire `BudgetLedger` (closed schema: no metadata, no caps; `period_recurrence`, an
/// extension, only on a budget whose period recurs).
pub fn ledger_json(l: &Ledger) -> Value {
    let amount = |amount: i64| json!({"unit": l.unit, "amount": amount});
    let mut b = json!({
        "ledger_id": l.ledger_id,
        "scope": l.scope,
        "scope_path": l.scope,
        "unit": l.unit,
        "allocated": amount(l.allocated),
        "remaining": amount(l.remaining),
        "reserved": amount(l.reserved),
        "spent": amount(l.spent),
        "debt": amount(l.debt),
        "overdraft_limit": amount(l.overdraft_limit),
        "is_over_limit": l.is_over_limit,
        "status": l.status,
        "rollover_policy": l.rollover_policy,
        "created_at": format_rfc3339_ms(l.created_at_ms),
    });
    if let Some(t) = &l.tenant_id {
        b["tenant_id"] = json!(t);
    }
    if let Some(p) = &l.commit_overage_policy {
        b["commit_overage_policy"] = json!(p);
    }
    if let Some(r) = &l.period_recurrence {
        b["period_recurrence"] = json!(r);
    }
    for (name, at) in
        [("period_start", l.period_start_ms), ("period_end", l.period_end_ms), ("updated_at", l.updated_at_ms)]
    {
        if let Some(ms) = at {
            b[name] = json!(format_rfc3339_ms(ms));
        }
    }
    b
}

/// Creates a ledger (shared by the HTTP handler, `--seed-demo` and the tests' setup).
pub async fn create_budget(store: &Store, context: &str, tenant: &str, r: &BudgetCreateRequest) -> ApiResult<Ledger> {
    let scope = validate_scope(&r.scope, tenant)?;
    check_amount(&r.allocated, r.unit, "allocated")?;
    if let Some(o) = &r.overdraft_limit {
        check_amount(o, r.unit, "overdraft_limit")?;
    }
    let mut f = json!({
        "ledger_id": uuid::Uuid::new_v4().to_string(),
        "tenant_id": tenant,
        "scope": scope,
        "unit": r.unit.as_str(),
        "allocated": r.allocated.amount.to_string(),
        "overdraft_limit": r.overdraft_limit.as_ref().map(|o| o.amount).unwrap_or(0).to_string(),
        "rollover_policy": r.rollover_policy.unwrap_or(RolloverPolicy::None).as_str(),
    });
    if let Some(p) = r.commit_overage_policy {
        f["commit_overage_policy"] = json!(p.as_str());
    }
    let period = period_fields(&r.period_start, &r.period_end, &r.period_recurrence)?;
    if r.period_recurrence.as_deref().is_some_and(|t| t != "NONE") && r.period_end.is_none() {
        return Err(ApiError::invalid("period_recurrence needs a period_end (the end of the first period)"));
    }
    f.as_object_mut().expect("object").extend(period.into_iter().filter(|(_, v)| v != ""));
    if let Some(m) = &r.metadata {
        f["metadata"] = json!(Value::Object(m.clone()).to_string());
    }
    if let Some(c) = &r.caps {
        f["caps"] = json!(c.to_string());
    }
    let call = CreateBudget {
        context: context.to_string(),
        fields: f.to_string(),
        ..CreateBudget::on(tenant, &scope, r.unit)
    };
    let ledger = Ledger::decoded(store.run(call).await?.value)?;
    // Tenants with budgets are what the expiry sweep visits.
    register_tenant(store, tenant).await?;
    Ok(ledger)
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::BudgetsWrite)).await?;
    let (r, _) = parse_json::<BudgetCreateRequest>(&req.body)?;
    let tenant = body_tenant(&caller, r.tenant_id.as_deref())?;
    if let Caller::Tenant(k) = &caller {
        k.check_scope(&r.scope.to_ascii_lowercase())?;
    }
    ctx.act_for(&tenant)?;
    let record = create_budget(&app.store, &script_context(ctx, &caller, true, None), &tenant, &r).await?;
    Ok(Answer::json(201, &ledger_json(&record)))
}

/// `scope` and `unit` query parameters naming one ledger.
fn ledger_query(q: &HashMap<String, String>) -> ApiResult<(String, Unit)> {
    let scope = q.get("scope").filter(|s| !s.is_empty()).ok_or_else(|| ApiError::invalid("scope is required"))?;
    let unit = q.get("unit").ok_or_else(|| ApiError::invalid("unit is required"))?;
    let unit = Unit::parse(unit).ok_or_else(|| ApiError::invalid(format!("unit {unit:?} is not a known unit")))?;
    Ok((scope.to_ascii_lowercase(), unit))
}

/// The tenant a scope names (`tenant:<id>` first).
fn scope_tenant(scope: &str) -> ApiResult<String> {
    scope
        .split('/')
        .next()
        .and_then(|s| s.strip_prefix("tenant:"))
        .filter(|t| validate_tenant_id(t).is_ok())
        .map(String::from)
        .ok_or_else(|| ApiError::invalid(format!("scope {scope:?} must start with tenant:<id>")))
}

fn budget_not_found() -> ApiError {
    ApiError::new(ErrorCode::BudgetNotFound, crate::domain::messages::BUDGET_MISSING)
}

pub async fn lookup(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::BudgetsRead)).await?;
    let (scope, unit) = ledger_query(&super::parse_query(&req.query)?)?;
    let tenant = scope_tenant(&scope)?;
    if matches!(caller, Caller::Admin) {
        ctx.act_for(&tenant)?;
    }
    if let Caller::Tenant(k) = &caller {
        k.check_scope(&scope)?;
        if k.tenant != tenant {
            return Err(budget_not_found());
        }
    }
    let ledger = ops::ledgers::read(&app.store, &tenant, &scope, unit).await?.ok_or_else(budget_not_found)?;
    Ok(Answer::json(200, &ledger_json(&ledger)))
}

/// The ledger selection of listBudgets (query) and bulkActionBudgets (body): every given
/// property must hold.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetFilter {
    #[serde(default)]
    pub tenant_id: Option<String>,
    #[serde(default)]
    pub scope_prefix: Option<String>,
    #[serde(default)]
    pub unit: Option<Unit>,
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub over_limit: Option<bool>,
    #[serde(default)]
    pub has_debt: Option<bool>,
    #[serde(default)]
    pub utilization_min: Option<f64>,
    #[serde(default)]
    pub utilization_max: Option<f64>,
    #[serde(default)]
    pub search: Option<String>,
}

impl BudgetFilter {
    pub fn from_query(q: &ListQuery) -> ApiResult<BudgetFilter> {
        let unit = q.get("unit").map(|u| Unit::parse(u).ok_or_else(|| ApiError::invalid("unit is not a known unit")));
        let ratio = |name: &str| {
            q.get(name)
                .map(|v| {
                    v.parse::<f64>().map_err(|_| ApiError::invalid(format!("{name} must be a number from 0 to 1")))
                })
                .transpose()
        };
        let f = BudgetFilter {
            tenant_id: q.get("tenant_id").map(String::from),
            scope_prefix: q.get("scope_prefix").map(String::from),
            unit: unit.transpose()?,
            status: q.get("status").map(String::from),
            over_limit: query_bool(q.get("over_limit"), "over_limit")?,
            has_debt: query_bool(q.get("has_debt"), "has_debt")?,
            utilization_min: ratio("utilization_min")?,
            utilization_max: ratio("utilization_max")?,
            search: q.get("search").map(String::from),
        };
        f.check()?;
        Ok(f)
    }

    pub fn check(&self) -> ApiResult<()> {
        check_status(self.status.as_deref(), &["ACTIVE", "FROZEN", "CLOSED"])?;
        check_search(self.search.as_deref())?;
        for (name, v) in [("utilization_min", self.utilization_min), ("utilization_max", self.utilization_max)] {
            if v.is_some_and(|x| !(0.0..=1.0).contains(&x)) {
                return Err(ApiError::invalid(format!("{name} must be a number from 0 to 1")));
            }
        }
        if let (Some(a), Some(b)) = (self.utilization_min, self.utilization_max) {
            if a > b {
                return Err(ApiError::invalid("utilization_min must not exceed utilization_max"));
            }
        }
        Ok(())
    }

    pub fn matches(&self, tenant: &str, l: &Ledger) -> bool {
        let u = l.utilization();
        self.scope_prefix.as_ref().is_none_or(|p| l.scope.starts_with(p.to_ascii_lowercase().as_str()))
            && self.unit.is_none_or(|x| l.unit == x.as_str())
            && self.status.as_ref().is_none_or(|s| l.status == *s)
            && self.over_limit.is_none_or(|o| l.is_over_limit == o)
            && self.has_debt.is_none_or(|h| (l.debt > 0) == h)
            && self.utilization_min.is_none_or(|m| u >= m)
            && self.utilization_max.is_none_or(|m| u <= m)
            && search_matches(self.search.as_deref(), &[tenant, &l.scope])
    }
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::BudgetsRead)).await?;
    let q = ListQuery::parse(
        req,
        &["utilization", "tenant_id", "scope", "unit", "status", "commit_overage_policy", "debt"],
    )?;
    let filter = BudgetFilter::from_query(&q)?;
    let tenants = match (&caller, q.get("tenant_id")) {
        (Caller::Tenant(k), _) => vec![k.tenant.clone()],
        (Caller::Admin, Some(t)) => {
            ctx.act_for(t)?;
            vec![t.to_string()]
        }
        (Caller::Admin, None) => ops::tenants::registry(&app.store).await?,
    };
    let mut rows = vec![];
    for tenant in tenants {
        for l in ops::ledgers::of_tenant(&app.store, &tenant).await? {
            let u = l.utilization();
            let admitted = match &caller {
                Caller::Tenant(k) => crate::domain::scope_admitted(&k.scope_filter(), &l.scope),
                Caller::Admin => true,
            };
            if !admitted || !filter.matches(&tenant, &l) {
                continue;
            }
            let key = match q.sort_by.as_str() {
                "tenant_id" => tenant.clone(),
                "scope" => l.scope.clone(),
                "unit" => l.unit.clone(),
                "status" => l.status.clone(),
                "commit_overage_policy" => l.commit_overage_policy.clone().unwrap_or_default(),
                "debt" => sort_int(l.debt),
                _ => format!("{u:030.12}"),
            };
            let id = format!("{tenant}|{}|{}", l.scope, l.unit);
            rows.push((key, id, ledger_json(&l)));
        }
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("ledgers", items, next)))
}

/// The admin-plane `GET /v1/balances`: the key's tenant's ledgers as `BudgetLedger` items.
pub async fn balances(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let key = tenant_auth(app, ctx, req, Permission::BalancesRead).await?;
    let q = ListQuery::parse(req, &["scope"])?;
    if q.get("tenant_id").is_some_and(|t| t != key.tenant) {
        return Err(ApiError::forbidden("tenant_id does not match the tenant of the API key"));
    }
    let prefix = q.get("scope_prefix").map(str::to_ascii_lowercase);
    if let Some(p) = &prefix {
        key.check_scope(p)?;
    }
    let unit = q.get("unit").map(|u| Unit::parse(u).ok_or_else(|| ApiError::invalid("unit is not a known unit")));
    let unit = unit.transpose()?;
    let mut rows = vec![];
    for l in ops::ledgers::of_tenant(&app.store, &key.tenant).await? {
        if prefix.as_ref().is_some_and(|p| !l.scope.starts_with(p.as_str()))
            || unit.is_some_and(|u| l.unit != u.as_str())
            || !crate::domain::scope_admitted(&key.scope_filter(), &l.scope)
        {
            continue;
        }
        let id = format!("{}|{}", l.scope, l.unit);
        rows.push((id.clone(), id, ledger_json(&l)));
    }
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("balances", items, next)))
}

/// Runs `budget_update.lua` on the ledger named by the query.
async fn change(app: &App, ctx: &mut Ctx, req: &ApiRequest, mode: &str, arg: String) -> ApiResult<Answer> {
    let (scope, unit) = ledger_query(&super::parse_query(&req.query)?)?;
    let tenant = scope_tenant(&scope)?;
    ctx.act_for(&tenant)?;
    let call = UpdateBudget {
        context: script_context(ctx, &Caller::Admin, false, None),
        mode: mode.to_string(),
        change: arg,
        ..UpdateBudget::on(&tenant, &scope, unit)
    };
    Ok(Answer::json(200, &ledger_json(&Ledger::decoded(app.store.run(call).await?.value)?)))
}

pub async fn update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (_, unit) = ledger_query(&super::parse_query(&req.query)?)?;
    let (r, _) = parse_json::<BudgetUpdateRequest>(&req.body)?;
    let mut patch = Map::new();
    if let Some(o) = &r.overdraft_limit {
        check_amount(o, unit, "overdraft_limit")?;
        patch.insert("overdraft_limit".into(), json!(o.amount.to_string()));
    }
    if let Some(p) = r.commit_overage_policy {
        patch.insert("commit_overage_policy".into(), json!(p.as_str()));
    }
    if let Some(m) = &r.metadata {
        patch.insert("metadata".into(), json!(Value::Object(m.clone()).to_string()));
    }
    if let Some(p) = r.rollover_policy {
        patch.insert("rollover_policy".into(), json!(p.as_str()));
    }
    patch.extend(period_fields(&r.period_start, &r.period_end, &r.period_recurrence)?);
    change(app, ctx, req, "update", Value::Object(patch).to_string()).await
}

pub async fn freeze(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    status_change(app, ctx, req, "freeze").await
}

pub async fn unfreeze(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    status_change(app, ctx, req, "unfreeze").await
}

async fn status_change(app: &App, ctx: &mut Ctx, req: &ApiRequest, mode: &str) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let r = if req.body.iter().all(u8::is_ascii_whitespace) {
        StatusChangeRequest::default()
    } else {
        parse_json::<StatusChangeRequest>(&req.body)?.0
    };
    let reason = r.reason.unwrap_or_default();
    if reason.chars().count() > 512 {
        return Err(ApiError::invalid("reason must be at most 512 characters"));
    }
    change(app, ctx, req, mode, reason).await
}

pub async fn fund(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::BudgetsWrite)).await?;
    let query = super::parse_query(&req.query)?;
    let (scope, unit) = ledger_query(&query)?;
    let (r, raw) = parse_json::<FundRequest>(&req.body)?;
    check_amount(&r.amount, unit, "amount")?;
    if let Some(s) = &r.spent {
        check_amount(s, unit, "spent")?;
    }
    if r.reason.as_ref().is_some_and(|s| s.chars().count() > 512) {
        return Err(ApiError::invalid("reason must be at most 512 characters"));
    }
    if r.idempotency_key.as_ref().is_some_and(|k| k.is_empty() || k.chars().count() > 256) {
        return Err(ApiError::invalid("idempotency_key must be 1 to 256 characters"));
    }
    let tenant = match &caller {
        Caller::Admin => query
            .get("tenant_id")
            .filter(|t| !t.is_empty())
            .cloned()
            .ok_or_else(|| ApiError::invalid("tenant_id is required with the admin key"))?,
        Caller::Tenant(k) => {
            k.check_not_suspended()?;
            k.check_scope(&scope)?;
            k.tenant.clone()
        }
    };
    if scope_tenant(&scope)? != tenant {
        return Err(budget_not_found());
    }
    ctx.act_for(&tenant)?;
    let spent = match (r.operation, &r.spent) {
        (FundOperation::ResetSpent, Some(s)) => s.amount.to_string(),
        _ => String::new(),
    };
    let call = FundBudget {
        context: script_context(ctx, &caller, true, None),
        operation: r.operation.as_str().to_string(),
        amount: r.amount.amount.to_string(),
        spent,
        reason: r.reason.clone().unwrap_or_default(),
        payload_hash: payload_hash(&raw, &[]),
        ..FundBudget::on(&tenant, &scope, unit, r.idempotency_key.as_deref())
    };
    let reply = app.store.run(call).await?;
    let v = reply.value;
    let amt = |s: &str| -> ApiResult<Value> {
        let amount: i64 =
            s.parse().map_err(|_| ApiError::fault(format!("malformed amount {s:?} in a funding answer")))?;
        Ok(json!({"unit": unit.as_str(), "amount": amount}))
    };
    Ok(Answer::json(
        200,
        &json!({
            "operation": v.operation,
            "previous_allocated": amt(&v.previous_allocated)?, "new_allocated": amt(&v.new_allocated)?,
            "previous_remaining": amt(&v.previous_remaining)?, "new_remaining": amt(&v.new_remaining)?,
            "previous_debt": amt(&v.previous_debt)?, "new_debt": amt(&v.new_debt)?,
            "previous_spent": amt(&v.previous_spent)?, "new_spent": amt(&v.new_spent)?,
            "timestamp": format_rfc3339_ms(v.timestamp_ms.parse().unwrap_or(0)),
        }),
    )
    .replayed(reply.replay))
}
