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

/// One EMF record: `dimensions` (name, value) become one dimension set; `metrics` are counts
/// (or milliseconds for names ending in `Ms`). Never carries secrets: names and numbers only.
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
            "Dimensions": [dimensions.iter().map(|(d, _)| *d).collect::<Vec<_>>()],
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

/// Per request: count, errors and latency by operation; decisions by decision and reason code.
pub fn request(op: &str, status: u16, latency_ms: f64, body: &[u8]) {
    if !ENABLED.load(Ordering::Relaxed) {
        return;
    }
    let server_error = f64::from(u8::from(status >= 500));
    let client_error = f64::from(u8::from((400..500).contains(&status)));
    emit(
        &[("Operation", op)],
        &[("Requests", 1.0), ("Errors", server_error), ("ClientErrors", client_error), ("LatencyMs", latency_ms)],
    );
    if status == 200 && matches!(op, "create-reservation" | "decide") {
        if let Ok(v) = serde_json::from_slice::<Value>(body) {
            let decision = v["decision"].as_str().unwrap_or("ALLOW");
            let reason = v["reason_code"].as_str().unwrap_or("NONE");
            emit(&[("Operation", op), ("Decision", decision), ("ReasonCode", reason)], &[("Decisions", 1.0)]);
        }
    }
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
        assert_eq!(m["Dimensions"], json!([["Operation"]]));
        assert_eq!(m["Metrics"][1], json!({"Name": "LatencyMs", "Unit": "Milliseconds"}));
        assert_eq!((r["Operation"].clone(), r["Requests"].clone()), (json!("commit-reservation"), json!(1.0)));
    }
}
