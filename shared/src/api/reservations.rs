//! Reservation lifecycle handlers: authenticate -> parse -> one script -> map the result.

use serde_json::{json, Value};

use super::auth::{Principal, TenantCaller};
use super::{Answer, ApiRequest, App, Ctx, Params};
use crate::domain::{derive_scopes, leaf_segment, payload_hash, Permission};
use crate::error::{ApiError, ApiResult};
use crate::ids::ReservationId;
use crate::keys::{budget_code, TenantKeys};
use crate::maintenance::expire_reservations;
use crate::model::*;
use crate::store::{scripts, Reply};

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

fn parse<T: serde::de::DeserializeOwned + Validate>(req: &ApiRequest) -> ApiResult<(T, Value)> {
    let parsed = parse_body::<T>(&req.body)?;
    check_idempotency_header(req, parsed.0.idempotency_key())?;
    Ok(parsed)
}

async fn tenant_caller(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<TenantCaller> {
    match authenticate(app, ctx, req, false).await? {
        Principal::Tenant(c) => Ok(c),
        Principal::Admin => Err(ApiError::unauthorized("Invalid or missing API key")),
    }
}

fn json_or_empty(v: &Option<impl serde::Serialize>) -> String {
    v.as_ref().map(|v| serde_json::to_string(v).expect("serializable")).unwrap_or_default()
}

/// How long a finished reservation's keys live (see `maintenance::record_ttl`).
fn retention_ms(app: &App) -> String {
    crate::maintenance::record_ttl(app.config.retention).as_millis().to_string()
}

fn int(s: &str) -> ApiResult<i64> {
    s.parse().map_err(|_| ApiError::internal("Malformed amount in the budget store"))
}

/// `subject.tenant`, when given, must be the key's tenant (exact match): else 403.
fn check_subject_tenant(subject: &Subject, caller: &TenantCaller) -> ApiResult<()> {
    match &subject.tenant {
        Some(t) if *t != caller.tenant => {
            Err(ApiError::forbidden("subject.tenant does not match the tenant of the API key"))
        }
        _ => Ok(()),
    }
}

/// Splits the concatenated 8-character ledger codes a script reports.
fn split_codes(codes: &str) -> Vec<String> {
    codes.as_bytes().chunks(8).map(|c| String::from_utf8_lossy(c).into_owned()).collect()
}

/// The budgeted scopes of a subject in a unit: the derived scopes whose ledger codes are
/// among `codes` (those of a reservation id, or of an evaluation), in canonical order.
fn budgeted_scopes(subject: &Subject, unit: Unit, codes: &[String]) -> Vec<String> {
    derive_scopes(subject).into_iter().filter(|s| codes.contains(&budget_code(s, unit))).collect()
}

/// Decodes the 7-strings-per-budget snapshot the scripts return (canonical order) into
/// `Balance`s of the given scopes.
fn balances(scopes: &[String], unit: Unit, snapshot: &[String]) -> ApiResult<Vec<Balance>> {
    if snapshot.len() != scopes.len() * 7 {
        return Err(ApiError::internal("Malformed balance snapshot"));
    }
    scopes
        .iter()
        .zip(snapshot.chunks(7))
        .map(|(scope, b)| {
            let amount = |s: &str| int(s).map(|amount| Amount { unit, amount });
            let optional = |s: &str| -> ApiResult<Option<Amount>> {
                let a = amount(s)?;
                Ok((a.amount != 0).then_some(a))
            };
            Ok(Balance {
                scope: leaf_segment(scope).to_string(),
                scope_path: scope.clone(),
                remaining: amount(&b[1])?,
                reserved: Some(amount(&b[2])?),
                spent: Some(amount(&b[3])?),
                allocated: Some(amount(&b[0])?),
                debt: optional(&b[4])?,
                overdraft_limit: optional(&b[5])?,
                is_over_limit: (b[6] == "1").then_some(true),
            })
        })
        .collect()
}

/// Subject and unit of the reservation a commit/release script reported.
fn reservation_context(reply: &Reply) -> ApiResult<(Subject, Unit)> {
    let bad = || ApiError::internal("Malformed reservation record");
    let subject = reply.context.first().and_then(|s| serde_json::from_str(s).ok()).ok_or_else(bad)?;
    let unit = reply.context.get(1).and_then(|u| Unit::parse(u)).ok_or_else(bad)?;
    Ok((subject, unit))
}

/// `max(0, expires_at - now)` while the reservation is ACTIVE, else 0 (recomputed on replays).
fn remaining_ttl(reply: &Reply, expires_at_ms: i64) -> i64 {
    if reply.status == "ACTIVE" {
        (expires_at_ms - reply.now_ms).max(0)
    } else {
        0
    }
}

pub async fn create(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = tenant_caller(app, ctx, req).await?;
    let (r, raw) = parse::<ReservationCreateRequest>(req)?;
    check_subject_tenant(&r.subject, &caller)?;
    let hash = payload_hash(&raw, &[("grace_period_ms", json!(5000)), ("dry_run", json!(false))]);
    let scopes = derive_scopes(&r.subject);
    let keys = TenantKeys::new(&caller.tenant);
    let token = ReservationId::token_for(&r.idempotency_key);
    let unit = r.estimate.unit;
    if r.dry_run == Some(true) {
        let record = keys.idempotency("reserve-dry-run", &[&r.idempotency_key]);
        let live = keys.reservation(&token);
        let ask = Ask {
            idempotency_key: &r.idempotency_key,
            subject: &r.subject,
            action: &r.action,
            estimate: &r.estimate,
            scopes: &scopes,
            hash,
        };
        let ev = evaluate(app, ctx, &caller, [record, live], ask).await?;
        let allowed = ev.decision != Decision::Deny;
        return Ok(Answer::json(
            200,
            &ReservationCreateResponse {
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
            },
        ));
    }

    let mut script_keys = vec![
        keys.tenant(),
        keys.api_key(&caller.key_id),
        keys.reservation(&token),
        keys.idempotency("reserve-dry-run", &[&r.idempotency_key]),
        keys.scope_units(),
        keys.expiry_index(),
        keys.created_index(),
        keys.due_index(),
        keys.listing_index(),
        keys.reservation_metadata(&token),
    ];
    script_keys.extend(scopes.iter().map(|s| keys.budget(s, unit)));
    let mut args = vec![
        caller.digest.clone(),
        Permission::ReservationsCreate.accepted().to_string(),
        hash,
        ReservationId::prefix(&caller.tenant, &token),
        unit.as_str().to_string(),
        r.estimate.amount.to_string(),
        r.ttl_ms.map(|t| t.to_string()).unwrap_or_default(),
        r.grace_period_ms.unwrap_or(5000).to_string(),
        r.overage_policy.map(|p| p.as_str().to_string()).unwrap_or_default(),
        r.idempotency_key.clone(),
        serde_json::to_string(&r.subject).expect("serializable"),
        serde_json::to_string(&r.action).expect("serializable"),
        json_or_empty(&r.metadata),
        retention_ms(app),
    ];
    args.extend(scopes.iter().map(|s| format!("{s}|{}", budget_code(s, unit))));

    let mut reply = app.store.run(&scripts::RESERVE, &script_keys, &args).await?;
    if reply.status == "RECLAIM" {
        // Lazy reclaim: expire the tenant's overdue reservations, then evaluate once more.
        let opts = app.config.sweep_options();
        expire_reservations(&app.store, &caller.tenant, &reply.result, &opts).await?;
        args.push("reclaimed".to_string());
        reply = app.store.run(&scripts::RESERVE, &script_keys, &args).await?;
    }
    let res = &reply.result;
    if res.len() < 4 {
        return Err(ApiError::internal("Malformed reserve result"));
    }
    let expires_at_ms = int(&res[2])?;
    let codes = ReservationId::parse(&res[1]).map(|r| r.budget_codes).unwrap_or_default();
    let budgeted = budgeted_scopes(&r.subject, unit, &codes);
    let decision = if res[0] == "ALLOW_WITH_CAPS" { Decision::AllowWithCaps } else { Decision::Allow };
    let caps = if res[3].is_empty() { None } else { serde_json::from_str(&res[3]).ok() };
    Ok(Answer::json(
        200,
        &ReservationCreateResponse {
            decision,
            reservation_id: Some(res[1].clone()),
            reserved: Some(r.estimate.clone()),
            expires_at_ms: Some(expires_at_ms),
            remaining_ttl_ms: Some(remaining_ttl(&reply, expires_at_ms)),
            scope_path: scopes.last().cloned(),
            affected_scopes: scopes,
            caps,
            reason_code: None,
            balances: Some(balances(&budgeted, unit, &res[4..])?),
        },
    ))
}

/// The outcome of an evaluation (dry_run or decide).
struct Evaluation {
    decision: Decision,
    reason_code: Option<String>,
    caps: Option<Value>,
    balances: Vec<Balance>,
}

/// Runs the evaluation script: the live reserve's checks, reported as a decision and stored
/// under the idempotency key (`records` = this namespace's record, and the live reservation
/// the same key would name, for cross-mode mismatch detection).
/// What dry_run and decide evaluate.
struct Ask<'a> {
    idempotency_key: &'a str,
    subject: &'a Subject,
    action: &'a Action,
    estimate: &'a Amount,
    scopes: &'a [String],
    hash: String,
}

async fn evaluate(
    app: &App,
    ctx: &Ctx,
    caller: &TenantCaller,
    records: [String; 2],
    ask: Ask<'_>,
) -> ApiResult<Evaluation> {
    let Ask { idempotency_key, subject, action, estimate, scopes, hash } = ask;
    let keys = TenantKeys::new(&caller.tenant);
    let [record, live] = records;
    let mut script_keys =
        vec![keys.tenant(), keys.api_key(&caller.key_id), record, live, keys.scope_units(), keys.events()];
    script_keys.extend(scopes.iter().map(|s| keys.budget(s, estimate.unit)));
    let mut args = vec![
        caller.digest.clone(),
        Permission::ReservationsCreate.accepted().to_string(),
        hash,
        estimate.unit.as_str().to_string(),
        estimate.amount.to_string(),
        idempotency_key.to_string(),
        (app.config.retention.as_millis() as u64).min(EVALUATION_RETENTION_MS).to_string(),
        event_context(ctx, Some(caller), &caller.tenant),
        serde_json::to_string(subject).expect("serializable"),
        serde_json::to_string(action).expect("serializable"),
    ];
    args.extend(scopes.iter().map(|s| format!("{s}|{}", budget_code(s, estimate.unit))));
    let reply = app.store.run(&scripts::EVALUATE, &script_keys, &args).await?;
    let res = &reply.result;
    if res.len() < 4 {
        return Err(ApiError::internal("Malformed evaluation result"));
    }
    let codes = split_codes(&res[3]);
    let budgeted: Vec<String> =
        scopes.iter().filter(|s| codes.contains(&budget_code(s, estimate.unit))).cloned().collect();
    let decision = match res[0].as_str() {
        "ALLOW" => Decision::Allow,
        "ALLOW_WITH_CAPS" => Decision::AllowWithCaps,
        _ => Decision::Deny,
    };
    Ok(Evaluation {
        decision,
        reason_code: (!res[1].is_empty()).then(|| res[1].clone()),
        caps: if res[2].is_empty() { None } else { serde_json::from_str(&res[2]).ok() },
        balances: if decision == Decision::Deny { Vec::new() } else { balances(&budgeted, estimate.unit, &res[4..])? },
    })
}

/// dry_run and decide records are kept 24 hours (protocol.md §4.8), or the record retention
/// when an operator set it shorter.
const EVALUATION_RETENTION_MS: u64 = 24 * 3_600_000;

pub async fn decide(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = tenant_caller(app, ctx, req).await?;
    let (r, raw) = parse::<DecisionRequest>(req)?;
    check_subject_tenant(&r.subject, &caller)?;
    let scopes = derive_scopes(&r.subject);
    let keys = TenantKeys::new(&caller.tenant);
    let record = keys.idempotency("decide", &[&r.idempotency_key]);
    let ask = Ask {
        idempotency_key: &r.idempotency_key,
        subject: &r.subject,
        action: &r.action,
        estimate: &r.estimate,
        scopes: &scopes,
        hash: payload_hash(&raw, &[]),
    };
    let ev = evaluate(app, ctx, &caller, [record.clone(), record], ask).await?;
    Ok(Answer::json(
        200,
        &DecisionResponse {
            decision: ev.decision,
            caps: ev.caps,
            reason_code: ev.reason_code,
            affected_scopes: scopes,
        },
    ))
}

/// The request context scripts stamp on the events they write (P-148).
fn event_context(ctx: &Ctx, caller: Option<&TenantCaller>, tenant: &str) -> String {
    json!({
        "request_id": ctx.request_id,
        "trace_id": ctx.trace.trace_id,
        "actor": if caller.is_some() { "api_key" } else { "admin_on_behalf_of" },
        "key_id": caller.map(|c| c.key_id.as_str()).unwrap_or(""),
        "tenant": tenant,
        "trace_flags": ctx.trace.inbound_flags.as_deref().unwrap_or(""),
    })
    .to_string()
}

/// Post-only accounting: debit `actual` without a reservation (201).
pub async fn create_event(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = tenant_caller(app, ctx, req).await?;
    let (r, raw) = parse::<EventCreateRequest>(req)?;
    check_subject_tenant(&r.subject, &caller)?;
    let scopes = derive_scopes(&r.subject);
    let keys = TenantKeys::new(&caller.tenant);
    let unit = r.actual.unit;
    let mut script_keys = vec![
        keys.tenant(),
        keys.api_key(&caller.key_id),
        keys.idempotency("event", &[&r.idempotency_key]),
        keys.scope_units(),
        keys.events(),
    ];
    script_keys.extend(scopes.iter().map(|s| keys.budget(s, unit)));
    let mut args = vec![
        caller.digest.clone(),
        Permission::ReservationsCommit.accepted().to_string(),
        payload_hash(&raw, &[]),
        format!("evt_{}", crate::ids::random_uuid().simple()),
        unit.as_str().to_string(),
        r.actual.amount.to_string(),
        r.overage_policy.map(|p| p.as_str().to_string()).unwrap_or_default(),
        app.config.retention.as_millis().to_string(),
        event_context(ctx, Some(&caller), &caller.tenant),
        String::from_utf8_lossy(&req.body).into_owned(),
    ];
    args.extend(scopes.iter().map(|s| format!("{s}|{}", budget_code(s, unit))));
    let reply = app.store.run(&scripts::EVENT, &script_keys, &args).await?;
    let res = &reply.result;
    if res.len() < 3 {
        return Err(ApiError::internal("Malformed event result"));
    }
    let codes = split_codes(&res[2]);
    let budgeted = budgeted_scopes(&r.subject, unit, &codes);
    Ok(Answer::json(
        201,
        &EventCreateResponse {
            status: "APPLIED",
            event_id: res[0].clone(),
            charged: if res[1].is_empty() { None } else { Some(Amount { unit, amount: int(&res[1])? }) },
            balances: Some(balances(&budgeted, unit, &res[3..])?),
        },
    ))
}

/// The reservation a `{reservation_id}` route addresses, with the caller's auth arguments.
struct Target {
    id: String,
    rid: ReservationId,
    keys: TenantKeys,
    /// The key record the script checks (for admin calls: any key of the slot, unchecked).
    auth_key: String,
    digest: String,
    admin: bool,
    /// The tenant key behind the call (None for admin-key calls).
    caller: Option<TenantCaller>,
}

impl Target {
    fn budget_keys(&self) -> impl Iterator<Item = String> + '_ {
        self.rid.budget_codes.iter().map(|c| self.keys.budget_by_code(c))
    }
}

/// Resolves the path's reservation: 400 for a bad id, 404 when it cannot exist, and for a
/// reservation of another tenant 403 (after verifying the caller's key) or 404.
async fn target(app: &App, principal: Principal, params: &Params, permission: Permission) -> ApiResult<Target> {
    let id = params.get("reservation_id").cloned().unwrap_or_default();
    let n = id.chars().count();
    if n == 0 || n > 128 {
        return Err(ApiError::invalid(format!("reservation_id must be 1 to 128 characters (got {n})")));
    }
    Ok(match principal {
        Principal::Admin => {
            let rid = ReservationId::parse(&id).ok_or_else(reservation_not_found)?;
            let keys = TenantKeys::new(&rid.tenant);
            Target { auth_key: keys.tenant(), keys, rid, id, digest: String::new(), admin: true, caller: None }
        }
        Principal::Tenant(c) => {
            let keys = TenantKeys::new(&c.tenant);
            let auth_key = keys.api_key(&c.key_id);
            let Some(rid) = ReservationId::parse(&id) else {
                verify_key(app, &auth_key, &c, permission).await?;
                return Err(reservation_not_found());
            };
            if rid.tenant != c.tenant {
                verify_key(app, &auth_key, &c, permission).await?;
                return Err(foreign_reservation(app, &rid).await?);
            }
            Target { keys, rid, id, auth_key, digest: c.digest.clone(), admin: false, caller: Some(c) }
        }
    })
}

fn reservation_not_found() -> ApiError {
    ApiError::not_found("Reservation not found")
}

async fn verify_key(app: &App, auth_key: &str, c: &TenantCaller, p: Permission) -> ApiResult<()> {
    let args = [c.digest.clone(), p.accepted().to_string()];
    app.store.run(&scripts::AUTHENTICATE, &[auth_key.to_string()], &args).await.map(|_| ())
}

/// 403 when the id names an existing reservation of another tenant, else 404.
async fn foreign_reservation(app: &App, rid: &ReservationId) -> ApiResult<ApiError> {
    use redis::AsyncCommands;
    let key = TenantKeys::new(&rid.tenant).reservation(&rid.token);
    let record: Option<String> = app.store.conn().get(key).await?;
    let codes =
        record.and_then(|r| serde_json::from_str::<Value>(&r).ok()).and_then(|r| r["codes"].as_str().map(String::from));
    Ok(if codes == Some(rid.budget_codes.concat()) {
        ApiError::forbidden("Reservation belongs to another tenant")
    } else {
        reservation_not_found()
    })
}

pub async fn commit(app: &App, ctx: &mut Ctx, req: &ApiRequest, params: &Params) -> ApiResult<Answer> {
    let principal = authenticate(app, ctx, req, false).await?;
    let (r, raw) = parse::<CommitRequest>(req)?;
    let t = target(app, principal, params, Permission::ReservationsCommit).await?;
    let mut keys = vec![
        t.keys.tenant(),
        t.auth_key.clone(),
        t.keys.reservation(&t.rid.token),
        t.keys.expiry_index(),
        t.keys.events(),
        t.keys.listing_index(),
        t.keys.reservation_metadata(&t.rid.token),
    ];
    keys.extend(t.budget_keys());
    let args = [
        t.digest.clone(),
        Permission::ReservationsCommit.accepted().to_string(),
        t.id.clone(),
        r.idempotency_key.clone(),
        payload_hash(&raw, &[]),
        r.actual.unit.as_str().to_string(),
        r.actual.amount.to_string(),
        json_or_empty(&r.metrics),
        json_or_empty(&r.metadata),
        retention_ms(app),
        event_context(ctx, t.caller.as_ref(), &t.rid.tenant),
    ];
    let reply = app.store.run(&scripts::COMMIT, &keys, &args).await?;
    let res = &reply.result;
    if res.len() < 2 {
        return Err(ApiError::internal("Malformed commit result"));
    }
    let (subject, unit) = reservation_context(&reply)?;
    let budgeted = budgeted_scopes(&subject, unit, &t.rid.budget_codes);
    Ok(Answer::json(
        200,
        &CommitResponse {
            status: "COMMITTED",
            charged: Amount { unit, amount: int(&res[0])? },
            released: if res[1].is_empty() { None } else { Some(Amount { unit, amount: int(&res[1])? }) },
            balances: Some(balances(&budgeted, unit, &res[2..])?),
        },
    ))
}

/// Authenticates before the body is parsed (401 precedes 400) and records the tenant.
async fn authenticate(app: &App, ctx: &mut Ctx, req: &ApiRequest, admin_allowed: bool) -> ApiResult<Principal> {
    let principal = app.authenticate(&req.headers, admin_allowed).await?;
    if let Principal::Tenant(c) = &principal {
        ctx.tenant = Some(c.tenant.clone());
    }
    Ok(principal)
}

pub async fn release(app: &App, ctx: &mut Ctx, req: &ApiRequest, params: &Params) -> ApiResult<Answer> {
    let principal = authenticate(app, ctx, req, true).await?;
    let (r, raw) = parse::<ReleaseRequest>(req)?;
    let t = target(app, principal, params, Permission::ReservationsRelease).await?;
    let audit = if t.admin {
        json!({
            "tenant_id": t.rid.tenant,
            "operation": "releaseReservation",
            "resource_type": "reservation",
            "resource_id": t.id,
            "status": 200,
            "actor_type": "admin_on_behalf_of",
            "reason": r.reason,
            "request_id": ctx.request_id,
            "trace_id": ctx.trace.trace_id,
            "user_agent": req.headers.get("user-agent").and_then(|v| v.to_str().ok()),
        })
        .to_string()
    } else {
        String::new()
    };
    let mut keys = vec![
        t.keys.tenant(),
        t.auth_key.clone(),
        t.keys.reservation(&t.rid.token),
        t.keys.expiry_index(),
        t.keys.audit_log(),
        t.keys.events(),
        t.keys.listing_index(),
        t.keys.reservation_metadata(&t.rid.token),
    ];
    keys.extend(t.budget_keys());
    let args = [
        t.digest.clone(),
        Permission::ReservationsRelease.accepted().to_string(),
        t.id.clone(),
        r.idempotency_key.clone(),
        payload_hash(&raw, &[]),
        r.reason.clone().unwrap_or_default(),
        retention_ms(app),
        audit,
    ];
    let reply = app.store.run(&scripts::RELEASE, &keys, &args).await?;
    let res = &reply.result;
    if res.is_empty() {
        return Err(ApiError::internal("Malformed release result"));
    }
    let (subject, unit) = reservation_context(&reply)?;
    let budgeted = budgeted_scopes(&subject, unit, &t.rid.budget_codes);
    Ok(Answer::json(
        200,
        &ReleaseResponse {
            status: "RELEASED",
            released: Amount { unit, amount: int(&res[0])? },
            balances: Some(balances(&budgeted, unit, &res[1..])?),
        },
    ))
}

pub async fn extend(app: &App, ctx: &mut Ctx, req: &ApiRequest, params: &Params) -> ApiResult<Answer> {
    let principal = authenticate(app, ctx, req, false).await?;
    let (r, raw) = parse::<ReservationExtendRequest>(req)?;
    let t = target(app, principal, params, Permission::ReservationsExtend).await?;
    let mut keys = vec![
        t.keys.tenant(),
        t.auth_key.clone(),
        t.keys.reservation(&t.rid.token),
        t.keys.expiry_index(),
        t.keys.idempotency("extend", &[&t.id, &r.idempotency_key]),
        t.keys.events(),
        t.keys.listing_index(),
        t.keys.reservation_metadata(&t.rid.token),
    ];
    keys.extend(t.budget_keys());
    let args = [
        t.digest.clone(),
        Permission::ReservationsExtend.accepted().to_string(),
        t.id.clone(),
        payload_hash(&raw, &[]),
        r.extend_by_ms.to_string(),
        retention_ms(app),
    ];
    let reply = app.store.run(&scripts::EXTEND, &keys, &args).await?;
    let expires_at_ms = int(reply.result.first().ok_or_else(|| ApiError::internal("Malformed extend result"))?)?;
    Ok(Answer::json(
        200,
        &ReservationExtendResponse {
            status: "ACTIVE",
            expires_at_ms,
            remaining_ttl_ms: Some(remaining_ttl(&reply, expires_at_ms)),
            balances: None,
        },
    ))
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest, params: &Params) -> ApiResult<Answer> {
    let principal = authenticate(app, ctx, req, true).await?;
    let t = target(app, principal, params, Permission::ReservationsList).await?;
    let res_key = t.keys.reservation(&t.rid.token);
    let auth_key = if t.admin { res_key.clone() } else { t.auth_key.clone() };
    let keys = [auth_key, res_key, t.keys.reservation_metadata(&t.rid.token)];
    let args = [t.digest.clone(), Permission::ReservationsList.accepted().to_string(), t.id.clone()];
    let reply = app.store.run(&scripts::GET_RESERVATION, &keys, &args).await?;
    if reply.status == "OVERDUE" {
        // Expire it now, as every touch does; if the store refuses the write, the sweep will.
        let opts = app.config.sweep_options();
        if let Err(e) = expire_reservations(&app.store, &t.rid.tenant, std::slice::from_ref(&t.id), &opts).await {
            tracing::warn!(error = %e.message, reservation_id = %t.id, "could not expire an overdue reservation on read");
        }
        return Err(ApiError::new(crate::error::ErrorCode::ReservationExpired, "Reservation has expired"));
    }
    let f = &reply.result;
    if f.len() != 13 {
        return Err(ApiError::internal("Malformed reservation record"));
    }
    let bad = || ApiError::internal("Malformed reservation record");
    let unit = Unit::parse(&f[4]).ok_or_else(bad)?;
    let subject: Subject = serde_json::from_str(&f[2]).map_err(|_| bad())?;
    let scopes = derive_scopes(&subject);
    let optional_json = |s: &str| {
        if s.is_empty() {
            None
        } else {
            serde_json::from_str::<Value>(s).ok()
        }
    };
    let optional_int = |s: &str| {
        if s.is_empty() {
            Ok(None)
        } else {
            int(s).map(Some)
        }
    };
    let committed = if f[0] == "COMMITTED" { optional_int(&f[6])?.map(|amount| Amount { unit, amount }) } else { None };
    Ok(Answer::json(
        200,
        &ReservationDetail {
            reservation_id: t.id.clone(),
            status: f[0].clone(),
            idempotency_key: f[1].clone(),
            subject: serde_json::from_str(&f[2]).map_err(|_| bad())?,
            action: serde_json::from_str(&f[3]).map_err(|_| bad())?,
            reserved: Amount { unit, amount: int(&f[5])? },
            committed,
            created_at_ms: int(&f[7])?,
            expires_at_ms: int(&f[8])?,
            finalized_at_ms: optional_int(&f[9])?,
            scope_path: f[10].clone(),
            affected_scopes: scopes,
            metadata: optional_json(&f[11]),
            committed_metadata: optional_json(&f[12]),
        },
    ))
}
