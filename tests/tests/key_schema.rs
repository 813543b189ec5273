//! Client text never shapes a key: idempotency keys with braces, colons, globs, unicode or 256
//! characters stay in the tenant's slot and never collide; odd reservation ids are just 404s.

use cycles_tests::*;

#[tokio::test]
async fn hostile_idempotency_keys_work_and_stay_distinct() {
    let h = Harness::start().await;
    let t = h.funded(10_000).await;
    let keys = [
        "{tenant-x}".to_string(),
        "a:b:c".to_string(),
        "*".to_string(),
        "}{".to_string(),
        "ключ-🔑".to_string(),
        "k".repeat(256),
        format!("{}x", "k".repeat(255)),
    ];
    let mut ids = std::collections::HashSet::new();
    for (i, key) in keys.iter().enumerate() {
        let r = h.reserve(&t, 1 + i as i64, json!({"idempotency_key": key})).await;
        let id = r.assert_ok()["reservation_id"].as_str().unwrap().to_string();
        assert!(ids.insert(id.clone()), "distinct keys never share a reservation");
        // replays find the same reservation; commits with the same odd key work too
        let again = h.reserve(&t, 1 + i as i64, json!({"idempotency_key": key})).await;
        assert_eq!(again.assert_ok()["reservation_id"], id.as_str());
        let c = json!({"idempotency_key": key, "actual": {"unit": "TOKENS", "amount": 1}});
        h.post(&t.key, &format!("/v1/reservations/{id}/commit"), &c).await.assert_ok();
        let d = json!({"idempotency_key": key, "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
            "estimate": {"unit": "TOKENS", "amount": 1}});
        h.post(&t.key, "/v1/decide", &d).await.assert_ok();
    }
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (0, keys.len() as i64));
}

#[tokio::test]
async fn odd_reservation_ids_are_plain_not_found() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    for id in ["{x}", "a:b", "%2A", "x.y.z", "%F0%9F%94%91", &format!("{}.{}.{}", t.id, "{AAAAAAAAAAAA}", "AAAAAAAA")] {
        let r = h.get(&t.key, &format!("/v1/reservations/{id}")).await;
        assert!(matches!(r.status, 403 | 404), "{id}: {}", r.raw);
        assert_error_shape(&r);
    }
    let long = "é".repeat(128);
    h.get(&t.key, &format!("/v1/reservations/{long}")).await.assert_error(404, "NOT_FOUND");
    h.get(&t.key, &format!("/v1/reservations/{long}x")).await.assert_error(400, "INVALID_REQUEST");
}

/// Only ops choose keys (the engine issue's one key schema): no handler of `shared/src/api`
/// names a key of the schema; each asks an op by tenant, id or token.
#[test]
fn handlers_choose_no_keys() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/src/api");
    let banned = [
        "TenantKeys",
        "keys::key_lookup",
        "keys::webhook_lookup",
        "keys::policy_lookup",
        "keys::auth_failures",
        "keys::public_requests",
        "keys::evidence(",
        "keys::due_index",
        "HEALTH_PROBE",
        "TENANT_REGISTRY",
        "SWEEP_SLOTS",
        "TRIM_CURSOR",
    ];
    let mut files = 0;
    for entry in std::fs::read_dir(dir).expect("shared/src/api") {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        files += 1;
        for b in banned {
            assert!(!text.contains(b), "{} names a key ({b}): ask an op instead", path.display());
        }
    }
    assert!(files > 20, "read the handlers");
}
