//! The webhook security configuration (getWebhookSecurityConfig, updateWebhookSecurityConfig):
//! stored, so it is in force on the next webhook write and the next delivery pass of every
//! container; validated; audited; the environment's rules apply while none is stored.
//!
//! The configuration is deployment-wide, so this binary holds one test (tests sharing one
//! Redis Cluster never see it) and removes the stored configuration before and after.

use cycles_shared::egress::DEFAULT_BLOCKED;
use cycles_shared::ops::settings::WEBHOOK_SECURITY;
use cycles_tests::receiver::Receiver;
use cycles_tests::*;
use redis::AsyncCommands;

const PATH: &str = "/v1/admin/config/webhook-security";

/// Removes the stored configuration when dropped, so a failing test leaves none behind.
struct Cleared(String);

impl Drop for Cleared {
    fn drop(&mut self) {
        if let Ok(client) = redis::Client::open(self.0.as_str()) {
            if let Ok(mut c) = client.get_connection() {
                let _: redis::RedisResult<()> = redis::cmd("DEL").arg(WEBHOOK_SECURITY).query(&mut c);
            }
        }
    }
}

async fn create(h: &Harness, tenant: &str, url: &str) -> Resp {
    let body = json!({"url": url, "event_types": ["budget.funded"], "retry_policy": {"max_retries": 0}});
    h.admin("POST", &format!("/v1/admin/webhooks?tenant_id={tenant}"), Some(&body)).await
}

#[tokio::test]
async fn the_stored_configuration_governs_writes_and_deliveries() {
    let h = Harness::start().await;
    let _: () = h.store.conn().del(WEBHOOK_SECURITY).await.unwrap();
    let _cleared = Cleared(h.redis_url.clone());
    let t = h.funded(100).await;
    let rx = Receiver::start().await;

    // none stored: the environment's rules, as in force. A deployment blocks the defaults...
    let defaults: Vec<&str> = DEFAULT_BLOCKED.split(',').collect();
    let deployed = Harness::start_beside(&h, |c| {
        c.webhooks.egress = cycles_shared::egress::EgressRules { allow_http: true, ..Default::default() }
    })
    .await;
    let r = deployed.admin("GET", PATH, None).await;
    assert_eq!(
        r.assert_ok(),
        &json!({"blocked_cidr_ranges": defaults, "allowed_url_patterns": [], "allow_http": true})
    );
    assert!(defaults.contains(&"127.0.0.0/8"));
    // ...while the development switch (the harness's, cycles-local --dev-webhooks) blocks
    // nothing, and so lists nothing (issue 27: it listed 127.0.0.0/8 while loopback was allowed)
    let r = h.admin("GET", PATH, None).await;
    assert_eq!(r.assert_ok(), &json!({"blocked_cidr_ranges": [], "allowed_url_patterns": [], "allow_http": true}));
    let sub = create(&h, &t.id, &rx.url).await;
    assert_eq!(sub.status, 201, "{}", sub.raw);
    let sub_id = sub.body["subscription"]["subscription_id"].as_str().unwrap().to_string();

    // an allow-list that the receiver does not match; absent fields take the spec's defaults
    let put = h
        .admin("PUT", PATH, Some(&json!({"allowed_url_patterns": ["https://93.184.216.34/*"], "allow_http": true})))
        .await;
    let stored = json!({"blocked_cidr_ranges": defaults, "allowed_url_patterns": ["https://93.184.216.34/*"], "allow_http": true});
    let in_force =
        json!({"blocked_cidr_ranges": [], "allowed_url_patterns": ["https://93.184.216.34/*"], "allow_http": true});
    assert_eq!(put.assert_ok(), &in_force);
    assert_eq!(h.admin("GET", PATH, None).await.assert_ok(), &in_force);
    assert_eq!(deployed.admin("GET", PATH, None).await.assert_ok(), &stored, "a deployment blocks the defaults");
    let raw: String = h.store.conn().get(WEBHOOK_SECURITY).await.unwrap();
    assert_eq!(serde_json::from_str::<serde_json::Value>(&raw).unwrap(), stored);
    let put_request = put.headers["x-request-id"].clone();

    // the next write is checked against it, on both write paths
    create(&h, &t.id, &rx.url).await.assert_error(400, "WEBHOOK_URL_INVALID");
    let k = h.key(&t.id, Some(vec!["webhooks:write".into()])).await;
    let body = json!({"url": rx.url, "event_types": ["budget.funded"]});
    h.admin_as(&k.secret, "POST", "/v1/webhooks", Some(&body)).await.assert_error(400, "WEBHOOK_URL_INVALID");
    h.admin("PATCH", &format!("/v1/admin/webhooks/{sub_id}"), Some(&json!({"url": format!("{}/x", rx.url)})))
        .await
        .assert_error(400, "WEBHOOK_URL_INVALID");
    assert_eq!(create(&h, &t.id, "https://93.184.216.34/in").await.status, 201);

    // and the next delivery pass: the existing subscription's endpoint is no longer called
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 5}});
    let path = format!("/v1/admin/budgets/fund?scope=tenant:{}&unit=TOKENS&tenant_id={}", t.id, t.id);
    h.admin("POST", &path, Some(&fund)).await.assert_ok();
    let report = h.deliver(&[&t.id]).await;
    assert_eq!((report.deliveries_created, report.failed), (2, 2), "both endpoints refused or unreachable: {report:?}");
    assert!(rx.received().is_empty(), "the endpoint outside the allow-list was not called");

    // bad configurations are refused whole, and change nothing
    for (bad, why) in [
        (json!({"blocked_cidr_ranges": ["10.0.0.0/33"]}), "not a CIDR"),
        (json!({"blocked_cidr_ranges": ["nonsense"]}), "not a CIDR"),
        (json!({"allowed_url_patterns": [""]}), "an empty pattern"),
        (json!({"allow_http": "yes"}), "not a boolean"),
        (json!({"allow_https": true}), "an unknown field"),
        (json!({"blocked_cidr_ranges": vec!["10.0.0.0/8"; 257]}), "too many entries"),
    ] {
        let r = h.admin("PUT", PATH, Some(&bad)).await;
        r.assert_error(400, "INVALID_REQUEST");
        assert_error_shape(&r);
        assert_eq!(h.admin("GET", PATH, None).await.assert_ok(), &in_force, "{why}");
    }
    h.send_to(&h.admin_base, "GET", PATH, &[("x-cycles-api-key", &t.key)], None)
        .await
        .assert_error(401, "UNAUTHORIZED");
    h.send_to(&h.admin_base, "PUT", PATH, &[("x-cycles-api-key", &t.key)], Some(&json!({}).to_string()))
        .await
        .assert_error(401, "UNAUTHORIZED");

    // http refused by the stored configuration though the environment allows it
    h.admin("PUT", PATH, Some(&json!({"allow_http": false}))).await.assert_ok();
    create(&h, &t.id, &rx.url).await.assert_error(400, "WEBHOOK_URL_INVALID");

    // the change is audited, by its own script, with before and after
    let r = h.admin("GET", &format!("/v1/admin/audit/logs?tenant_id=__admin__&request_id={put_request}"), None).await;
    let e = &r.assert_ok()["logs"][0];
    assert_eq!(
        (e["operation"].as_str(), e["status"].as_u64(), e["resource_type"].as_str()),
        (Some("updateWebhookSecurityConfig"), Some(200), Some("config"))
    );
    assert_eq!(e["metadata"]["current"]["allowed_url_patterns"], json!(["https://93.184.216.34/*"]), "{e}");

    // loosened again: writes and deliveries reach the receiver
    h.admin("PUT", PATH, Some(&json!({"allow_http": true}))).await.assert_ok();
    assert_eq!(create(&h, &t.id, &rx.url).await.status, 201);
    h.admin("POST", &format!("/v1/admin/webhooks/{sub_id}/replay"), Some(&json!({}))).await;
    rx.wait_for(1, std::time::Duration::from_secs(10), || async {
        h.deliver(&[&t.id]).await;
    })
    .await;
}
