//! Provisioning library: tenants, API keys and budgets. Used by `cycles-local --seed-demo` and
//! the tests; the operator plane's HTTP handlers reuse the same records.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use rand::{Rng, RngCore};
use redis::AsyncCommands;
use serde_json::Value;

use crate::api::auth::key_digest;
use crate::domain::DEFAULT_PERMISSIONS;
use crate::error::{ApiError, ApiResult};
use crate::keys::{self, TenantKeys};
use crate::model::{OveragePolicy, Unit};
use crate::store::{scripts, Store};

const LEVELS: [&str; 6] = ["tenant", "workspace", "app", "workflow", "agent", "toolset"];

/// Tenant ids follow the governance spec: `^[a-z0-9-]+$`, 3 to 64 characters.
pub fn validate_tenant_id(id: &str) -> ApiResult<()> {
    let ok =
        (3..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid("tenant_id must match ^[a-z0-9-]+$ and be 3 to 64 characters"))
    }
}

/// A budget scope: `tenant:<id>` first, then canonical levels in strictly increasing order,
/// values of `[a-z0-9._-]` (stored lower-case, as the runtime derives them).
pub fn validate_scope(scope: &str, tenant_id: &str) -> ApiResult<String> {
    let scope = scope.to_ascii_lowercase();
    let bad = |why: &str| ApiError::invalid(format!("scope {scope:?} is invalid: {why}"));
    let mut last_level = None;
    for (i, segment) in scope.split('/').enumerate() {
        let (level, value) = segment.split_once(':').ok_or_else(|| bad("segments are level:value"))?;
        let rank = LEVELS.iter().position(|l| *l == level).ok_or_else(|| bad("unknown level"))?;
        if i == 0 && level != "tenant" {
            return Err(bad("the first segment must be tenant:<id>"));
        }
        if i == 0 && value != tenant_id {
            return Err(bad("the tenant segment must name the budget's tenant"));
        }
        if last_level.is_some_and(|l| rank <= l) {
            return Err(bad("levels must follow tenant > workspace > app > workflow > agent > toolset"));
        }
        let value_ok = !value.is_empty()
            && value.len() <= 128
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !value_ok {
            return Err(bad("values must match ^[a-z0-9_.-]+$ and be at most 128 characters"));
        }
        last_level = Some(rank);
    }
    Ok(scope)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

async fn write(store: &Store, keys: Vec<String>, args: Vec<String>) -> ApiResult<bool> {
    match store.run(&scripts::PROVISION, &keys, &args).await {
        Ok(_) => Ok(true),
        Err(e) if e.message.ends_with("already exists") => Ok(false),
        Err(e) => Err(e),
    }
}

#[derive(Debug, Clone, Default)]
pub struct NewTenant {
    pub tenant_id: String,
    pub name: String,
    pub default_commit_overage_policy: Option<OveragePolicy>,
    pub default_reservation_ttl_ms: Option<i64>,
    pub max_reservation_ttl_ms: Option<i64>,
    pub max_reservation_extensions: Option<i64>,
}

/// Creates an ACTIVE tenant. Returns false when it already exists (nothing is changed).
pub async fn create_tenant(store: &Store, t: &NewTenant) -> ApiResult<bool> {
    validate_tenant_id(&t.tenant_id)?;
    let mut args: Vec<String> =
        ["tenant", "tenant_id", &t.tenant_id, "name", &t.name, "status", "ACTIVE"].map(String::from).to_vec();
    args.extend(["created_at_ms".to_string(), now_ms().to_string()]);
    let settings = [
        ("default_commit_overage_policy", t.default_commit_overage_policy.map(|p| p.as_str().to_string())),
        ("default_reservation_ttl_ms", t.default_reservation_ttl_ms.map(|v| v.to_string())),
        ("max_reservation_ttl_ms", t.max_reservation_ttl_ms.map(|v| v.to_string())),
        ("max_reservation_extensions", t.max_reservation_extensions.map(|v| v.to_string())),
    ];
    for (field, value) in settings {
        if let Some(v) = value {
            args.extend([field.to_string(), v]);
        }
    }
    let created = write(store, vec![TenantKeys::new(&t.tenant_id).tenant()], args).await?;
    let _: () = store.conn().sadd(keys::TENANT_REGISTRY, &t.tenant_id).await?;
    Ok(created)
}

#[derive(Debug, Clone, Default)]
pub struct NewApiKey {
    pub tenant_id: String,
    pub name: String,
    /// None = the default permission set.
    pub permissions: Option<Vec<String>>,
    /// None = 90 days from now.
    pub expires_at_ms: Option<i64>,
}

/// A freshly created key: `secret` is the full key and is never retrievable again.
#[derive(Debug, Clone)]
pub struct CreatedKey {
    pub key_id: String,
    pub secret: String,
    pub key_prefix: String,
    pub expires_at_ms: i64,
}

pub async fn create_api_key(store: &Store, pepper: &str, k: &NewApiKey) -> ApiResult<CreatedKey> {
    validate_tenant_id(&k.tenant_id)?;
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    let key_id: String = (0..16).map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char).collect();
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut secret);
    let full = format!("cyc_live_{key_id}_{}", URL_SAFE_NO_PAD.encode(secret));
    let permissions =
        k.permissions.clone().unwrap_or_else(|| DEFAULT_PERMISSIONS.iter().map(|p| p.to_string()).collect());
    let expires_at_ms = k.expires_at_ms.unwrap_or_else(|| now_ms() + 90 * 24 * 3_600_000);
    let args = [
        "api_key",
        "key_id",
        &key_id,
        "tenant_id",
        &k.tenant_id,
        "name",
        &k.name,
        "digest",
        &key_digest(pepper, &full),
        "status",
        "ACTIVE",
        "permissions",
        &format!(",{},", permissions.join(",")),
        "expires_at_ms",
        &expires_at_ms.to_string(),
        "created_at_ms",
        &now_ms().to_string(),
        "key_prefix",
        &full[..14],
    ]
    .map(String::from)
    .to_vec();
    let keys = TenantKeys::new(&k.tenant_id);
    if !write(store, vec![keys.api_key(&key_id)], args).await? {
        return Err(ApiError::internal("API key id collision; retry"));
    }
    // The global lookup is written last: a key becomes usable only once its record exists.
    let _: () = store.conn().set(keys::key_lookup(&key_id), &k.tenant_id).await?;
    Ok(CreatedKey { key_prefix: full[..14].to_string(), key_id, secret: full, expires_at_ms })
}

#[derive(Debug, Clone)]
pub struct NewBudget {
    pub tenant_id: String,
    pub scope: String,
    pub unit: Unit,
    pub allocated: i64,
    pub overdraft_limit: i64,
    pub commit_overage_policy: Option<OveragePolicy>,
    /// Operator caps returned with ALLOW_WITH_CAPS when this is the deepest derived scope.
    pub caps: Option<Value>,
}

impl NewBudget {
    pub fn new(tenant_id: &str, scope: &str, unit: Unit, allocated: i64) -> NewBudget {
        NewBudget {
            tenant_id: tenant_id.to_string(),
            scope: scope.to_string(),
            unit,
            allocated,
            overdraft_limit: 0,
            commit_overage_policy: None,
            caps: None,
        }
    }
}

/// Creates an ACTIVE budget ledger. Returns false when (scope, unit) already exists.
pub async fn create_budget(store: &Store, b: &NewBudget) -> ApiResult<bool> {
    validate_tenant_id(&b.tenant_id)?;
    let scope = validate_scope(&b.scope, &b.tenant_id)?;
    if b.allocated < 0 || b.overdraft_limit < 0 {
        return Err(ApiError::invalid("allocated and overdraft_limit must be >= 0"));
    }
    let keys = TenantKeys::new(&b.tenant_id);
    let now = now_ms().to_string();
    let mut args: Vec<String> = vec!["budget".into(), scope.clone(), b.unit.as_str().into()];
    let fields = [
        ("ledger_id", uuid::Uuid::new_v4().to_string()),
        ("tenant_id", b.tenant_id.clone()),
        ("scope", scope.clone()),
        ("unit", b.unit.as_str().to_string()),
        ("status", "ACTIVE".to_string()),
        ("allocated", b.allocated.to_string()),
        ("remaining", b.allocated.to_string()),
        ("reserved", "0".to_string()),
        ("spent", "0".to_string()),
        ("debt", "0".to_string()),
        ("overdraft_limit", b.overdraft_limit.to_string()),
        ("is_over_limit", "false".to_string()),
        ("commit_overage_policy", b.commit_overage_policy.map(|p| p.as_str().to_string()).unwrap_or_default()),
        ("caps", b.caps.as_ref().map(|c| c.to_string()).unwrap_or_default()),
        ("created_at_ms", now.clone()),
        ("updated_at_ms", now),
    ];
    for (f, v) in fields {
        args.extend([f.to_string(), v]);
    }
    let created = write(store, vec![keys.budget(&scope, b.unit), keys.scope_units()], args).await?;
    // Tenants with budgets are what the expiry sweep visits.
    let _: () = store.conn().sadd(keys::TENANT_REGISTRY, &b.tenant_id).await?;
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_the_grammar() {
        assert_eq!(validate_scope("tenant:acme/Workspace:Prod", "acme").unwrap(), "tenant:acme/workspace:prod");
        assert!(validate_scope("workspace:prod", "acme").is_err());
        assert!(validate_scope("tenant:other", "acme").is_err());
        assert!(validate_scope("tenant:acme/agent:a/workspace:w", "acme").is_err());
        assert!(validate_scope("tenant:acme/agent:*", "acme").is_err());
        assert!(validate_scope("tenant:acme//agent:a", "acme").is_err());
    }

    #[test]
    fn tenant_ids_follow_the_governance_pattern() {
        assert!(validate_tenant_id("tenant-a").is_ok());
        assert!(validate_tenant_id("ab").is_err());
        assert!(validate_tenant_id("a.b.c").is_err());
        assert!(validate_tenant_id("a{b}").is_err());
    }
}
