//! CyclesEvidence v0.2 through the API: off by default; with it on, a signed, content-addressed
//! receipt for decide, reserve (live and dry_run), commit, release and evaluated denials,
//! fetched without a key and verified against the served key set (by `evidence::verify`;
//! `scripts/evidence-check` verifies the same with an independent Python verifier); replays
//! answer with the first receipt; reservations list theirs; the tenant switch; a key rotation
//! keeps old receipts verifiable.

use cycles_shared::config::{Config, EvidenceMode};
use cycles_shared::evidence::{content_id, verify, Disposition, Signer};
use cycles_tests::*;
use serde_json::Value;

const SERVER: &str = "https://cycles.test/v1";
const OLD: &str = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
const NEW: &str = "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb";

fn evidence_on(c: &mut Config, mode: EvidenceMode, keys: &str) {
    c.evidence.mode = mode;
    c.evidence.signer = Some(Signer::from_config(SERVER, keys).unwrap());
    c.evidence.tenant_cache = std::time::Duration::ZERO;
}

fn one_key() -> String {
    format!(r#"[{{"kid": "k1", "private_key": "{OLD}", "nbf_ms": 0}}]"#)
}

async fn harness(mode: EvidenceMode) -> Harness {
    Harness::start_configured(|c| evidence_on(c, mode, &one_key())).await
}

/// The envelope a reference names, fetched without a key, and the served key set.
async fn fetch(h: &Harness, reference: &Value) -> (Value, Value) {
    let id = reference["evidence_id"].as_str().expect("a cycles_evidence reference");
    assert_eq!(reference["cycles_evidence_url"], format!("{SERVER}/evidence/{id}"));
    let r = h.send("GET", &format!("/v1/evidence/{id}"), &[], None).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    assert_eq!(r.headers.get("cache-control").map(String::as_str), Some("public, max-age=31536000, immutable"));
    let envelope = r.body.clone();
    assert_eq!(envelope["evidence_id"], id);
    // served as its canonical bytes
    assert_eq!(r.raw.as_bytes(), cycles_shared::evidence::canonical(&envelope).as_slice());
    let jwks = h.send("GET", "/v1/.well-known/cycles-jwks.json", &[], None).await;
    assert_eq!(jwks.status, 200);
    (envelope, jwks.body.clone())
}

async fn authentic(h: &Harness, reference: &Value) -> Value {
    let (envelope, jwks) = fetch(h, reference).await;
    assert_eq!(verify(&envelope, Some(&jwks)), Disposition::Authentic, "{envelope}");
    assert_eq!(envelope["schema_version"], "cycles-evidence/v0.1");
    assert_eq!(envelope["server_id"], SERVER);
    assert!(envelope["signer_did"].as_str().unwrap().starts_with("did:cycles:") && envelope["trace_id"].is_string());
    envelope
}

#[tokio::test]
async fn evidence_is_off_by_default_and_nothing_changes() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let r = h.reserve(&t, 10, json!({})).await;
    assert!(r.assert_ok().get("cycles_evidence").is_none());
    let none = h.send("GET", &format!("/v1/evidence/{}", "a".repeat(64)), &[], None).await;
    none.assert_error(404, "NOT_FOUND");
    h.send("GET", "/v1/.well-known/cycles-jwks.json", &[], None).await.assert_error(404, "NOT_FOUND");
    h.send("GET", "/v1/evidence/not-hex", &[], None).await.assert_error(400, "INVALID_REQUEST");
}

#[tokio::test]
async fn every_evaluated_operation_gets_a_verifiable_receipt() {
    let h = harness(EvidenceMode::On).await;
    let t = h.funded(1000).await;
    // decide
    let body = json!({"idempotency_key": unique("d"), "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m", "policy_keys": {"host": "h"}}, "estimate": {"unit": "TOKENS", "amount": 5}});
    let d = h.post(&t.key, "/v1/decide", &body).await;
    let e = authentic(&h, &d.assert_ok()["cycles_evidence"]).await;
    assert_eq!(e["artifact_type"], "decide");
    assert_eq!(
        e["payload"]["decide"]["request"]["action"],
        json!({"kind": "llm.completion", "name": "m"}),
        "mirror fields only"
    );
    assert_eq!(e["payload"]["decide"]["response"]["decision"], "ALLOW");
    // live reserve: the response without transport fields
    let r = h.reserve(&t, 100, json!({})).await;
    let r = r.assert_ok().clone();
    let e = authentic(&h, &r["cycles_evidence"]).await;
    let resp = &e["payload"]["reserve"]["response"];
    assert_eq!(resp["reservation_id"], r["reservation_id"]);
    assert!(resp.get("remaining_ttl_ms").is_none() && resp.get("cycles_evidence").is_none());
    let rid = r["reservation_id"].as_str().unwrap();
    // commit: the reservation id hoisted into the payload
    let c = h.commit(&t, rid, 60).await;
    let e = authentic(&h, &c.assert_ok()["cycles_evidence"]).await;
    assert_eq!(
        (e["artifact_type"].as_str(), e["payload"]["commit"]["reservation_id"].as_str()),
        (Some("commit"), Some(rid))
    );
    assert_eq!(e["payload"]["commit"]["response"]["charged"]["amount"], 60);
    // release
    let rid2 = h.reserve_ok(&t, 10, json!({})).await;
    let rl = h.release(&t, &rid2).await;
    let e = authentic(&h, &rl.assert_ok()["cycles_evidence"]).await;
    assert_eq!(e["payload"]["release"]["response"]["status"], "RELEASED");
    // dry_run DENY
    let dry = h.reserve(&t, 5000, json!({"dry_run": true})).await;
    let e = authentic(&h, &dry.assert_ok()["cycles_evidence"]).await;
    assert_eq!(e["payload"]["reserve"]["request"]["dry_run"], true);
    assert_eq!(e["payload"]["reserve"]["response"]["decision"], "DENY");
    // a live denial: an `error` receipt of the 409 the caller got
    let denied = h.reserve(&t, 5000, json!({})).await;
    denied.assert_error(409, "BUDGET_EXCEEDED");
    let e = authentic(&h, &denied.body["cycles_evidence"]).await;
    let p = &e["payload"]["error"];
    assert_eq!((p["endpoint"].as_str(), p["http_status"].as_i64()), (Some("POST /v1/reservations"), Some(409)));
    assert_eq!(p["response"]["request_id"], denied.body["request_id"]);
    assert!(p["response"].get("cycles_evidence").is_none() && p.get("reservation_id").is_none());
    // a commit of an expired reservation: 410 with the reservation id
    let short = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let late = h.commit(&t, &short, 5).await;
    late.assert_error(410, "RESERVATION_EXPIRED");
    let e = authentic(&h, &late.body["cycles_evidence"]).await;
    assert_eq!(e["payload"]["error"]["reservation_id"], short);
    // the content id is the hash of the canonical bytes with id and signature emptied
    assert_eq!(e["evidence_id"], json!(content_id(&e)));
}

#[tokio::test]
async fn refusals_before_evaluation_and_observed_reserves_get_no_receipt() {
    let h = harness(EvidenceMode::On).await;
    let t = h.funded(1000).await;
    let bad = h.reserve(&t, -1, json!({})).await;
    bad.assert_error(400, "INVALID_REQUEST");
    assert!(bad.body.get("cycles_evidence").is_none());
    let wrong = h.post("cyc_live_nope_nope", "/v1/reservations", &json!({})).await;
    assert!(wrong.status == 401 && wrong.body.get("cycles_evidence").is_none());
    let unbudgeted = h.tenant().await;
    let missing = h.reserve(&unbudgeted, 1, json!({})).await;
    missing.assert_error(404, "NOT_FOUND");
    assert!(missing.body.get("cycles_evidence").is_none());
    // a unit mismatch is an evaluated denial: attested
    let unit = h.reserve(&t, 1, json!({"estimate": {"unit": "CREDITS", "amount": 1}})).await;
    unit.assert_error(400, "UNIT_MISMATCH");
    assert!(unit.body["cycles_evidence"].is_object());
    let observed = h.reserve(&t, 1, json!({"observe_mode": "OBSERVE"})).await;
    assert!(observed.assert_ok().get("cycles_evidence").is_none(), "an observed reserve is neither dry_run nor hold");
}

#[tokio::test]
async fn replays_answer_with_the_first_receipt_and_reservations_list_theirs() {
    let h = harness(EvidenceMode::On).await;
    let t = h.funded(1000).await;
    let ik = unique("r");
    let first = h.reserve(&t, 10, json!({"idempotency_key": ik})).await.assert_ok().clone();
    let again = h.reserve(&t, 10, json!({"idempotency_key": ik})).await.assert_ok().clone();
    assert_eq!(first["cycles_evidence"], again["cycles_evidence"]);
    let rid = first["reservation_id"].as_str().unwrap();
    let body = json!({"idempotency_key": "c-1", "actual": {"unit": "TOKENS", "amount": 4}});
    let path = format!("/v1/reservations/{rid}/commit");
    let c1 = h.post(&t.key, &path, &body).await.assert_ok().clone();
    let c2 = h.post(&t.key, &path, &body).await.assert_ok().clone();
    assert_eq!(c1["cycles_evidence"], c2["cycles_evidence"]);
    let decide = json!({"idempotency_key": "d-1", "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 5}});
    let d1 = h.post(&t.key, "/v1/decide", &decide).await.assert_ok().clone();
    let d2 = h.post(&t.key, "/v1/decide", &decide).await.assert_ok().clone();
    assert_eq!(d1["cycles_evidence"], d2["cycles_evidence"]);
    // the reservation shows both receipts; the listing when asked
    let g = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    let ev = &g.assert_ok()["evidence"];
    assert_eq!((&ev["reserve"], &ev["commit"]), (&first["cycles_evidence"], &c1["cycles_evidence"]));
    let l = h.get(&t.key, "/v1/reservations?include=evidence").await;
    let rows = l.assert_ok()["reservations"].as_array().unwrap().clone();
    assert!(rows.iter().any(|r| r["reservation_id"] == rid && r["evidence"]["commit"] == c1["cycles_evidence"]));
    let plain = h.get(&t.key, "/v1/reservations").await;
    assert!(plain.assert_ok()["reservations"].as_array().unwrap().iter().all(|r| r.get("evidence").is_none()));
}

#[tokio::test]
async fn each_tenant_can_switch_its_receipts() {
    // `tenant`: only tenants that say so
    let h = harness(EvidenceMode::Tenant).await;
    let t = h.funded(1000).await;
    assert!(h.reserve(&t, 1, json!({})).await.assert_ok().get("cycles_evidence").is_none());
    let path = format!("/v1/admin/tenants/{}", t.id);
    let p = h.admin("PATCH", &path, Some(&json!({"evidence_enabled": true}))).await;
    assert_eq!(p.assert_ok()["evidence_enabled"], true);
    assert!(h.reserve(&t, 1, json!({})).await.assert_ok()["cycles_evidence"].is_object());
    // `on`: every tenant unless it says no
    let h = harness(EvidenceMode::On).await;
    let t = h.funded(1000).await;
    assert!(h.reserve(&t, 1, json!({})).await.assert_ok()["cycles_evidence"].is_object());
    let path = format!("/v1/admin/tenants/{}", t.id);
    h.admin("PATCH", &path, Some(&json!({"evidence_enabled": false}))).await.assert_ok();
    assert!(h.reserve(&t, 1, json!({})).await.assert_ok().get("cycles_evidence").is_none());
    let changed = h.admin_events(&t.id, "tenant.settings_changed").await;
    assert_eq!(changed.last().unwrap()["data"]["changed_fields"], json!(["evidence_enabled"]));
}

#[tokio::test]
async fn a_key_rotation_keeps_earlier_receipts_verifiable() {
    let h = harness(EvidenceMode::On).await;
    let t = h.funded(1000).await;
    let before = h.reserve(&t, 1, json!({})).await.assert_ok()["cycles_evidence"].clone();
    let (old_envelope, _) = fetch(&h, &before).await;
    assert!(old_envelope["signer_did"].as_str().unwrap().ends_with("#k1"));
    // redeploy: k1 retired now (its private half gone), k2 signs from now on; `now` must be
    // past the receipt's millisecond (windows are half-open)
    tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    let now = cycles_shared::domain::now_ms();
    assert!(old_envelope["issued_at_ms"].as_i64().unwrap() < now);
    let old_public = hex::encode(Signer::from_config(SERVER, &one_key()).unwrap().keys[0].public.as_bytes());
    let rotated = format!(
        r#"[{{"kid": "k1", "public_key": "{old_public}", "nbf_ms": 0, "exp_ms": {now}}},
            {{"kid": "k2", "private_key": "{NEW}", "nbf_ms": {now}}}]"#
    );
    let h2 = Harness::start_beside(&h, |c| evidence_on(c, EvidenceMode::On, &rotated)).await;
    let (old_again, jwks) = fetch(&h2, &before).await;
    assert_eq!(old_again, old_envelope);
    assert_eq!(verify(&old_again, Some(&jwks)), Disposition::Authentic, "signed before the rotation: still authentic");
    let keys = jwks["keys"].as_array().unwrap();
    assert_eq!(
        (keys.len(), keys[0]["status"].as_str(), keys[0]["cycles_exp_ms"].as_i64()),
        (2, Some("retired"), Some(now))
    );
    let after = h2.reserve(&t, 1, json!({})).await.assert_ok()["cycles_evidence"].clone();
    let e = authentic(&h2, &after).await;
    assert!(e["signer_did"].as_str().unwrap().ends_with("#k2"));
    // a receipt claiming the retired key after its window is refused
    let mut forged = e.clone();
    forged["signer_did"] = json!(old_envelope["signer_did"]);
    forged["evidence_id"] = json!(content_id(&forged));
    assert_eq!(verify(&forged, Some(&jwks)), Disposition::SignerAuthorityFailed);
    // a tampered envelope does not verify
    let mut tampered = old_envelope.clone();
    tampered["payload"]["reserve"]["response"]["reserved"]["amount"] = json!(999);
    assert_eq!(verify(&tampered, Some(&jwks)), Disposition::SignatureInvalid);
}

#[tokio::test]
async fn the_public_evidence_routes_are_rate_limited() {
    early_in_a_window(60_000, 5_000).await; // the limits count per calendar minute
    let h = Harness::start_configured(|c| {
        evidence_on(c, EvidenceMode::On, &one_key());
        c.public_rate_limit = 2;
    })
    .await;
    // from an address of its own (the counters are per address and minute, and shared)
    let client = client_from(71);
    let get = |path: String| {
        let (client, base) = (&client, &h.base);
        async move { send_with(client, base, "GET", &path, &[], None).await }
    };
    let statuses = [
        get("/v1/.well-known/cycles-jwks.json".into()).await.status,
        get(format!("/v1/evidence/{}", "b".repeat(64))).await.status,
    ];
    assert_eq!(statuses, [200, 404]);
    let r = get("/v1/.well-known/cycles-jwks.json".into()).await;
    r.assert_error(429, "LIMIT_EXCEEDED");
    assert!(r.headers.contains_key("retry-after"));
}

/// Issue 27 (1, 2): one rule for `null` on the protocol's requests: an optional field sent as
/// `null` is absent, so no receipt, stored request or replay fingerprint holds one (the
/// envelope schema allows none); and where receipts are on, an integer beyond 2^53 is refused
/// (JCS writes numbers as doubles: the receipt could not hold what was submitted).
#[tokio::test]
async fn nulls_are_absent_and_integers_beyond_2_pow_53_are_refused_where_signed() {
    let h = harness(EvidenceMode::On).await;
    let t = h.funded(1_000_000).await;
    let no_nulls = |e: &Value| assert_no_nulls(e, &e.to_string());
    let key = unique("rk");
    let with_nulls = json!({"idempotency_key": key, "metadata": null, "ttl_ms": null, "grace_period_ms": null,
        "overage_policy": null, "dry_run": null,
        "subject": {"tenant": t.id, "workspace": null, "dimensions": null},
        "action": {"kind": "llm.completion", "name": "m", "tags": null},
        "estimate": {"unit": "TOKENS", "amount": 10}});
    let r = h.post(&t.key, "/v1/reservations", &with_nulls).await;
    let r = r.assert_ok().clone();
    let rid = r["reservation_id"].as_str().unwrap().to_string();
    no_nulls(&authentic(&h, &r["cycles_evidence"]).await);
    // the same request without them is the same request: a replay, not a mismatch
    let without = json!({"idempotency_key": key, "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 10}});
    let again = h.post(&t.key, "/v1/reservations", &without).await;
    assert_eq!(again.assert_ok()["reservation_id"], rid.as_str());
    // metadata inside is the caller's data, kept as sent
    let got = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    assert!(got.assert_ok().get("metadata").is_none(), "{}", got.raw);

    let decide = json!({"idempotency_key": unique("d"), "metadata": null, "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": 5}});
    let d = h.post(&t.key, "/v1/decide", &decide).await;
    no_nulls(&authentic(&h, &d.assert_ok()["cycles_evidence"]).await);

    let commit = json!({"idempotency_key": unique("c"), "actual": {"unit": "TOKENS", "amount": 7}, "metrics": null, "metadata": null});
    let c = h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &commit).await;
    no_nulls(&authentic(&h, &c.assert_ok()["cycles_evidence"]).await);
    let rid2 = h.reserve_ok(&t, 10, json!({})).await;
    let commit = json!({"idempotency_key": unique("c"), "actual": {"unit": "TOKENS", "amount": 7},
        "metrics": {"tokens_input": null, "custom": null, "latency_ms": 12}});
    let c = h.post(&t.key, &format!("/v1/reservations/{rid2}/commit"), &commit).await;
    let e = authentic(&h, &c.assert_ok()["cycles_evidence"]).await;
    no_nulls(&e);
    let rid3 = h.reserve_ok(&t, 10, json!({})).await;
    let release = json!({"idempotency_key": unique("rl"), "reason": null});
    let rl = h.post(&t.key, &format!("/v1/reservations/{rid3}/release"), &release).await;
    no_nulls(&authentic(&h, &rl.assert_ok()["cycles_evidence"]).await);
    // a required field sent as null is missing
    let bad = json!({"idempotency_key": unique("rk"), "subject": {"tenant": t.id},
        "action": {"kind": "llm.completion", "name": "m"}, "estimate": null});
    h.post(&t.key, "/v1/reservations", &bad).await.assert_error(400, "INVALID_REQUEST");

    // integers beyond 2^53: refused where a receipt would be made, exact at 2^53
    let big = |amount: u64, dry: bool| {
        json!({"idempotency_key": unique("rk"), "subject": {"tenant": t.id}, "dry_run": dry,
            "action": {"kind": "llm.completion", "name": "m"}, "estimate": {"unit": "TOKENS", "amount": amount}})
    };
    for (path, body) in [
        ("/v1/reservations", big(i64::MAX as u64, true)),
        ("/v1/decide", {
            let mut b = big((1 << 53) + 1, false);
            b.as_object_mut().unwrap().remove("dry_run");
            b
        }),
        ("/v1/reservations", big((1 << 53) + 1, false)),
    ] {
        let r = h.post(&t.key, path, &body).await;
        r.assert_error(400, "INVALID_REQUEST");
        assert!(r.body["message"].as_str().unwrap().contains("estimate.amount"), "{}", r.raw);
    }
    let exact = h.post(&t.key, "/v1/reservations", &big(1 << 53, true)).await;
    let e = authentic(&h, &exact.assert_ok()["cycles_evidence"]).await;
    assert_eq!(e["payload"]["reserve"]["request"]["estimate"]["amount"].as_u64(), Some(1 << 53));
    // without receipts the whole int64 range stays exact (reserve.rs)
    let off = Harness::start_beside(&h, |_| {}).await;
    let r = off.post(&t.key, "/v1/reservations", &big((1 << 53) + 1, true)).await;
    assert_eq!(r.assert_ok()["decision"], "DENY");
}
