//! API keys: the key check of the operator plane (what a key may do), creating and updating
//! or revoking keys.

use redis::AsyncCommands;
use serde::{Deserialize, Deserializer};

use super::records::{csv_list, field, int_field, json_field, read_records, Record, RecordAnswer};
use super::{lua_list, script};
use crate::error::{ApiError, ApiResult};
use crate::keys::{self, TenantKeys};
use crate::store::Store;

script! {
    /// Checks a key and reports its permissions, its scope filter and (when `tenant` holds the
    /// tenant record) its tenant's status (`lua/authenticate.lua`).
    pub struct Authenticate = authenticate read_only -> Grant {
        keys: [api_key; tenant],
        args: [digest, accepted],
    }
}

/// What a checked key may do.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Grant {
    #[serde(default, deserialize_with = "lua_list")]
    pub permissions: Vec<String>,
    /// The scope segments the key is limited to (empty: every scope).
    #[serde(default, deserialize_with = "stored_scope_filter")]
    pub scope_filter: Vec<String>,
    /// Its tenant's status (the reply's status), when the check was given the tenant record.
    #[serde(skip)]
    pub tenant_status: String,
}

/// A scope filter as stored: JSON text of an array, absent or empty for none.
fn stored_scope_filter<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let text = Option::<String>::deserialize(d)?;
    Ok(text.as_deref().and_then(|f| serde_json::from_str(f).ok()).unwrap_or_default())
}

/// Checks a key (see `Authenticate`) and reports what it may do, with its tenant's status.
pub async fn check(store: &Store, tenant: &str, key_id: &str, digest: &str, accepted: &str) -> ApiResult<Grant> {
    let keys = TenantKeys::new(tenant);
    let call = Authenticate {
        api_key: keys.api_key(key_id),
        tenant: vec![keys.tenant()],
        digest: digest.to_string(),
        accepted: accepted.to_string(),
    };
    let reply = store.run(call).await?;
    Ok(Grant { tenant_status: reply.status, ..reply.value })
}

/// The key record a runtime script checks for a caller of `tenant`: its API key, or for an
/// operator (no key) the tenant record, which the scripts leave unchecked (no digest).
pub fn check_record(tenant: &str, key_id: Option<&str>) -> String {
    let keys = TenantKeys::new(tenant);
    key_id.map_or_else(|| keys.tenant(), |k| keys.api_key(k))
}

/// An API key as stored (the hash `cy:{<tenant>}:k:<key id>`); the secret is never stored, its
/// digest never leaves this record.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub key_id: String,
    pub tenant_id: String,
    pub key_prefix: String,
    pub status: String,
    pub name: Option<String>,
    pub description: Option<String>,
    pub permissions: Vec<String>,
    pub scope_filter: Option<serde_json::Value>,
    pub metadata: Option<serde_json::Value>,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub revoked_at_ms: Option<i64>,
    pub revoked_reason: Option<String>,
    pub last_used_at_ms: Option<i64>,
}

impl ApiKey {
    /// The key of a stored hash; `None` when the hash is empty.
    pub fn from_record(r: &Record) -> Option<ApiKey> {
        if r.is_empty() {
            return None;
        }
        Some(ApiKey {
            key_id: field(r, "key_id").unwrap_or_default().to_string(),
            tenant_id: field(r, "tenant_id").unwrap_or_default().to_string(),
            key_prefix: field(r, "key_prefix").unwrap_or_default().to_string(),
            status: field(r, "status").unwrap_or("ACTIVE").to_string(),
            name: field(r, "name").map(String::from),
            description: field(r, "description").map(String::from),
            permissions: csv_list(field(r, "permissions").unwrap_or_default()),
            scope_filter: json_field(r, "scope_filter"),
            metadata: json_field(r, "metadata"),
            created_at_ms: int_field(r, "created_at_ms").unwrap_or(0),
            expires_at_ms: int_field(r, "expires_at_ms").unwrap_or(0),
            revoked_at_ms: int_field(r, "revoked_at_ms"),
            revoked_reason: field(r, "revoked_reason").map(String::from),
            last_used_at_ms: int_field(r, "last_used_at_ms"),
        })
    }

    /// A script's answer that is a key's record.
    pub fn decoded(answer: RecordAnswer) -> ApiResult<ApiKey> {
        ApiKey::from_record(&answer.0).ok_or_else(|| ApiError::fault("an API key script answered no record"))
    }

    /// The status as callers see it: an ACTIVE key past its expiry is EXPIRED.
    pub fn effective_status(&self, now_ms: i64) -> &str {
        if self.status == "ACTIVE" && self.expires_at_ms <= now_ms {
            "EXPIRED"
        } else {
            &self.status
        }
    }
}

/// The tenant owning a key id (immutable once written), `None` when unknown.
pub async fn owner(store: &Store, key_id: &str) -> ApiResult<Option<String>> {
    Ok(store.conn().get(keys::key_lookup(key_id)).await?)
}

/// Publishes a key id's owner: written after the key's record, so a key becomes usable only
/// once its record exists.
pub async fn publish_owner(store: &Store, key_id: &str, tenant: &str) -> ApiResult<()> {
    let key = keys::key_lookup(key_id);
    store.write(redis::cmd("SET").arg(&key).arg(tenant).to_owned(), &key).await
}

/// Every API key of a tenant.
pub async fn of_tenant(store: &Store, tenant: &str) -> ApiResult<Vec<ApiKey>> {
    let keys = TenantKeys::new(tenant);
    let ids: Vec<String> = store.conn().smembers(keys.api_key_index()).await?;
    let record_keys: Vec<String> = ids.iter().map(|id| keys.api_key(id)).collect();
    Ok(read_records(store, &record_keys).await?.iter().filter_map(ApiKey::from_record).collect())
}

script! {
    /// validateApiKey (`lua/validate_key.lua`): whether a presented key is usable now.
    pub struct Validate = validate_key read_only -> Validation {
        keys: [api_key, tenant],
        args: [digest],
    }
}

/// Whether `digest` (of a presented key `key_id` of `tenant`) is usable now, and for what.
pub async fn validate(store: &Store, tenant: &str, key_id: &str, digest: String) -> ApiResult<Validation> {
    let keys = TenantKeys::new(tenant);
    Ok(store.run(Validate { api_key: keys.api_key(key_id), tenant: keys.tenant(), digest }).await?.value)
}

/// Creates key `key_id` of `tenant` from its record `fields` (JSON, the digest included; never
/// the secret), with its event and audit row: the stored record.
pub async fn create(
    store: &Store,
    tenant: &str,
    key_id: &str,
    context: &str,
    fields: String,
) -> ApiResult<RecordAnswer> {
    let keys = TenantKeys::new(tenant);
    let call = CreateApiKey {
        tenant: keys.tenant(),
        api_key: keys.api_key(key_id),
        api_key_index: keys.api_key_index(),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context: context.to_string(),
        fields,
    };
    Ok(store.run(call).await?.value)
}

/// Updates, revokes or rotates key `key_id` of `tenant` (`mode` and `change` as
/// `UpdateApiKey` takes them): the stored record afterwards.
pub async fn change(
    store: &Store,
    tenant: &str,
    key_id: &str,
    context: &str,
    mode: &str,
    change: String,
) -> ApiResult<RecordAnswer> {
    let keys = TenantKeys::new(tenant);
    let call = UpdateApiKey {
        tenant: keys.tenant(),
        api_key: keys.api_key(key_id),
        events: keys.events(),
        audit_log: keys.audit_log(),
        context: context.to_string(),
        mode: mode.to_string(),
        change,
    };
    Ok(store.run(call).await?.value)
}

/// What `Validate` found.
#[derive(Debug, Clone, Deserialize)]
pub struct Validation {
    pub valid: bool,
    /// Why not: INVALID (unknown key or wrong secret), REVOKED, EXPIRED, TENANT_SUSPENDED,
    /// TENANT_CLOSED.
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default, deserialize_with = "lua_list")]
    pub permissions: Vec<String>,
    #[serde(default, deserialize_with = "stored_scope_filter")]
    pub scope_filter: Vec<String>,
    #[serde(default)]
    pub expires_at_ms: Option<String>,
}

script! {
    /// createApiKey (`lua/api_key_create.lua`): `fields` is the key's record (JSON, the digest
    /// included; never the secret).
    pub struct CreateApiKey = api_key_create -> RecordAnswer {
        keys: [tenant, api_key, api_key_index, events, audit_log],
        args: [context, fields],
    }
}

script! {
    /// updateApiKey and revokeApiKey (`lua/api_key_update.lua`): `mode` is `update` (`change`: a
    /// JSON patch) or `revoke` (`change`: the reason).
    pub struct UpdateApiKey = api_key_update -> RecordAnswer {
        keys: [tenant, api_key, events, audit_log],
        args: [context, mode, change],
    }
}

script! {
    /// One more occurrence in a per-minute counter (`lua/count_minute.lua`): failed authentications,
    /// public requests.
    pub struct CountMinute = count_minute -> MinuteCount {
        keys: [counter],
        args: [],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct MinuteCount {
    pub count: u64,
}

script! {
    /// A failed authentication's event, alert count and lazy key expiry, in its owner's slot
    /// (`lua/auth_failure.lua`).
    pub struct AuthFailure = auth_failure -> super::Nothing {
        keys: [events, api_key],
        args: [context, owner, key_id, reason, source, sample, counted],
    }
}

script! {
    /// Expires a tenant's keys past their expiry (`lua/key_expiry.lua`), for the sweep.
    pub struct ExpireKeys = key_expiry -> ExpiredKeys {
        keys: [events, api_key_index],
        args: [tenant],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ExpiredKeys {
    pub expired: u64,
}

/// One more request of `source` to the public routes in `minute` (epoch minutes): the count.
pub async fn count_public(store: &Store, source: &str, minute: i64) -> ApiResult<u64> {
    Ok(store.run(CountMinute { counter: keys::public_requests(source, minute) }).await?.value.count)
}

/// A failed authentication as the dispatcher saw it.
pub struct Failure<'a> {
    /// The key's tenant, when the presented key id names one.
    pub tenant: Option<&'a str>,
    /// The presented key id (None for the admin key or an unreadable key).
    pub key_id: Option<&'a str>,
    pub source: &'a str,
    /// EventDataApiKey.failure_reason (`key_not_found`, `invalid_key`, `key_expired`, ...).
    pub reason: &'a str,
    /// The request context (request and trace ids) for the event.
    pub context: String,
}

/// Records a failed authentication: counts it against its key id and its source for this
/// minute, and writes its event (the first of either in the minute), its tenant's alert count
/// (the first failure of its key id in the minute only: someone who knows a key id cannot
/// raise the tenant's auth-failure spike by repeating it) and a lazy key expiry. Answers the
/// larger of the two counts.
pub async fn record_failure(store: &Store, f: Failure<'_>) -> ApiResult<u64> {
    let minute = crate::domain::now_ms() / 60_000;
    let mut counts = vec![];
    for (kind, who) in [("k", f.key_id), ("s", Some(f.source))] {
        if let Some(who) = who {
            let counter = keys::auth_failures(kind, who, minute);
            counts.push(store.run(CountMinute { counter }).await?.value.count);
        }
    }
    let owner = f.tenant.unwrap_or(crate::ops::events::SYSTEM_TENANT);
    let owner_keys = TenantKeys::new(owner);
    let call = AuthFailure {
        events: owner_keys.events(),
        api_key: owner_keys.api_key(f.key_id.unwrap_or("-")),
        context: f.context,
        owner: owner.to_string(),
        key_id: f.key_id.unwrap_or("admin").to_string(),
        reason: f.reason.to_string(),
        source: f.source.to_string(),
        sample: if counts.contains(&1) { "1" } else { "" }.to_string(),
        counted: if f.key_id.is_some() && counts.first() == Some(&1) { "1" } else { "" }.to_string(),
    };
    store.run(call).await?;
    Ok(counts.into_iter().max().unwrap_or(0))
}

/// The sweep's expiry of one tenant's keys past their expiry date.
pub async fn expire_keys(store: &Store, tenant: &str) -> ApiResult<u64> {
    let keys = TenantKeys::new(tenant);
    let call = ExpireKeys { events: keys.events(), api_key_index: keys.api_key_index(), tenant: tenant.to_string() };
    Ok(store.run(call).await?.value.expired)
}
