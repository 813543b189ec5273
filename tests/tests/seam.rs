//! The seam between Rust and Lua: stored answers written by earlier versions (arrays) replay
//! exactly like today's (objects), and the rules both sides execute agree case by case.

use cycles_shared::ids::ReservationId;
use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;
use serde_json::{json, Value};

/// The flat balances of an earlier stored answer: 7 strings per budget.
fn flat(balances: &Value) -> Vec<Value> {
    balances.as_array().map(|b| b.iter().flat_map(|row| row.as_array().unwrap().clone()).collect()).unwrap_or_default()
}

fn text(v: &Value) -> Value {
    if v.is_null() {
        json!("")
    } else {
        v.clone()
    }
}

/// An answer stored the way versions before the typed seam stored it.
fn legacy(kind: &str, now: &Value) -> Value {
    let mut out = match kind {
        "reserve" => vec![now["decision"].clone(), now["expires_at_ms"].clone(), text(&now["caps"])],
        "commit" => vec![now["charged"].clone(), text(&now["released"])],
        "release" => vec![now["released"].clone()],
        "extend" => return json!([now["expires_at_ms"]]),
        "evaluate" => {
            vec![now["decision"].clone(), text(&now["reason_code"]), text(&now["caps"]), now["codes"].clone()]
        }
        "charge" => vec![now["event_id"].clone(), text(&now["charged"]), now["codes"].clone()],
        "fund" => {
            let fields = ["operation", "previous_allocated", "new_allocated", "previous_remaining", "new_remaining"];
            let more = ["previous_debt", "new_debt", "previous_spent", "new_spent", "timestamp_ms"];
            return Value::Array(fields.iter().chain(&more).map(|f| now[*f].clone()).collect());
        }
        other => panic!("no legacy shape for {other}"),
    };
    out.extend(flat(&now["balances"]));
    Value::Array(out)
}

/// Rewrites an answer kept in a reservation record's field (`result`, `cr`, `rr`) to its
/// legacy shape.
async fn age_record_field(h: &Harness, key: &str, field: &str, kind: &str) {
    let mut conn = h.store.conn();
    let raw: String = conn.get(key).await.unwrap();
    let mut rec: Value = serde_json::from_str(&raw).unwrap();
    assert!(rec[field].is_object(), "{field} is stored as an object today: {raw}");
    rec[field] = legacy(kind, &rec[field]);
    let _: () = redis::cmd("SET").arg(key).arg(rec.to_string()).arg("KEEPTTL").query_async(&mut conn).await.unwrap();
}

/// Rewrites the `result` of an idempotency record (a hash) to its legacy shape.
async fn age_hash_result(h: &Harness, key: &str, kind: &str) {
    let mut conn = h.store.conn();
    let raw: String = conn.hget(key, "result").await.unwrap();
    let now: Value = serde_json::from_str(&raw).unwrap();
    assert!(now.is_object(), "stored as an object today: {raw}");
    let _: () = conn.hset(key, "result", legacy(kind, &now).to_string()).await.unwrap();
}

fn without_ttl(mut v: Value) -> Value {
    v.as_object_mut().unwrap().remove("remaining_ttl_ms");
    v
}

#[tokio::test]
async fn stored_answers_of_earlier_versions_replay_unchanged() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let keys = TenantKeys::new(&t.id);
    let agent = format!("tenant:{}/agent:c", t.id);
    let mut capped = NewBudget::new(&t.id, &agent, Unit::Tokens, 500);
    capped.caps = Some(json!({"max_steps_remaining": 3}));
    h.budget_with(capped).await;
    let subject = json!({"tenant": t.id, "agent": "c"});
    let action = json!({"kind": "llm.completion", "name": "m"});

    // reserve (with caps), then commit below the estimate; a second reservation released
    let reserve = json!({"idempotency_key": "r1", "subject": subject, "action": action,
        "estimate": {"unit": "TOKENS", "amount": 100}});
    let first = h.post(&t.key, "/v1/reservations", &reserve).await.assert_ok().clone();
    assert_eq!(first["decision"], "ALLOW_WITH_CAPS");
    let rid = first["reservation_id"].as_str().unwrap().to_string();
    let token = ReservationId::parse(&rid).unwrap().token;
    let extend = json!({"idempotency_key": "e1", "extend_by_ms": 1000});
    let extended = h.post(&t.key, &format!("/v1/reservations/{rid}/extend"), &extend).await.assert_ok().clone();
    let commit = json!({"idempotency_key": "c1", "actual": {"unit": "TOKENS", "amount": 60}});
    let committed = h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &commit).await.assert_ok().clone();
    assert_eq!(committed["released"]["amount"], 40);
    let reserve2 = json!({"idempotency_key": "r2", "subject": subject, "action": action,
        "estimate": {"unit": "TOKENS", "amount": 7}});
    let rid2 =
        h.post(&t.key, "/v1/reservations", &reserve2).await.assert_ok()["reservation_id"].as_str().unwrap().to_string();
    let token2 = ReservationId::parse(&rid2).unwrap().token;
    let release = json!({"idempotency_key": "l1"});
    let released = h.post(&t.key, &format!("/v1/reservations/{rid2}/release"), &release).await.assert_ok().clone();

    // evaluations: an ALLOW_WITH_CAPS decide, a DENY dry_run; a capped event; a keyed funding
    let decide = json!({"idempotency_key": "d1", "subject": subject, "action": action,
        "estimate": {"unit": "TOKENS", "amount": 1}});
    let decided = h.post(&t.key, "/v1/decide", &decide).await.assert_ok().clone();
    assert_eq!(decided["decision"], "ALLOW_WITH_CAPS");
    let dry = json!({"idempotency_key": "y1", "subject": {"tenant": t.id}, "action": action, "dry_run": true,
        "estimate": {"unit": "TOKENS", "amount": 5000}});
    let dried = h.post(&t.key, "/v1/reservations", &dry).await.assert_ok().clone();
    assert_eq!(dried["decision"], "DENY");
    let event = json!({"idempotency_key": "v1", "subject": subject, "action": action,
        "actual": {"unit": "TOKENS", "amount": 5}});
    let charged = h.post(&t.key, "/v1/events", &event).await;
    assert_eq!(charged.status, 201, "{}", charged.raw);
    let fund = json!({"operation": "CREDIT", "amount": {"unit": "TOKENS", "amount": 3}, "idempotency_key": "f1"});
    let root = format!("tenant:{}", t.id);
    let fund_path = format!("/v1/admin/budgets/fund?scope={root}&unit=TOKENS&tenant_id={}", t.id);
    let funded = h.admin("POST", &fund_path, Some(&fund)).await.assert_ok().clone();

    age_record_field(&h, &keys.reservation(&token), "result", "reserve").await;
    age_record_field(&h, &keys.reservation(&token), "cr", "commit").await;
    age_record_field(&h, &keys.reservation(&token2), "rr", "release").await;
    age_hash_result(&h, &keys.idempotency("extend", &[&rid, "e1"]), "extend").await;
    age_hash_result(&h, &keys.idempotency("decide", &["d1"]), "evaluate").await;
    age_hash_result(&h, &keys.idempotency("reserve-dry-run", &["y1"]), "evaluate").await;
    age_hash_result(&h, &keys.idempotency("event", &["v1"]), "charge").await;
    age_hash_result(&h, &keys.idempotency("fund", &[&root, "TOKENS", "f1"]), "fund").await;
    let before = h.root(&t).await;

    // Every replay answers what the first call answered, from the legacy shape.
    let again = h.post(&t.key, "/v1/reservations", &reserve).await.assert_ok().clone();
    assert_eq!(without_ttl(again), without_ttl(first));
    let again = h.post(&t.key, &format!("/v1/reservations/{rid}/extend"), &extend).await;
    assert_eq!(again.assert_ok()["expires_at_ms"], extended["expires_at_ms"]);
    let again = h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &commit).await;
    assert_eq!(again.assert_ok(), &committed);
    let again = h.post(&t.key, &format!("/v1/reservations/{rid2}/release"), &release).await;
    assert_eq!(again.assert_ok(), &released);
    assert_eq!(h.post(&t.key, "/v1/decide", &decide).await.assert_ok(), &decided);
    assert_eq!(h.post(&t.key, "/v1/reservations", &dry).await.assert_ok(), &dried);
    let again = h.post(&t.key, "/v1/events", &event).await;
    assert_eq!((again.status, &again.body), (201, &charged.body));
    assert_eq!(h.admin("POST", &fund_path, Some(&fund)).await.assert_ok(), &funded);
    // ... and moves nothing.
    let after = h.root(&t).await;
    assert_eq!(
        (after.allocated, after.remaining, after.reserved, after.spent),
        (before.allocated, before.remaining, before.reserved, before.spent)
    );
}

/// Runs a Lua expression per case over the script library's helpers and returns its answers.
async fn lua_answers(h: &Harness, body: &str, args: &[String]) -> Vec<String> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(format!("{}\n{body}", cycles_shared::ops::helpers())).arg(0);
    for a in args {
        cmd.arg(a);
    }
    cmd.query_async(&mut h.store.conn()).await.unwrap()
}

#[tokio::test]
async fn scope_admission_is_the_same_rule_in_rust_and_lua() {
    let h = Harness::start().await;
    let filters: [&[&str]; 6] = [
        &["workspace:eng"],
        &["WORKSPACE:ENG"],
        &["agent:*"],
        &["app:x", "toolset:*"],
        &["workspace:en"],
        &["workspace:eng:*"],
    ];
    let scopes = [
        "tenant:t",
        "tenant:t/workspace:eng",
        "tenant:t/workspace:engineering",
        "tenant:t/workspace:eng/agent:a",
        "tenant:t/app:x",
        "tenant:t/app:xy/toolset:s",
        "tenant:t/workflow:agent",
    ];
    let mut args = vec![];
    let mut expected = vec![];
    for filter in filters {
        let filter: Vec<String> = filter.iter().map(|s| s.to_string()).collect();
        for scope in scopes {
            args.push(json!(filter).to_string());
            args.push(scope.to_string());
            expected.push(cycles_shared::domain::scope_admitted(&filter, scope).to_string());
        }
    }
    let got = lua_answers(
        &h,
        "local out = {}\nfor i = 1, #ARGV, 2 do out[#out + 1] = tostring(admits(scope_filter(ARGV[i]), ARGV[i + 1])) end\nreturn out",
        &args,
    )
    .await;
    assert_eq!(got, expected);
    assert!(expected.contains(&"true".to_string()) && expected.contains(&"false".to_string()));
}

#[tokio::test]
async fn timestamps_are_formatted_alike_in_rust_and_lua() {
    let h = Harness::start().await;
    let mut ms: Vec<i64> = vec![0, 1, 999, 1000, 86_399_999, 951_782_400_000, 4_107_542_399_999, 1_796_083_200_123];
    let mut x: i64 = 1_700_000_000_000;
    for _ in 0..200 {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407)
            .rem_euclid(4_102_444_800_000);
        ms.push(x);
    }
    let args: Vec<String> = ms.iter().map(i64::to_string).collect();
    let got = lua_answers(
        &h,
        "local out = {}\nfor i = 1, #ARGV do out[i] = iso8601(tonumber(ARGV[i])) end\nreturn out",
        &args,
    )
    .await;
    let expected: Vec<String> = ms.iter().map(|m| cycles_shared::domain::format_rfc3339_ms(*m)).collect();
    assert_eq!(got, expected);
}
