//! CyclesEvidence storage: each envelope under its content id (global key), and, in the
//! tenant's slot, where a replay finds the evidence of its first answer: a reservation's
//! evidence hash (reserve, commit, release) or, for decide and dry_run, a key per idempotency
//! record. Written after the operation's own script, both at once (one more round trip).

use std::collections::HashMap;
use std::time::Duration;

use redis::AsyncCommands;

use crate::error::ApiResult;
use crate::keys::{self, TenantKeys};
use crate::store::{Conn, Store};

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
    pub fn reservation(tenant: &str, token: &str, field: &'static str) -> Slot {
        Slot::Reservation { key: TenantKeys::new(tenant).reservation_evidence(token), field }
    }
    pub fn record(tenant: &str, ns: &str, idempotency_key: &str) -> Slot {
        Slot::Record(TenantKeys::new(tenant).idempotency("evidence", &[ns, idempotency_key]))
    }
}

/// Stores an envelope (kept `retention`) and its replay slot in one more round trip: one
/// pipeline on a standalone server; on a cluster (the envelope's key and the tenant's slot
/// live on different nodes) two requests in flight at once. With `archived` (an archive is
/// configured), the id also goes to that tenant's evidence log, which the export reads.
pub async fn save(
    store: &Store,
    id: &str,
    envelope: &str,
    slot: &Slot,
    retention: Duration,
    archived: Option<&str>,
) -> ApiResult<()> {
    let ms = retention.as_millis() as u64;
    let mut put = redis::cmd("SET");
    put.arg(keys::evidence(id)).arg(envelope).arg("PX").arg(ms);
    let mut remember = redis::pipe();
    match slot {
        Slot::Reservation { key, field } => {
            remember.hset(key, *field, id).pexpire(key, ms as i64);
        }
        Slot::Record(key) => {
            remember.cmd("SET").arg(key).arg(id).arg("PX").arg(ms);
        }
        Slot::None => {}
    }
    if let Some(tenant) = archived {
        remember.cmd("XADD").arg(TenantKeys::new(tenant).evidence_log()).arg("*").arg("id").arg(id);
    }
    let mut conn = store.conn();
    if matches!(conn, Conn::Single(_)) {
        let mut all = redis::pipe();
        all.add_command(put).ignore();
        for cmd in remember.cmd_iter() {
            all.add_command(cmd.clone()).ignore();
        }
        let _: () = all.query_async(&mut conn).await?;
        return Ok(());
    }
    // a cluster routes each request to its slot's node (the envelope's, the tenant's), and
    // refuses a pipeline whose replies are all ignored: two requests in flight at once
    let mut other = store.conn();
    let note = async {
        match (slot, archived) {
            (Slot::None, None) => Ok(()),
            _ => remember.query_async::<redis::Value>(&mut other).await.map(|_| ()),
        }
    };
    let (a, b) = tokio::join!(put.query_async::<()>(&mut conn), note);
    a?;
    b?;
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

/// The evidence ids of many reservations (one pipeline).
pub async fn of_reservations(store: &Store, tenant: &str, tokens: &[&str]) -> ApiResult<Vec<HashMap<String, String>>> {
    let keys = TenantKeys::new(tenant);
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
