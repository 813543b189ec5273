//! `GET /v1/admin/overview` (getAdminOverview, admin key): the dashboard snapshot
//! (`ops::overview`): one read per request, rebuilt when older than `CYCLES_OVERVIEW_MAX_AGE_MS`.

use super::admin::require_admin;
use super::{Answer, ApiRequest, App, Ctx};
use crate::error::ApiResult;

pub async fn get(app: &App, ctx: &mut Ctx, req: &ApiRequest) -> ApiResult<Answer> {
    require_admin(app, ctx, req).await?;
    let max_age = app.config.overview_max_age.as_millis() as i64;
    Ok(Answer::json(200, &crate::ops::overview::overview(&app.store, max_age).await?))
}
