//! Authentication. A tenant key `cyc_live_<key id>_<secret>` names its key id; the immutable
//! `key_id -> tenant` lookup is cached for the container's life, and the mutable key record
//! (digest, status, expiry, permissions) is checked inside the operation's own script, so a
//! warm request spends no round trip on auth and a revocation takes effect immediately.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::App;
use crate::domain::messages;
use crate::error::{ApiError, ApiResult};

pub const API_KEY_HEADER: &str = "x-cycles-api-key";
pub const ADMIN_KEY_HEADER: &str = "x-admin-api-key";
const KEY_ID_LEN: usize = 16;

/// Who is calling, on either plane.
#[derive(Debug, Clone)]
pub enum Caller {
    Admin,
    Tenant(TenantKey),
}

/// A presented tenant key whose tenant is known. Its digest is checked inside the operation's
/// script on the runtime plane; on the operator plane a key check comes first and fills
/// `grant` with what the key may do.
#[derive(Debug, Clone)]
pub struct TenantKey {
    pub tenant: String,
    pub key_id: String,
    pub digest: String,
    pub grant: Option<Grant>,
}

pub use crate::ops::auth::Grant;

impl TenantKey {
    fn grant(&self) -> Grant {
        self.grant.clone().unwrap_or_default()
    }

    pub fn permissions(&self) -> Vec<String> {
        self.grant().permissions
    }

    pub fn scope_filter(&self) -> Vec<String> {
        self.grant().scope_filter
    }

    /// 403 FORBIDDEN when the key's scope filter does not admit `scope`.
    pub fn check_scope(&self, scope: &str) -> ApiResult<()> {
        if crate::domain::scope_admitted(&self.scope_filter(), scope) {
            Ok(())
        } else {
            Err(ApiError::forbidden(format!("{}{scope}", messages::SCOPE_NOT_ADMITTED)))
        }
    }

    /// Tenant-key writes of a suspended tenant are refused.
    pub fn check_not_suspended(&self) -> ApiResult<()> {
        if self.grant().tenant_status == "SUSPENDED" {
            return Err(ApiError::new(crate::error::ErrorCode::TenantSuspended, messages::TENANT_SUSPENDED));
        }
        Ok(())
    }
}

pub fn unauthorized() -> ApiError {
    ApiError::unauthorized(messages::UNAUTHORIZED)
}

/// The 401 of a key rejected for `reason` (told to the log and the auth_failed event, never to
/// the caller), as the scripts' rejections read (`store::Reply`).
pub fn rejected(e: ApiError, reason: &str) -> ApiError {
    ApiError { cause: Some(format!("{REJECTED}{reason}")), ..e }
}

const REJECTED: &str = "api key rejected: ";

/// The failure reason of a 401 (EventDataApiKey.failure_reason): `key_not_found`,
/// `invalid_key`, `key_revoked`, `key_expired`, `invalid_format`, `missing_key`,
/// `invalid_admin_key`, `admin_key_required`, `api_key_required`.
pub fn failure_reason(e: &ApiError) -> String {
    let reason = e.cause.as_deref().and_then(|c| c.strip_prefix(REJECTED));
    reason.map(str::to_ascii_lowercase).unwrap_or_else(|| "missing_key".to_string())
}

/// Splits `cyc_live_<16 chars key id>_<secret>` (or `cyc_test_...`) into its key id.
pub fn key_id_of(key: &str) -> Option<&str> {
    let rest = key.strip_prefix("cyc_live_").or_else(|| key.strip_prefix("cyc_test_"))?;
    let key_id = rest.get(..KEY_ID_LEN)?;
    let ok = key_id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (ok && rest.as_bytes().get(KEY_ID_LEN) == Some(&b'_') && rest.len() > KEY_ID_LEN + 1).then_some(key_id)
}

/// Peppered HMAC-SHA256 of the whole presented key, hex.
pub fn key_digest(pepper: &str, key: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(pepper.as_bytes()).expect("HMAC takes any key length");
    mac.update(key.as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

impl App {
    /// Authenticates a request. `admin_allowed` marks the routes where `X-Admin-API-Key` is
    /// honoured (it then takes precedence; elsewhere it is ignored).
    pub async fn authenticate(&self, headers: &HeaderMap, admin_allowed: bool) -> ApiResult<Caller> {
        if admin_allowed {
            if let Some(given) = headers.get(ADMIN_KEY_HEADER) {
                let Some(expected) = &self.config.admin_api_key else {
                    return Err(ApiError::internal("Admin API key is not configured on this server"));
                };
                return if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
                    Ok(Caller::Admin)
                } else {
                    Err(rejected(ApiError::unauthorized("Invalid admin API key"), "INVALID_ADMIN_KEY"))
                };
            }
        }
        let key = header(headers, API_KEY_HEADER).ok_or_else(|| rejected(unauthorized(), "MISSING_KEY"))?;
        let key_id = key_id_of(key).ok_or_else(|| rejected(unauthorized(), "INVALID_FORMAT"))?;
        let tenant = self.tenant_of_key(key_id).await?.ok_or_else(|| rejected(unauthorized(), "KEY_NOT_FOUND"))?;
        Ok(Caller::Tenant(TenantKey {
            tenant,
            key_id: key_id.to_string(),
            digest: key_digest(&self.config.key_pepper, key),
            grant: None,
        }))
    }

    /// After a 401: the failure is recorded (`ops::auth::record_failure`: its event, its
    /// tenant's alert count, a lazy key expiry), and once its key id or source address has
    /// failed more than `auth_failure_limit` times this minute, the answer is 429
    /// LIMIT_EXCEEDED with Retry-After instead. A store failure here leaves the 401 as it was.
    pub async fn auth_failed(&self, ctx: &super::Ctx, headers: &HeaderMap, e: ApiError) -> ApiError {
        let presented = header(headers, API_KEY_HEADER).filter(|_| !headers.contains_key(ADMIN_KEY_HEADER));
        let key_id = presented.and_then(key_id_of);
        let tenant = match key_id {
            Some(k) => self.tenant_of_key(k).await.ok().flatten(),
            None => None,
        };
        let context = serde_json::json!({"request_id": ctx.request_id, "trace_id": ctx.trace.trace_id,
            "actor": "system", "tenant": tenant.clone().unwrap_or_default()});
        let failure = crate::ops::auth::Failure {
            tenant: tenant.as_deref(),
            key_id,
            source: ctx.source_ip.as_deref().unwrap_or("unknown"),
            reason: &failure_reason(&e),
            context: context.to_string(),
        };
        let count = match crate::ops::auth::record_failure(&self.store, failure).await {
            Ok(count) => count,
            Err(store) => {
                tracing::warn!(error = %store.message, "could not record a failed authentication");
                return e;
            }
        };
        let limit = self.config.auth_failure_limit;
        if limit == 0 || count <= limit {
            return e;
        }
        ApiError::minute_limit(
            limit,
            "Too many failed authentications from this key or address",
            crate::domain::now_ms(),
        )
    }

    /// The owner of a key id; immutable once written, so positive answers are cached.
    async fn tenant_of_key(&self, key_id: &str) -> ApiResult<Option<String>> {
        if let Some(t) = self.key_tenants.lock().expect("cache lock").get(key_id) {
            return Ok(Some(t.clone()));
        }
        let tenant = crate::ops::auth::owner(&self.store, key_id).await?;
        if let Some(t) = &tenant {
            let mut cache = self.key_tenants.lock().expect("cache lock");
            if cache.len() > 100_000 {
                cache.clear();
            }
            cache.insert(key_id.to_string(), t.clone());
        }
        Ok(tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_ids_parse_only_from_well_formed_keys() {
        assert_eq!(key_id_of("cyc_live_abcdefgh12345678_secret-part"), Some("abcdefgh12345678"));
        assert_eq!(key_id_of("cyc_test_abcdefgh12345678_s"), Some("abcdefgh12345678"));
        assert_eq!(key_id_of("cyc_live_ABCDEFGH12345678_s"), None);
        assert_eq!(key_id_of("cyc_live_abcdefgh12345678_"), None);
        assert_eq!(key_id_of("cyc_live_abc"), None);
        assert_eq!(key_id_of("bearer x"), None);
    }

    #[test]
    fn digest_depends_on_pepper() {
        assert_ne!(key_digest("a", "k"), key_digest("b", "k"));
        assert_eq!(key_digest("a", "k").len(), 64);
    }
}
