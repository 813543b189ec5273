//! The public action-kind registry of protocol v0.1.26: listing with filters and cursors, exact
//! lookup, cache validation, no key needed, and the per-address rate limit with Retry-After.

use cycles_tests::*;

#[tokio::test]
async fn the_registry_lists_in_pages_without_a_key() {
    let h = Harness::start().await;
    let first = h.send("GET", "/v1/action-kinds", &[], None).await;
    let body = first.assert_ok();
    assert_eq!(body["version"], "0.1.26");
    assert_eq!(body["kinds"].as_array().unwrap().len(), 50, "the default page");
    assert_eq!((body["has_more"].as_bool(), body["next_cursor"].as_str()), (Some(true), Some("50")));
    assert_eq!(body["kinds"][0]["kind"], "llm.completion");
    let etag = first.headers["etag"].clone();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    let rest = h.send("GET", "/v1/action-kinds?cursor=50&limit=100", &[], None).await;
    let body = rest.assert_ok();
    assert_eq!(body["kinds"].as_array().unwrap().len(), 12, "62 kinds in all");
    assert_eq!(body["has_more"], false);
    assert!(body.get("next_cursor").is_none());
    // cache validation: 304 without a body
    let again = h.send("GET", "/v1/action-kinds", &[("if-none-match", &etag)], None).await;
    assert_eq!((again.status, again.raw.as_str()), (304, ""));
    assert_eq!(again.headers["etag"], etag);
    let stale = h.send("GET", "/v1/action-kinds", &[("if-none-match", "\"other\"")], None).await;
    assert_eq!(stale.status, 200);
    // a risk class
    let r = h.send("GET", "/v1/action-kinds?risk_class=high_risk&limit=100", &[], None).await;
    let kinds = r.assert_ok()["kinds"].as_array().unwrap().clone();
    assert!(!kinds.is_empty() && kinds.iter().all(|k| k["risk_class"] == "high_risk"));
    for bad in ["risk_class=scary", "limit=0", "limit=101", "limit=ten", "cursor=abc", "deprecated=maybe"] {
        h.send("GET", &format!("/v1/action-kinds?{bad}"), &[], None).await.assert_error(400, "INVALID_REQUEST");
    }
}

#[tokio::test]
async fn a_kind_is_found_by_its_exact_string_only() {
    let h = Harness::start().await;
    let r = h.send("GET", "/v1/action-kinds/llm.completion", &[], None).await;
    let k = r.assert_ok();
    assert_eq!((k["kind"].as_str(), k["risk_class"].as_str()), (Some("llm.completion"), Some("side_effect")));
    assert!(k["mcp_tool_prefixes"].as_array().unwrap().iter().any(|p| p == "llm_"));
    for missing in ["llm", "LLM.completion", "llm.completion.x", "custom.acme.erp.post", "openai.completion"] {
        let r = h.send("GET", &format!("/v1/action-kinds/{missing}"), &[], None).await;
        r.assert_error(404, "NOT_FOUND");
    }
}

#[tokio::test]
async fn each_address_is_rate_limited_and_told_when_to_retry() {
    early_in_a_window(60_000, 5_000).await; // the limits count per calendar minute
    let h = Harness::start_configured(|c| c.public_rate_limit = 3).await;
    let (client, other) = (client_from(61), client_from(62));
    let etag = send_with(&client, &h.base, "GET", "/v1/action-kinds", &[], None).await.headers["etag"].clone();
    for path in ["/v1/action-kinds/http.get", "/v1/action-kinds?limit=1"] {
        send_with(&client, &h.base, "GET", path, &[], None).await.assert_ok();
    }
    let r = send_with(&client, &h.base, "GET", "/v1/action-kinds/http.get", &[], None).await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    let after: i64 = r.headers["retry-after"].parse().unwrap();
    assert!((1..=60).contains(&after), "Retry-After {after}");
    // a conditional request still answers 304, uncounted; another address is not limited
    let cached = send_with(&client, &h.base, "GET", "/v1/action-kinds", &[("if-none-match", &etag)], None).await;
    assert_eq!(cached.status, 304);
    send_with(&other, &h.base, "GET", "/v1/action-kinds", &[], None).await.assert_ok();
}
