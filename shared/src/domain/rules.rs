//! Rules and defaults both sides apply: the Rust side reads these constants, and the script
//! library receives them as its `RULES` table (`ops::library_header`), so each lives once.

use crate::model::OveragePolicy;

/// A reservation's TTL when neither the request nor its tenant sets one.
pub const DEFAULT_TTL_MS: i64 = 60_000;
/// The longest TTL a tenant allows unless it sets its own maximum.
pub const MAX_TTL_MS: i64 = 3_600_000;
/// How often a reservation may be extended unless its tenant says otherwise.
pub const MAX_EXTENSIONS: i64 = 10;
/// The grace period after expiry during which commit and release are still accepted.
pub const DEFAULT_GRACE_MS: i64 = 5_000;
/// The overage policy when neither the request, a budget nor the tenant sets one.
pub const DEFAULT_OVERAGE_POLICY: OveragePolicy = OveragePolicy::AllowIfAvailable;
/// How long the answer of a dry_run or decide is kept for replay (or the record retention,
/// when an operator set it shorter).
pub const EVALUATION_RETENTION_MS: u64 = 24 * 3_600_000;
/// How long an API key lives when its creator gives no expiry (90 days).
pub const DEFAULT_KEY_LIFETIME_MS: i64 = 90 * 24 * 3_600_000;
/// How long a keyed funding answer is kept for replay.
pub const FUNDING_IDEMPOTENCY_MS: u64 = 24 * 3_600_000;

/// The most policies one tenant may hold (every runtime script reads all of them).
pub const MAX_POLICIES: usize = 100;

/// The alert settings of the spec's `WebhookThresholdConfig`, at its defaults: what a tenant
/// without subscriptions that set them is alerted at.
pub mod alerts {
    /// `budget_utilization`: budget.threshold_crossed.
    pub const UTILIZATION: [f64; 3] = [0.80, 0.95, 1.0];
    /// `burn_rate_multiplier` and `burn_rate_window_seconds`: budget.burn_rate_anomaly.
    pub const BURN_MULTIPLIER: f64 = 3.0;
    pub const BURN_WINDOW_S: i64 = 300;
    /// `denial_rate_threshold`, `expiry_rate_threshold`, `auth_failure_rate_threshold`.
    pub const DENIAL_RATE: f64 = 0.10;
    pub const EXPIRY_RATE: f64 = 0.05;
    pub const AUTH_FAILURE_RATE: f64 = 0.10;
    /// `rate_window_seconds`: the rate spikes' window.
    pub const RATE_WINDOW_S: i64 = 300;
    /// A rate spike needs this many attempts in its window (a handful of requests is no rate).
    pub const MIN_SAMPLES: i64 = 10;
    /// A burn-rate baseline needs this many closed windows of history.
    pub const MIN_BURN_WINDOWS: i64 = 3;
}

/// The `RULES` table of the script library.
pub fn lua_table() -> String {
    use alerts::*;
    let th: Vec<String> = UTILIZATION.iter().map(|t| t.to_string()).collect();
    format!(
        "local RULES = {{DEFAULT_TTL_MS = {DEFAULT_TTL_MS}, MAX_TTL_MS = {MAX_TTL_MS}, MAX_EXTENSIONS = {MAX_EXTENSIONS}, \
         DEFAULT_GRACE_MS = {DEFAULT_GRACE_MS}, DEFAULT_OVERAGE_POLICY = '{}', MAX_POLICIES = {MAX_POLICIES}, \
         ALERTS = {{th = {{{}}}, bm = {BURN_MULTIPLIER:?}, bw = {BURN_WINDOW_S}, \
         dr = {DENIAL_RATE:?}, er = {EXPIRY_RATE:?}, ar = {AUTH_FAILURE_RATE:?}, rw = {RATE_WINDOW_S}, \
         min_samples = {MIN_SAMPLES}, min_burn_windows = {MIN_BURN_WINDOWS}}}}}\n",
        DEFAULT_OVERAGE_POLICY.as_str(),
        th.join(", ")
    )
}
