//! Counters as CloudWatch Embedded Metric Format (EMF) lines: one JSON object per line on
//! stdout, which CloudWatch turns into metrics without any API call. Enabled by the Lambda
//! front ends; the local gateway keeps its output readable.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{json, Map, Value};

static ENABLED: AtomicBool = AtomicBool::new(false);

pub const NAMESPACE: &str = "Cycles";

pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// One EMF record: `dimensions` (name, value) become one dimension set, and the empty set too,
/// so every metric also exists as a service-wide total (what the template's alarms watch);
/// `metrics` are counts (or milliseconds for names ending in `Ms`). Never carries secrets:
/// names and numbers only.
pub fn record(dimensions: &[(&str, &str)], metrics: &[(&str, f64)], timestamp_ms: i64) -> Value {
    let mut root = Map::new();
    let defs: Vec<Value> = metrics
        .iter()
        .map(|(name, _)| json!({"Name": name, "Unit": if name.ends_with("Ms") { "Milliseconds" } else { "Count" }}))
        .collect();
    root.insert(
        "_aws".into(),
        json!({"Timestamp": timestamp_ms, "CloudWatchMetrics": [{
            "Namespace": NAMESPACE,
            "Dimensions": [dimensions.iter().map(|(d, _)| *d).collect::<Vec<_>>(), Vec::<&str>::new()],
            "Metrics": defs,
        }]}),
    );
    for (d, v) in dimensions {
        root.insert(d.to_string(), json!(v));
    }
    for (m, v) in metrics {
        root.insert(m.to_string(), json!(v));
    }
    Value::Object(root)
}

/// Prints one EMF line when enabled.
pub fn emit(dimensions: &[(&str, &str)], metrics: &[(&str, f64)]) {
    if ENABLED.load(Ordering::Relaxed) {
        println!("{}", record(dimensions, metrics, crate::domain::now_ms()));
    }
}

/// Per request: count, errors, replays and latency by operation; decisions by decision and
/// reason code.
pub fn request(op: &str, status: u16, latency_ms: f64, body: &[u8], replayed: bool) {
    if ENABLED.load(Ordering::Relaxed) {
        for r in request_records(op, status, latency_ms, body, replayed, crate::domain::now_ms()) {
            println!("{r}");
        }
    }
}

/// The EMF records of one request. `StoreErrors` counts the answers given because Redis could
/// not be reached (the 500 whose message is `error::STORE_UNAVAILABLE`).
pub fn request_records(op: &str, status: u16, latency_ms: f64, body: &[u8], replayed: bool, now_ms: i64) -> Vec<Value> {
    let server_error = f64::from(u8::from(status >= 500));
    let unavailable = crate::error::STORE_UNAVAILABLE.as_bytes();
    let store_error = status == 500 && body.windows(unavailable.len()).any(|w| w == unavailable);
    let client_error = f64::from(u8::from((400..500).contains(&status)));
    let mut out = vec![record(
        &[("Operation", op)],
        &[
            ("Requests", 1.0),
            ("Errors", server_error),
            ("ClientErrors", client_error),
            ("Replays", f64::from(u8::from(replayed))),
            ("StoreErrors", f64::from(u8::from(store_error))),
            ("LatencyMs", latency_ms),
        ],
        now_ms,
    )];
    // A replay repeats an earlier decision; it is not a new one.
    if status == 200 && !replayed && matches!(op, "create-reservation" | "decide") {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            let decision = v["decision"].as_str().unwrap_or("ALLOW");
            let reason = v["reason_code"].as_str().unwrap_or("NONE");
            let dimensions = [("Operation", op), ("Decision", decision), ("ReasonCode", reason)];
            out.push(record(&dimensions, &[("Decisions", 1.0)], now_ms));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_the_emf_shape() {
        let r = record(&[("Operation", "commit-reservation")], &[("Requests", 1.0), ("LatencyMs", 2.5)], 42);
        let m = &r["_aws"]["CloudWatchMetrics"][0];
        assert_eq!(r["_aws"]["Timestamp"], 42);
        assert_eq!(m["Namespace"], "Cycles");
        assert_eq!(m["Dimensions"], json!([["Operation"], []]), "per operation and service-wide");
        assert_eq!(m["Metrics"][1], json!({"Name": "LatencyMs", "Unit": "Milliseconds"}));
        assert_eq!((r["Operation"].clone(), r["Requests"].clone()), (json!("commit-reservation"), json!(1.0)));
    }

    #[test]
    fn replays_are_counted_apart_from_decisions() {
        let body = br#"{"decision":"DENY","reason_code":"BUDGET_EXCEEDED"}"#;
        let fresh = request_records("decide", 200, 1.0, body, false, 7);
        assert_eq!(fresh.len(), 2);
        assert_eq!(
            (fresh[0]["Replays"].clone(), fresh[1]["ReasonCode"].clone()),
            (json!(0.0), json!("BUDGET_EXCEEDED"))
        );
        let replay = request_records("decide", 200, 1.0, body, true, 7);
        assert_eq!(replay.len(), 1, "a replay is no new decision");
        assert_eq!(replay[0]["Replays"], json!(1.0));
        let failed = request_records("commit-reservation", 503, 1.0, b"{}", false, 7);
        assert_eq!((failed[0]["Errors"].clone(), failed[0]["ClientErrors"].clone()), (json!(1.0), json!(0.0)));
    }

    #[test]
    fn store_failures_are_counted_apart() {
        let down = serde_json::to_vec(&json!({"error": "INTERNAL_ERROR", "message": crate::error::STORE_UNAVAILABLE}))
            .unwrap();
        assert_eq!(request_records("decide", 500, 1.0, &down, false, 0)[0]["StoreErrors"], json!(1.0));
        let fault = br#"{"error":"INTERNAL_ERROR","message":"Internal error"}"#;
        assert_eq!(request_records("decide", 500, 1.0, fault, false, 0)[0]["StoreErrors"], json!(0.0));
    }
}
