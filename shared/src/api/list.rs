//! `GET /v1/reservations`: every filter of the spec's listReservations, sorted with opaque cursors bound to
//! the filters. Every sort order is a walk of an index from the cursor (created_at: the created
//! index; the others: ranges of the listing index, see `lua/lib/listing.lua`), so a page costs the same
//! at 1,000 or 1,000,000 reservations and never more than `SCAN_BUDGET` index entries: a
//! page that filters leave short ends early with a cursor where the walk stopped. Records are
//! read without their metadata; `include` reads it for the page's rows only.

use std::collections::HashMap;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::auth::Caller;
use super::{parse_limit, parse_query, Answer, ApiRequest, App, Ctx};
use crate::domain::{parse_rfc3339_ms, scope_admitted, Permission};
use crate::error::{ApiError, ApiResult};
use crate::keys::digest;
use crate::model::ReservationDetail;
use crate::ops::auth::{check_record, Authenticate};
use crate::ops::listing::{self, List};
use crate::ops::reservations::ReservationRecord;

const SUBJECT_FILTERS: [&str; 5] = ["workspace", "app", "workflow", "agent", "toolset"];
const SORT_KEYS: [&str; 7] =
    ["reservation_id", "tenant", "scope_path", "status", "reserved", "created_at_ms", "expires_at_ms"];
const STATUSES: [&str; 4] = ["ACTIVE", "COMMITTED", "RELEASED", "EXPIRED"];
/// Index entries examined per request at most (a page may end early, with a cursor).
pub const SCAN_BUDGET: usize = 1_000;
/// The answer when more reservations than `Config::listing_catch_up` wait to be indexed (the
/// sweep or the next listing catches up; a creation-time listing never waits).
const CATCHING_UP: &str =
    "The listing index is catching up with recently created reservations; retry shortly, or sort by created_at_ms";

#[derive(Serialize)]
struct ListResponse {
    reservations: Vec<ReservationDetail>,
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
    summary: ReservationDetail,
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
        // Blank subject filters and date bounds mean "absent"; a blank status, sort,
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
}

fn row_from_record(tenant: &str, token: &str, raw: &str) -> Option<Row> {
    let record = ReservationRecord::parse(raw)?;
    let summary = record.detail(tenant, token)?;
    // (the detail holds the subject, parsed and checked: it is not parsed again)
    let tenant_of_subject = summary.subject.get("tenant").and_then(Value::as_str).map(String::from);
    Some(Row { summary, tenant_of_subject })
}

/// One walk of an index: its ranges (several merged by token, or one), in one order.
struct Segment {
    ranges: Vec<Range>,
    order: &'static str,
    /// The tenant sort's groups: rows with (true) or without (false) `subject.tenant`.
    tenant_present: Option<bool>,
    /// The status of every row of a status-sort group.
    status: Option<&'static str>,
}

/// A lexicographic range of an index: its members start with `mark` (the listing index's
/// member kinds; '' for the created index) and lie within `lo`..`hi`.
struct Range {
    mark: String,
    lo: String,
    hi: String,
}

impl Range {
    /// Every member that starts with `mark` (up to the next mark, exclusive: an upper bound of
    /// byte 0xFF cannot travel in a UTF-8 argument).
    fn of(mark: &str) -> Range {
        let (head, last) = mark.split_at(mark.len() - 1);
        let next = char::from(last.as_bytes()[0] + 1);
        Range { mark: mark.to_string(), lo: format!("[{mark}"), hi: format!("({head}{next}") }
    }
}

const STATUS_MARKS: [(&str, &str); 4] = [("ACTIVE", "A"), ("COMMITTED", "C"), ("EXPIRED", "E"), ("RELEASED", "R")];

/// The status members' ranges of the listing index: per status, subjects with a tenant ("0")
/// and without ("1"); `keep` selects which.
fn status_ranges(keep: impl Fn(&str, &str) -> bool) -> Vec<Range> {
    let mut ranges = Vec::new();
    for (status, mark) in STATUS_MARKS {
        for tenant in ["0", "1"] {
            if keep(status, tenant) {
                ranges.push(Range::of(&format!("{mark}{tenant}")));
            }
        }
    }
    ranges
}

/// Where a walk stands: a segment and, within it, the member last served (its value part and
/// token; value parts include their range's mark).
#[derive(Clone)]
struct Position {
    segment: usize,
    value: String,
    token: String,
}

/// How a sort order walks the indexes: the index and its segments, in walk order.
fn plan(q: &Query) -> (bool, Vec<Segment>) {
    let one = |ranges: Vec<Range>, order| Segment { ranges, order, tenant_present: None, status: None };
    let ties_asc = if q.desc { "desc-ties-asc" } else { "asc" };

    let mut segments = match q.sort_by.as_str() {
        "created_at_ms" => {
            let pad = |ms: i64| format!("{:013}", ms.max(0));
            let (lo, hi) = q.created;
            let range = Range {
                mark: String::new(),
                lo: lo.map(|f| format!("[{}", pad(f))).unwrap_or_else(|| "-".to_string()),
                hi: hi.map(|t| format!("({}", pad(t + 1))).unwrap_or_else(|| "+".to_string()),
            };
            return (false, vec![one(vec![range], ties_asc)]);
        }
        "expires_at_ms" => vec![one(vec![Range::of("x")], ties_asc)],
        "reserved" => vec![one(vec![Range::of("r")], ties_asc)],
        "scope_path" => vec![one(vec![Range::of("p")], ties_asc)],
        "reservation_id" => vec![one(status_ranges(|_, _| true), if q.desc { "desc" } else { "asc" })],
        "status" => STATUS_MARKS
            .iter()
            .map(|(status, _)| Segment { status: Some(status), ..one(status_ranges(|s, _| s == *status), "asc") })
            .collect(),
        // tenant: rows with subject.tenant, then those without (the reverse when descending)
        _ => [("0", true), ("1", false)]
            .map(|(mark, present)| Segment {
                tenant_present: Some(present),
                ..one(status_ranges(|_, t| t == mark), "asc")
            })
            .into(),
    };
    if q.desc && segments.len() > 1 {
        segments.reverse();
    }
    (true, segments)
}

/// Decodes a cursor's last sort value and id into a walk position.
fn position_of(q: &Query, segments: &[Segment], c: &Cursor) -> ApiResult<Position> {
    let bad = || ApiError::invalid("cursor is malformed");
    let token = c.lrid.split('.').nth(1).filter(|t| t.len() == crate::ids::TOKEN_LEN).ok_or_else(bad)?.to_string();
    let int = |width: usize| c.lsv.as_i64().filter(|v| *v >= 0).map(|v| format!("{v:0width$}")).ok_or_else(bad);
    let (segment, value) = match q.sort_by.as_str() {
        "created_at_ms" => (0, int(13)?),
        "expires_at_ms" => (0, format!("x{}", int(13)?)),
        "reserved" => (0, format!("r{}", int(19)?)),
        "scope_path" => (0, format!("p{}\0", c.lsv.as_str().ok_or_else(bad)?)),
        "reservation_id" => (0, String::new()),
        "status" => {
            let status = c.lsv.as_str().ok_or_else(bad)?;
            (segments.iter().position(|s| s.status == Some(status)).ok_or_else(bad)?, String::new())
        }
        _ => (segments.iter().position(|s| s.tenant_present == Some(!c.lsv.is_null())).ok_or_else(bad)?, String::new()),
    };
    Ok(Position { segment, value, token })
}

/// The cursor's last sort value for a walk position (`tenant` of the row, when it has one).
fn sort_value(q: &Query, segments: &[Segment], p: &Position, tenant: &str) -> Value {
    let digits = |v: &str| v.trim_start_matches(['x', 'r']).parse::<i64>().map(Value::from).unwrap_or(Value::Null);
    match q.sort_by.as_str() {
        "created_at_ms" | "expires_at_ms" | "reserved" => digits(&p.value),
        "scope_path" => Value::from(p.value.trim_start_matches('p').trim_end_matches('\0')),
        "reservation_id" => Value::Null,
        "status" => Value::from(segments[p.segment].status.unwrap_or_default()),
        _ => match segments[p.segment].tenant_present {
            Some(true) => Value::from(tenant),
            _ => Value::Null,
        },
    }
}

/// Reads members of a segment after a position: each range is read in the segment's order
/// and, for several ranges, merged by token (the reservation id order). Returns up to `count`
/// members as (value part, token), and the key's scope filter.
async fn read_segment(
    app: &App,
    auth: &(String, String),
    tenant: &str,
    listing: bool,
    segment: &Segment,
    after: Option<&Position>,
    count: usize,
) -> ApiResult<(Vec<(String, String)>, Vec<String>)> {
    let mut call = List {
        digest: auth.1.clone(),
        accepted: Permission::ReservationsList.accepted().to_string(),
        order: segment.order.to_string(),
        count: count.to_string(),
        walk: if listing { "lex" } else { "created" }.to_string(),
        ranges: Vec::with_capacity(segment.ranges.len() * 3),
        ..List::on(tenant, auth.0.clone(), listing)
    };
    for range in &segment.ranges {
        let pos = match after {
            // merged ranges share the token order: each continues after the last token served
            Some(p) if segment.ranges.len() > 1 => format!("{}{}", range.mark, p.token),
            Some(p) => format!("{}{}", p.value, p.token),
            None => String::new(),
        };
        call.ranges.extend([range.lo.clone(), range.hi.clone(), pos]);
    }
    let reply = app.store.run(call).await?.value;
    let scope_filter = reply.scope_filter.and_then(|f| serde_json::from_str(&f).ok()).unwrap_or_default();
    let split = |m: String| {
        let at = m.len().saturating_sub(crate::ids::TOKEN_LEN);
        (m[..at].to_string(), m[at..].to_string())
    };
    let lists: Vec<Vec<(String, String)>> =
        reply.ranges.into_iter().map(|members| members.0.into_iter().map(split).collect()).collect();
    let mut merged: Vec<(String, String)> = lists.into_iter().flatten().collect();
    if segment.ranges.len() > 1 {
        merged.sort_by(|a, b| if segment.order == "desc" { b.1.cmp(&a.1) } else { a.1.cmp(&b.1) });
        merged.truncate(count);
    }
    Ok((merged, scope_filter))
}

pub async fn list(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    let principal = app.authenticate(ctx, req, true).await?;
    let q = parse_query(&req.query)?;
    let given_tenant = q.get("tenant").filter(|t| !t.is_empty());
    let (tenant, auth) = match principal {
        Caller::Admin => {
            let tenant = given_tenant.ok_or_else(|| {
                ApiError::invalid("tenant query parameter is required when using admin key authentication")
            })?;
            (tenant.clone(), (check_record(tenant, None), String::new()))
        }
        Caller::Tenant(c) => {
            ctx.act_for(&c.tenant)?;
            if given_tenant.is_some_and(|t| *t != c.tenant) {
                return Err(ApiError::forbidden("tenant does not match the tenant of the API key"));
            }
            let key = check_record(&c.tenant, Some(&c.key_id));
            (c.tenant, (key, c.digest))
        }
    };
    let query = Query::parse(&q, &tenant)?;
    let (mut rows, next) = walk(app, &auth, &tenant, &query).await?;
    if query.include.iter().any(|i| i == "metadata" || i == "committed_metadata") && !rows.is_empty() {
        attach_metadata(app, &tenant, &query, &mut rows).await?;
    }
    if query.include.iter().any(|i| i == "evidence")
        && !rows.is_empty()
        && super::evidence::enabled_for(app, &tenant).await?
    {
        let tokens: Vec<&str> =
            rows.iter().map(|r| r.summary.reservation_id.split('.').nth(1).unwrap_or("-")).collect();
        let found = crate::ops::evidence::of_reservations(&app.store, &tenant, &tokens).await?;
        for (row, ids) in rows.iter_mut().zip(found) {
            row.summary.evidence = super::evidence::reservation_refs(app, &ids);
        }
    }
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

/// `idempotency_key` names at most one reservation (its token derives from the key): read that
/// one record, whatever the sort.
async fn by_idempotency_key(
    app: &App,
    auth: &(String, String),
    tenant: &str,
    query: &Query,
    key: &str,
) -> ApiResult<Page> {
    let scope_filter: Vec<String> = if auth.1.is_empty() {
        Vec::new()
    } else {
        let check = Authenticate {
            api_key: auth.0.clone(),
            tenant: vec![],
            digest: auth.1.clone(),
            accepted: Permission::ReservationsList.accepted().to_string(),
        };
        app.store.run(check).await?.value.scope_filter
    };
    let token = crate::ids::ReservationId::token_for(key);
    let raw = listing::records(&app.store, tenant, &[&token]).await?;
    let row = raw.first().and_then(|raw| row_from_record(tenant, &token, raw));
    let row = row.filter(|r| query.matches(r) && scope_admitted(&scope_filter, &r.summary.scope_path));
    Ok((row.into_iter().collect(), None))
}

/// Walks the sort order's segments from the cursor: a page of rows that pass the filters, and
/// the cursor of the next page (after the last row served, or where the scan budget ran out).
async fn walk(app: &App, auth: &(String, String), tenant: &str, query: &Query) -> ApiResult<Page> {
    if let Some(key) = &query.idempotency_key {
        return by_idempotency_key(app, auth, tenant, query, key).await;
    }
    let (listing, segments) = plan(query);
    // A reserve writes no listing member: those of the reservations made since the sweep's
    // last visit are written first (`ops::listing::flush`), so the walk sees every one.
    let batches = app.config.listing_catch_up.div_ceil(listing::FLUSH_BATCH);
    if listing && !listing::flush(&app.store, tenant, batches, app.config.sweep_compact_listing).await? {
        return Err(ApiError::internal(CATCHING_UP).with_status(503));
    }
    let mut position = query.cursor.as_ref().map(|c| position_of(query, &segments, c)).transpose()?;
    let mut rows: Vec<Row> = Vec::new();
    let mut scanned = 0;
    let cursor_at = |p: &Position, row: Option<&Row>| {
        let id = row.map(|r| r.summary.reservation_id.clone()).unwrap_or_else(|| format!("{tenant}.{}.", p.token));
        (sort_value(query, &segments, p, tenant), id)
    };
    let mut served: Option<Position> = None;
    let first = position.as_ref().map_or(0, |p| p.segment);
    for (s, segment) in segments.iter().enumerate().skip(first) {
        let mut after = position.clone().filter(|p| p.segment == s);
        // First read just enough for a full page plus the look-ahead row; grow when filters skip rows.
        let mut size = query.limit + 1;
        loop {
            let (members, scope_filter) =
                read_segment(app, auth, tenant, listing, segment, after.as_ref(), size).await?;
            let tokens: Vec<&str> = members.iter().map(|(_, t)| t.as_str()).collect();
            let raws = listing::records(&app.store, tenant, &tokens).await?;
            for ((value, token), raw) in members.iter().zip(&raws) {
                scanned += 1;
                let here = Position { segment: s, value: value.clone(), token: token.clone() };
                let row = row_from_record(tenant, token, raw).filter(|r| {
                    query.matches(r)
                        && scope_admitted(&scope_filter, &r.summary.scope_path)
                        && segment.tenant_present.is_none_or(|p| r.tenant_of_subject.is_some() == p)
                });
                if let Some(row) = row {
                    if rows.len() == query.limit {
                        // One more match exists: the page ends at the last row served.
                        let next = cursor_at(served.as_ref().expect("limit >= 1"), rows.last());
                        return Ok((rows, Some(next)));
                    }
                    rows.push(row);
                    served = Some(here.clone());
                }
                position = Some(here);
                if scanned >= SCAN_BUDGET && rows.len() < query.limit {
                    // Scanned enough for one request: hand back a cursor at the scan position.
                    return Ok((rows, Some(cursor_at(position.as_ref().expect("just set"), None))));
                }
            }
            if members.len() < size {
                break;
            }
            after = position.clone();
            size = (size * 2).min(500);
        }
    }
    Ok((rows, None))
}

/// Reads metadata and commit metadata of the page's rows, as `include` asks.
async fn attach_metadata(app: &App, tenant: &str, query: &Query, rows: &mut [Row]) -> ApiResult<()> {
    let tokens: Vec<&str> = rows.iter().map(|r| r.summary.reservation_id.split('.').nth(1).unwrap_or("-")).collect();
    let found = listing::metadata(&app.store, tenant, &tokens).await?;
    let wants = |t: &str| query.include.iter().any(|i| i == t);
    let json = |s: &Option<String>| s.as_deref().and_then(|s| serde_json::from_str::<Value>(s).ok());
    for (row, meta) in rows.iter_mut().zip(found) {
        if wants("metadata") {
            row.summary.metadata = json(&meta.metadata);
        }
        if wants("committed_metadata") && row.summary.status == "COMMITTED" {
            row.summary.committed_metadata = json(&meta.committed_metadata);
        }
    }
    Ok(())
}
