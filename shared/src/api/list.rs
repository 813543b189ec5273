//! `GET /v1/reservations`: every filter of protocol.md §6, sorted with opaque cursors bound to
//! the filters. The default order (created_at) walks the per-tenant lexicographic index from
//! the cursor, so a page costs the same at 1,000 or 1,000,000 reservations; other sort keys
//! load the tenant's matching rows and sort them in memory.

use std::cmp::Ordering;
use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::Principal;
use super::{parse_limit, parse_query, Answer, ApiRequest, App, Ctx};
use crate::domain::{derive_scopes, parse_rfc3339_ms, scope_admitted, Permission};
use crate::error::{ApiError, ApiResult};
use crate::keys::{digest, TenantKeys};
use crate::model::{Amount, Subject, Unit};
use crate::store::scripts;

const SUBJECT_FILTERS: [&str; 5] = ["workspace", "app", "workflow", "agent", "toolset"];
const SORT_KEYS: [&str; 7] =
    ["reservation_id", "tenant", "scope_path", "status", "reserved", "created_at_ms", "expires_at_ms"];
const STATUSES: [&str; 4] = ["ACTIVE", "COMMITTED", "RELEASED", "EXPIRED"];
/// Index entries examined per request at most (a page may end early, with a cursor).
const SCAN_BUDGET: usize = 5_000;

#[derive(Serialize)]
struct Summary {
    reservation_id: String,
    status: String,
    idempotency_key: String,
    subject: Value,
    action: Value,
    reserved: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    committed: Option<Amount>,
    created_at_ms: i64,
    expires_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    finalized_at_ms: Option<i64>,
    scope_path: String,
    affected_scopes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    committed_metadata: Option<Value>,
}

#[derive(Serialize)]
struct ListResponse {
    reservations: Vec<Summary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
    has_more: bool,
}

/// Cursor contents (base64url JSON): version, sort, filter hash, last sort value and id.
#[derive(Serialize, Deserialize)]
struct Cursor {
    v: u8,
    sb: String,
    sd: String,
    fh: String,
    lsv: Value,
    lrid: String,
}

/// A reservation row with what filtering and sorting need.
struct Row {
    summary: Summary,
    tenant_of_subject: Option<String>,
}

struct Query {
    status: Option<String>,
    segments: Vec<String>,
    idempotency_key: Option<String>,
    created: (Option<i64>, Option<i64>),
    expires: (Option<i64>, Option<i64>),
    finalized: (Option<i64>, Option<i64>),
    sort_by: String,
    desc: bool,
    include: Vec<String>,
    limit: usize,
    cursor: Option<Cursor>,
    filter_hash: String,
}

fn window(q: &HashMap<String, String>, from: &str, to: &str) -> ApiResult<(Option<i64>, Option<i64>)> {
    let bound = |name: &str| -> ApiResult<Option<i64>> {
        match q.get(name).map(|v| v.trim()).filter(|v| !v.is_empty()) {
            None => Ok(None),
            Some(v) => parse_rfc3339_ms(v)
                .map(Some)
                .ok_or_else(|| ApiError::invalid(format!("{name} must be an RFC 3339 date-time (got {v:?})"))),
        }
    };
    let (a, b) = (bound(from)?, bound(to)?);
    if let (Some(a), Some(b)) = (a, b) {
        if a > b {
            return Err(ApiError::invalid(format!("{from} must not be after {to}")));
        }
    }
    Ok((a, b))
}

impl Query {
    fn parse(q: &HashMap<String, String>, tenant: &str) -> ApiResult<Query> {
        // Blank subject filters and date bounds mean "absent" (P-109); a blank status, sort,
        // limit or idempotency_key is an invalid value of its type.
        let given = |name: &str| q.get(name).map(|v| v.as_str()).filter(|v| !v.is_empty());
        let status = match q.get("status").map(String::as_str) {
            Some(s) if STATUSES.contains(&s) => Some(s.to_string()),
            Some(s) => {
                return Err(ApiError::invalid(format!("status must be one of {} (got {s:?})", STATUSES.join(", "))))
            }
            None => None,
        };
        let segments: Vec<String> = SUBJECT_FILTERS
            .iter()
            .filter_map(|f| given(f).map(|v| format!("{f}:{}", v.to_ascii_lowercase())))
            .collect();
        let idempotency_key = q.get("idempotency_key").cloned();
        if idempotency_key.as_ref().is_some_and(|k| k.is_empty() || k.chars().count() > 256) {
            return Err(ApiError::invalid("idempotency_key must be 1 to 256 characters"));
        }
        let created = window(q, "from", "to")?;
        let expires = window(q, "expires_from", "expires_to")?;
        let finalized = window(q, "finalized_from", "finalized_to")?;
        let sort_given = q.get("sort_by").map(|s| s.to_ascii_lowercase());
        if let Some(s) = &sort_given {
            if !SORT_KEYS.contains(&s.as_str()) {
                return Err(ApiError::invalid(format!("sort_by must be one of {}", SORT_KEYS.join(", "))));
            }
        }
        let dir_given = q.get("sort_dir").map(|s| s.to_ascii_lowercase());
        let desc = match dir_given.as_deref() {
            None | Some("desc") => true,
            Some("asc") => false,
            Some(d) => return Err(ApiError::invalid(format!("sort_dir must be asc or desc (got {d:?})"))),
        };
        let include = given("include")
            .map(|v| v.split(',').map(|t| t.trim().to_ascii_lowercase()).filter(|t| !t.is_empty()).collect())
            .unwrap_or_default();
        let limit = parse_limit(q.get("limit"), 200)?;
        // The cursor is bound to everything that selects or orders rows (not include/limit).
        let filter_hash = digest(&[
            tenant,
            status.as_deref().unwrap_or(""),
            &segments.join("/"),
            idempotency_key.as_deref().unwrap_or(""),
            &format!("{created:?}{expires:?}{finalized:?}"),
        ]);
        let mut query = Query {
            status,
            segments,
            idempotency_key,
            created,
            expires,
            finalized,
            sort_by: sort_given.clone().unwrap_or_else(|| "created_at_ms".to_string()),
            desc,
            include,
            limit,
            cursor: None,
            filter_hash,
        };
        if let Some(raw) = given("cursor") {
            let bad = || ApiError::invalid("cursor is malformed");
            let bytes = URL_SAFE_NO_PAD.decode(raw).map_err(|_| bad())?;
            let cursor: Cursor = serde_json::from_slice(&bytes).map_err(|_| bad())?;
            if cursor.v != 1 || cursor.fh != query.filter_hash {
                return Err(ApiError::invalid("cursor was issued for different filters"));
            }
            let sort_mismatch = sort_given.as_ref().is_some_and(|s| *s != cursor.sb)
                || dir_given.as_ref().is_some_and(|d| *d != cursor.sd);
            if sort_mismatch || !SORT_KEYS.contains(&cursor.sb.as_str()) {
                return Err(ApiError::invalid("cursor was issued for a different sort"));
            }
            query.sort_by = cursor.sb.clone();
            query.desc = cursor.sd == "desc";
            query.cursor = Some(cursor);
        }
        Ok(query)
    }

    fn in_window(value: Option<i64>, (from, to): (Option<i64>, Option<i64>)) -> bool {
        match value {
            Some(v) => from.is_none_or(|f| v >= f) && to.is_none_or(|t| v <= t),
            None => from.is_none() && to.is_none(),
        }
    }

    fn matches(&self, row: &Row) -> bool {
        let s = &row.summary;
        self.status.as_ref().is_none_or(|st| *st == s.status)
            && self.idempotency_key.as_ref().is_none_or(|k| *k == s.idempotency_key)
            && self.segments.iter().all(|seg| s.scope_path.split('/').any(|p| p == seg))
            && Self::in_window(Some(s.created_at_ms), self.created)
            && Self::in_window(Some(s.expires_at_ms), self.expires)
            && Self::in_window(s.finalized_at_ms, self.finalized)
    }

    /// The sort value of a row; `None` is a missing value (only `tenant` can be missing).
    fn sort_value(&self, row: &Row) -> Option<Value> {
        let s = &row.summary;
        Some(match self.sort_by.as_str() {
            "reservation_id" => Value::from(s.reservation_id.clone()),
            "tenant" => Value::from(row.tenant_of_subject.clone()?),
            "scope_path" => Value::from(s.scope_path.clone()),
            "status" => Value::from(s.status.clone()),
            "reserved" => Value::from(s.reserved.amount),
            "expires_at_ms" => Value::from(s.expires_at_ms),
            _ => Value::from(s.created_at_ms),
        })
    }
}

/// Total order of rows: sort value in the requested direction (missing values last in asc,
/// first in desc), ties by reservation id ascending.
fn compare(q: &Query, a: &(Option<Value>, String), b: &(Option<Value>, String)) -> Ordering {
    let by_value = match (&a.0, &b.0) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Greater,
        (Some(_), None) => Ordering::Less,
        (Some(x), Some(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i.cmp(&j),
            _ => x.as_str().unwrap_or("").cmp(y.as_str().unwrap_or("")),
        },
    };
    let by_value = if q.desc { by_value.reverse() } else { by_value };
    by_value.then_with(|| a.1.cmp(&b.1))
}

fn row_from_record(tenant: &str, token: &str, raw: &str, include: &[String]) -> Option<Row> {
    let rec: Value = serde_json::from_str(raw).ok()?;
    let field = |f: &str| rec[f].as_str();
    let int = |f: &str| field(f).and_then(|v| v.parse::<i64>().ok());
    let unit = Unit::parse(field("unit")?)?;
    let subject_raw = field("subject")?;
    let subject: Subject = serde_json::from_str(subject_raw).ok()?;
    let scopes = derive_scopes(&subject);
    let status = field("status")?.to_string();
    let json_of = |f: &str| field(f).and_then(|v| serde_json::from_str::<Value>(v).ok());
    let wants = |t: &str| include.iter().any(|i| i == t);
    let summary = Summary {
        reservation_id: format!("{tenant}.{token}.{}", field("codes")?),
        idempotency_key: field("ik").unwrap_or_default().to_string(),
        subject: serde_json::from_str(subject_raw).ok()?,
        action: json_of("action")?,
        reserved: Amount { unit, amount: int("estimate")? },
        committed: if status == "COMMITTED" { int("charged").map(|amount| Amount { unit, amount }) } else { None },
        created_at_ms: int("created")?,
        expires_at_ms: int("expires")?,
        finalized_at_ms: if status == "COMMITTED" || status == "RELEASED" { int("finalized") } else { None },
        scope_path: scopes.last()?.clone(),
        affected_scopes: scopes,
        metadata: if wants("metadata") { json_of("metadata") } else { None },
        committed_metadata: if wants("committed_metadata") { json_of("cmeta") } else { None },
        status,
    };
    Some(Row { summary, tenant_of_subject: subject.tenant })
}

/// One chunk of the listing: up to `count` index members in order within `range` (read with
/// the caller's auth), each with its token and raw record ('' when the record is gone), and
/// the key's scope filter (rows outside it are never listed).
struct Chunk {
    entries: Vec<(String, String, String)>,
    scope_filter: Vec<String>,
}

impl Chunk {
    fn admits(&self, row: &Row) -> bool {
        scope_admitted(&self.scope_filter, &row.summary.scope_path)
    }
}

async fn chunk(
    app: &App,
    auth: &(String, String),
    keys: &TenantKeys,
    range: (&str, &str),
    desc: bool,
    count: usize,
) -> ApiResult<Chunk> {
    let args = [
        auth.1.clone(),
        Permission::ReservationsList.accepted().to_string(),
        range.0.to_string(),
        range.1.to_string(),
        if desc { "REV".to_string() } else { String::new() },
        count.to_string(),
    ];
    let reply = app.store.run(&scripts::LIST, &[auth.0.clone(), keys.created_index()], &args).await?;
    let scope_filter = reply.context.first().and_then(|f| serde_json::from_str(f).ok()).unwrap_or_default();
    let members = reply.result;
    if members.is_empty() {
        return Ok(Chunk { entries: Vec::new(), scope_filter });
    }
    let tokens: Vec<String> = members.iter().map(|m| m.get(13..).unwrap_or("").to_string()).collect();
    let record_keys: Vec<String> = tokens.iter().map(|t| keys.reservation(t)).collect();
    let raws = app.store.run(&scripts::READ_RECORDS, &record_keys, &[]).await?.result;
    let entries = members.into_iter().zip(tokens).zip(raws).map(|((m, t), r)| (m, t, r)).collect();
    Ok(Chunk { entries, scope_filter })
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let principal = app.authenticate(&req.headers, true).await?;
    let q = parse_query(&req.query)?;
    let given_tenant = q.get("tenant").filter(|t| !t.is_empty());
    let (tenant, auth) = match principal {
        Principal::Admin => {
            let tenant = given_tenant.ok_or_else(|| {
                ApiError::invalid("tenant query parameter is required when using admin key authentication")
            })?;
            (tenant.clone(), (TenantKeys::new(tenant).tenant(), String::new()))
        }
        Principal::Tenant(c) => {
            ctx.tenant = Some(c.tenant.clone());
            if given_tenant.is_some_and(|t| *t != c.tenant) {
                return Err(ApiError::forbidden("tenant does not match the tenant of the API key"));
            }
            let key = TenantKeys::new(&c.tenant).api_key(&c.key_id);
            (c.tenant, (key, c.digest))
        }
    };
    let query = Query::parse(&q, &tenant)?;
    let keys = TenantKeys::new(&tenant);
    let (rows, next) = if query.sort_by == "created_at_ms" {
        walk_index(app, &auth, &keys, &tenant, &query).await?
    } else {
        sort_all(app, &auth, &keys, &tenant, &query).await?
    };
    let next_cursor = next.map(|(lsv, lrid)| {
        let c = Cursor {
            v: 1,
            sb: query.sort_by.clone(),
            sd: if query.desc { "desc" } else { "asc" }.to_string(),
            fh: query.filter_hash.clone(),
            lsv,
            lrid,
        };
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&c).expect("serializable"))
    });
    let reservations = rows.into_iter().map(|r| r.summary).collect();
    Ok(Answer::json(200, &ListResponse { reservations, has_more: next_cursor.is_some(), next_cursor }))
}

type Page = (Vec<Row>, Option<(Value, String)>);

/// Default order: walk the created index from the cursor (or the window's edge).
async fn walk_index(
    app: &App,
    auth: &(String, String),
    keys: &TenantKeys,
    tenant: &str,
    query: &Query,
) -> ApiResult<Page> {
    let pad = |ms: i64| format!("{:013}", ms.max(0));
    let (lo, hi) = query.created;
    let lower = lo.map(|f| format!("[{}", pad(f))).unwrap_or_else(|| "-".to_string());
    let upper = hi.map(|t| format!("({}", pad(t + 1))).unwrap_or_else(|| "+".to_string());
    let mut position = query.cursor.as_ref().map(|c| {
        let token = c.lrid.split('.').nth(1).unwrap_or("");
        format!("({}{token}", pad(c.lsv.as_i64().unwrap_or(0)))
    });
    // First read just enough for a full page plus the look-ahead row; grow when filters skip rows.
    let mut size = query.limit + 1;
    let mut rows: Vec<Row> = Vec::new();
    let mut scanned = 0;
    loop {
        let (start, end) = match (&position, query.desc) {
            (Some(p), true) => (p.clone(), lower.clone()),
            (Some(p), false) => (p.clone(), upper.clone()),
            (None, true) => (upper.clone(), lower.clone()),
            (None, false) => (lower.clone(), upper.clone()),
        };
        let chunk = chunk(app, auth, keys, (&start, &end), query.desc, size).await?;
        let entries = &chunk.entries;
        for (member, token, raw) in entries {
            scanned += 1;
            position = Some(format!("({member}"));
            let row = row_from_record(tenant, token, raw, &query.include);
            if let Some(row) = row.filter(|r| query.matches(r) && chunk.admits(r)) {
                if rows.len() == query.limit {
                    // One more match exists: the page ends at the last row served.
                    let last = rows.last().expect("limit >= 1");
                    let next = (Value::from(last.summary.created_at_ms), last.summary.reservation_id.clone());
                    return Ok((rows, Some(next)));
                }
                rows.push(row);
            }
            if scanned >= SCAN_BUDGET && rows.len() < query.limit {
                // Scanned enough for one request: hand back a cursor at the scan position.
                let created: i64 = member.get(..13).and_then(|c| c.parse().ok()).unwrap_or(0);
                return Ok((rows, Some((Value::from(created), format!("{tenant}.{token}.")))));
            }
        }
        if entries.len() < size {
            return Ok((rows, None));
        }
        size = (size * 2).min(500);
    }
}

/// Other sort keys: load every matching row of the tenant, sort, and cut the page.
async fn sort_all(
    app: &App,
    auth: &(String, String),
    keys: &TenantKeys,
    tenant: &str,
    query: &Query,
) -> ApiResult<Page> {
    let mut rows = Vec::new();
    let mut position = "-".to_string();
    loop {
        let chunk = chunk(app, auth, keys, (&position, "+"), false, 500).await?;
        let entries = &chunk.entries;
        for (_, token, raw) in entries {
            let row = row_from_record(tenant, token, raw, &query.include);
            if let Some(row) = row.filter(|r| query.matches(r) && chunk.admits(r)) {
                rows.push(row);
            }
        }
        match entries.last() {
            Some((last, _, _)) if entries.len() == 500 => position = format!("({last}"),
            _ => break,
        }
    }
    let mut keyed: Vec<((Option<Value>, String), Row)> =
        rows.into_iter().map(|r| ((query.sort_value(&r), r.summary.reservation_id.clone()), r)).collect();
    keyed.sort_by(|a, b| compare(query, &a.0, &b.0));
    if let Some(c) = &query.cursor {
        let after = (if c.lsv.is_null() { None } else { Some(c.lsv.clone()) }, c.lrid.clone());
        keyed.retain(|(k, _)| compare(query, k, &after) == Ordering::Greater);
    }
    let more = keyed.len() > query.limit;
    keyed.truncate(query.limit);
    let next = if more { keyed.last().map(|(k, _)| (k.0.clone().unwrap_or(Value::Null), k.1.clone())) } else { None };
    Ok((keyed.into_iter().map(|(_, r)| r).collect(), next))
}
