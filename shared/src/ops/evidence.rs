//! CyclesEvidence storage: each envelope under its content id (global key), and, in the
//! tenant's slot, where a replay finds the evidence of its first answer: a reservation's
//! evidence hash (reserve, commit, release) or, for decide and dry_run, a key per idempotency
//! record. Written after the operation's own script, both at once (one more round trip).

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use crate::error::ApiResult;
use crate::keys::{self, TenantKeys};
use crate::store::Store;

/// Where the evidence id of one operation's first answer is kept.
#[derive(Debug, Clone)]
pub enum Slot {
    /// A field (`reserve`, `commit`, `release`) of a reservation's evidence hash.
    Reservation {
        key: String,
        field: &'static str,
    },
    /// A key of its own (decide, dry_run; errors have none: they are never replayed).
    Record(String),
    None,
}

impl Slot {
    pub fn reservation(keys: &TenantKeys, token: &str, field: &'static str) -> Slot {
        Slot::Reservation { key: keys.reservation_evidence(token), field }
    }
    pub fn record(keys: &TenantKeys, ns: &str, idempotency_key: &str) -> Slot {
        Slot::Record(keys.idempotency("evidence", &[ns, idempotency_key]))
    }
}

/// Stores an envelope (kept `retention`) and its replay slot, both writes in flight at once.
pub async fn save(store: &Store, id: &str, envelope: &str, slot: &Slot, retention: Duration) -> ApiResult<()> {
    let ms = retention.as_millis() as u64;
    let mut envelopes = store.conn();
    let put = async move {
        let _: () = redis::cmd("SET")
            .arg(keys::evidence(id))
            .arg(envelope)
            .arg("PX")
            .arg(ms)
            .query_async(&mut envelopes)
            .await?;
        Ok::<(), redis::RedisError>(())
    };
    let mut refs = store.conn();
    let remember = async move {
        match slot {
            Slot::Reservation { key, field } => {
                let _: () = redis::pipe()
                    .hset(key, *field, id)
                    .ignore()
                    .pexpire(key, ms as i64)
                    .ignore()
                    .query_async(&mut refs)
                    .await?;
            }
            Slot::Record(key) => {
                let _: () = redis::cmd("SET").arg(key).arg(id).arg("PX").arg(ms).query_async(&mut refs).await?;
            }
            Slot::None => {}
        }
        Ok::<(), redis::RedisError>(())
    };
    tokio::try_join!(put, remember)?;
    Ok(())
}

/// The evidence id a replay answers with (None: the first answer had none).
pub async fn recorded(store: &Store, slot: &Slot) -> ApiResult<Option<String>> {
    Ok(match slot {
        Slot::Reservation { key, field } => store.conn().hget(key, *field).await?,
        Slot::Record(key) => store.conn().get(key).await?,
        Slot::None => None,
    })
}

/// A reservation's evidence ids by operation.
pub async fn of_reservation(store: &Store, keys: &TenantKeys, token: &str) -> ApiResult<HashMap<String, String>> {
    Ok(store.conn().hgetall(keys.reservation_evidence(token)).await?)
}

/// The evidence ids of many reservations (one pipeline).
pub async fn of_reservations(
    store: &Store,
    keys: &TenantKeys,
    tokens: &[&str],
) -> ApiResult<Vec<HashMap<String, String>>> {
    let mut pipe = redis::pipe();
    for t in tokens {
        pipe.hgetall(keys.reservation_evidence(t));
    }
    Ok(pipe.query_async(&mut store.conn()).await?)
}

/// One envelope as stored (its canonical JSON).
pub async fn read(store: &Store, id: &str) -> ApiResult<Option<String>> {
    Ok(store.conn().get(keys::evidence(id)).await?)
}

/// A tenant's own switch (`evidence_enabled` on its record), when it set one.
pub async fn tenant_switch(store: &Store, tenant: &str) -> ApiResult<Option<bool>> {
    let v: Option<String> = store.conn().hget(TenantKeys::new(tenant).tenant(), "evidence_enabled").await?;
    Ok(v.map(|v| v == "true"))
}
