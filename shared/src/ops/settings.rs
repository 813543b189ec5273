//! Deployment-wide settings an operator changes at run time: stored in Redis, so every
//! container reads the same ones, and each change is written with its audit row. Today: the
//! webhook security configuration (the SSRF rules of webhook writes and deliveries).

use redis::AsyncCommands;

use super::script;
use crate::egress::{EgressRules, WebhookSecurity};
use crate::error::{ApiError, ApiResult};
use crate::store::Store;

/// The stored webhook security configuration (JSON), in the admin audit stream's slot.
pub const WEBHOOK_SECURITY: &str = "cy:{__admin__}:config:webhook-security";

script! {
    /// updateWebhookSecurityConfig (`lua/webhook_security_write.lua`).
    pub struct WriteWebhookSecurity = webhook_security_write -> WebhookSecurity {
        keys: [config, audit_log],
        args: [context, settings],
    }
}

/// Stores the webhook security configuration, with its audit entry (`__admin__`).
pub async fn write_webhook_security(store: &Store, context: String, settings: &WebhookSecurity) -> ApiResult<()> {
    let call = WriteWebhookSecurity {
        config: WEBHOOK_SECURITY.into(),
        audit_log: crate::keys::TenantKeys::new(super::audit::ADMIN_OWNER).audit_log(),
        context,
        settings: serde_json::to_string(settings).expect("settings serialize"),
    };
    store.run(call).await.map(|_| ())
}

/// The stored configuration, if an operator stored one.
pub async fn stored_webhook_security(store: &Store) -> ApiResult<Option<WebhookSecurity>> {
    let raw: Option<String> = store.conn().get(WEBHOOK_SECURITY).await?;
    raw.map(|r| {
        serde_json::from_str(&r)
            .map_err(|_| ApiError::internal("the stored webhook security configuration is malformed"))
    })
    .transpose()
}

/// The rules in force: the environment's `defaults` with the stored configuration, if any, in
/// their place (the built-in unsafe ranges apply either way).
pub async fn egress_rules(store: &Store, defaults: &EgressRules) -> ApiResult<EgressRules> {
    Ok(match stored_webhook_security(store).await? {
        Some(s) => defaults.with_settings(&s),
        None => defaults.clone(),
    })
}
