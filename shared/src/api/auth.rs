//! Authentication. A tenant key `cyc_live_<key id>_<secret>` names its key id; the immutable
//! `key_id -> tenant` lookup is cached for the container's life, and the mutable key record
//! (digest, status, expiry, permissions) is checked inside the operation's own script, so a
//! warm request spends no round trip on auth and a revocation takes effect immediately.

use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::Sha256;
use subtle::ConstantTimeEq;

use super::{ApiRequest, App};
use crate::domain::messages;
use crate::domain::roles::Role;
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
    id_after_prefix(key.strip_prefix("cyc_live_").or_else(|| key.strip_prefix("cyc_test_"))?)
}

/// The key id of an operator key `cyo_<16 chars key id>_<secret>`.
pub fn operator_key_id_of(key: &str) -> Option<&str> {
    id_after_prefix(key.strip_prefix("cyo_")?)
}

/// `<16 chars key id>_<secret>` -> the key id (lower-case letters and digits, a secret after).
fn id_after_prefix(rest: &str) -> Option<&str> {
    let key_id = rest.get(..KEY_ID_LEN)?;
    let ok = key_id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    (ok && rest.as_bytes().get(KEY_ID_LEN) == Some(&b'_') && rest.len() > KEY_ID_LEN + 1).then_some(key_id)
}

/// Peppered HMAC-SHA256 of the whole presented key, hex. The MAC keyed with the pepper is kept
/// per thread (keying it hashes two SHA-256 blocks, as many as the digest itself).
pub fn key_digest(pepper: &str, key: &str) -> String {
    thread_local! {
        static KEYED: std::cell::RefCell<Option<(String, Hmac<Sha256>)>> = const { std::cell::RefCell::new(None) };
    }
    let mut mac = KEYED.with_borrow_mut(|keyed| match keyed {
        Some((p, mac)) if p == pepper => mac.clone(),
        _ => {
            let mac = Hmac::<Sha256>::new_from_slice(pepper.as_bytes()).expect("HMAC takes any key length");
            *keyed = Some((pepper.to_string(), mac.clone()));
            mac
        }
    });
    mac.update(key.as_bytes());
    crate::ids::lower_hex(&mac.finalize().into_bytes())
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The key id audit entries and events name for the bootstrap `ADMIN_API_KEY`.
pub const BOOTSTRAP_KEY_ID: &str = "ADMIN_API_KEY";

/// The operator behind an accepted operator credential: an operator key, the bootstrap
/// `ADMIN_API_KEY` (an owner), or an IAM principal API Gateway verified (its mapped role).
#[derive(Debug, Clone)]
pub struct Operator {
    /// What audit entries and events name: the operator key id, `ADMIN_API_KEY`, or
    /// `iam:<principal ARN>`.
    pub key_id: String,
    pub role: Role,
    /// The tenants this operator may act for (`None`: every tenant).
    pub tenant_pattern: Option<String>,
}

impl App {
    /// Authenticates a request. `admin_allowed` marks the routes where operator credentials are
    /// honoured (they then take precedence; elsewhere they are ignored); an accepted operator
    /// must hold the role the route needs and, when limited to some tenants, act for one of
    /// them (`Ctx::admit`).
    pub async fn authenticate(&self, ctx: &mut super::Ctx, req: &ApiRequest, admin_allowed: bool) -> ApiResult<Caller> {
        if admin_allowed {
            if let Some(operator) = self.operator(ctx, req).await? {
                ctx.admit(operator, req)?;
                return Ok(Caller::Admin);
            }
        }
        let headers = &req.headers;
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

    /// The operator credential of a request, checked: `X-Admin-API-Key` (an operator key or the
    /// bootstrap key), else the IAM principal API Gateway verified; `None` when it has neither.
    async fn operator(&self, ctx: &mut super::Ctx, req: &ApiRequest) -> ApiResult<Option<Operator>> {
        if let Some(given) = req.headers.get(ADMIN_KEY_HEADER) {
            let given = given.to_str().unwrap_or_default();
            if let Some(key_id) = operator_key_id_of(given) {
                // a refusal is audited (and throttled) under the presented key id
                ctx.key_id = Some(key_id.to_string());
                return self.operator_key(key_id, given).await.map(Some);
            }
            let bootstrap = self.config.admin_api_key.as_deref().filter(|_| self.config.bootstrap_admin_key);
            if bootstrap.is_some_and(|expected| bool::from(given.as_bytes().ct_eq(expected.as_bytes()))) {
                return Ok(Some(Operator {
                    key_id: BOOTSTRAP_KEY_ID.to_string(),
                    role: Role::Owner,
                    tenant_pattern: None,
                }));
            }
            return Err(rejected(ApiError::unauthorized("Invalid admin API key"), "INVALID_ADMIN_KEY"));
        }
        let Some(arn) = &req.iam_principal else { return Ok(None) };
        ctx.key_id = Some(format!("iam:{arn}"));
        let role = self.config.iam_role(arn).ok_or_else(|| {
            ApiError::new(
                crate::error::ErrorCode::InsufficientPermissions,
                format!("The IAM principal {arn} has no operator role on this deployment (CYCLES_IAM_ROLES)"),
            )
        })?;
        Ok(Some(Operator { key_id: format!("iam:{arn}"), role, tenant_pattern: None }))
    }

    /// Checks an operator key; a checked key is trusted for `CYCLES_AUTH_CACHE_MS` by this
    /// container (by the digest of the whole presented key, never the key itself).
    async fn operator_key(&self, key_id: &str, given: &str) -> ApiResult<Operator> {
        let digest = key_digest(&self.config.key_pepper, given);
        let ttl = self.config.auth_cache;
        if let Some((operator, at)) = self.operator_keys.lock().expect("cache lock").get(&digest) {
            if at.elapsed() < ttl {
                return Ok(operator.clone());
            }
        }
        let checked = crate::ops::operators::check(&self.store, key_id, digest.clone()).await?;
        let role =
            Role::parse(&checked.role).ok_or_else(|| ApiError::fault("an operator key holds an unknown role"))?;
        let tenant_pattern = checked.tenant_pattern.filter(|p| !p.is_empty());
        let operator = Operator { key_id: key_id.to_string(), role, tenant_pattern };
        if !ttl.is_zero() {
            let mut cache = self.operator_keys.lock().expect("cache lock");
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(digest, (operator.clone(), std::time::Instant::now()));
        }
        Ok(operator)
    }

    /// After a 401: the failure is recorded (`ops::auth::record_failure`: its event, its
    /// tenant's alert count, a lazy key expiry), and once its key id or source address has
    /// failed more than `auth_failure_limit` times this minute, the answer is 429
    /// LIMIT_EXCEEDED with Retry-After instead. A store failure here leaves the 401 as it was.
    pub async fn auth_failed(&self, ctx: &super::Ctx, headers: &HeaderMap, e: ApiError) -> ApiError {
        let presented = header(headers, API_KEY_HEADER).filter(|_| !headers.contains_key(ADMIN_KEY_HEADER));
        let tenant_key_id = presented.and_then(key_id_of);
        let tenant = match tenant_key_id {
            Some(k) => self.tenant_of_key(k).await.ok().flatten(),
            None => None,
        };
        // an operator key's failures count against its key id too (its events go to the
        // deployment's own stream, as the bootstrap key's do)
        let key_id = tenant_key_id.or_else(|| header(headers, ADMIN_KEY_HEADER).and_then(operator_key_id_of));
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
        assert_eq!(operator_key_id_of("cyo_abcdefgh12345678_secret"), Some("abcdefgh12345678"));
        assert_eq!(operator_key_id_of("cyo_abcdefgh12345678_"), None);
        assert_eq!(operator_key_id_of("cyc_live_abcdefgh12345678_secret"), None);
        assert_eq!(key_id_of("cyo_abcdefgh12345678_secret"), None);
    }

    #[test]
    fn digest_depends_on_pepper() {
        assert_ne!(key_digest("a", "k"), key_digest("b", "k"));
        assert_eq!(key_digest("a", "k").len(), 64);
        // the MAC kept per thread follows the pepper, back and forth
        assert_eq!(key_digest("a", "k"), key_digest("a", "k"));
        let fresh = |p: &str, k: &str| {
            let mut mac = Hmac::<Sha256>::new_from_slice(p.as_bytes()).unwrap();
            mac.update(k.as_bytes());
            hex::encode(mac.finalize().into_bytes())
        };
        for (p, k) in [("a", "k"), ("b", "k"), ("a", "other"), ("b", "k")] {
            assert_eq!(key_digest(p, k), fresh(p, k), "{p} {k}");
        }
    }
}
