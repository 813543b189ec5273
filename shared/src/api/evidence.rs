//! CyclesEvidence on the runtime plane: the public `GET /v1/evidence/{evidence_id}` and
//! `GET /v1/.well-known/cycles-jwks.json`, and the receipts the reservation handlers attach to
//! their answers (`cycles_evidence`) when the deployment and the tenant have evidence on.
//!
//! A receipt is made after the operation's own script: the envelope attests the request (as
//! the evidence mirrors define it) and the answer without its transport fields, is signed here
//! and stored in one more round trip. A replay answers with the reference of the first answer.

use std::time::Instant;

use serde_json::{json, Value};

use super::{throttle_public, Answer, ApiRequest, App, Ctx};
use crate::config::EvidenceMode;
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::ops::evidence::{self as store, Slot};

/// The fields of each evidence mirror (`cycles-evidence-v0.2.yaml`): the attested payload is
/// the wire object cut down to them (later fields, such as v0.1.26's, are not attested).
pub mod mirror {
    pub const DECISION_REQUEST: &[&str] = &["idempotency_key", "subject", "action", "estimate", "metadata"];
    pub const RESERVE_REQUEST: &[&str] = &[
        "idempotency_key",
        "subject",
        "action",
        "estimate",
        "ttl_ms",
        "grace_period_ms",
        "overage_policy",
        "dry_run",
        "metadata",
    ];
    pub const COMMIT_REQUEST: &[&str] = &["idempotency_key", "actual", "metrics", "metadata"];
    pub const RELEASE_REQUEST: &[&str] = &["idempotency_key", "reason"];
    pub const DECISION_RESPONSE: &[&str] = &["decision", "caps", "reason_code", "retry_after_ms", "affected_scopes"];
    pub const RESERVE_RESPONSE: &[&str] = &[
        "decision",
        "affected_scopes",
        "reservation_id",
        "reserved",
        "caps",
        "reason_code",
        "retry_after_ms",
        "expires_at_ms",
        "scope_path",
        "balances",
    ];
    pub const COMMIT_RESPONSE: &[&str] = &["status", "charged", "released", "balances"];
    pub const RELEASE_RESPONSE: &[&str] = &["status", "released", "balances"];
    pub const ERROR_RESPONSE: &[&str] = &["error", "message", "request_id", "trace_id", "details"];
    pub const ACTION: &[&str] = &["kind", "name", "tags"];
}

/// The error codes an `error` receipt is made for: denials reached by evaluating the request
/// (nothing is attested for a request refused before: validation, authentication, rate).
const ATTESTED_ERRORS: [ErrorCode; 9] = [
    ErrorCode::BudgetExceeded,
    ErrorCode::BudgetFrozen,
    ErrorCode::BudgetClosed,
    ErrorCode::OverdraftLimitExceeded,
    ErrorCode::DebtOutstanding,
    ErrorCode::UnitMismatch,
    ErrorCode::ReservationExpired,
    ErrorCode::ReservationFinalized,
    ErrorCode::TenantClosed,
];

/// A request body cut down to a mirror (its `action` to the Action mirror).
pub fn attested_request(body: &Value, fields: &[&str]) -> Value {
    let mut v = crate::evidence::project(body, fields);
    if let Some(a) = v.get("action").cloned() {
        v["action"] = crate::evidence::project(&a, mirror::ACTION);
    }
    v
}

/// Whether a tenant gets receipts: the deployment's mode, and the tenant's own
/// `evidence_enabled` (read at most once per `CYCLES_EVIDENCE_TENANT_CACHE_MS` per container).
pub async fn enabled_for(app: &App, tenant: &str) -> ApiResult<bool> {
    let e = &app.config.evidence;
    if !e.enabled() {
        return Ok(false);
    }
    let cached = app.evidence_switches.lock().expect("switch cache").get(tenant).copied();
    let switch = match cached {
        Some((value, at)) if at.elapsed() < e.tenant_cache => value,
        _ => {
            let value = store::tenant_switch(&app.store, tenant).await?;
            let mut cache = app.evidence_switches.lock().expect("switch cache");
            if cache.len() > 10_000 {
                cache.clear(); // bounded: a busy container re-reads at worst
            }
            cache.insert(tenant.to_string(), (value, Instant::now()));
            value
        }
    };
    Ok(match e.mode {
        EvidenceMode::On => switch != Some(false),
        EvidenceMode::Tenant => switch == Some(true),
        EvidenceMode::Off => false,
    })
}

/// The `CyclesEvidenceRef` of an envelope.
pub fn reference(app: &App, evidence_id: &str) -> Value {
    let server = app.config.evidence.signer.as_ref().map(|s| s.server_id.trim_end_matches('/')).unwrap_or("");
    json!({"evidence_id": evidence_id, "cycles_evidence_url": format!("{server}/evidence/{evidence_id}")})
}

/// A reservation's `ReservationEvidence` (None when it has no receipt).
pub fn reservation_refs(app: &App, ids: &std::collections::HashMap<String, String>) -> Option<Value> {
    let refs: serde_json::Map<String, Value> = ["reserve", "commit", "release"]
        .iter()
        .filter_map(|f| ids.get(*f).map(|id| (f.to_string(), reference(app, id))))
        .collect();
    (!refs.is_empty()).then_some(Value::Object(refs))
}

/// Signs and stores a receipt of `artifact` with `payload`; its reference, or None when it
/// could not be made (the answer stands without one: the operation happened; the cause is
/// logged).
async fn issue(app: &App, ctx: &Ctx, tenant: &str, artifact: &str, payload: Value, slot: &Slot) -> Option<Value> {
    let signer = app.config.evidence.signer.as_ref()?;
    let now = crate::domain::now_ms();
    let Some(sealed) = signer.seal(artifact, payload, now, &ctx.trace.trace_id) else {
        tracing::error!(request_id = %ctx.request_id, "no evidence signing key is in force; the answer carries no receipt");
        return None;
    };
    // with an archive, the envelope's id also goes to the tenant's evidence log (`jobs::export`)
    let archived = app.config.export.bucket.is_some().then_some(tenant);
    match store::save(&app.store, &sealed.evidence_id, &sealed.text, slot, app.config.evidence.retention, archived)
        .await
    {
        Ok(()) => Some(reference(app, &sealed.evidence_id)),
        Err(e) => {
            tracing::error!(request_id = %ctx.request_id, error = %e.message, cause = e.cause.as_deref().unwrap_or(""),
                "could not store an evidence envelope");
            None
        }
    }
}

/// The 200 answer of an operation of `tenant`, with `cycles_evidence` when the tenant gets
/// receipts: a replay's first reference (found at the slot `slot` names), else a fresh receipt
/// of `artifact` whose payload `payload` builds from the answer (before any transport field is
/// added). Without receipts the answer is serialized as it is, nothing more: not even the
/// slot's key (which may cost a digest).
#[allow(clippy::too_many_arguments)]
pub async fn answer<T: serde::Serialize>(
    app: &App,
    ctx: &Ctx,
    tenant: &str,
    replayed: bool,
    response: &T,
    artifact: &'static str,
    slot: impl FnOnce() -> Slot,
    payload: impl FnOnce(&Value) -> Value,
) -> Answer {
    // The operation has happened: a store that cannot tell the switch or the first receipt
    // costs the receipt (logged), never the answer.
    let quiet =
        |e: ApiError| tracing::warn!(request_id = %ctx.request_id, error = %e.message, "no receipt for this answer");
    if !enabled_for(app, tenant).await.unwrap_or_else(|e| {
        quiet(e);
        false
    }) {
        return Answer::json(200, response).replayed(replayed);
    }
    let mut body = serde_json::to_value(response).expect("responses serialize");
    let slot = slot();
    let reference = if replayed {
        match store::recorded(&app.store, &slot).await {
            Ok(id) => id.map(|id| reference(app, &id)),
            Err(e) => {
                quiet(e);
                None
            }
        }
    } else {
        issue(app, ctx, tenant, artifact, payload(&body), &slot).await
    };
    if let Some(r) = reference {
        body["cycles_evidence"] = r;
    }
    Answer::json(200, &body).replayed(replayed)
}

/// An `error` receipt for a denial of `endpoint` (the attested error body is the one the
/// caller gets, without `cycles_evidence`), carried by the error to its answer.
pub async fn on_error(
    app: &App,
    ctx: &Ctx,
    endpoint: &'static str,
    reservation_id: Option<&str>,
    request: &[u8],
    fields: &[&str],
    outcome: ApiResult<Answer>,
) -> ApiResult<Answer> {
    let Err(mut e) = outcome else { return outcome };
    let Some(tenant) = ctx.tenant.clone() else { return Err(e) };
    if !ATTESTED_ERRORS.contains(&e.code) || !enabled_for(app, &tenant).await.unwrap_or(false) {
        return Err(e);
    }
    let body = crate::evidence::project(&e.body(&ctx.request_id, &ctx.trace.trace_id), mirror::ERROR_RESPONSE);
    let mut payload = json!({"endpoint": endpoint, "http_status": e.status(), "response": body});
    if let Ok(mut req) = serde_json::from_slice::<Value>(request) {
        crate::model::without_nulls(&mut req);
        payload["request"] = attested_request(&req, fields);
    }
    if let Some(id) = reservation_id {
        payload["reservation_id"] = json!(id);
    }
    e.evidence = issue(app, ctx, &tenant, "error", payload, &Slot::None).await;
    Err(e)
}

/// `GET /v1/evidence/{evidence_id}` (getEvidence): public, the id is the capability; the
/// envelope as stored (JCS bytes), immutable.
pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let id = req.param("evidence_id");
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(ApiError::invalid("evidence_id must be 64 lowercase hex characters"));
    }
    throttle_public(app, ctx).await?;
    let not_found = || ApiError::not_found("No evidence envelope has this id");
    if !app.config.evidence.enabled() {
        return Err(not_found());
    }
    let text = store::read(&app.store, id).await?.ok_or_else(not_found)?;
    Ok(Answer::text(200, "application/json", text)
        .with_header("cache-control", "public, max-age=31536000, immutable".to_string()))
}

/// `GET /v1/.well-known/cycles-jwks.json` (getEvidenceJwks): the signer's keys, retired ones
/// included; 404 when this deployment signs nothing.
pub async fn jwks(app: &App, ctx: &mut Ctx, _req: &ApiRequest) -> ApiResult<Answer> {
    throttle_public(app, ctx).await?;
    let signer = match (&app.config.evidence.signer, app.config.evidence.enabled()) {
        (Some(s), true) => s,
        _ => return Err(ApiError::not_found("This server publishes no evidence key set")),
    };
    Ok(Answer::json(200, &signer.jwks(crate::domain::now_ms()))
        .with_header("cache-control", "public, max-age=300".to_string()))
}
