//! The scheduled jobs: the expiry sweep and retention (`sweep`, the `maintenance` function) and
//! the webhook dispatcher (`dispatch`, the `deliver-webhooks` function). They call `ops`, as the
//! HTTP handlers do.

pub mod dispatch;
pub mod export;
pub mod sweep;
