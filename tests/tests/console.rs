//! What an operator console served from another origin relies on: CORS for allowed origins only
//! (both planes, preflights included), and list limits clamped to their maximum.

use cycles_tests::*;

const CONSOLE: &str = "https://console.example.com";

#[tokio::test]
async fn allowed_origins_get_cors_answers_on_both_planes() {
    let h = Harness::start_configured(|c| c.cors_origins = vec![CONSOLE.to_string()]).await;
    let t = h.funded(100).await;
    // preflight on the operator plane: the methods this path serves
    let pre = h
        .send_to(
            &h.admin_base,
            "OPTIONS",
            &format!("/v1/admin/tenants/{}", t.id),
            &[("origin", CONSOLE), ("access-control-request-method", "PATCH")],
            None,
        )
        .await;
    assert_eq!(pre.status, 204, "{}", pre.raw);
    assert_eq!(pre.headers["access-control-allow-origin"], CONSOLE);
    assert_eq!(pre.headers["access-control-allow-methods"], "GET, PATCH");
    assert!(pre.headers["access-control-allow-headers"].contains("x-admin-api-key"));
    // the answer itself, success and error alike
    let ok = h
        .send_to(
            &h.admin_base,
            "GET",
            "/v1/admin/tenants",
            &[("origin", CONSOLE), ("x-admin-api-key", ADMIN_KEY)],
            None,
        )
        .await;
    assert_eq!(ok.status, 200);
    assert_eq!(ok.headers["access-control-allow-origin"], CONSOLE);
    assert!(ok.headers["access-control-expose-headers"].contains("x-request-id"));
    let denied = h.send_to(&h.admin_base, "GET", "/v1/admin/tenants", &[("origin", CONSOLE)], None).await;
    assert_eq!((denied.status, denied.headers["access-control-allow-origin"].as_str()), (401, CONSOLE));
    // the runtime plane too
    let pre = h
        .send("OPTIONS", "/v1/reservations", &[("origin", CONSOLE), ("access-control-request-method", "POST")], None)
        .await;
    assert_eq!((pre.status, pre.headers["access-control-allow-methods"].as_str()), (204, "GET, POST"));
    // another origin: no CORS headers, preflight refused
    let other = h
        .send_to(
            &h.admin_base,
            "GET",
            "/v1/admin/tenants",
            &[("origin", "https://evil.example"), ("x-admin-api-key", ADMIN_KEY)],
            None,
        )
        .await;
    assert_eq!(other.status, 200);
    assert!(!other.headers.contains_key("access-control-allow-origin"));
    let pre = h
        .send_to(
            &h.admin_base,
            "OPTIONS",
            "/v1/admin/tenants",
            &[("origin", "https://evil.example"), ("access-control-request-method", "GET")],
            None,
        )
        .await;
    pre.assert_error(403, "FORBIDDEN");
}

#[tokio::test]
async fn nothing_is_open_by_default() {
    let h = Harness::start().await;
    let r = h
        .send_to(
            &h.admin_base,
            "GET",
            "/v1/admin/tenants",
            &[("origin", CONSOLE), ("x-admin-api-key", ADMIN_KEY)],
            None,
        )
        .await;
    assert_eq!(r.status, 200);
    assert!(!r.headers.contains_key("access-control-allow-origin") && !r.headers.contains_key("vary"));
    let pre = h
        .send_to(
            &h.admin_base,
            "OPTIONS",
            "/v1/admin/tenants",
            &[("origin", CONSOLE), ("access-control-request-method", "GET")],
            None,
        )
        .await;
    pre.assert_error(403, "FORBIDDEN");
}

#[tokio::test]
async fn operator_list_limits_are_clamped_runtime_limits_are_not() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    for _ in 0..3 {
        h.reserve_ok(&t, 1, json!({})).await;
    }
    let r = h.admin("GET", &format!("/v1/admin/budgets?tenant_id={}&limit=5000", t.id), None).await;
    assert_eq!(r.assert_ok()["ledgers"].as_array().unwrap().len(), 1);
    h.admin("GET", "/v1/admin/budgets?limit=0", None).await.assert_error(400, "INVALID_REQUEST");
    // the runtime protocol keeps its 1..200 bound
    h.get(&t.key, "/v1/reservations?limit=201").await.assert_error(400, "INVALID_REQUEST");
}

#[tokio::test]
async fn the_operator_plane_can_be_restricted_to_source_ranges() {
    let h = Harness::start_configured(|c| c.admin_allowed_cidrs = vec!["10.0.0.0/8".into()]).await;
    let r = h.admin("GET", "/v1/admin/tenants", None).await;
    r.assert_error(403, "FORBIDDEN");
    assert_error_shape(&r);
    // the runtime plane is not restricted
    assert_eq!(h.send("GET", "/health/live", &[], None).await.status, 200);
    let open = Harness::start_configured(|c| c.admin_allowed_cidrs = vec!["127.0.0.0/8".into()]).await;
    open.admin("GET", "/v1/admin/tenants", None).await.assert_ok();
}
