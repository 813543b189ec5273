//! Reservation lifecycle handlers: authenticate, parse, one script call (`ops::reservations`),
//! answer.

use serde_json::{json, Value};

use super::auth::{unauthorized, Caller, TenantKey};
use super::evidence::{self, attested_request, mirror};
use super::{Answer, ApiRequest, App, Ctx};
use crate::domain::action_kinds::kind_info;
use crate::domain::{derive_scopes, messages, payload_hash, rules, Permission};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::evidence::project;
use crate::ids::ReservationId;
use crate::keys::budget_codes;
use crate::model::*;
use crate::ops::auth::Authenticate;
use crate::ops::evidence::Slot;
use crate::ops::maintenance::{expire_reservations, record_ttl};
use crate::ops::reservations::*;
use crate::ops::LedgerState;

const IDEMPOTENCY_HEADER: &str = "x-idempotency-key";

/// The header key, when present, must equal the body key exactly.
fn check_idempotency_header(req: &ApiRequest, body_key: &str) -> ApiResult<()> {
    match req.headers.get(IDEMPOTENCY_HEADER) {
        Some(h) if h.as_bytes() != body_key.as_bytes() => {
            Err(ApiError::invalid("X-Idempotency-Key header does not match idempotency_key in request body"))
        }
        _ => Ok(()),
    }
}

/// A protocol request, after authentication (which names the tenant): its typed body and its
/// JSON. Where the tenant gets receipts, an integer beyond 2^53 is refused (400): a receipt
/// could not hold it exactly.
async fn parse<T: serde::de::DeserializeOwned + Validate>(
    app: &App,
    ctx: &Ctx,
    req: &ApiRequest,
) -> ApiResult<(T, Value)> {
    let parsed = parse_body::<T>(&req.body)?;
    check_idempotency_header(req, parsed.0.idempotency_key())?;
    // (a deployment without receipts never walks the body for it)
    let Some(tenant) = ctx.tenant.as_deref().filter(|_| app.config.evidence.enabled()) else { return Ok(parsed) };
    let Some(path) = crate::model::unsignable_integer(&parsed.1) else { return Ok(parsed) };
    if evidence::enabled_for(app, tenant).await? {
        return Err(ApiError::invalid(format!(
            "{path} is beyond 2^53 ({}); signed receipts are on for this tenant and cannot hold it exactly",
            crate::model::MAX_SIGNABLE_INTEGER
        )));
    }
    Ok(parsed)
}

/// Authenticates before the body is parsed (401 precedes 400) and records the tenant.
async fn authenticate(app: &App, ctx: &mut Ctx, req: &ApiRequest, admin_allowed: bool) -> ApiResult<Caller> {
    let caller = app.authenticate(ctx, req, admin_allowed).await?;
    if let Caller::Tenant(c) = &caller {
        ctx.act_for(&c.tenant)?;
    }
    Ok(caller)
}

async fn tenant_key(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<TenantKey> {
    match authenticate(app, ctx, req, false).await? {
        Caller::Tenant(c) => Ok(c),
        Caller::Admin => Err(super::auth::rejected(unauthorized(), "API_KEY_REQUIRED")),
    }
}

fn json_or_empty(v: &Option<impl serde::Serialize>) -> String {
    v.as_ref().map(|v| serde_json::to_string(v).expect("serializable")).unwrap_or_default()
}

/// How long a finished reservation's keys live.
fn record_ttl_ms(app: &App) -> String {
    record_ttl(app.config.retention).as_millis().to_string()
}

fn int(s: &str) -> ApiResult<i64> {
    s.parse().map_err(|_| ApiError::fault(format!("malformed amount {s:?} in the budget store")))
}

/// The caps a script answered (a policy's or a budget's, as stored): none, or well formed. A
/// malformed one is a fault (logged, 500), never silently dropped from an ALLOW_WITH_CAPS.
fn stored_caps<T: serde::de::DeserializeOwned>(caps: Option<&str>) -> ApiResult<Option<T>> {
    caps.filter(|c| !c.is_empty())
        .map(|c| {
            serde_json::from_str(c).map_err(|e| ApiError::fault(format!("malformed caps {c:?} in the store: {e}")))
        })
        .transpose()
}

/// `subject.tenant`, when given, must be the key's tenant (exact match): else 403.
fn check_subject_tenant(subject: &Subject, caller: &TenantKey) -> ApiResult<()> {
    match &subject.tenant {
        Some(t) if *t != caller.tenant => {
            Err(ApiError::forbidden("subject.tenant does not match the tenant of the API key"))
        }
        _ => Ok(()),
    }
}

/// The budgeted scopes of a subject in a unit: the derived `scopes` (their ledger `codes` in
/// that unit) whose codes are among `answered` (those of a reservation id, or of an
/// evaluation), in canonical order.
fn budgeted_scopes(scopes: &[String], codes: &[String], answered: &str) -> Vec<String> {
    scopes
        .iter()
        .zip(codes)
        .filter(|(_, code)| answered.as_bytes().chunks(8).any(|c| c == code.as_bytes()))
        .map(|(s, _)| s.clone())
        .collect()
}

/// The `Balance`s of an answer: the budgeted scopes with their ledger states, in order.
fn balances(scopes: &[String], unit: Unit, states: &[LedgerState]) -> ApiResult<Vec<Balance>> {
    if scopes.len() != states.len() {
        return Err(ApiError::fault(format!("{} ledger states for {} budgeted scopes", states.len(), scopes.len())));
    }
    Ok(scopes.iter().zip(states).map(|(scope, state)| state.balance(scope, unit)).collect())
}

/// `max(0, expires_at - now)` while the reservation is ACTIVE, else 0 (recomputed on replays).
fn remaining_ttl(status: &str, now_ms: i64, expires_at_ms: i64) -> i64 {
    if status == "ACTIVE" {
        (expires_at_ms - now_ms).max(0)
    } else {
        0
    }
}

/// The request context scripts stamp on the events they write (a flat object of strings,
/// written directly: `json::string_object`).
fn event_context(ctx: &Ctx, caller: Option<&TenantKey>, tenant: &str) -> String {
    crate::json::string_object(&[
        ("request_id", &ctx.request_id),
        ("trace_id", &ctx.trace.trace_id),
        ("actor", if caller.is_some() { "api_key" } else { "admin_on_behalf_of" }),
        ("key_id", caller.map(|c| c.key_id.as_str()).unwrap_or("")),
        ("tenant", tenant),
        ("trace_flags", ctx.trace.inbound_flags.as_deref().unwrap_or("")),
    ])
}

/// The v0.1.26 side of a request (`A.governance` of the reserve and evaluate scripts, decoded
/// there only where a tenant's policies or observe mode need it): the action's kind and risk
/// class, the policy keys its kind declares, the run id, and whether an observed ALLOW is
/// written (sampling). The requested observe mode travels apart (`A.observe`).
struct Governance {
    json: String,
    /// The replacement of a deprecated kind (`X-Cycles-Deprecated-Kind`).
    replacement: Option<String>,
}

fn governance(app: &App, action: &Action, subject: &Subject) -> ApiResult<Governance> {
    let info = kind_info(&action.kind, app.config.custom_kinds()).map_err(ApiError::invalid)?;
    let keys = action.policy_keys.as_ref().map(|k| serde_json::to_value(k).expect("serializable"));
    let rate = app.config.observe_allow_sample_rate;
    let sampled = rate >= 1.0 || (uuid::Uuid::new_v4().as_u128() % 1_000_000) as f64 / 1_000_000.0 < rate;
    #[derive(serde::Serialize)]
    struct Fields<'a> {
        kind: &'a str,
        risk: &'a str,
        keys: Value,
        run: &'a str,
        sampled: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        rate: Option<f64>,
    }
    let json = serde_json::to_string(&Fields {
        kind: &action.kind,
        risk: &info.risk_class,
        keys: info.matching_keys(keys.as_ref()),
        run: subject.dimensions.as_ref().and_then(|d| d.get("run_id")).map(String::as_str).unwrap_or_default(),
        sampled,
        rate: (rate < 1.0).then_some(rate),
    })
    .expect("serializable");
    Ok(Governance { json, replacement: info.replacement })
}

/// The reason codes of v0.1.26 and of our guards (`lua/lib/guards.lua`): their DENY answers
/// always carry `deny_detail`.
const V26_AND_LATER_REASONS: [&str; 6] = [
    "ACTION_QUOTA_EXCEEDED",
    "ACTION_KIND_DENIED",
    "ACTION_KIND_NOT_ALLOWED",
    "ACTIVE_RESERVATIONS_EXCEEDED",
    "SPEND_RATE_EXCEEDED",
    "TEMPLATE_INSTANCES_EXCEEDED",
];

/// Whether a DENY answer (200) carries `deny_detail`: where v0.1.26 is in play (the request
/// uses one of its fields, the evaluation observed, or the reason is one of its codes), or
/// always when the deployment says so. Clients of v0.1.25 that validate answers strictly (the
/// Python client does) thus see the v0.1.25 shape.
fn show_deny_detail(app: &App, speaks_v26: bool, e: &Evaluated) -> bool {
    let v26_reason = e.reason_code.as_deref().is_some_and(|r| V26_AND_LATER_REASONS.contains(&r));
    app.config.deny_detail_always || speaks_v26 || e.observed || v26_reason
}

fn deprecated_kind(answer: Answer, g: &Governance) -> Answer {
    match &g.replacement {
        Some(r) => answer.with_header("x-cycles-deprecated-kind", r.clone()),
        None => answer,
    }
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let outcome = reserve(app, ctx, req).await;
    evidence::on_error(app, ctx, "POST /v1/reservations", None, &req.body, mirror::RESERVE_REQUEST, outcome).await
}

async fn reserve(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = tenant_key(app, ctx, req).await?;
    let (r, raw) = parse::<ReservationCreateRequest>(app, ctx, req).await?;
    check_subject_tenant(&r.subject, &caller)?;
    let hash = payload_hash(&raw, &[("grace_period_ms", json!(rules::DEFAULT_GRACE_MS)), ("dry_run", json!(false))]);
    let scopes = derive_scopes(&r.subject);
    let unit = r.estimate.unit;
    let codes = budget_codes(&scopes, unit);
    let g = governance(app, &r.action, &r.subject)?;
    if r.dry_run == Some(true) {
        return Ok(deprecated_kind(dry_run(app, ctx, &caller, &r, &raw, hash, scopes, &codes, &g).await?, &g));
    }
    let token = ReservationId::token_for(&r.idempotency_key);
    // (built again, not cloned, for the rare second call: a clone on every reserve costs more)
    let reserve = |reclaimed: &str| {
        Reserve {
            reclaimed: reclaimed.to_string(),
            digest: caller.digest.clone(),
            accepted: Permission::ReservationsCreate.accepted().to_string(),
            payload_hash: hash.clone(),
            id_prefix: ReservationId::prefix(&caller.tenant, &token),
            unit: unit.as_str().to_string(),
            amount: r.estimate.amount.to_string(),
            ttl_ms: r.ttl_ms.map(|t| t.to_string()).unwrap_or_default(),
            grace_ms: r.grace_period_ms.unwrap_or(rules::DEFAULT_GRACE_MS).to_string(),
            overage_policy: r.overage_policy.map(|p| p.as_str().to_string()).unwrap_or_default(),
            idempotency_key: stored_text(&r.idempotency_key),
            subject: serde_json::to_string(&r.subject).expect("serializable"),
            action: serde_json::to_string(&r.action).expect("serializable"),
            metadata: json_or_empty(&r.metadata),
            context: event_context(ctx, Some(&caller), &caller.tenant),
            observe: r.observe_mode.map(ObserveMode::as_str).unwrap_or_default().to_string(),
            governance: g.json.clone(),
            record_ttl_ms: evaluation_ttl_ms(app),
            ..Default::default()
        }
        .keys(&caller.tenant, &caller.key_id, &token, &r.idempotency_key, &scopes, &codes)
    };
    let mut reply = app.store.run(reserve("")).await?;
    if let Reserved::Reclaim { reclaim } = &reply.value {
        // Lazy reclaim: expire the tenant's overdue reservations, then evaluate once more.
        expire_reservations(&app.store, &caller.tenant, reclaim, app.config.retention).await?;
        reply = app.store.run(reserve("1")).await?;
    }
    let hold = match reply.value {
        Reserved::Held(hold) => hold,
        Reserved::Observed(e) => {
            // the tenant observes: the reserve was evaluated (dry-run shape), nothing held
            // (no receipt: an observed reserve is neither a dry_run nor a hold)
            let ev = evaluation_of(app, e, reply.replay, &scopes, &codes, unit, true)?;
            let replayed = ev.replayed;
            return Ok(deprecated_kind(Answer::json(200, &dry_run_answer(ev, &r, scopes)).replayed(replayed), &g));
        }
        Reserved::Reclaim { .. } => return Err(ApiError::fault("a reserve asked to reclaim twice")),
    };
    let expires_at_ms = int(&hold.expires_at_ms)?;
    let held = ReservationId::parse(&hold.reservation_id).map(|r| r.budget_codes.concat()).unwrap_or_default();
    let budgeted = budgeted_scopes(&scopes, &codes, &held);
    let response = ReservationCreateResponse {
        decision: if hold.decision == "ALLOW_WITH_CAPS" { Decision::AllowWithCaps } else { Decision::Allow },
        reserved: Some(r.estimate.clone()),
        expires_at_ms: Some(expires_at_ms),
        remaining_ttl_ms: Some(remaining_ttl(&reply.status, reply.now_ms, expires_at_ms)),
        scope_path: scopes.last().cloned(),
        caps: stored_caps(hold.caps.as_deref())?,
        reason_code: None,
        balances: Some(balances(&budgeted, unit, &hold.balances)?),
        reservation_id: Some(hold.reservation_id),
        affected_scopes: scopes,
        deny_detail: None,
    };
    let slot = || Slot::reservation(&caller.tenant, &token, "reserve");
    let answer = evidence::answer(app, ctx, &caller.tenant, reply.replay, &response, "reserve", slot, |b| {
        json!({"request": attested_request(&raw, mirror::RESERVE_REQUEST), "response": project(b, mirror::RESERVE_RESPONSE)})
    })
    .await;
    Ok(deprecated_kind(answer, &g))
}

/// The outcome of an evaluation (dry_run or decide).
struct Evaluation {
    replayed: bool,
    decision: Decision,
    reason_code: Option<String>,
    caps: Option<Value>,
    balances: Vec<Balance>,
    deny_detail: Option<Value>,
    /// Evaluated in observe mode.
    observed: bool,
}

/// What dry_run and decide evaluate, and where their answers are kept: `record` is this
/// namespace's idempotency record, `live` the reservation the same key would name (for decide,
/// `record` again), for cross-mode mismatch detection.
struct Ask<'a> {
    idempotency_key: &'a str,
    subject: &'a Subject,
    action: &'a Action,
    estimate: &'a Amount,
    scopes: &'a [String],
    /// The scopes' ledger codes in the estimate's unit.
    codes: &'a [String],
    hash: String,
    asked: Asked<'a>,
    governance: &'a Governance,
    /// The requested observe mode ('' when none; decide has ENFORCE: it is no reservation).
    observe: &'a str,
    /// The request uses a v0.1.26 field.
    speaks_v26: bool,
}

fn evaluation_ttl_ms(app: &App) -> String {
    (app.config.retention.as_millis() as u64).min(rules::EVALUATION_RETENTION_MS).to_string()
}

/// An evaluation answer of the scripts, as the handlers give it.
fn evaluation_of(
    app: &App,
    e: Evaluated,
    replayed: bool,
    scopes: &[String],
    codes: &[String],
    unit: Unit,
    speaks_v26: bool,
) -> ApiResult<Evaluation> {
    let decision = match e.decision.as_str() {
        "ALLOW" => Decision::Allow,
        "ALLOW_WITH_CAPS" => Decision::AllowWithCaps,
        _ => Decision::Deny,
    };
    let budgeted = budgeted_scopes(scopes, codes, &e.codes);
    let show = decision == Decision::Deny && show_deny_detail(app, speaks_v26, &e);
    let observed = e.observed;
    Ok(Evaluation {
        replayed,
        decision,
        reason_code: e.reason_code,
        caps: stored_caps(e.caps.as_deref())?,
        balances: if decision == Decision::Deny { Vec::new() } else { balances(&budgeted, unit, &e.balances)? },
        deny_detail: if show { e.deny_detail } else { None },
        observed,
    })
}

async fn evaluate(app: &App, ctx: &Ctx, caller: &TenantKey, ask: Ask<'_>) -> ApiResult<Evaluation> {
    let unit = ask.estimate.unit;
    let call = Evaluate {
        digest: caller.digest.clone(),
        accepted: Permission::ReservationsCreate.accepted().to_string(),
        payload_hash: ask.hash,
        unit: unit.as_str().to_string(),
        amount: ask.estimate.amount.to_string(),
        idempotency_key: stored_text(ask.idempotency_key),
        record_ttl_ms: evaluation_ttl_ms(app),
        context: event_context(ctx, Some(caller), &caller.tenant),
        subject: serde_json::to_string(ask.subject).expect("serializable"),
        action: serde_json::to_string(ask.action).expect("serializable"),
        observe: ask.observe.to_string(),
        governance: ask.governance.json.clone(),
        ..Evaluate::on(&caller.tenant, &caller.key_id, ask.asked, ask.scopes, ask.codes)
    };
    let reply = app.store.run(call).await?;
    evaluation_of(app, reply.value, reply.replay, ask.scopes, ask.codes, unit, ask.speaks_v26)
}

/// The dry-run shaped answer of a reserve evaluation (dry_run, or observe mode).
fn dry_run_answer(ev: Evaluation, r: &ReservationCreateRequest, scopes: Vec<String>) -> ReservationCreateResponse {
    let allowed = ev.decision != Decision::Deny;
    ReservationCreateResponse {
        decision: ev.decision,
        reservation_id: None,
        reserved: allowed.then(|| r.estimate.clone()),
        expires_at_ms: None,
        remaining_ttl_ms: None,
        scope_path: scopes.last().cloned(),
        affected_scopes: scopes,
        caps: ev.caps,
        reason_code: ev.reason_code,
        balances: allowed.then_some(ev.balances),
        deny_detail: ev.deny_detail,
    }
}

/// A reserve with `dry_run: true` (or `observe_mode: OBSERVE`): evaluated, not held; its answer
/// is kept under reserve's idempotency namespace.
#[allow(clippy::too_many_arguments)]
async fn dry_run(
    app: &App,
    ctx: &Ctx,
    caller: &TenantKey,
    r: &ReservationCreateRequest,
    raw: &Value,
    hash: String,
    scopes: Vec<String>,
    codes: &[String],
    g: &Governance,
) -> ApiResult<Answer> {
    let ask = Ask {
        idempotency_key: &r.idempotency_key,
        subject: &r.subject,
        action: &r.action,
        estimate: &r.estimate,
        scopes: &scopes,
        codes,
        hash,
        asked: Asked::DryRun(&r.idempotency_key),
        governance: g,
        observe: r.observe_mode.map(ObserveMode::as_str).unwrap_or_default(),
        speaks_v26: r.observe_mode.is_some() || r.action.policy_keys.is_some(),
    };
    let ev = evaluate(app, ctx, caller, ask).await?;
    let (replayed, observed) = (ev.replayed, r.observe_mode == Some(ObserveMode::Observe) || ev.observed);
    let response = dry_run_answer(ev, r, scopes);
    if observed {
        // an observed reserve is neither a dry_run nor a hold: no receipt
        return Ok(Answer::json(200, &response).replayed(replayed));
    }
    let slot = || Slot::record(&caller.tenant, "reserve-dry-run", &r.idempotency_key);
    Ok(evidence::answer(app, ctx, &caller.tenant, replayed, &response, "reserve", slot, |b| {
        json!({"request": attested_request(raw, mirror::RESERVE_REQUEST), "response": project(b, mirror::RESERVE_RESPONSE)})
    })
    .await)
}

pub async fn decide(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let outcome = evaluate_decision(app, ctx, req).await;
    evidence::on_error(app, ctx, "POST /v1/decide", None, &req.body, mirror::DECISION_REQUEST, outcome).await
}

async fn evaluate_decision(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = tenant_key(app, ctx, req).await?;
    let (r, raw) = parse::<DecisionRequest>(app, ctx, req).await?;
    check_subject_tenant(&r.subject, &caller)?;
    let scopes = derive_scopes(&r.subject);
    let codes = budget_codes(&scopes, r.estimate.unit);
    let g = governance(app, &r.action, &r.subject)?;
    let ask = Ask {
        idempotency_key: &r.idempotency_key,
        subject: &r.subject,
        action: &r.action,
        estimate: &r.estimate,
        scopes: &scopes,
        codes: &codes,
        hash: payload_hash(&raw, &[]),
        asked: Asked::Decide(&r.idempotency_key),
        governance: &g,
        // decide is no reservation: the tenant's observe mode does not apply to it
        observe: ObserveMode::Enforce.as_str(),
        speaks_v26: r.action.policy_keys.is_some(),
    };
    let ev = evaluate(app, ctx, &caller, ask).await?;
    let replayed = ev.replayed;
    let response = DecisionResponse {
        decision: ev.decision,
        caps: ev.caps,
        reason_code: ev.reason_code,
        affected_scopes: scopes,
        deny_detail: ev.deny_detail,
    };
    let slot = || Slot::record(&caller.tenant, "decide", &r.idempotency_key);
    let answer = evidence::answer(app, ctx, &caller.tenant, replayed, &response, "decide", slot, |b| {
        json!({"request": attested_request(&raw, mirror::DECISION_REQUEST), "response": project(b, mirror::DECISION_RESPONSE)})
    })
    .await;
    Ok(deprecated_kind(answer, &g))
}

/// createEvent: the post-only debit of `actual`, without a reservation (201).
pub async fn create_event(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = tenant_key(app, ctx, req).await?;
    let (r, raw) = parse::<EventCreateRequest>(app, ctx, req).await?;
    check_subject_tenant(&r.subject, &caller)?;
    let scopes = derive_scopes(&r.subject);
    let unit = r.actual.unit;
    let codes = budget_codes(&scopes, unit);
    let call = Charge {
        digest: caller.digest.clone(),
        accepted: Permission::ReservationsCommit.accepted().to_string(),
        payload_hash: payload_hash(&raw, &[]),
        event_id: format!("evt_{}", crate::ids::random_uuid().simple()),
        unit: unit.as_str().to_string(),
        amount: r.actual.amount.to_string(),
        overage_policy: r.overage_policy.map(|p| p.as_str().to_string()).unwrap_or_default(),
        record_ttl_ms: app.config.retention.as_millis().to_string(),
        context: event_context(ctx, Some(&caller), &caller.tenant),
        body: String::from_utf8_lossy(&req.body).into_owned(),
        action: serde_json::to_string(&r.action).expect("serializable"),
        ..Charge::on(&caller.tenant, &caller.key_id, &r.idempotency_key, &scopes, &codes)
    };
    let reply = app.store.run(call).await?;
    let charged = reply.value;
    let budgeted = budgeted_scopes(&scopes, &codes, &charged.codes);
    Ok(Answer::json(
        201,
        &EventCreateResponse {
            status: "APPLIED",
            event_id: charged.event_id,
            charged: charged.charged.as_deref().map(int).transpose()?.map(|amount| Amount { unit, amount }),
            balances: Some(balances(&budgeted, unit, &charged.balances)?),
        },
    )
    .replayed(reply.replay))
}

/// The reservation a `{reservation_id}` route addresses, with the caller's auth arguments.
struct Addressed {
    raw: String,
    id: ReservationId,
    /// The key record the script checks (for admin calls: the tenant record, unchecked).
    auth_key: String,
    digest: String,
    /// The tenant key behind the call (None for admin-key calls).
    caller: Option<TenantKey>,
}

impl Addressed {
    fn target(&self) -> Target<'_> {
        Target::new(&self.raw, &self.id, self.auth_key.clone())
    }
}

/// Resolves the path's reservation: 400 for a bad id, 404 when it cannot exist, and for a
/// reservation of another tenant 403 (after checking the caller's key) or 404.
async fn address(app: &App, caller: Caller, req: &ApiRequest, permission: Permission) -> ApiResult<Addressed> {
    let raw = req.param("reservation_id").to_string();
    let n = raw.chars().count();
    if n == 0 || n > 128 {
        return Err(ApiError::invalid(format!("reservation_id must be 1 to 128 characters (got {n})")));
    }
    Ok(match caller {
        Caller::Admin => {
            let id = ReservationId::parse(&raw).ok_or_else(reservation_not_found)?;
            let auth_key = crate::ops::auth::check_record(&id.tenant, None);
            Addressed { auth_key, id, raw, digest: String::new(), caller: None }
        }
        Caller::Tenant(c) => {
            let auth_key = crate::ops::auth::check_record(&c.tenant, Some(&c.key_id));
            let Some(id) = ReservationId::parse(&raw) else {
                check_key(app, &auth_key, &c, permission).await?;
                return Err(reservation_not_found());
            };
            if id.tenant != c.tenant {
                check_key(app, &auth_key, &c, permission).await?;
                return Err(foreign_reservation(app, &id).await?);
            }
            Addressed { id, raw, auth_key, digest: c.digest.clone(), caller: Some(c) }
        }
    })
}

fn reservation_not_found() -> ApiError {
    ApiError::not_found(messages::RESERVATION_NOT_FOUND)
}

async fn check_key(app: &App, auth_key: &str, c: &TenantKey, p: Permission) -> ApiResult<()> {
    let call = Authenticate {
        api_key: auth_key.to_string(),
        tenant: vec![],
        digest: c.digest.clone(),
        accepted: p.accepted().to_string(),
    };
    app.store.run(call).await.map(|_| ())
}

/// 403 when the id names an existing reservation of another tenant, else 404.
async fn foreign_reservation(app: &App, id: &ReservationId) -> ApiResult<ApiError> {
    let record = stored(&app.store, id).await?;
    Ok(if record.is_some_and(|r| r.codes == id.budget_codes.concat()) {
        ApiError::forbidden(messages::RESERVATION_FOREIGN)
    } else {
        reservation_not_found()
    })
}

/// The answer of a commit or release: the settled amounts and the budgeted scopes' balances.
fn settled_balances(s: &Settled, id: &ReservationId) -> ApiResult<(Unit, Vec<Balance>)> {
    let unit = s.unit()?;
    let scopes = derive_scopes(&s.subject()?);
    let budgeted = budgeted_scopes(&scopes, &budget_codes(&scopes, unit), &id.budget_codes.concat());
    Ok((unit, balances(&budgeted, unit, &s.balances)?))
}

pub async fn commit(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let outcome = settle_commit(app, ctx, req).await;
    let id = Some(req.param("reservation_id"));
    let endpoint = "POST /v1/reservations/{reservation_id}/commit";
    evidence::on_error(app, ctx, endpoint, id, &req.body, mirror::COMMIT_REQUEST, outcome).await
}

async fn settle_commit(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = authenticate(app, ctx, req, false).await?;
    let (r, raw) = parse::<CommitRequest>(app, ctx, req).await?;
    let a = address(app, caller, req, Permission::ReservationsCommit).await?;
    let call = Commit {
        digest: a.digest.clone(),
        accepted: Permission::ReservationsCommit.accepted().to_string(),
        reservation_id: a.raw.clone(),
        idempotency_key: stored_text(&r.idempotency_key),
        payload_hash: payload_hash(&raw, &[]),
        unit: r.actual.unit.as_str().to_string(),
        amount: r.actual.amount.to_string(),
        metrics: json_or_empty(&r.metrics),
        metadata: json_or_empty(&r.metadata),
        record_ttl_ms: record_ttl_ms(app),
        context: event_context(ctx, a.caller.as_ref(), &a.id.tenant),
        ..Default::default()
    }
    .target(&a.target());
    let reply = app.store.run(call).await?;
    let settled = reply.value;
    let (unit, balances) = settled_balances(&settled, &a.id)?;
    let charged = settled.charged.as_deref().ok_or_else(|| ApiError::fault("a commit answered no charge"))?;
    let response = CommitResponse {
        status: "COMMITTED",
        charged: Amount { unit, amount: int(charged)? },
        released: settled.released.as_deref().map(int).transpose()?.map(|amount| Amount { unit, amount }),
        balances: Some(balances),
    };
    Ok(settlement_answer(app, ctx, &a, reply.replay, "commit", &raw, &response).await)
}

/// The answer of a commit or a release, with its receipt (the reservation id hoisted into the
/// payload) when the tenant gets receipts.
async fn settlement_answer(
    app: &App,
    ctx: &Ctx,
    a: &Addressed,
    replayed: bool,
    artifact: &'static str,
    raw: &Value,
    response: &impl serde::Serialize,
) -> Answer {
    let (req_fields, resp_fields) = match artifact {
        "commit" => (mirror::COMMIT_REQUEST, mirror::COMMIT_RESPONSE),
        _ => (mirror::RELEASE_REQUEST, mirror::RELEASE_RESPONSE),
    };
    let slot = || Slot::reservation(&a.id.tenant, &a.id.token, artifact);
    evidence::answer(app, ctx, &a.id.tenant, replayed, response, artifact, slot, |b| {
        json!({"reservation_id": a.raw, "request": attested_request(raw, req_fields), "response": project(b, resp_fields)})
    })
    .await
}

pub async fn release(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let outcome = settle_release(app, ctx, req).await;
    let id = Some(req.param("reservation_id"));
    let endpoint = "POST /v1/reservations/{reservation_id}/release";
    evidence::on_error(app, ctx, endpoint, id, &req.body, mirror::RELEASE_REQUEST, outcome).await
}

async fn settle_release(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = authenticate(app, ctx, req, true).await?;
    let (r, raw) = parse::<ReleaseRequest>(app, ctx, req).await?;
    let a = address(app, caller, req, Permission::ReservationsRelease).await?;
    // An admin-key release records its audit entry in the same step as the release.
    let audit = if a.caller.is_none() {
        ctx.act_for(&a.id.tenant)?;
        super::admin::script_context(ctx, &Caller::Admin, true, None)
    } else {
        String::new()
    };
    let call = Release {
        digest: a.digest.clone(),
        accepted: Permission::ReservationsRelease.accepted().to_string(),
        reservation_id: a.raw.clone(),
        idempotency_key: stored_text(&r.idempotency_key),
        payload_hash: payload_hash(&raw, &[]),
        reason: r.reason.as_deref().map(stored_text).unwrap_or_default(),
        record_ttl_ms: record_ttl_ms(app),
        audit,
        ..Default::default()
    }
    .target(&a.target());
    let reply = app.store.run(call).await?;
    let settled = reply.value;
    let (unit, balances) = settled_balances(&settled, &a.id)?;
    let released = settled.released.as_deref().ok_or_else(|| ApiError::fault("a release answered no amount"))?;
    let response = ReleaseResponse {
        status: "RELEASED",
        released: Amount { unit, amount: int(released)? },
        balances: Some(balances),
    };
    Ok(settlement_answer(app, ctx, &a, reply.replay, "release", &raw, &response).await)
}

pub async fn extend(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = authenticate(app, ctx, req, false).await?;
    let (r, raw) = parse::<ReservationExtendRequest>(app, ctx, req).await?;
    let a = address(app, caller, req, Permission::ReservationsExtend).await?;
    let call = Extend {
        digest: a.digest.clone(),
        accepted: Permission::ReservationsExtend.accepted().to_string(),
        reservation_id: a.raw.clone(),
        payload_hash: payload_hash(&raw, &[]),
        extend_by_ms: r.extend_by_ms.to_string(),
        record_ttl_ms: record_ttl_ms(app),
        ..Default::default()
    }
    .target(&a.target(), &r.idempotency_key);
    let reply = app.store.run(call).await?;
    let expires_at_ms = int(&reply.value.expires_at_ms)?;
    Ok(Answer::json(
        200,
        &ReservationExtendResponse {
            status: "ACTIVE",
            expires_at_ms,
            remaining_ttl_ms: Some(remaining_ttl(&reply.status, reply.now_ms, expires_at_ms)),
            balances: None,
        },
    )
    .replayed(reply.replay))
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = authenticate(app, ctx, req, true).await?;
    let a = address(app, caller, req, Permission::ReservationsList).await?;
    // an operator acts for no tenant here (no tenant header), unless limited to some
    if a.caller.is_none() && ctx.limited() {
        ctx.act_for(&a.id.tenant)?;
    }
    let with_evidence = evidence::enabled_for(app, &a.id.tenant).await?;
    let auth = a.caller.is_some().then(|| a.auth_key.clone());
    let call = GetReservation {
        digest: a.digest.clone(),
        accepted: Permission::ReservationsList.accepted().to_string(),
        reservation_id: a.raw.clone(),
        with_evidence: if with_evidence { "1" } else { "" }.to_string(),
        ..GetReservation::on(&a.id.tenant, &a.id.token, auth)
    };
    let reply = app.store.run(call).await?;
    if reply.status == "OVERDUE" {
        // Expire it now, as every touch does; if the store refuses the write, the sweep will.
        let ids = std::slice::from_ref(&a.raw);
        if let Err(e) = expire_reservations(&app.store, &a.id.tenant, ids, app.config.retention).await {
            tracing::warn!(error = %e.message, reservation_id = %a.raw, "could not expire an overdue reservation on read");
        }
        return Err(ApiError::new(ErrorCode::ReservationExpired, messages::RESERVATION_EXPIRED));
    }
    let stored = reply.value;
    let malformed = || ApiError::fault(format!("reservation record {} is malformed", a.raw));
    let record = reply.attachment.as_deref().and_then(ReservationRecord::parse).ok_or_else(malformed)?;
    let mut detail = record.detail(&a.id.tenant, &a.id.token).ok_or_else(malformed)?;
    detail.reservation_id = a.raw.clone();
    if let Some(scope) = stored.scope {
        detail.scope_path = scope;
    }
    let json = |s: &Option<String>| s.as_deref().and_then(|s| serde_json::from_str::<Value>(s).ok());
    detail.metadata = json(&stored.metadata);
    detail.committed_metadata = json(&stored.committed_metadata);
    if let Some(ids) = &stored.evidence {
        detail.evidence = evidence::reservation_refs(app, ids);
    }
    Ok(Answer::json(200, &detail))
}
