//! Operator keys: named `X-Admin-API-Key` credentials with a role, stored hashed under the
//! `__admin__` owner (beside the audit stream their changes write, so change and entry are one
//! step), created, changed and checked by one script each.

use redis::AsyncCommands;
use serde::Deserialize;

use super::audit::ADMIN_OWNER;
use super::records::{field, int_field, read_records, Record, RecordAnswer};
use super::script;
use crate::domain::roles::Role;
use crate::error::{ApiError, ApiResult};
use crate::keys::TenantKeys;
use crate::store::Store;

script! {
    /// createOperatorKey (`lua/operator_key_create.lua`): `fields` is the key's record (JSON,
    /// the digest included; never the secret).
    pub struct CreateOperatorKey = operator_key_create -> RecordAnswer {
        keys: [operator_key, operator_key_index, operator_owners, audit_log],
        args: [context, fields],
    }
}

script! {
    /// update, revoke and rotate an operator key (`lua/operator_key_update.lua`).
    pub struct UpdateOperatorKey = operator_key_update -> RecordAnswer {
        keys: [operator_key, operator_owners, audit_log],
        args: [context, mode, change, bootstrap],
    }
}

script! {
    /// Checks a presented operator key (`lua/operator_key_check.lua`).
    pub struct CheckOperatorKey = operator_key_check -> Checked {
        keys: [operator_key],
        args: [digest],
    }
}

/// What a successful check of an operator key found.
#[derive(Debug, Clone, Deserialize)]
pub struct Checked {
    pub role: String,
    #[serde(default)]
    pub tenant_pattern: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// An operator key as stored; the secret is never stored, its digest never leaves this record.
#[derive(Debug, Clone, PartialEq)]
pub struct OperatorKey {
    pub key_id: String,
    pub key_prefix: String,
    pub name: String,
    pub description: Option<String>,
    pub role: Role,
    pub status: String,
    pub tenant_pattern: Option<String>,
    pub created_at_ms: i64,
    pub updated_at_ms: Option<i64>,
    pub expires_at_ms: Option<i64>,
    pub last_used_at_ms: Option<i64>,
    pub revoked_at_ms: Option<i64>,
    pub revoked_reason: Option<String>,
    pub rotated_at_ms: Option<i64>,
    pub previous_until_ms: Option<i64>,
    pub created_by: Option<String>,
}

impl OperatorKey {
    /// The key of a stored hash; `None` when the hash is empty.
    pub fn from_record(r: &Record) -> Option<OperatorKey> {
        if r.is_empty() {
            return None;
        }
        let text = |name: &str| field(r, name).filter(|v| !v.is_empty()).map(String::from);
        Some(OperatorKey {
            key_id: field(r, "key_id").unwrap_or_default().to_string(),
            key_prefix: field(r, "key_prefix").unwrap_or_default().to_string(),
            name: field(r, "name").unwrap_or_default().to_string(),
            description: text("description"),
            role: field(r, "role").and_then(Role::parse).unwrap_or(Role::Viewer),
            status: field(r, "status").unwrap_or("ACTIVE").to_string(),
            tenant_pattern: text("tenant_pattern"),
            created_at_ms: int_field(r, "created_at_ms").unwrap_or(0),
            updated_at_ms: int_field(r, "updated_at_ms"),
            expires_at_ms: int_field(r, "expires_at_ms"),
            last_used_at_ms: int_field(r, "last_used_at_ms"),
            revoked_at_ms: int_field(r, "revoked_at_ms"),
            revoked_reason: text("revoked_reason"),
            rotated_at_ms: int_field(r, "rotated_at_ms"),
            previous_until_ms: int_field(r, "previous_until_ms"),
            created_by: text("created_by"),
        })
    }

    /// A script's answer that is a key's record.
    pub fn decoded(answer: RecordAnswer) -> ApiResult<OperatorKey> {
        OperatorKey::from_record(&answer.0).ok_or_else(|| ApiError::fault("an operator key script answered no record"))
    }

    /// The status as callers see it: an ACTIVE key past its expiry is EXPIRED.
    pub fn effective_status(&self, now_ms: i64) -> &str {
        match self.expires_at_ms {
            Some(at) if self.status == "ACTIVE" && at <= now_ms => "EXPIRED",
            _ => &self.status,
        }
    }
}

fn admin_keys() -> TenantKeys {
    TenantKeys::new(ADMIN_OWNER)
}

/// Creates operator key `key_id` from its record `fields` (JSON, the digest included), with its
/// audit entry: the stored record.
pub async fn create(store: &Store, key_id: &str, context: &str, fields: String) -> ApiResult<OperatorKey> {
    let keys = admin_keys();
    let call = CreateOperatorKey {
        operator_key: keys.operator_key(key_id),
        operator_key_index: keys.operator_key_index(),
        operator_owners: keys.operator_owners(),
        audit_log: keys.audit_log(),
        context: context.to_string(),
        fields,
    };
    OperatorKey::decoded(store.run(call).await?.value)
}

/// What changes an operator key: `mode` and `change` (a JSON patch for `update`, the reason for
/// `revoke`, `{digest, prefix, grace_ms}` for `rotate`), and whether the bootstrap key is on (the
/// last owner may then be revoked or demoted).
pub struct Change<'a> {
    pub mode: &'a str,
    pub change: String,
    pub bootstrap_on: bool,
}

/// Updates, revokes or rotates operator key `key_id`: the stored record afterwards.
pub async fn change(store: &Store, key_id: &str, context: &str, c: Change<'_>) -> ApiResult<OperatorKey> {
    let keys = admin_keys();
    let call = UpdateOperatorKey {
        operator_key: keys.operator_key(key_id),
        operator_owners: keys.operator_owners(),
        audit_log: keys.audit_log(),
        context: context.to_string(),
        mode: c.mode.to_string(),
        change: c.change,
        bootstrap: if c.bootstrap_on { "1" } else { "" }.to_string(),
    };
    OperatorKey::decoded(store.run(call).await?.value)
}

/// Checks a presented operator key by its id and the digest of the whole key (401 with the
/// reason as its cause when refused).
pub async fn check(store: &Store, key_id: &str, digest: String) -> ApiResult<Checked> {
    Ok(store.run(CheckOperatorKey { operator_key: admin_keys().operator_key(key_id), digest }).await?.value)
}

/// One operator key, `None` when unknown.
pub async fn get(store: &Store, key_id: &str) -> ApiResult<Option<OperatorKey>> {
    let records = read_records(store, &[admin_keys().operator_key(key_id)]).await?;
    Ok(records.first().and_then(OperatorKey::from_record))
}

/// Every operator key (at most 1,000 exist).
pub async fn all(store: &Store) -> ApiResult<Vec<OperatorKey>> {
    let keys = admin_keys();
    let ids: Vec<String> = store.conn().smembers(keys.operator_key_index()).await?;
    let record_keys: Vec<String> = ids.iter().map(|id| keys.operator_key(id)).collect();
    Ok(read_records(store, &record_keys).await?.iter().filter_map(OperatorKey::from_record).collect())
}
