//! A warm request makes exactly one Redis round trip: one FCALL of the Cycles library, or one
//! EVALSHA where the server refuses Redis Functions (observed with MONITOR on a Redis each test
//! starts for itself).

use cycles_shared::local::EmbeddedRedis;
use cycles_tests::*;

#[tokio::test]
async fn one_fcall_per_warm_request() {
    let h = private_redis(None).await;
    every_hot_path_request_is_one(&h, "fcall").await;
}

/// Without FUNCTION (as on Redis 6, or under such an ACL) the scripts run by EVALSHA.
#[tokio::test]
async fn one_evalsha_per_warm_request_where_functions_are_refused() {
    let h = private_redis(Some("-function -fcall -fcall_ro")).await;
    every_hot_path_request_is_one(&h, "evalsha").await;
}

/// FCALL allowed but the library cannot be loaded: EVALSHA too, after the first refusal.
#[tokio::test]
async fn one_evalsha_per_warm_request_where_the_library_cannot_be_loaded() {
    let h = private_redis(Some("-function")).await;
    every_hot_path_request_is_one(&h, "evalsha").await;
}

/// With CyclesEvidence on, a receipt costs one more round trip: one pipeline storing the
/// envelope and where a replay finds it, after the operation's one FCALL.
#[tokio::test]
async fn evidence_adds_one_pipelined_write() {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server for the round-trip test");
    let h = Harness::start_with_redis(redis, |c| {
        c.evidence.mode = cycles_shared::config::EvidenceMode::On;
        let keys = r#"[{"kid": "k", "private_key": "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60", "nbf_ms": 0}]"#;
        c.evidence.signer = Some(cycles_shared::evidence::Signer::from_config("https://x/v1", keys).unwrap());
        c.evidence.tenant_cache = std::time::Duration::from_secs(3600);
    })
    .await;
    let t = h.funded(1_000_000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await; // warm: scripts, the tenant's switch
    h.commit(&t, &rid, 5).await.assert_ok();
    let receipt = ["\"fcall\"", "\"set\"", "\"hset\"", "\"pexpire\""];
    assert_eq!(commands(&h, "reserve+evidence", h.reserve(&t, 10, json!({}))).await, receipt);
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    assert_eq!(commands(&h, "commit+evidence", h.commit(&t, &rid, 5)).await, receipt);
    let decide = json!({"idempotency_key": "d-1", "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
        "estimate": {"unit": "TOKENS", "amount": 1}});
    let record = ["\"fcall\"", "\"set\"", "\"set\""];
    assert_eq!(commands(&h, "decide+evidence", h.post(&t.key, "/v1/decide", &decide)).await, record);
    // reading a reservation with its receipts stays one round trip
    let path = format!("/v1/reservations/{rid}");
    assert_eq!(commands(&h, "get+evidence", h.get(&t.key, &path)).await, ["\"fcall\""]);
}

/// A tenant with policies is reserved by the governed script (`lua/reserve_governed.lua`): the
/// first reserve a gateway makes for it is handed over by the plain one, which writes nothing
/// (two round trips, one hold), and every later one goes there directly (one round trip); a
/// tenant without policies never leaves the plain one. Under Functions and by EVALSHA alike.
#[tokio::test]
async fn a_tenant_with_policies_is_handed_to_the_governed_reserve_once() {
    // (by EVALSHA, the governed script's text is loaded at its first call: refused, loaded, run)
    let evalsha_first = ["evalsha", "evalsha", "script", "evalsha"];
    for (denied, command, handed) in
        [(None, "fcall", &["fcall", "fcall"][..]), (Some("-function -fcall -fcall_ro"), "evalsha", &evalsha_first[..])]
    {
        let h = private_redis(denied).await;
        let (plain, governed) = (h.funded(1_000_000).await, h.funded(1_000_000).await);
        h.reserve_ok(&plain, 10, json!({})).await;
        h.reserve_ok(&governed, 10, json!({})).await; // (warm, still without a policy)
        let policy = json!({"tenant_id": governed.id, "name": "caps", "scope_pattern": format!("tenant:{}", governed.id),
            "caps": {"max_tokens": 64}});
        assert_eq!(h.admin("POST", "/v1/admin/policies", Some(&policy)).await.status, 201);

        let first = commands(&h, "first governed reserve", async {
            let r = h.reserve(&governed, 10, json!({})).await;
            // the policy's caps: the governed script decided it
            assert_eq!(r.assert_ok()["decision"], "ALLOW_WITH_CAPS", "{}", r.raw);
            r
        })
        .await;
        assert_eq!(first, handed.iter().map(|c| format!("\"{c}\"")).collect::<Vec<_>>(), "handed over once");
        assert_eq!(h.root(&governed).await.reserved, 20, "one hold: the plain script wrote nothing");
        one_round_trip(&h, "governed reserve", command, h.reserve(&governed, 10, json!({}))).await;
        one_round_trip(&h, "plain reserve", command, h.reserve(&plain, 10, json!({}))).await;
        assert_eq!((h.root(&governed).await.reserved, h.root(&plain).await.reserved), (30, 20));
    }
}

/// A reserve no budget of its unit covers is answered by the governed script (which tells a unit
/// mismatch from a missing budget), for that call only: the tenant's next reserve is one round
/// trip again.
#[tokio::test]
async fn a_reserve_without_a_budget_is_answered_by_the_governed_reserve_for_that_call_only() {
    let h = private_redis(None).await;
    let t = h.funded(1_000_000).await;
    h.reserve_ok(&t, 10, json!({})).await;
    let seen = commands(&h, "unbudgeted reserve", async {
        let r = h.reserve(&t, 10, json!({"subject": {"workspace": "nobody"}})).await;
        r.assert_error(404, "NOT_FOUND");
        Resp { status: 200, ..r }
    })
    .await;
    assert_eq!(seen, vec!["\"fcall\"", "\"fcall\""], "handed over for this call");
    one_round_trip(&h, "budgeted reserve", "fcall", h.reserve(&t, 10, json!({}))).await;
    assert_eq!(h.root(&t).await.reserved, 20);
}

/// A harness on a private standalone server (other tests must not pollute MONITOR), connected
/// as a user whose ACL removes `denied` commands, when given.
async fn private_redis(denied: Option<&str>) -> Harness {
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server for the round-trip test");
    let Some(denied) = denied else {
        return Harness::start_on(redis.url(), Some(redis)).await;
    };
    let client = redis::Client::open(redis.url()).unwrap();
    let mut admin = client.get_multiplexed_async_connection().await.unwrap();
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER").arg("restricted").arg("on").arg(">pw").arg("~*").arg("&*").arg("+@all");
    acl.arg(denied.split(' ').collect::<Vec<_>>());
    let _: () = acl.query_async(&mut admin).await.unwrap();
    let url = format!("redis://restricted:pw@127.0.0.1:{}", redis.port);
    Harness::start_on(url, Some(redis)).await
}

async fn every_hot_path_request_is_one(h: &Harness, command: &str) {
    let t = h.funded(1_000_000).await;
    // Warm up: scripts loaded, key lookup cached.
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.extend(&t, &rid, 10).await.assert_ok();
    h.commit(&t, &rid, 5).await.assert_ok();
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.release(&t, &rid).await.assert_ok();
    h.reserve(&t, 1, json!({"dry_run": true})).await.assert_ok();
    let warm = |key: &str| {
        json!({"idempotency_key": key, "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
            "actual": {"unit": "TOKENS", "amount": 1}})
    };
    assert_eq!(h.post(&t.key, "/v1/events", &warm("warm-event")).await.status, 201);
    let mut warm_decide = warm("warm-decide");
    merge(&mut warm_decide, json!({"actual": null, "estimate": {"unit": "TOKENS", "amount": 1}}));
    h.post(&t.key, "/v1/decide", &warm_decide).await.assert_ok();
    h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_ok();

    let rid = h.reserve_ok(&t, 10, json!({})).await;
    one_round_trip(h, "reserve", command, h.reserve(&t, 10, json!({}))).await;
    one_round_trip(h, "dry_run", command, h.reserve(&t, 10, json!({"dry_run": true}))).await;
    one_round_trip(h, "extend", command, h.extend(&t, &rid, 10)).await;
    one_round_trip(h, "get", command, h.get(&t.key, &format!("/v1/reservations/{rid}"))).await;
    one_round_trip(h, "commit", command, h.commit(&t, &rid, 5)).await;
    let event = json!({"idempotency_key": "ev-1", "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
        "actual": {"unit": "TOKENS", "amount": 1}});
    let (body, path) = (event.to_string(), "/v1/events");
    one_round_trip(h, "event", command, async {
        let r = h.send("POST", path, &[("x-cycles-api-key", &t.key)], Some(&body)).await;
        assert_eq!(r.status, 201);
        Resp { status: 200, ..r }
    })
    .await;
    let decide = json!({"idempotency_key": "d-1", "subject": {"tenant": t.id}, "action": {"kind": "k", "name": "n"},
        "estimate": {"unit": "TOKENS", "amount": 1}});
    one_round_trip(h, "decide", command, h.post(&t.key, "/v1/decide", &decide)).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    one_round_trip(h, "release", command, h.release(&t, &rid)).await;
}

/// Runs `request` and asserts that exactly one command — `command` — reached Redis from a
/// client (`monitored`).
async fn one_round_trip(h: &Harness, name: &str, command: &str, request: impl std::future::Future<Output = Resp>) {
    let seen = commands(h, name, request).await;
    assert_eq!(seen, vec![format!("\"{command}\"")], "{name} made other round trips");
}

/// The commands that reached Redis from a client while `request` ran, in order.
async fn commands(h: &Harness, name: &str, request: impl std::future::Future<Output = Resp>) -> Vec<String> {
    monitored(h, name, request).await.into_iter().map(|words| words[0].to_lowercase()).collect()
}
