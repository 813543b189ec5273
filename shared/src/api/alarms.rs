//! System alerts a container observes itself: the store lost and found again
//! (system.store_connection_lost / _restored, written once the store answers again, since
//! nothing can be written while it is lost) and an operation whose p99 latency over a window
//! exceeds `CYCLES_HIGH_LATENCY_MS` (system.high_latency). Each is written by `system_alert.lua`,
//! once however many containers saw the same condition.

use std::collections::HashMap;
use std::sync::Mutex;

use serde_json::{json, Value};

use super::{App, Ctx};
use crate::domain::{format_rfc3339_ms, now_ms};

/// Latency samples kept per operation and window (a reservoir beyond it).
const SAMPLES: usize = 2_000;
/// A window needs this many requests before its p99 means anything.
const MIN_SAMPLES: usize = 20;

/// What this container has seen of the store and of its operations' latency.
#[derive(Default)]
pub struct Alarms {
    /// When the store was first found unreachable, and how many answers failed since.
    lost: Mutex<Option<(i64, u64)>>,
    windows: Mutex<HashMap<&'static str, Window>>,
}

#[derive(Default)]
struct Window {
    start_ms: i64,
    seen: u64,
    samples: Vec<f64>,
}

impl Alarms {
    /// A store failure (an answer given because Redis could not be reached).
    fn store_lost(&self, now: i64) {
        let mut lost = self.lost.lock().expect("alarm lock");
        let (since, failures) = lost.unwrap_or((now, 0));
        *lost = Some((since, failures + 1));
    }

    /// The store answered: the outage it ends, if there was one.
    fn store_answered(&self) -> Option<(i64, u64)> {
        self.lost.lock().expect("alarm lock").take()
    }

    /// Adds a latency; when it closes a window whose p99 exceeds `threshold_ms`, that p99 and
    /// the window's request count.
    fn latency(&self, op: &'static str, ms: f64, now: i64, window_ms: i64, threshold_ms: f64) -> Option<(f64, u64)> {
        let mut windows = self.windows.lock().expect("alarm lock");
        let w = windows.entry(op).or_insert_with(|| Window { start_ms: now, ..Default::default() });
        let mut closed = None;
        if now - w.start_ms >= window_ms {
            if w.samples.len() >= MIN_SAMPLES {
                w.samples.sort_by(f64::total_cmp);
                let p99 = w.samples[(w.samples.len() * 99).div_ceil(100) - 1];
                if p99 > threshold_ms {
                    closed = Some((p99, w.seen));
                }
            }
            *w = Window { start_ms: now, ..Default::default() };
        }
        w.seen += 1;
        if w.samples.len() < SAMPLES {
            w.samples.push(ms);
        } else {
            // reservoir sampling keeps the window's sample uniform
            let at = (now as u64 ^ w.seen.wrapping_mul(0x9E37_79B9_7F4A_7C15)) % w.seen;
            if (at as usize) < SAMPLES {
                w.samples[at as usize] = ms;
            }
        }
        closed
    }
}

/// Looks at one answered request: its store failure or success, and its latency. Writes the
/// alerts it completes (their failures are logged, never the request's).
pub async fn observe(app: &App, ctx: &Ctx, status: u16, store_down: bool, latency_ms: f64) {
    let now = now_ms();
    let mut events: Vec<(&str, Value)> = vec![];
    let mut marker = None;
    if store_down {
        app.alarms.store_lost(now);
    } else if (200..300).contains(&status) {
        if let Some((since, failures)) = app.alarms.store_answered() {
            let details = json!({"lost_at": format_rfc3339_ms(since), "restored_at": format_rfc3339_ms(now),
                "outage_ms": now - since, "failed_requests": failures});
            events.push((
                "system.store_connection_lost",
                system_data("critical", "The budget store could not be reached", &details),
            ));
            events.push((
                "system.store_connection_restored",
                system_data("info", "The budget store answers again", &details),
            ));
            marker = Some(("store-outage".to_string(), 60_000));
        }
    }
    let threshold = app.config.high_latency_ms;
    let window_ms = app.config.high_latency_window.as_millis() as i64;
    if threshold > 0.0 {
        if let Some((p99, requests)) = app.alarms.latency(ctx.operation, latency_ms, now, window_ms, threshold) {
            let details = json!({"operation": ctx.operation, "p99_ms": (p99 * 1000.0).round() / 1000.0,
                "threshold_ms": threshold, "window_seconds": window_ms / 1000, "requests": requests});
            let message = format!("p99 latency of {} was {p99:.1} ms, over {threshold} ms", ctx.operation);
            events.push(("system.high_latency", system_data("warning", &message, &details)));
            marker.get_or_insert((format!("high-latency:{}", ctx.operation), window_ms));
        }
    }
    let Some((name, ttl)) = marker else { return };
    let context = json!({"request_id": ctx.request_id, "trace_id": ctx.trace.trace_id}).to_string();
    let alerts = events.into_iter().flat_map(|(t, d)| [t.to_string(), d.to_string()]).collect();
    if let Err(e) = crate::ops::webhooks::system_alert(&app.store, &name, ttl, context, alerts).await {
        tracing::warn!(error = %e.message, "could not write a system alert");
    }
}

/// EventDataSystem.
fn system_data(severity: &str, message: &str, details: &Value) -> Value {
    let component = if details.get("operation").is_some() { "api" } else { "store" };
    json!({"component": component, "message": message, "severity": severity, "details": details})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_closes_with_its_p99_only_when_over_the_threshold() {
        let a = Alarms::default();
        for i in 0..100 {
            // 1..=100 ms: p99 is 99 ms
            assert_eq!(a.latency("op", f64::from(i + 1), 1_000 + i64::from(i), 60_000, 50.0), None);
        }
        assert_eq!(a.latency("op", 1.0, 61_000, 60_000, 50.0), Some((99.0, 100)));
        // the next window starts afresh; too few requests say nothing
        for i in 0..10 {
            a.latency("op", 500.0, 61_001 + i, 60_000, 50.0);
        }
        assert_eq!(a.latency("op", 1.0, 130_000, 60_000, 50.0), None, "11 requests are not a p99");
        // under the threshold: nothing
        for i in 0..30 {
            a.latency("fast", 2.0, i, 60_000, 50.0);
        }
        assert_eq!(a.latency("fast", 2.0, 60_000, 60_000, 50.0), None);
    }

    #[test]
    fn an_outage_is_told_once_when_the_store_answers() {
        let a = Alarms::default();
        assert_eq!(a.store_answered(), None);
        a.store_lost(1_000);
        a.store_lost(2_000);
        assert_eq!(a.store_answered(), Some((1_000, 2)));
        assert_eq!(a.store_answered(), None);
    }
}
