//! Provisioning library: tenants, API keys and budgets through the operator plane's own code
//! path (same scripts, records, events and audit rows). Used by `cycles-local --seed-demo` and
//! the benchmarks; the tests provision over HTTP.

use serde_json::Value;

use crate::api::api_keys::{self, ApiKeyCreateRequest};
use crate::api::budgets::{self, BudgetCreateRequest};
use crate::api::tenants::{self, TenantCreateRequest};
use crate::error::{ApiResult, ErrorCode};
use crate::model::{Amount, OveragePolicy, Unit};
use crate::store::Store;

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
            observe_mode: None,
            evidence_enabled: None,
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
            period_recurrence: None,
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
    use crate::domain::{validate_scope, validate_tenant_id};

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
