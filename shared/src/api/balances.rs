//! `GET /v1/balances` (runtime contract): the effective tenant's ledgers whose scope contains
//! every supplied subject segment, in a stable order (scope, unit) with opaque cursors.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;

use super::auth::Caller;
use super::{parse_limit, parse_query, query_bool, Answer, ApiRequest, App, Ctx};
use crate::domain::Permission;
use crate::error::{ApiError, ApiResult};
use crate::keys::digest;
use crate::model::{Balance, Unit};
use crate::ops::ledgers::{self, MaybeLedger};

const FILTERS: [&str; 6] = ["tenant", "workspace", "app", "workflow", "agent", "toolset"];

#[derive(serde::Serialize)]
struct BalanceResponse {
    balances: Vec<Balance>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
    has_more: bool,
}

/// A cursor: the last (scope, unit) served, bound to the filters that produced it.
fn encode_cursor(scope: &str, unit: &str, filters: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}\n{scope}\n{unit}", digest(&[filters])))
}

fn decode_cursor(cursor: &str, filters: &str) -> ApiResult<(String, String)> {
    let bad = || ApiError::invalid("cursor is malformed or was issued for different filters");
    let raw = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let mut parts = text.split('\n');
    let (hash, scope, unit) =
        (parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?, parts.next().ok_or_else(bad)?);
    if hash != digest(&[filters]) {
        return Err(bad());
    }
    Ok((scope.to_string(), unit.to_string()))
}

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let caller = match app.authenticate(ctx, req, false).await? {
        Caller::Tenant(c) => c,
        Caller::Admin => return Err(super::auth::rejected(super::auth::unauthorized(), "API_KEY_REQUIRED")),
    };
    ctx.act_for(&caller.tenant)?;
    let query = parse_query(&req.query)?;
    let given = |name: &str| query.get(name).filter(|v| !v.is_empty());
    if FILTERS.iter().all(|f| given(f).is_none()) {
        return Err(ApiError::invalid("at least one of tenant, workspace, app, workflow, agent, toolset is required"));
    }
    if let Some(t) = given("tenant") {
        if *t != caller.tenant {
            return Err(ApiError::forbidden("tenant does not match the tenant of the API key"));
        }
    }
    let limit = parse_limit(query.get("limit"), 200)?;
    // include_children may be ignored in v0 (every matching ledger is listed), but must be a boolean.
    query_bool(query.get("include_children").map(String::as_str), "include_children")?;
    // Each supplied filter must appear as a whole `level:value` segment (case-insensitive).
    let segments: Vec<String> =
        FILTERS.iter().filter_map(|f| given(f).map(|v| format!("{f}:{}", v.to_ascii_lowercase()))).collect();
    let filter_key = segments.join("/");

    let accepted = Permission::BalancesRead.accepted();
    let listed = ledgers::listed(&app.store, &caller.tenant, &caller.key_id, &caller.digest, accepted).await?;
    let mut ledgers: Vec<(String, Unit)> = listed
        .into_iter()
        .filter(|(scope, _)| segments.iter().all(|s| scope.split('/').any(|seg| seg == s)))
        .flat_map(|(scope, units)| {
            units.split(',').filter_map(Unit::parse).map(|u| (scope.clone(), u)).collect::<Vec<_>>()
        })
        .collect();
    ledgers.sort_by(|a, b| (a.0.as_str(), a.1.as_str()).cmp(&(b.0.as_str(), b.1.as_str())));
    if let Some(cursor) = query.get("cursor").filter(|c| !c.is_empty()) {
        let (scope, unit) = decode_cursor(cursor, &filter_key)?;
        ledgers.retain(|(s, u)| (s.as_str(), u.as_str()) > (scope.as_str(), unit.as_str()));
    }
    let has_more = ledgers.len() > limit;
    ledgers.truncate(limit);

    let states = ledgers::states(&app.store, &caller.tenant, &ledgers).await?;
    let mut balances = Vec::with_capacity(ledgers.len());
    for ((scope, unit), state) in ledgers.iter().zip(states) {
        // a ledger removed between the two reads is left out
        if let MaybeLedger::Present(state) = state {
            balances.push(state.balance(scope, *unit));
        }
    }
    let next_cursor = match (has_more, ledgers.last()) {
        (true, Some((scope, unit))) => Some(encode_cursor(scope, unit.as_str(), &filter_key)),
        _ => None,
    };
    Ok(Answer::json(200, &BalanceResponse { balances, has_more: next_cursor.is_some(), next_cursor }))
}
