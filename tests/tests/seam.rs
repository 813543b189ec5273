//! The seam between Rust and Lua: stored answers written by earlier versions (arrays) replay
//! exactly like today's (objects), and the rules both sides execute agree case by case.

use cycles_shared::ids::ReservationId;
use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;
use serde_json::{json, Value};

/// The flat balances of an earlier stored answer: 7 strings per budget (from today's text, or
/// the first layout's lists).
fn flat(balances: &Value) -> Vec<Value> {
    if let Some(text) = balances.as_str() {
        return text.split([',', ' ']).filter(|v| !v.is_empty()).map(Value::from).collect();
    }
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

/// Rewrites a reservation record in the first layout (a JSON object with its answers as nested
/// objects) and, with `field`, that answer (`result`, `cr`, `rr`) in its older array shape.
async fn age_record(h: &Harness, key: &str, field: Option<(&str, &str)>) {
    let mut conn = h.store.conn();
    let raw: String = conn.get(key).await.unwrap();
    // (replays leave a record as they found it: one aged before is still in the first layout)
    let mut rec = if raw.starts_with('{') { serde_json::from_str(&raw).unwrap() } else { first_layout(&raw) };
    if let Some((field, kind)) = field {
        rec[field] = legacy(kind, &rec[field]);
    }
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

    age_record(&h, &keys.reservation(&token), Some(("result", "reserve"))).await;
    age_record(&h, &keys.reservation(&token2), None).await;
    age_hash_result(&h, &keys.idempotency("extend", &[&rid, "e1"]), "extend").await;
    age_hash_result(&h, &keys.idempotency("decide", &["d1"]), "evaluate").await;
    age_hash_result(&h, &keys.idempotency("reserve-dry-run", &["y1"]), "evaluate").await;
    age_hash_result(&h, &keys.idempotency("event", &["v1"]), "charge").await;
    age_hash_result(&h, &keys.idempotency("fund", &[&root, "TOKENS", "f1"]), "fund").await;
    let before = h.root(&t).await;

    // Every replay answers what the first call answered, from the legacy shape.
    let again = h.post(&t.key, "/v1/reservations", &reserve).await.assert_ok().clone();
    assert_eq!(without_ttl(again), without_ttl(first.clone()));
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
    // the commit's answer in its array shape, the reserve's in the first layout's object
    age_record(&h, &keys.reservation(&token), Some(("cr", "commit"))).await;
    age_record(&h, &keys.reservation(&token2), Some(("rr", "release"))).await;
    let again = h.post(&t.key, "/v1/reservations", &reserve).await.assert_ok().clone();
    assert_eq!(without_ttl(again), without_ttl(first));
    let again = h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &commit).await;
    assert_eq!(again.assert_ok(), &committed);
    let again = h.post(&t.key, &format!("/v1/reservations/{rid2}/release"), &release).await;
    assert_eq!(again.assert_ok(), &released);
    // ... and moves nothing.
    let after = h.root(&t).await;
    assert_eq!(
        (after.allocated, after.remaining, after.reserved, after.spent),
        (before.allocated, before.remaining, before.reserved, before.spent)
    );
}

/// Runs a Lua expression per case over the script library's helpers and returns its answers.
async fn lua_answers(h: &Harness, body: &str, args: &[String]) -> Vec<String> {
    lua_on_keys(h, body, &[], args).await
}

/// The same with keys (one tenant's: one slot).
async fn lua_on_keys(h: &Harness, body: &str, keys: &[String], args: &[String]) -> Vec<String> {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(format!("{}\n{body}", cycles_shared::ops::helpers())).arg(keys.len());
    for k in keys {
        cmd.arg(k);
    }
    for a in args {
        cmd.arg(a);
    }
    cmd.query_async(&mut h.store.conn()).await.unwrap()
}

/// The library loads as Redis Functions. (The store falls back to EVALSHA where Functions are
/// refused, so a library that does not load would still serve, slower, and hide why.)
#[tokio::test]
async fn the_library_loads_as_redis_functions() {
    let h = Harness::start().await;
    let library = &cycles_shared::ops::LIBRARY.code;
    let loaded: redis::RedisResult<redis::Value> =
        redis::cmd("FUNCTION").arg("LOAD").arg("REPLACE").arg(library).query_async(&mut h.store.conn()).await;
    assert!(loaded.is_ok(), "FUNCTION LOAD: {loaded:?}");
}

/// A ledger as `read_budget` reads it: its view's fields in order, and whether it was read from
/// fields of its own (written before the view).
async fn lua_view(h: &Harness, key: String) -> Vec<String> {
    let body = "local b = read_budget(KEYS[1])\nreturn {b.scope, b.unit, b.status, b.allocated, b.remaining, \
                b.reserved, b.spent, b.debt, b.overdraft_limit, tostring(b.over), b.roll_at or '', b.policy or '', \
                b.caps or '', b.burn or '', tostring(b.legacy or false)}";
    lua_on_keys(h, body, &[key], &[]).await
}

/// A ledger's view (its `v` field) reads the same in Rust (`ops::ledgers`) and in Lua
/// (`read_budget`) whichever side wrote it, and a ledger written before the view is read from
/// its fields and folded into a view by its next write, with every value kept.
#[tokio::test]
async fn ledger_views_read_alike_in_rust_and_lua() {
    use cycles_shared::ops::ledgers::{read, VIEW_FIELDS};
    let h = Harness::start().await;
    let t = h.funded(1_000).await;
    let scope = format!("tenant:{}", t.id);
    let key = TenantKeys::new(&t.id).budget(&scope, Unit::Tokens);

    // written by Lua (a reserve), read by Rust
    h.reserve_ok(&t, 300, json!({})).await;
    let l = read(&h.store, &t.id, &scope, Unit::Tokens).await.unwrap().unwrap();
    assert_eq!((l.allocated, l.remaining, l.reserved, l.spent, l.status.as_str()), (1_000, 700, 300, 0, "ACTIVE"));
    let v = lua_view(&h, key.clone()).await;
    assert_eq!(v[3..10], ["1000", "700", "300", "0", "0", "0", "false"]);

    // written by Rust (the harness stages a view as `ops::ledgers::view_of` spells it), read by Lua
    let caps = r#"{"max_tokens":5}"#;
    h.set_budget(
        &t.id,
        &scope,
        Unit::Tokens,
        &[
            ("status", "FROZEN"),
            ("debt", "40"),
            ("remaining", "660"),
            ("overdraft_limit", "50"),
            ("is_over_limit", "true"),
            ("commit_overage_policy", "REJECT"),
            ("caps", caps),
            ("burn", "1:2:3:4:0"),
        ],
    )
    .await;
    let v = lua_view(&h, key.clone()).await;
    assert_eq!(
        v[2..15],
        ["FROZEN", "1000", "660", "300", "0", "40", "50", "true", "", "REJECT", caps, "1:2:3:4:0", "false"]
    );
    assert_eq!(h.reserve(&t, 1, json!({})).await.error(), "BUDGET_FROZEN");

    // a ledger from before the view: fields of its own, read as such, folded by the next write
    let stored: std::collections::HashMap<String, String> = h.store.conn().hgetall(&key).await.unwrap();
    let spread = cycles_shared::ops::ledgers::with_view(&stored).unwrap();
    let _: () = h.store.conn().hdel(&key, "v").await.unwrap();
    let legacy: Vec<(&str, String)> = VIEW_FIELDS
        .iter()
        .filter_map(|f| spread.get(*f).map(|v| (*f, v.clone())))
        .map(|(f, v)| (f, if f == "status" { "ACTIVE".to_string() } else { v }))
        .collect();
    let _: () = h.store.conn().hset_multiple(&key, &legacy).await.unwrap();
    let v = lua_view(&h, key.clone()).await;
    assert_eq!(
        v[2..15],
        ["ACTIVE", "1000", "660", "300", "0", "40", "50", "true", "", "REJECT", caps, "1:2:3:4:0", "true"]
    );
    // over the limit: a reserve is refused without a write; a release writes the view
    assert_eq!(h.reserve(&t, 1, json!({})).await.error(), "OVERDRAFT_LIMIT_EXCEEDED");
    let held: Vec<String> = h.store.conn().zrange(TenantKeys::new(&t.id).expiry_index(), 0, -1).await.unwrap();
    h.release(&t, held[0].as_str()).await.assert_ok();
    let fields: Vec<String> = h.store.conn().hkeys(&key).await.unwrap();
    assert!(fields.contains(&"v".to_string()) && !fields.contains(&"remaining".to_string()), "{fields:?}");
    let l = read(&h.store, &t.id, &scope, Unit::Tokens).await.unwrap().unwrap();
    assert_eq!((l.allocated, l.remaining, l.reserved, l.debt, l.overdraft_limit), (1_000, 960, 0, 40, 50));
    assert_eq!((l.is_over_limit, l.commit_overage_policy.as_deref()), (true, Some("REJECT")));
    let v = lua_view(&h, key).await;
    assert_eq!(v[12..15], [caps, "1:2:3:4:0", "false"]);
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

/// Caps come back from the scripts as the policy stored them: well formed they are the answer's
/// caps; malformed (a corrupt record) the answer is a fault (500), never an ALLOW_WITH_CAPS with
/// its caps silently left out.
#[tokio::test]
async fn malformed_caps_in_the_store_are_a_fault_not_dropped() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let body = json!({"tenant_id": t.id, "name": "caps", "scope_pattern": format!("tenant:{}", t.id),
        "caps": {"max_tokens": 50}});
    let p = h.admin("POST", "/v1/admin/policies", Some(&body)).await.assert_created().clone();
    let decide = || {
        let body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id},
            "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 5}});
        let h = &h;
        let key = t.key.clone();
        async move { h.post(&key, "/v1/decide", &body).await }
    };
    let ok = decide().await;
    assert_eq!(
        (ok.assert_ok()["decision"].as_str(), ok.body["caps"]["max_tokens"].as_i64()),
        (Some("ALLOW_WITH_CAPS"), Some(50))
    );
    // corrupt the stored rule's caps
    let rules = TenantKeys::new(&t.id).policy_rules();
    let id = p["policy_id"].as_str().unwrap();
    let row: String = h.store.conn().hget(&rules, id).await.unwrap();
    let mut rule: Value = serde_json::from_str(&row).unwrap();
    rule["caps"] = json!("{\"max_tokens\": ");
    let _: () = h.store.conn().hset(&rules, id, rule.to_string()).await.unwrap();
    // (as a hand edit of a rule must, the tenant record's runtime copy goes too: the next script
    // counts the rules again and keeps their new digest, by which the scripts know them)
    let _: () = h.store.conn().hdel(TenantKeys::new(&t.id).tenant(), "runtime").await.unwrap();
    decide().await.assert_error(500, "INTERNAL_ERROR");
}

/// The scripts the FCALLs of `request` ran, by name (without the library's version).
async fn scripts_run(h: &Harness, name: &str, request: impl std::future::Future<Output = Resp>) -> Vec<String> {
    let called = monitored(h, name, request).await;
    called
        .iter()
        .filter(|words| words[0].eq_ignore_ascii_case("\"fcall\""))
        .map(|words| words[1].trim_matches('"').rsplit_once('_').unwrap().0.to_string())
        .collect()
}

/// A plain tenant's reserve reads today's layouts only. A tenant record without its packed
/// copy, a ledger of before the view, a record of the first layout met by a replay and a ledger
/// whose period has ended go to the governed reserve for that call only (two round trips, one
/// hold), which brings what it writes up to date; the tenant's next reserve is the plain
/// script's again, in one round trip. A tenant without a record goes there for good.
#[tokio::test]
async fn what_is_older_than_todays_layouts_goes_to_the_governed_reserve_for_one_call() {
    use cycles_shared::domain::{format_rfc3339_ms, now_ms};
    use cycles_shared::local::EmbeddedRedis;
    let redis = EmbeddedRedis::start(&[]).await.expect("redis-server of its own (MONITOR)");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1_000_000).await;
    let keys = TenantKeys::new(&t.id);
    let root = format!("tenant:{}", t.id);
    let ledger = keys.budget(&root, Unit::Tokens);
    h.reserve_ok(&t, 10, json!({})).await; // (warm: scripts loaded, key known)
    let plain = ["reserve"];
    let once = ["reserve", "reserve_governed"];
    assert_eq!(scripts_run(&h, "plain", h.reserve(&t, 10, json!({}))).await, plain);

    // a tenant record without its packed copy: the governed reserve writes it again
    let _: () = h.store.conn().hdel(keys.tenant(), "runtime").await.unwrap();
    assert_eq!(scripts_run(&h, "tenant", h.reserve(&t, 10, json!({}))).await, once);
    let copy: Option<String> = h.store.conn().hget(keys.tenant(), "runtime").await.unwrap();
    assert!(copy.is_some(), "the packed copy is back");
    assert_eq!(scripts_run(&h, "after tenant", h.reserve(&t, 10, json!({}))).await, plain);

    // a ledger of before the view: the governed reserve folds its fields into the view
    let stored: std::collections::HashMap<String, String> = h.store.conn().hgetall(&ledger).await.unwrap();
    let spread = cycles_shared::ops::ledgers::with_view(&stored).unwrap();
    let _: () = h.store.conn().hdel(&ledger, "v").await.unwrap();
    let fields: Vec<(&str, String)> = cycles_shared::ops::ledgers::VIEW_FIELDS
        .iter()
        .filter_map(|f| spread.get(*f).map(|v| (*f, v.clone())))
        .collect();
    let _: () = h.store.conn().hset_multiple(&ledger, &fields).await.unwrap();
    assert_eq!(scripts_run(&h, "ledger", h.reserve(&t, 10, json!({}))).await, once);
    let names: Vec<String> = h.store.conn().hkeys(&ledger).await.unwrap();
    assert!(names.contains(&"v".to_string()) && !names.contains(&"remaining".to_string()), "{names:?}");
    assert_eq!(scripts_run(&h, "after ledger", h.reserve(&t, 10, json!({}))).await, plain);

    // a replay that meets a record of the first layout answers as the first call did
    let body = json!({"idempotency_key": "first-layout", "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 10}});
    let mut first = h.post(&t.key, "/v1/reservations", &body).await.assert_ok().clone();
    first.as_object_mut().unwrap().remove("remaining_ttl_ms"); // (time passes)
    let token = ReservationId::parse(first["reservation_id"].as_str().unwrap()).unwrap().token;
    age_record(&h, &keys.reservation(&token), None).await;
    let replay = async {
        let again = h.post(&t.key, "/v1/reservations", &body).await;
        let mut answer = again.assert_ok().clone();
        answer.as_object_mut().unwrap().remove("remaining_ttl_ms");
        assert_eq!(answer, first);
        again
    };
    assert_eq!(scripts_run(&h, "replay", replay).await, once);
    assert_eq!(scripts_run(&h, "after replay", h.reserve(&t, 10, json!({}))).await, plain);
    // every call above held once (the plain script wrote nothing before it handed over)
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.remaining), (80, 999_920));

    // a ledger whose period has ended: the governed reserve rolls it
    let p = h.tenant().await;
    let end = now_ms() + 1_500;
    let periodic = json!({"tenant_id": p.id, "scope": format!("tenant:{}", p.id), "unit": "TOKENS",
        "allocated": {"unit": "TOKENS", "amount": 100}, "rollover_policy": "NONE",
        "period_start": format_rfc3339_ms(end - 3_600_000), "period_end": format_rfc3339_ms(end),
        "period_recurrence": "DAILY"});
    h.admin("POST", "/v1/admin/budgets", Some(&periodic)).await.assert_created();
    let rid = h.reserve_ok(&p, 90, json!({})).await;
    h.commit(&p, &rid, 90).await.assert_ok();
    assert_eq!(scripts_run(&h, "before the end", h.reserve(&p, 5, json!({}))).await, plain);
    tokio::time::sleep(std::time::Duration::from_millis((end + 100 - now_ms()).max(0) as u64)).await;
    assert_eq!(scripts_run(&h, "period", h.reserve(&p, 50, json!({}))).await, once);
    let l = h.root(&p).await;
    assert_eq!((l.allocated, l.spent, l.reserved), (100, 0, 55), "rolled (the hold of 5 kept), then held");
    assert_eq!(scripts_run(&h, "after period", h.reserve(&p, 10, json!({}))).await, plain);

    // a tenant without a record is the governed reserve's from then on (nothing to bring up to date)
    let _: () = h.store.conn().del(TenantKeys::new(&p.id).tenant()).await.unwrap();
    assert_eq!(scripts_run(&h, "no record", h.reserve(&p, 1, json!({}))).await, once);
    assert_eq!(scripts_run(&h, "still none", h.reserve(&p, 1, json!({}))).await, ["reserve_governed"]);
}
