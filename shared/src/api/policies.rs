//! Policies (createPolicy, listPolicies, updatePolicy): admin key on behalf of a tenant, or a
//! tenant key with `policies:*` for its own. What they change at run time is applied by the
//! runtime scripts (`policy_settings` in `lua/lib/policies.lua`).

use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::admin::*;
use super::{query_bool, Answer, ApiRequest, App, Ctx};
use crate::domain::action_kinds::{is_kind_shaped, is_known, RISK_CLASSES};
use crate::domain::policies::validate_pattern;
use crate::domain::{parse_rfc3339_ms, Permission};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::model::{parse_json, OveragePolicy};
use crate::ops::policies::{
    self, ActionQuota, BudgetTemplate, Caps, Policy, RateLimits, RiskClassQuota, TtlOverride, QUOTA_WINDOWS,
};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyCreateRequest {
    #[serde(default)]
    tenant_id: Option<String>,
    name: String,
    #[serde(default)]
    description: Option<String>,
    scope_pattern: String,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default)]
    caps: Option<Caps>,
    #[serde(default)]
    commit_overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    reservation_ttl_override: Option<TtlOverride>,
    #[serde(default)]
    rate_limits: Option<RateLimits>,
    #[serde(default)]
    effective_from: Option<String>,
    #[serde(default)]
    effective_until: Option<String>,
    #[serde(default)]
    action_quotas: Option<Vec<ActionQuota>>,
    #[serde(default)]
    risk_class_quotas: Option<Vec<RiskClassQuota>>,
    #[serde(default)]
    allowed_action_kinds: Option<Vec<String>>,
    #[serde(default)]
    denied_action_kinds: Option<Vec<String>>,
    #[serde(default)]
    counting: Option<Counting>,
    #[serde(default)]
    budget_template: Option<BudgetTemplate>,
}

/// Where a policy's quotas and rate limits count (an extension; see `Policy::counting`).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Counting {
    Anchor,
    ScopePath,
}

impl Counting {
    fn stored(c: Option<Counting>) -> Option<String> {
        c.map(|c| match c {
            Counting::Anchor => "anchor".to_string(),
            Counting::ScopePath => "scope_path".to_string(),
        })
    }
}

/// A field a PATCH may set, clear (`null`), or leave alone (absent).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
    Option::<T>::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyUpdateRequest {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    description: Option<Option<String>>,
    #[serde(default)]
    priority: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    caps: Option<Option<Caps>>,
    #[serde(default, deserialize_with = "nullable")]
    commit_overage_policy: Option<Option<OveragePolicy>>,
    #[serde(default, deserialize_with = "nullable")]
    reservation_ttl_override: Option<Option<TtlOverride>>,
    #[serde(default, deserialize_with = "nullable")]
    rate_limits: Option<Option<RateLimits>>,
    #[serde(default, deserialize_with = "nullable")]
    effective_from: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    effective_until: Option<Option<String>>,
    #[serde(default)]
    status: Option<PolicyStatus>,
    #[serde(default)]
    action_quotas: Option<Vec<ActionQuota>>,
    #[serde(default)]
    risk_class_quotas: Option<Vec<RiskClassQuota>>,
    #[serde(default)]
    allowed_action_kinds: Option<Vec<String>>,
    #[serde(default)]
    denied_action_kinds: Option<Vec<String>>,
    #[serde(default, deserialize_with = "nullable")]
    counting: Option<Option<Counting>>,
    #[serde(default, deserialize_with = "nullable")]
    budget_template: Option<Option<BudgetTemplate>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
enum PolicyStatus {
    Active,
    Disabled,
}

fn time(name: &str, v: Option<&String>) -> ApiResult<Option<i64>> {
    v.map(|s| parse_rfc3339_ms(s).ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 date-time"))))
        .transpose()
}

/// The v0.1.26 action-governance fields of a policy, on the resulting state of a write:
/// quotas name known kinds (built-in or declared custom) and risk classes, within the spec's
/// bounds; the lists hold kind-shaped strings (a `custom.*` one declared); allow and deny are
/// mutually exclusive. Hosts and domains are stored lower-case (matching ignores case).
fn check_action_rules(app: &App, p: &mut Policy) -> ApiResult<()> {
    let bad = |m: String| Err(ApiError::invalid(m));
    let custom = app.config.custom_kinds();
    if p.action_quotas.len() > 50 || p.risk_class_quotas.len() > 20 {
        return bad("a policy holds at most 50 action_quotas and 20 risk_class_quotas".into());
    }
    if !p.allowed_action_kinds.is_empty() && !p.denied_action_kinds.is_empty() {
        return bad("allowed_action_kinds and denied_action_kinds are mutually exclusive (send [] to clear one)".into());
    }
    for (name, list) in
        [("allowed_action_kinds", &p.allowed_action_kinds), ("denied_action_kinds", &p.denied_action_kinds)]
    {
        if list.len() > 200 {
            return bad(format!("{name} holds at most 200 kinds"));
        }
        if let Some(k) = list.iter().find(|k| !is_kind_shaped(k) || k.starts_with("custom.") && !is_known(k, custom)) {
            return bad(format!("{name}: {k:?} is not an exact action kind (custom.* kinds must be declared)"));
        }
    }
    let common = |what: &str, max: i64, window: &str, ttl: Option<i64>, th: Option<f64>| -> ApiResult<()> {
        if !(1..=100_000).contains(&max) {
            return bad(format!("{what}: max_calls must be 1 to 100000"));
        }
        if !QUOTA_WINDOWS.contains(&window) {
            return bad(format!("{what}: window must be one of {}", QUOTA_WINDOWS.join(", ")));
        }
        match ttl {
            Some(_) if window != "per_run" => {
                return bad(format!("{what}: per_run_counter_ttl_ms is only for window per_run"))
            }
            Some(t) if !(60_000..=604_800_000).contains(&t) => {
                return bad(format!("{what}: per_run_counter_ttl_ms must be 60000 to 604800000"))
            }
            _ => {}
        }
        if th.is_some_and(|t| !(0.01..=0.99).contains(&t)) {
            return bad(format!("{what}: threshold_pct must be 0.01 to 0.99"));
        }
        Ok(())
    };
    for q in &mut p.action_quotas {
        let what = format!("action_quotas[{}]", q.action_kind);
        if !is_known(&q.action_kind, custom) {
            return bad(format!("{what}: not a registered or declared action kind"));
        }
        common(&what, q.max_calls, &q.window, q.per_run_counter_ttl_ms, q.threshold_pct)?;
        let lists = [(&mut q.host_allowlist, 253, true), (&mut q.recipient_domain_allowlist, 253, true)];
        for (list, max, lower) in lists.into_iter().chain([(&mut q.resource_type_allowlist, 128, false)]) {
            for v in list.iter_mut().flatten() {
                if v.is_empty() || v.chars().count() > max {
                    return bad(format!("{what}: allowlist entries must be 1 to {max} characters"));
                }
                if lower {
                    *v = v.to_ascii_lowercase();
                }
            }
        }
    }
    for q in &p.risk_class_quotas {
        let what = format!("risk_class_quotas[{}]", q.risk_class);
        if !RISK_CLASSES.contains(&q.risk_class.as_str()) {
            return bad(format!("{what}: risk_class must be one of {}", RISK_CLASSES.join(", ")));
        }
        common(&what, q.max_calls, &q.window, q.per_run_counter_ttl_ms, q.threshold_pct)?;
    }
    Ok(())
}

/// Every bound of the spec's Policy, on the resulting state of a write.
fn check(app: &App, p: &mut Policy) -> ApiResult<()> {
    check_action_rules(app, p)?;
    let bad = |m: &str| Err(ApiError::invalid(m.to_string()));
    if p.name.trim().is_empty() || p.name.chars().count() > 256 {
        return bad("name must be 1 to 256 characters");
    }
    if p.description.as_ref().is_some_and(|d| d.chars().count() > 1024) {
        return bad("description must be at most 1024 characters");
    }
    if p.priority < 0 {
        return bad("priority must be >= 0");
    }
    if let Some(c) = &p.caps {
        let caps: Caps = serde_json::from_value(c.clone()).map_err(|e| ApiError::invalid(format!("caps: {e}")))?;
        let lists = caps.tool_allowlist.iter().chain(caps.tool_denylist.iter()).flatten();
        if lists.clone().any(|t| t.chars().count() > 256) {
            return bad("caps tool names must be at most 256 characters");
        }
    }
    if let Some(t) = &p.reservation_ttl_override {
        let in_range = |v: Option<i64>| v.is_none_or(|v| (1000..=86_400_000).contains(&v));
        if !in_range(t.default_ttl_ms) || !in_range(t.max_ttl_ms) {
            return bad("reservation_ttl_override TTLs must be 1000 to 86400000 ms");
        }
        if t.max_extensions.is_some_and(|x| x < 0) {
            return bad("reservation_ttl_override.max_extensions must be >= 0");
        }
        if let (Some(d), Some(m)) = (t.default_ttl_ms, t.max_ttl_ms) {
            if d > m {
                return bad("reservation_ttl_override.default_ttl_ms must not exceed max_ttl_ms");
            }
        }
    }
    if let Some(r) = &p.rate_limits {
        let counts = [r.max_reservations_per_minute, r.max_commits_per_minute, r.max_active_reservations];
        let amounts = [&r.max_amount_per_minute, &r.max_amount_per_hour];
        if counts.iter().flatten().any(|n| *n < 1) || amounts.iter().copied().flatten().any(|a| a.amount < 1) {
            return bad("rate_limits values must be >= 1");
        }
    }
    if let Some(t) = &p.budget_template {
        check_template(t)?;
    }
    if let (Some(from), Some(until)) = (p.effective_from_ms, p.effective_until_ms) {
        if from >= until {
            return bad("effective_from must be before effective_until");
        }
    }
    Ok(())
}

/// A budget template makes ledgers as createBudget would: the same bounds.
fn check_template(t: &BudgetTemplate) -> ApiResult<()> {
    let bad = |m: String| Err(ApiError::invalid(format!("budget_template: {m}")));
    let amounts = [("allocated", Some(&t.allocated)), ("overdraft_limit", t.overdraft_limit.as_ref())];
    for (name, a) in amounts {
        match a {
            Some(a) if a.unit != t.unit => {
                return bad(format!("{name}.unit must be the template's unit {}", t.unit.as_str()))
            }
            Some(a) if a.amount < 0 => return bad(format!("{name} must be >= 0")),
            _ => {}
        }
    }
    if let Some(o) = &t.commit_overage_policy {
        if OveragePolicy::parse(o).is_none() {
            return bad(format!(
                "commit_overage_policy {o:?} is not REJECT, ALLOW_IF_AVAILABLE or ALLOW_WITH_OVERDRAFT"
            ));
        }
    }
    if let Some(r) = &t.rollover_policy {
        if !["NONE", "CARRY_FORWARD", "CAP_AT_ALLOCATED"].contains(&r.as_str()) {
            return bad(format!("rollover_policy {r:?} is not NONE, CARRY_FORWARD or CAP_AT_ALLOCATED"));
        }
    }
    if let Some(text) = t.period_recurrence.as_deref().filter(|t| *t != "NONE") {
        crate::domain::periods::Recurrence::parse(text)?;
    }
    if t.max_instances.is_some_and(|n| !(1..=1_000_000).contains(&n)) {
        return bad("max_instances must be 1 to 1000000".into());
    }
    Ok(())
}

fn caps_value(c: Option<Caps>) -> Option<Value> {
    c.map(|c| serde_json::to_value(c).expect("caps serialize"))
}

/// The fields of a policy that differ between two states (wire names).
fn changed_fields(before: &Policy, after: &Policy) -> Vec<&'static str> {
    let (b, a) = (before.wire(), after.wire());
    [
        "name",
        "description",
        "scope_pattern",
        "priority",
        "caps",
        "commit_overage_policy",
        "reservation_ttl_override",
        "rate_limits",
        "status",
        "effective_from",
        "effective_until",
        "action_quotas",
        "risk_class_quotas",
        "allowed_action_kinds",
        "denied_action_kinds",
        "counting",
        "budget_template",
    ]
    .into_iter()
    .filter(|f| b.get(f) != a.get(f))
    .collect()
}

async fn write(
    app: &App,
    ctx: &Ctx,
    caller: &Caller,
    tenant: &str,
    p: &Policy,
    expected: &str,
    changed: &[&str],
) -> ApiResult<(Policy, String)> {
    let context = script_context(ctx, caller, matches!(caller, Caller::Admin), None);
    crate::ops::policies::write(&app.store, tenant, context, p, expected, changed).await
}

/// `POST /v1/admin/policies` (createPolicy).
pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::PoliciesWrite)).await?;
    let (r, _) = parse_json::<PolicyCreateRequest>(&req.body)?;
    let tenant = body_tenant(&caller, r.tenant_id.as_deref())?;
    ctx.act_for(&tenant)?;
    let pattern = validate_pattern(&r.scope_pattern, &tenant).map_err(ApiError::invalid)?;
    if let Caller::Tenant(k) = &caller {
        k.check_scope(&pattern)?;
    }
    let p = Policy {
        policy_id: format!("pol_{:012x}{}", crate::domain::now_ms(), &uuid::Uuid::new_v4().simple().to_string()[..8]),
        name: r.name.trim().to_string(),
        description: r.description,
        scope_pattern: pattern,
        priority: r.priority.unwrap_or(0),
        caps: caps_value(r.caps),
        commit_overage_policy: r.commit_overage_policy.map(|o| o.as_str().to_string()),
        reservation_ttl_override: r.reservation_ttl_override,
        rate_limits: r.rate_limits,
        status: "ACTIVE".into(),
        effective_from_ms: time("effective_from", r.effective_from.as_ref())?,
        effective_until_ms: time("effective_until", r.effective_until.as_ref())?,
        action_quotas: r.action_quotas.unwrap_or_default(),
        risk_class_quotas: r.risk_class_quotas.unwrap_or_default(),
        allowed_action_kinds: r.allowed_action_kinds.unwrap_or_default(),
        denied_action_kinds: r.denied_action_kinds.unwrap_or_default(),
        counting: Counting::stored(r.counting),
        budget_template: r.budget_template,
        ..Policy::default()
    };
    let mut p = p;
    check(app, &mut p)?;
    let changed = changed_fields(&Policy::default(), &p);
    policies::publish_owner(&app.store, &p.policy_id, &tenant).await?;
    let (stored, _) = write(app, ctx, &caller, &tenant, &p, "", &changed).await?;
    Ok(Answer::json(201, &stored.wire()))
}

/// `GET /v1/admin/policies` (listPolicies): priority order (highest first), then newest.
pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::PoliciesRead)).await?;
    let q = ListQuery::parse(req, &["priority"])?;
    let tenant = match &caller {
        Caller::Admin => q
            .get("tenant_id")
            .map(String::from)
            .ok_or_else(|| ApiError::invalid("tenant_id is required with the admin key"))?,
        Caller::Tenant(k) => k.tenant.clone(),
    };
    ctx.act_for(&tenant)?;
    let status = match q.get("status") {
        None => None,
        Some(s @ ("ACTIVE" | "DISABLED")) => Some(s.to_string()),
        Some(s) => return Err(ApiError::invalid(format!("status {s:?} is not ACTIVE or DISABLED"))),
    };
    let pattern = q.get("scope_pattern").map(str::to_ascii_lowercase);
    let has_quotas = query_bool(q.get("has_action_quotas"), "has_action_quotas")?;
    let kind = q.get("references_action_kind");
    let rows = policies::all(&app.store, &tenant)
        .await?
        .into_iter()
        .filter(|p| status.as_ref().is_none_or(|s| *s == p.status))
        .filter(|p| pattern.as_ref().is_none_or(|x| *x == p.scope_pattern.to_ascii_lowercase()))
        .filter(|p| has_quotas.is_none_or(|h| h != (p.action_quotas.is_empty() && p.risk_class_quotas.is_empty())))
        .filter(|p| kind.is_none_or(|k| p.references_kind(k)))
        .filter(|p| match &caller {
            Caller::Tenant(k) => k.check_scope(&p.scope_pattern).is_ok(),
            Caller::Admin => true,
        })
        .filter(|p| q.matches_search(&[&p.name, &p.scope_pattern, p.description.as_deref().unwrap_or("")]))
        .map(|p| (sort_int(p.priority), p.policy_id.clone(), p.wire()))
        .collect();
    let (items, next) = q.page(rows);
    Ok(Answer::json(200, &list_body("policies", items, next)))
}

/// `PATCH /v1/admin/policies/{policy_id}` (updatePolicy): the resulting state is checked
/// whole; a write that raced another is read and applied again.
pub async fn update(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = dual_auth(app, ctx, req, Some(Permission::PoliciesWrite)).await?;
    let id = req.param("policy_id");
    let (r, _) = parse_json::<PolicyUpdateRequest>(&req.body)?;
    let not_found = || ApiError::not_found("Policy not found");
    let tenant = policies::owner(&app.store, id).await?.ok_or_else(not_found)?;
    if let Caller::Tenant(k) = &caller {
        if k.tenant != tenant {
            return Err(not_found());
        }
        k.check_not_suspended()?;
    }
    ctx.act_for(&tenant)?;
    for _ in 0..3 {
        let current = policies::read(&app.store, &tenant, id).await?.ok_or_else(not_found)?;
        if let Caller::Tenant(k) = &caller {
            k.check_scope(&current.scope_pattern)?;
        }
        let mut p = current.clone();
        if let Some(n) = &r.name {
            p.name = n.trim().to_string();
        }
        if let Some(d) = &r.description {
            p.description = d.clone();
        }
        if let Some(x) = r.priority {
            p.priority = x;
        }
        if let Some(c) = &r.caps {
            p.caps = caps_value(c.clone());
        }
        if let Some(o) = r.commit_overage_policy {
            p.commit_overage_policy = o.map(|o| o.as_str().to_string());
        }
        if let Some(t) = &r.reservation_ttl_override {
            p.reservation_ttl_override = t.clone();
        }
        if let Some(l) = &r.rate_limits {
            p.rate_limits = l.clone();
        }
        if let Some(f) = &r.effective_from {
            p.effective_from_ms = time("effective_from", f.as_ref())?;
        }
        if let Some(u) = &r.effective_until {
            p.effective_until_ms = time("effective_until", u.as_ref())?;
        }
        if let Some(s) = r.status {
            p.status = match s {
                PolicyStatus::Active => "ACTIVE",
                PolicyStatus::Disabled => "DISABLED",
            }
            .into();
        }
        for (field, value) in [
            (&mut p.allowed_action_kinds, &r.allowed_action_kinds),
            (&mut p.denied_action_kinds, &r.denied_action_kinds),
        ] {
            if let Some(v) = value {
                *field = v.clone();
            }
        }
        if let Some(q) = &r.action_quotas {
            p.action_quotas = q.clone();
        }
        if let Some(q) = &r.risk_class_quotas {
            p.risk_class_quotas = q.clone();
        }
        if let Some(c) = r.counting {
            p.counting = Counting::stored(c);
        }
        if let Some(t) = &r.budget_template {
            p.budget_template = t.clone();
        }
        check(app, &mut p)?;
        let changed = changed_fields(&current, &p);
        if changed.is_empty() {
            return Ok(Answer::json(200, &current.wire()));
        }
        let (stored, status) =
            write(app, ctx, &caller, &tenant, &p, &current.updated_at_ms.to_string(), &changed).await?;
        if status != "CONFLICT" {
            return Ok(Answer::json(200, &stored.wire()));
        }
    }
    Err(ApiError::new(ErrorCode::InternalError, "The policy kept changing under this update; retry"))
}
