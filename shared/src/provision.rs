//! Provisioning library: tenants, API keys and budgets through the operator plane's own code
//! path (same scripts, records, events and audit rows). Used by `cycles-local --seed-demo` and
//! the benchmarks; the tests provision over HTTP.

use serde_json::Value;

use crate::api::api_keys::{self, ApiKeyCreateRequest};
use crate::api::budgets::{self, BudgetCreateRequest};
use crate::api::tenants::{self, TenantCreateRequest};
use crate::error::{ApiError, ApiResult, ErrorCode};
use crate::model::{Amount, OveragePolicy, Unit};
use crate::store::Store;

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

/// The script context of provisioning done outside an HTTP request (seeding, tests, benches).
fn system_context() -> String {
    serde_json::json!({"request_id": crate::ids::new_request_id(), "trace_id": "", "actor": "system"}).to_string()
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

impl NewTenant {
    /// The operator-plane request body this describes.
    pub fn request(&self) -> TenantCreateRequest {
        TenantCreateRequest {
            tenant_id: self.tenant_id.clone(),
            name: self.name.clone(),
            parent_tenant_id: None,
            metadata: None,
            default_commit_overage_policy: self.default_commit_overage_policy,
            default_reservation_ttl_ms: self.default_reservation_ttl_ms,
            max_reservation_ttl_ms: self.max_reservation_ttl_ms,
            max_reservation_extensions: self.max_reservation_extensions,
            reservation_expiry_policy: None,
        }
    }
}

/// Creates an ACTIVE tenant through the operator plane's code path. Returns false when it
/// already exists (nothing is changed).
pub async fn create_tenant(store: &Store, t: &NewTenant) -> ApiResult<bool> {
    Ok(tenants::create_tenant(store, &system_context(), &t.request()).await?.1)
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

impl NewApiKey {
    pub fn request(&self) -> ApiKeyCreateRequest {
        ApiKeyCreateRequest {
            tenant_id: self.tenant_id.clone(),
            name: self.name.clone(),
            permissions: self.permissions.clone(),
            expires_at: self.expires_at_ms.map(crate::domain::format_rfc3339_ms),
            ..Default::default()
        }
    }
}

pub use crate::api::api_keys::CreatedKey;

pub async fn create_api_key(store: &Store, pepper: &str, k: &NewApiKey) -> ApiResult<CreatedKey> {
    api_keys::create_api_key(store, pepper, &system_context(), &k.request()).await
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

    pub fn request(&self) -> BudgetCreateRequest {
        BudgetCreateRequest {
            tenant_id: Some(self.tenant_id.clone()),
            scope: self.scope.clone(),
            unit: self.unit,
            allocated: Amount { unit: self.unit, amount: self.allocated },
            overdraft_limit: Some(Amount { unit: self.unit, amount: self.overdraft_limit }),
            commit_overage_policy: self.commit_overage_policy,
            rollover_policy: None,
            period_start: None,
            period_end: None,
            metadata: None,
            caps: self.caps.clone(),
        }
    }
}

/// Creates an ACTIVE budget ledger (its tenant must exist). Returns false when (scope, unit)
/// already exists.
pub async fn create_budget(store: &Store, b: &NewBudget) -> ApiResult<bool> {
    match budgets::create_budget(store, &system_context(), &b.tenant_id, &b.request()).await {
        Ok(_) => Ok(true),
        Err(e) if e.code == ErrorCode::DuplicateResource => Ok(false),
        Err(e) => Err(e),
    }
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
