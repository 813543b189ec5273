//! The export's cursors: where each owner's streams stand in the archive (`jobs::export`).

use serde::Deserialize;

use super::script;
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;

script! {
    /// The export cursor of one stream (`lua/export_mark.lua`): `mode` begin, finish or advance.
    pub struct MarkExport = export_mark -> ExportCursor {
        keys: [state],
        args: [mode, done, last],
    }
}

/// Where an export stands: the last entry id exported ('' for none) and the batch pending.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ExportCursor {
    pub done: String,
    pub pending: String,
}

/// Where `owner`'s `stream` stands (one read; moving it takes `mark`).
pub async fn cursor(store: &Store, owner: &str, stream: &str) -> ApiResult<ExportCursor> {
    let (done, pending): (Option<String>, Option<String>) = redis::cmd("HMGET")
        .arg(TenantKeys::new(owner).export_cursor(stream))
        .arg("done")
        .arg("pending")
        .query_async(&mut store.conn())
        .await?;
    Ok(ExportCursor { done: done.unwrap_or_default(), pending: pending.unwrap_or_default() })
}

/// Moves the cursor of `owner`'s `stream`: `begin` a batch ending at `last` (when `done` is
/// still where it was read) or `finish` it.
pub async fn mark(
    store: &Store,
    owner: &str,
    stream: &str,
    mode: &str,
    done: &str,
    last: &str,
) -> ApiResult<ExportCursor> {
    let call = MarkExport {
        state: TenantKeys::new(owner).export_cursor(stream),
        mode: mode.to_string(),
        done: done.to_string(),
        last: last.to_string(),
    };
    Ok(store.run(call).await?.value)
}
