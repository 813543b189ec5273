//! The webhook security configuration (admin key): the SSRF rules of webhook writes and
//! deliveries, stored so that every container applies the same ones.

use super::admin::{require_admin, script_context, Caller};
use super::{Answer, ApiRequest, App, Ctx};
use crate::egress::WebhookSecurity;
use crate::error::{ApiError, ApiResult};
use crate::model::parse_json;

/// `GET /v1/admin/config/webhook-security` (getWebhookSecurityConfig): the configuration in
/// force: the stored one, the environment's defaults while none is stored, and under
/// `cycles-local --dev-webhooks` no blocked range (none applies then).
pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let in_force = crate::ops::settings::egress_rules(&app.store, &app.config.webhooks.egress).await?;
    Ok(Answer::json(200, &in_force.settings()))
}

/// `PUT /v1/admin/config/webhook-security` (updateWebhookSecurityConfig): replaces the
/// configuration (absent fields take the spec's defaults); in force from the next webhook
/// write and the next delivery pass, on every container. Answers it as in force (see `get`).
pub async fn put(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let (settings, _) = parse_json::<WebhookSecurity>(&req.body)?;
    settings.validate().map_err(ApiError::invalid)?;
    crate::ops::settings::write_webhook_security(
        &app.store,
        script_context(ctx, &Caller::Admin, false, None),
        &settings,
    )
    .await?;
    Ok(Answer::json(200, &app.config.webhooks.egress.with_settings(&settings).settings()))
}
