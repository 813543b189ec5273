//! Bulk actions' invocation records: what a key's first invocation matched and, once done, its
//! answer, kept for 15 minutes. A retry after a crash resumes the recorded rows (each row's
//! change is atomic and idempotent, so the rows already done are not applied twice); a retry
//! after the end answers the recorded answer.

use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::keys::TenantKeys;
use crate::store::Store;

/// How long an invocation is remembered.
pub const REPLAY_WINDOW_MS: u64 = 15 * 60_000;

/// The state of an invocation of one idempotency key.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Invocation {
    /// Started: the rows it matched (row handles), to be applied.
    Running { payload_hash: String, rows: Vec<String> },
    /// Finished: the answer.
    Done { payload_hash: String, answer: Value },
}

fn record_key(kind: &str, idempotency_key: &str) -> String {
    TenantKeys::new(super::audit::ADMIN_OWNER).idempotency(&format!("bulk-{kind}"), &[idempotency_key])
}

/// The recorded invocation of a key, if any; 409 IDEMPOTENCY_MISMATCH when it was made with
/// another request body.
pub async fn recorded(store: &Store, kind: &str, key: &str, payload_hash: &str) -> ApiResult<Option<Invocation>> {
    let raw: Option<String> = store.conn().get(record_key(kind, key)).await?;
    let Some(raw) = raw else { return Ok(None) };
    let inv: Invocation = serde_json::from_str(&raw)
        .map_err(|e| ApiError::fault(format!("a bulk invocation record is malformed: {e}")))?;
    let (Invocation::Running { payload_hash: h, .. } | Invocation::Done { payload_hash: h, .. }) = &inv;
    if h != payload_hash {
        return Err(ApiError::new(
            ErrorCode::IdempotencyMismatch,
            "idempotency_key was already used with a different bulk request",
        ));
    }
    Ok(Some(inv))
}

/// Records the start of an invocation unless another already started with the key (false then).
pub async fn start(store: &Store, kind: &str, key: &str, payload_hash: &str, rows: &[String]) -> ApiResult<bool> {
    let inv = Invocation::Running { payload_hash: payload_hash.to_string(), rows: rows.to_vec() };
    let opts = redis::SetOptions::default()
        .conditional_set(redis::ExistenceCheck::NX)
        .with_expiration(redis::SetExpiry::PX(REPLAY_WINDOW_MS));
    let set: Option<String> =
        store.conn().set_options(record_key(kind, key), serde_json::to_string(&inv).expect("serializes"), opts).await?;
    Ok(set.is_some())
}

/// Records the answer of a finished invocation.
pub async fn finish(store: &Store, kind: &str, key: &str, payload_hash: &str, answer: &Value) -> ApiResult<()> {
    let inv = Invocation::Done { payload_hash: payload_hash.to_string(), answer: answer.clone() };
    let _: () = store
        .conn()
        .pset_ex(record_key(kind, key), serde_json::to_string(&inv).expect("serializes"), REPLAY_WINDOW_MS)
        .await?;
    Ok(())
}
