//! commitReservation: charging, overage policies, debt and the lifecycle.

use cycles_shared::keys::TenantKeys;
use cycles_shared::model::Unit;
use cycles_tests::*;
use redis::AsyncCommands;

#[tokio::test]
async fn commit_below_estimate_releases_the_rest() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    let r = h.commit(&t, &rid, 80).await;
    let b = r.assert_ok();
    // A commit below the estimate charges the actual and releases the rest.
    assert_eq!(b["status"], "COMMITTED");
    assert_eq!(b["charged"], json!({"unit": "TOKENS", "amount": 80}));
    assert_eq!(b["released"], json!({"unit": "TOKENS", "amount": 20}));
    assert_eq!(b["balances"][0]["spent"]["amount"], 80);
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.reserved, l.spent, l.debt), (920, 0, 80, 0));
    // The reservation then reads as COMMITTED with the charged amount and a finalization time.
    let d = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    let d = d.assert_ok();
    assert_eq!(d["status"], "COMMITTED");
    assert_eq!(d["committed"]["amount"], 80);
    assert!(d["finalized_at_ms"].as_i64().unwrap() >= d["created_at_ms"].as_i64().unwrap());
}

#[tokio::test]
async fn commit_equal_to_estimate_has_no_released_field() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    let b = h.commit(&t, &rid, 100).await;
    // Nothing left over: no released field.
    assert!(b.assert_ok().get("released").is_none());
    assert_eq!(h.root(&t).await.spent, 100);
}

#[tokio::test]
async fn commit_unit_mismatch_is_400_with_details() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    let body = json!({"idempotency_key": "c", "actual": {"unit": "CREDITS", "amount": 1}});
    let r = h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &body).await;
    // A commit in another unit than the reservation's is a 400 naming both units; the hold stays.
    r.assert_error(400, "UNIT_MISMATCH");
    assert_eq!(r.body["details"]["expected_units"], json!(["TOKENS"]));
    assert_eq!(r.body["details"]["requested_unit"], "CREDITS");
    assert_eq!(h.root(&t).await.reserved, 100);
}

#[tokio::test]
async fn reject_policy_refuses_any_overage_and_keeps_the_reservation() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 100, json!({"overage_policy": "REJECT"})).await;
    // REJECT refuses any actual above the estimate; the reservation stays active.
    h.commit(&t, &rid, 101).await.assert_error(409, "BUDGET_EXCEEDED");
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.reserved, l.spent), (900, 100, 0));
    // still ACTIVE: a smaller commit succeeds
    h.commit(&t, &rid, 100).await.assert_ok();
}

#[tokio::test]
async fn allow_if_available_covers_or_caps_the_overage() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    // Coverable overage.
    let rid = h.reserve_ok(&t, 100, json!({})).await;
    assert_eq!(h.commit(&t, &rid, 150).await.assert_ok()["charged"]["amount"], 150);
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.spent, l.reserved), (850, 150, 0));
    // Uncoverable overage is capped at what remains, never debt, flag set.
    let rid = h.reserve_ok(&t, 800, json!({})).await; // remaining 50
    let r = h.commit(&t, &rid, 900).await;
    let b = r.assert_ok();
    assert_eq!(b["charged"]["amount"], 850); // 800 + min(100, 50)
    assert!(b.get("released").is_none());
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.spent, l.debt, l.is_over_limit), (0, 1000, 0, true));
    // The flagged scope blocks new reservations.
    h.budget(&t.id, &format!("tenant:{}/agent:x", t.id), Unit::Credits, 1).await;
    h.reserve(&t, 0, json!({})).await.assert_error(409, "OVERDRAFT_LIMIT_EXCEEDED");
}

#[tokio::test]
async fn allow_if_available_flags_only_scopes_that_could_not_cover() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.budget(&t.id, &root, Unit::Tokens, 130).await;
    h.budget(&t.id, &agent, Unit::Tokens, 1000).await;
    let rid = h.reserve_ok(&t, 100, json!({"subject": {"tenant": t.id, "agent": "a"}})).await;
    let r = h.commit(&t, &rid, 200).await;
    assert_eq!(r.assert_ok()["charged"]["amount"], 130);
    let root_l = h.ledger(&t.id, &root, Unit::Tokens).await;
    let agent_l = h.ledger(&t.id, &agent, Unit::Tokens).await;
    assert_eq!((root_l.remaining, root_l.spent, root_l.is_over_limit), (0, 130, true));
    assert_eq!((agent_l.remaining, agent_l.spent, agent_l.is_over_limit), (870, 130, false));
}

#[tokio::test]
async fn overdraft_within_limit_accrues_only_the_shortfall_as_debt() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.overdraft_budget(&t.id, &root, 1000, 500).await;
    let rid = h.reserve_ok(&t, 900, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"})).await; // remaining 100
    let second = h.reserve_ok(&t, 0, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"})).await;
    // Overage 300, remaining 100 -> 100 funded, 200 debt.
    let r = h.commit(&t, &rid, 1200).await;
    assert_eq!(r.assert_ok()["charged"]["amount"], 1200);
    assert!(r.body["balances"][0]["debt"]["amount"] == 200);
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.spent, l.debt, l.reserved, l.is_over_limit), (-200, 1000, 200, 0, false));
    let rid = second;
    // Debt + shortfall beyond the limit -> 409, no change.
    h.commit(&t, &rid, 301).await.assert_error(409, "OVERDRAFT_LIMIT_EXCEEDED");
    assert_eq!(h.root(&t).await.debt, 200);
    // exactly at the limit is fine
    h.commit(&t, &rid, 300).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.debt, l.is_over_limit), (-500, 500, false));
}

#[tokio::test]
async fn overdraft_with_zero_limit_behaves_like_allow_if_available() {
    let h = Harness::start().await;
    let t = h.funded(100).await;
    let rid = h.reserve_ok(&t, 80, json!({"overage_policy": "ALLOW_WITH_OVERDRAFT"})).await;
    // Capped at remaining (20), flagged, no debt, no 409.
    let r = h.commit(&t, &rid, 200).await;
    assert_eq!(r.assert_ok()["charged"]["amount"], 100);
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.spent, l.debt, l.is_over_limit), (0, 100, 0, true));
}

#[tokio::test]
async fn overdraft_mixed_scopes_cap_on_zero_limit_and_debt_on_positive() {
    let h = Harness::start().await;
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    let agent = format!("{root}/agent:a");
    h.overdraft_budget(&t.id, &root, 100, 1000).await;
    h.budget(&t.id, &agent, Unit::Tokens, 1000).await; // zero limit, plenty left
    let sub = json!({"subject": {"tenant": t.id, "agent": "a"}, "overage_policy": "ALLOW_WITH_OVERDRAFT"});
    let rid = h.reserve_ok(&t, 50, sub).await;
    let r = h.commit(&t, &rid, 250).await; // overage 200; root has 50 left
    assert_eq!(r.assert_ok()["charged"]["amount"], 250);
    let root_l = h.ledger(&t.id, &root, Unit::Tokens).await;
    let agent_l = h.ledger(&t.id, &agent, Unit::Tokens).await;
    assert_eq!((root_l.remaining, root_l.spent, root_l.debt), (-150, 100, 150));
    assert_eq!((agent_l.remaining, agent_l.spent, agent_l.debt, agent_l.is_over_limit), (750, 250, 0, false));
}

#[tokio::test]
async fn policy_is_the_one_recorded_at_reserve_time() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({"overage_policy": "REJECT"})).await;
    // Later ledger/tenant changes do not alter a recorded policy.
    h.set_budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, &[("commit_overage_policy", "ALLOW_IF_AVAILABLE")])
        .await;
    h.commit(&t, &rid, 11).await.assert_error(409, "BUDGET_EXCEEDED");
}

#[tokio::test]
async fn commit_on_finalized_expired_and_unknown_reservations() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({})).await;
    h.commit(&t, &rid, 5).await.assert_ok();
    // New key on a COMMITTED reservation.
    h.commit(&t, &rid, 5).await.assert_error(409, "RESERVATION_FINALIZED");
    let rid2 = h.reserve_ok(&t, 10, json!({})).await;
    h.release(&t, &rid2).await.assert_ok();
    h.commit(&t, &rid2, 5).await.assert_error(409, "RESERVATION_FINALIZED");
    // Never existed (well-formed id of this tenant, and garbage ids).
    let forged = format!("{}.AAAAAAAAAAAAAA.AAAAAAAA", t.id);
    h.commit(&t, &forged, 1).await.assert_error(404, "NOT_FOUND");
    h.commit(&t, "no-such-reservation", 1).await.assert_error(404, "NOT_FOUND");
    // The path bound: an id over 128 characters is a 400.
    h.commit(&t, &"x".repeat(129), 1).await.assert_error(400, "INVALID_REQUEST");
    assert_eq!(h.root(&t).await.spent, 5);
}

#[tokio::test]
async fn commit_window_includes_grace_and_ends_after_it() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let inside = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 3000})).await;
    let after = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(std::time::Duration::from_millis(1300)).await;
    // Inside grace -> accepted; past expires_at + grace -> 410 and the hold returns.
    h.commit(&t, &inside, 7).await.assert_ok();
    h.commit(&t, &after, 7).await.assert_error(410, "RESERVATION_EXPIRED");
    // Again on the now EXPIRED reservation.
    h.commit(&t, &after, 7).await.assert_error(410, "RESERVATION_EXPIRED");
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent, l.remaining), (0, 7, 993));
}

#[tokio::test]
async fn over_limit_scopes_still_settle_existing_reservations() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let a = h.reserve_ok(&t, 10, json!({})).await;
    let b = h.reserve_ok(&t, 10, json!({})).await;
    h.set_budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, &[("is_over_limit", "true")]).await;
    // An over-limit scope blocks new reservations, never the settlement of existing ones.
    h.commit(&t, &a, 10).await.assert_ok();
    h.release(&t, &b).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.reserved, l.spent), (0, 10));
}

#[tokio::test]
async fn frozen_budget_blocks_commit_but_not_release() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let a = h.reserve_ok(&t, 10, json!({})).await;
    h.set_budget(&t.id, &format!("tenant:{}", t.id), Unit::Tokens, &[("status", "FROZEN")]).await;
    // A commit on a FROZEN ledger is refused; release still returns the hold.
    h.commit(&t, &a, 10).await.assert_error(409, "BUDGET_FROZEN");
    h.release(&t, &a).await.assert_ok();
    assert_eq!(h.root(&t).await.reserved, 0);
}

#[tokio::test]
async fn commit_records_metrics_and_metadata() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({"metadata": {"run": 7}})).await;
    let body = json!({"idempotency_key": "c1", "actual": {"unit": "TOKENS", "amount": 3},
        "metrics": {"tokens_input": 1, "tokens_output": 2, "latency_ms": 30, "model_version": "v1", "custom": {"x": 1}},
        "metadata": {"note": "done"}});
    h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &body).await.assert_ok();
    let d = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    // The reservation's metadata and the commit's metadata are kept apart.
    assert_eq!(d.body["metadata"], json!({"run": 7}));
    assert_eq!(d.body["committed_metadata"], json!({"note": "done"}));
    let bad =
        json!({"idempotency_key": "c2", "actual": {"unit": "TOKENS", "amount": 3}, "metrics": {"latency_ms": -1}});
    h.post(&t.key, &format!("/v1/reservations/{rid}/commit"), &bad).await.assert_error(400, "INVALID_REQUEST");
}

/// A finished reservation's metadata is kept exactly as long as its record, however it ended
/// (commit, release, expiry): the scripts that end one reach the metadata key beside the
/// record without naming it, and give it the record's retention.
#[tokio::test]
async fn a_finished_reservations_metadata_lives_as_long_as_its_record() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let keys = TenantKeys::new(&t.id);
    let token = |rid: &str| rid.split('.').nth(1).unwrap().to_string();
    let meta = json!({"metadata": {"run": 7}});
    let committed = h.reserve_ok(&t, 10, meta.clone()).await;
    let released = h.reserve_ok(&t, 10, meta.clone()).await;
    let expired = h.reserve_ok(&t, 10, json!({"metadata": {"run": 7}, "ttl_ms": 1000, "grace_period_ms": 0})).await;
    let plain = h.reserve_ok(&t, 10, json!({})).await;
    let live: i64 = h.store.conn().pttl(keys.reservation_metadata(token(&committed))).await.unwrap();
    assert_eq!(live, -1, "a live reservation's metadata has no expiry of its own");

    let body =
        json!({"idempotency_key": "c1", "actual": {"unit": "TOKENS", "amount": 3}, "metadata": {"note": "done"}});
    h.post(&t.key, &format!("/v1/reservations/{committed}/commit"), &body).await.assert_ok();
    h.release(&t, &released).await.assert_ok();
    h.commit(&t, &plain, 5).await.assert_ok();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    h.sweep_tenant(&t, &Default::default()).await;
    for rid in [&committed, &released, &expired] {
        let mut conn = h.store.conn();
        let record: i64 = conn.pttl(keys.reservation(token(rid))).await.unwrap();
        let metadata: i64 = conn.pttl(keys.reservation_metadata(token(rid))).await.unwrap();
        assert!(record > 0 && (record - metadata).abs() < 5_000, "{rid}: record {record} ms, metadata {metadata} ms");
        let kept: Option<String> = conn.hget(keys.reservation_metadata(token(rid)), "metadata").await.unwrap();
        assert_eq!(kept.as_deref(), Some(r#"{"run":7}"#), "{rid}");
    }
    let d = h.get(&t.key, &format!("/v1/reservations/{committed}")).await;
    assert_eq!(d.body["committed_metadata"], json!({"note": "done"}));
    assert_eq!(d.body["status"], "COMMITTED");
    // a reservation without metadata has no metadata key, before or after
    let exists: bool = h.store.conn().exists(keys.reservation_metadata(token(&plain))).await.unwrap();
    assert!(!exists);
}

#[tokio::test]
async fn records_without_a_stored_scope_path_still_settle() {
    // Records written before the reserve script stored the scope path (first layout) derive it
    // from the subject.
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 100, json!({"subject": {"tenant": t.id, "agent": "Bot"}})).await;
    let path = format!("tenant:{}/agent:bot", t.id);
    let key = TenantKeys::new(&t.id).reservation(rid.split('.').nth(1).unwrap());
    let raw: String = h.store.conn().get(&key).await.unwrap();
    assert_eq!(record_fields(&raw)["scope"], path, "new records keep their scope path");
    let mut record = first_layout(&raw);
    record.as_object_mut().unwrap().remove("scope");
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(record.to_string())
        .arg("KEEPTTL")
        .query_async(&mut h.store.conn())
        .await
        .unwrap();

    let d = h.get(&t.key, &format!("/v1/reservations/{rid}")).await;
    assert_eq!(d.assert_ok()["scope_path"], path);
    h.commit(&t, &rid, 80).await.assert_ok();
    let l = h.root(&t).await;
    assert_eq!((l.remaining, l.reserved, l.spent), (920, 0, 80));
    // written back in today's layout, the scope path derived from the subject
    let raw: String = h.store.conn().get(&key).await.unwrap();
    let record = record_fields(&raw);
    assert_eq!((record["status"].as_str(), record["scope"].as_str()), ("COMMITTED", path.as_str()));
}
