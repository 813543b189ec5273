//! Property-based ledger invariants under concurrency: random interleavings of reserve, commit,
//! release, extend, event, expiry and funding over scope chains of depth 1-6, every unit and
//! every overage policy, from several concurrent tasks. After each case:
//! - the balance identity holds on every scope (checked by `Harness::ledger`);
//! - `reserved` equals the sum of the ACTIVE holds on that scope;
//! - `spent` equals the sum of the charges attributed to that scope (plus `debt`: a shortfall
//!   under ALLOW_WITH_OVERDRAFT goes to debt instead of spent);
//! - REJECT and ALLOW_IF_AVAILABLE never leave debt or a negative remaining;
//!   ALLOW_WITH_OVERDRAFT never exceeds `overdraft_limit`;
//! - no reservation is finalized twice.
//!
//! A failure prints its seed; `INVARIANTS_SEED=<seed>` replays exactly that case.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cycles_shared::model::Unit;
use cycles_tests::*;
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const LEVELS: [&str; 6] = ["tenant", "workspace", "app", "workflow", "agent", "toolset"];
const POLICIES: [&str; 3] = ["REJECT", "ALLOW_IF_AVAILABLE", "ALLOW_WITH_OVERDRAFT"];

/// What the clients observed: holds, charges per subject depth, finalizations.
#[derive(Default)]
struct Book {
    /// reservation id -> (estimate, subject depth)
    holds: HashMap<String, (i64, usize)>,
    /// successful finalizations per reservation
    finalized: HashMap<String, u32>,
    /// (depth of the subject, amount charged)
    charges: Vec<(usize, i64)>,
}

struct Case {
    seed: u64,
    depth: usize,
    unit: Unit,
    policy: &'static str,
}

fn subject(t: &Tenant, depth: usize) -> serde_json::Value {
    let mut s = json!({"tenant": t.id});
    for level in LEVELS.iter().take(depth).skip(1) {
        s[*level] = json!(format!("{level}-x"));
    }
    s
}

fn scope_of(t: &Tenant, depth: usize) -> String {
    let mut parts = vec![format!("tenant:{}", t.id)];
    for level in LEVELS.iter().take(depth).skip(1) {
        parts.push(format!("{level}:{level}-x"));
    }
    parts.join("/")
}

async fn client(h: Arc<Harness>, t: Tenant, case: (u64, usize, Unit, &'static str), book: Arc<Mutex<Book>>) {
    let (seed, depth, unit, policy) = case;
    let mut rng = StdRng::seed_from_u64(seed);
    let unit_s = unit.as_str();
    let mine: &mut Vec<String> = &mut vec![];
    for step in 0..14 {
        let d = rng.gen_range(1..=depth);
        let amount = rng.gen_range(1..400i64);
        match rng.gen_range(0..10) {
            0..=3 => {
                let ttl = if rng.gen_bool(0.2) { 1000 } else { 60_000 };
                let body = json!({"idempotency_key": format!("r-{seed}-{step}"), "subject": subject(&t, d),
                    "action": {"kind": "llm", "name": "m"}, "estimate": {"unit": unit_s, "amount": amount},
                    "ttl_ms": ttl, "grace_period_ms": 0, "overage_policy": policy});
                let r = h.post(&t.key, "/v1/reservations", &body).await;
                if r.status == 200 {
                    let id = r.body["reservation_id"].as_str().unwrap().to_string();
                    book.lock().unwrap().holds.insert(id.clone(), (amount, d));
                    mine.push(id);
                } else {
                    assert!(r.status == 409 || r.status == 200, "reserve: {}", r.raw);
                }
            }
            4..=5 if !mine.is_empty() => {
                let id = mine[rng.gen_range(0..mine.len())].clone();
                let actual = rng.gen_range(0..800i64);
                let body = json!({"idempotency_key": format!("c-{seed}-{step}"), "actual": {"unit": unit_s, "amount": actual}});
                let r = h.post(&t.key, &format!("/v1/reservations/{id}/commit"), &body).await;
                if r.status == 200 {
                    let charged = r.body["charged"]["amount"].as_i64().unwrap();
                    let mut b = book.lock().unwrap();
                    let depth = b.holds[&id].1;
                    b.charges.push((depth, charged));
                    *b.finalized.entry(id).or_default() += 1;
                } else {
                    assert!([409, 410].contains(&r.status), "commit: {}", r.raw);
                }
            }
            6 if !mine.is_empty() => {
                let id = mine[rng.gen_range(0..mine.len())].clone();
                let body = json!({"idempotency_key": format!("l-{seed}-{step}")});
                let r = h.post(&t.key, &format!("/v1/reservations/{id}/release"), &body).await;
                if r.status == 200 {
                    *book.lock().unwrap().finalized.entry(id).or_default() += 1;
                } else {
                    assert!([409, 410].contains(&r.status), "release: {}", r.raw);
                }
            }
            7 if !mine.is_empty() => {
                let id = mine[rng.gen_range(0..mine.len())].clone();
                let body = json!({"idempotency_key": format!("x-{seed}-{step}"), "extend_by_ms": 1000});
                let r = h.post(&t.key, &format!("/v1/reservations/{id}/extend"), &body).await;
                assert!([200, 409, 410].contains(&r.status), "extend: {}", r.raw);
            }
            8 => {
                let body = json!({"idempotency_key": format!("e-{seed}-{step}"), "subject": subject(&t, d),
                    "action": {"kind": "tool", "name": "t"}, "actual": {"unit": unit_s, "amount": amount},
                    "overage_policy": policy});
                let r = h.post(&t.key, "/v1/events", &body).await;
                if r.status == 201 {
                    let charged = r.body["charged"]["amount"].as_i64().unwrap_or(amount);
                    book.lock().unwrap().charges.push((d, charged));
                } else {
                    assert_eq!(r.status, 409, "event: {}", r.raw);
                }
            }
            _ => {
                let scope = scope_of(&t, d);
                let body = json!({"operation": "CREDIT", "amount": {"unit": unit_s, "amount": amount}});
                let path = format!("/v1/admin/budgets/fund?scope={scope}&unit={unit_s}&tenant_id={}", t.id);
                h.admin("POST", &path, Some(&body)).await.assert_ok();
            }
        }
    }
}

async fn run_case(h: Arc<Harness>, c: Case) {
    let t = h.tenant().await;
    let mut rng = StdRng::seed_from_u64(c.seed);
    let mut limits = vec![];
    for depth in 1..=c.depth {
        let limit = if c.policy == "ALLOW_WITH_OVERDRAFT" { rng.gen_range(0..500) } else { 0 };
        limits.push(limit);
        h.budget_with(NewBudget {
            overdraft_limit: limit,
            ..NewBudget::new(&t.id, &scope_of(&t, depth), c.unit, rng.gen_range(200..3000))
        })
        .await;
    }
    let book = Arc::new(Mutex::new(Book::default()));
    let tasks: Vec<_> = (0..4u64)
        .map(|k| {
            tokio::spawn(client(
                h.clone(),
                t.clone(),
                (c.seed ^ (k + 1).wrapping_mul(0x9E37), c.depth, c.unit, c.policy),
                book.clone(),
            ))
        })
        .collect();
    for task in tasks {
        task.await.expect("client task");
    }
    // expiry: let the short holds lapse, then sweep
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut report = cycles_shared::jobs::sweep::SweepReport::default();
    let opts = cycles_shared::jobs::sweep::SweepOptions::default();
    cycles_shared::jobs::sweep::sweep_tenant(&h.store, &t.id, &opts, &mut report).await.unwrap();

    // the store's view of which reservations are still ACTIVE
    let r = h.get(&t.key, "/v1/reservations?status=ACTIVE&limit=200").await;
    let active: Vec<String> = r.assert_ok()["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["reservation_id"].as_str().unwrap().to_string())
        .collect();
    let b = std::mem::take(&mut *book.lock().unwrap());
    for (id, n) in &b.finalized {
        assert!(*n <= 1, "seed {}: reservation {id} finalized {n} times", c.seed);
    }
    for depth in 1..=c.depth {
        let scope = scope_of(&t, depth);
        let l = h.ledger(&t.id, &scope, c.unit).await; // balance identity asserted inside
        let held: i64 = active.iter().map(|id| b.holds[id]).filter(|(_, d)| *d >= depth).map(|(e, _)| e).sum();
        assert_eq!(l.reserved, held, "seed {}: reserved on {scope}", c.seed);
        let spent: i64 = b.charges.iter().filter(|(d, _)| *d >= depth).map(|(_, x)| x).sum();
        assert_eq!(l.spent + l.debt, spent, "seed {}: spent + debt on {scope}", c.seed);
        match c.policy {
            "ALLOW_WITH_OVERDRAFT" => {
                assert!(l.debt <= limits[depth - 1], "seed {}: debt over limit on {scope}: {l:?}", c.seed)
            }
            _ => assert!(l.debt == 0 && l.remaining >= 0, "seed {}: {} left debt on {scope}: {l:?}", c.seed, c.policy),
        }
    }
}

#[test]
fn ledger_invariants_hold_under_random_concurrent_operations() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let h = Arc::new(rt.block_on(Harness::start()));
    let replay: Option<u64> = std::env::var("INVARIANTS_SEED").ok().and_then(|s| s.parse().ok());
    let cases = if replay.is_some() { 1 } else { 12 };
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(seed in any::<u64>(), depth in 1usize..=6, unit in 0usize..4, policy in 0usize..3)| {
        let seed = replay.unwrap_or(seed);
        let case = Case { seed, depth, unit: Unit::ALL[unit], policy: POLICIES[policy] };
        eprintln!("invariants case: seed={seed} depth={depth} unit={} policy={}", case.unit.as_str(), case.policy);
        rt.block_on(run_case(h.clone(), case));
    });
}
