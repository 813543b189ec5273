//! Spend analytics: the usage log the charging scripts append to is folded into hour, day and
//! month rollups (`lua/lib/usage.lua`) by the sweep and before every report; a report reads a
//! bounded run of buckets per page (`domain::usage` makes its rows).

use serde::Deserialize;

use super::{lua_list, script};
use crate::config::UsageOptions;
use crate::domain::usage::{bucket_rows, Dim, Granularity, Row, Selection};
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;

script! {
    /// A bounded batch of the usage log folded into the rollups (`lua/usage_fold.lua`).
    pub struct FoldUsage = usage_fold -> Folded {
        keys: [usage_log],
        args: [max_groups, retention_ms, limit],
    }
}

script! {
    /// A page's buckets, after the key check and a fold (`lua/usage_read.lua`).
    pub struct ReadUsage = usage_read -> Buckets {
        keys: [api_key, usage_log; buckets],
        args: [digest, accepted, max_groups, retention_ms, fold_limit, max_fields],
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Folded {
    pub folded: u64,
    pub more: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Buckets {
    /// Each bucket read, in order: its groups and their values, alternating.
    #[serde(deserialize_with = "lua_list")]
    pub buckets: Vec<Fields>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Fields(#[serde(deserialize_with = "lua_list")] pub Vec<String>);

/// Entries folded per script call, by the sweep and before a report.
const FOLD_BATCH: usize = 2_000;
/// Fold calls per tenant per sweep visit (a tenant with more is due again at once).
const FOLD_CALLS: usize = 25;
/// Buckets one page reads at most, and groups (the bucket that passes it is the last).
pub const PAGE_BUCKETS: usize = 200;
pub const PAGE_GROUPS: usize = 20_000;

/// Folds a tenant's usage log (the sweep's visit): how many entries were folded.
pub async fn fold(store: &Store, tenant: &str, opts: UsageOptions) -> ApiResult<u64> {
    let keys = TenantKeys::new(tenant);
    let mut folded = 0;
    for _ in 0..FOLD_CALLS {
        let call = FoldUsage {
            usage_log: keys.usage_log(),
            max_groups: opts.max_groups.to_string(),
            retention_ms: opts.retention.as_millis().to_string(),
            limit: FOLD_BATCH.to_string(),
        };
        let batch = store.run(call).await?.value;
        folded += batch.folded;
        if !batch.more {
            break;
        }
    }
    Ok(folded)
}

/// What a report asks: its buckets (`first..=last`), groups, selection and page size.
#[derive(Debug, Clone)]
pub struct Report {
    pub granularity: Granularity,
    pub last: i64,
    pub dims: Vec<Dim>,
    pub selection: Selection,
    pub limit: usize,
}

/// Where a page starts: a bucket, and the rows of it already served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub bucket: i64,
    pub skip: usize,
}

/// A tenant API key's credentials (its scope filter then bounds the groups shown), or none for
/// an operator.
pub struct Reader<'a> {
    pub key_id: &'a str,
    pub digest: &'a str,
    pub accepted: &'a str,
}

/// One page of a report from `at`: at most `limit` rows, `PAGE_BUCKETS` buckets and (about)
/// `PAGE_GROUPS` groups read; the position of the next page, if any.
pub async fn page(
    store: &Store,
    tenant: &str,
    reader: Option<Reader<'_>>,
    report: &Report,
    at: Position,
    opts: UsageOptions,
) -> ApiResult<(Vec<Row>, Option<Position>)> {
    let keys = TenantKeys::new(tenant);
    let wanted: Vec<i64> = (at.bucket..=report.last).take(PAGE_BUCKETS).collect();
    let call = ReadUsage {
        api_key: keys.api_key(reader.as_ref().map_or("-", |r| r.key_id)),
        usage_log: keys.usage_log(),
        buckets: wanted.iter().map(|n| keys.usage_bucket(report.granularity.key_part(*n))).collect(),
        digest: reader.as_ref().map_or("", |r| r.digest).to_string(),
        accepted: reader.as_ref().map_or("", |r| r.accepted).to_string(),
        max_groups: opts.max_groups.to_string(),
        retention_ms: opts.retention.as_millis().to_string(),
        fold_limit: FOLD_BATCH.to_string(),
        max_fields: PAGE_GROUPS.to_string(),
    };
    let read = store.run(call).await?.value.buckets;
    let mut rows = Vec::new();
    for (i, fields) in read.iter().enumerate() {
        let bucket = wanted[i];
        let skip = if i == 0 { at.skip } else { 0 };
        let all = bucket_rows(bucket, &fields.0, &report.dims, &report.selection)?;
        let room = report.limit - rows.len();
        let rest = all.len().saturating_sub(skip);
        if rest > room {
            rows.extend(all.into_iter().skip(skip).take(room));
            return Ok((rows, Some(Position { bucket, skip: skip + room })));
        }
        rows.extend(all.into_iter().skip(skip));
        if rows.len() == report.limit {
            let next = bucket + 1;
            return Ok((rows, (next <= report.last).then_some(Position { bucket: next, skip: 0 })));
        }
    }
    let next = at.bucket + read.len() as i64;
    Ok((rows, (next <= report.last).then_some(Position { bucket: next, skip: 0 })))
}
