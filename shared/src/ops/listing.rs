//! Listing reservations: walking an index in sort order, reading the records of the rows (never
//! their metadata) and, for `include`, their metadata; backfilling the listing index.

use serde::Deserialize;

use super::{lua_list, script};
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;

script! {
    /// One chunk of a listing: up to `count` members of each range of one index in sort order,
    /// after a position (`lua/list.lua`), with the key's scope filter. `walk` is `created` for
    /// the creation-time walk (the created stream, merged with `index`: the created index of
    /// before the stream), else `lex`.
    pub struct List = list read_only -> Ranges {
        keys: [auth, index, stream],
        args: [digest, accepted, order, count, walk; ranges],
    }
}

impl List {
    /// A chunk of `tenant`'s listing index (`listing`), else of its creation order, checked
    /// against `auth_record` (`ops::auth::check_record`); the other arguments to be set.
    pub fn on(tenant: &str, auth_record: String, listing: bool) -> List {
        let keys = TenantKeys::new(tenant);
        List {
            auth: auth_record,
            index: if listing { keys.listing_index() } else { keys.created_index() },
            stream: keys.created_stream(),
            ..Default::default()
        }
    }
}

/// The raw records of some reservations of `tenant` by token ('' where one is gone).
pub async fn records(store: &Store, tenant: &str, tokens: &[&str]) -> ApiResult<Vec<String>> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    let keys = TenantKeys::new(tenant);
    let records = tokens.iter().map(|t| keys.reservation(t)).collect();
    Ok(store.run(ReadRecords { records }).await?.value.records)
}

/// Metadata and commit metadata of some reservations of `tenant` by token.
pub async fn metadata(store: &Store, tenant: &str, tokens: &[&str]) -> ApiResult<Vec<MetadataRow>> {
    let keys = TenantKeys::new(tenant);
    let pairs = tokens.iter().flat_map(|t| [keys.reservation_metadata(t), keys.reservation(t)]).collect();
    Ok(store.run(ReadMetadata { pairs }).await?.value.rows)
}

#[derive(Debug, Clone, Deserialize)]
pub struct Ranges {
    #[serde(deserialize_with = "lua_list")]
    pub ranges: Vec<Members>,
    /// The key's scope filter (JSON array), when it has one.
    #[serde(default)]
    pub scope_filter: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(transparent)]
pub struct Members(#[serde(deserialize_with = "lua_list")] pub Vec<String>);

script! {
    /// The raw records of reservations ('' where one is gone), metadata cut out
    /// (`lua/read_records.lua`).
    pub struct ReadRecords = read_records read_only -> Records {
        keys: [; records],
        args: [],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Records {
    #[serde(deserialize_with = "lua_list")]
    pub records: Vec<String>,
}

script! {
    /// Metadata and commit metadata of reservations (`lua/read_metadata.lua`): `pairs` holds per
    /// reservation its metadata key, then its record key.
    pub struct ReadMetadata = read_metadata read_only -> MetadataRows {
        keys: [; pairs],
        args: [],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct MetadataRows {
    #[serde(deserialize_with = "lua_list")]
    pub rows: Vec<MetadataRow>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct MetadataRow {
    #[serde(default)]
    pub metadata: Option<String>,
    #[serde(default)]
    pub committed_metadata: Option<String>,
}

script! {
    /// Moves the listing members of up to `batch` finished reservations into the index's
    /// compact chunks (`lua/list_compact.lua`).
    pub struct Compact = list_compact -> Compacted {
        keys: [listing_index, listing_chunks],
        args: [batch],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Compacted {
    /// Finished reservations looked at (fewer than the batch: none is left to compact).
    pub looked: usize,
}

/// Finished reservations one compaction call looks at (a few ms of script time).
pub const COMPACT_BATCH: usize = 200;

/// Compacts `tenant`'s listing index, up to `batches` calls; answers the finished reservations
/// taken out of the index.
pub async fn compact(store: &Store, tenant: &str, batches: usize) -> ApiResult<usize> {
    let keys = TenantKeys::new(tenant);
    let mut moved = 0;
    for _ in 0..batches {
        let call = Compact {
            listing_index: keys.listing_index(),
            listing_chunks: keys.listing_chunks(),
            batch: COMPACT_BATCH.to_string(),
        };
        let looked = store.run(call).await?.value.looked;
        moved += looked;
        if looked < COMPACT_BATCH {
            break;
        }
    }
    Ok(moved)
}

script! {
    /// Writes the listing members of up to `batch` reservations created since the last flush,
    /// as their records stand (`lua/list_flush.lua`): an ended one's into the compact chunks
    /// when `pack` is "1", the others into the index.
    pub struct Flush = list_flush -> Flushed {
        keys: [listing_index, listing_chunks, created_stream, listing_flushed],
        args: [batch, pack],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Flushed {
    /// Whether created-stream entries beyond the batch wait.
    pub more: bool,
}

/// Reservations one flush call indexes at most (a few ms of script time, like a compaction's).
pub const FLUSH_BATCH: usize = 200;

/// Writes the listing members of `tenant`'s reservations created since the last flush, up to
/// `batches` calls, ended ones straight into the compact chunks when `pack` (compaction on);
/// answers whether the index caught up with the created stream.
pub async fn flush(store: &Store, tenant: &str, batches: usize, pack: bool) -> ApiResult<bool> {
    let keys = TenantKeys::new(tenant);
    for _ in 0..batches {
        let call = Flush {
            listing_index: keys.listing_index(),
            listing_chunks: keys.listing_chunks(),
            created_stream: keys.created_stream(),
            listing_flushed: keys.listing_flushed(),
            batch: FLUSH_BATCH.to_string(),
            pack: if pack { "1" } else { "" }.to_string(),
        };
        if !store.run(call).await?.value.more {
            return Ok(true);
        }
    }
    Ok(false)
}

script! {
    /// Puts reservations written before the listing index into it (`lua/list_backfill.lua`).
    pub struct Backfill = list_backfill -> super::Nothing {
        keys: [listing_index; records],
        args: [; members],
    }
}
