//! Many tasks against one small budget: never oversubscribed, the balance identity holds.

use std::sync::Arc;

use cycles_shared::model::Unit;
use cycles_tests::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reserves_never_oversubscribe() {
    let h = Arc::new(Harness::start().await);
    let t = h.tenant().await;
    let root = format!("tenant:{}", t.id);
    h.budget(&t.id, &root, Unit::Tokens, 1_000).await;
    h.budget(&t.id, &format!("{root}/agent:a"), Unit::Tokens, 700).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (h, t) = (h.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            let agent = if i % 2 == 0 { json!({"tenant": t.id, "agent": "a"}) } else { json!({"tenant": t.id}) };
            let r = h.reserve(&t, 37, json!({"subject": agent})).await;
            match r.status {
                200 => Some((i, r.body["reservation_id"].as_str().unwrap().to_string())),
                409 => {
                    assert_eq!(r.error(), "BUDGET_EXCEEDED");
                    None
                }
                _ => panic!("unexpected {}", r.raw),
            }
        }));
    }
    let mut granted = Vec::new();
    for task in tasks {
        if let Some(g) = task.await.unwrap() {
            granted.push(g);
        }
    }
    let root_l = h.ledger(&t.id, &root, Unit::Tokens).await;
    let agent_l = h.ledger(&t.id, &format!("{root}/agent:a"), Unit::Tokens).await;
    assert_eq!(root_l.reserved, 37 * granted.len() as i64);
    assert!(root_l.remaining >= 0 && root_l.remaining < 37, "the budget was used up, never overdrawn");
    assert!(agent_l.reserved <= 700 && agent_l.remaining >= 0);
    assert_eq!(agent_l.reserved, 37 * granted.iter().filter(|(i, _)| i % 2 == 0).count() as i64);
    // Settle everything concurrently: half commit 20, half release.
    let mut tasks = Vec::new();
    for (n, (_, rid)) in granted.iter().cloned().enumerate() {
        let (h, t) = (h.clone(), t.clone());
        tasks.push(tokio::spawn(async move {
            if n % 2 == 0 {
                h.commit(&t, &rid, 20).await.assert_ok().clone()
            } else {
                h.release(&t, &rid).await.assert_ok().clone()
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let commits = granted.len().div_ceil(2) as i64;
    let l = h.ledger(&t.id, &root, Unit::Tokens).await;
    assert_eq!((l.reserved, l.spent, l.remaining), (0, 20 * commits, 1_000 - 20 * commits));
}

#[tokio::test]
async fn the_suite_runs_on_the_configured_deployment() {
    let h = Harness::start().await;
    // A comma-separated REDIS_URL is a cluster: make sure the store really runs in cluster mode,
    // so a green cluster run means the scripts worked across real hash slots.
    let cluster_configured = h.redis_url.contains(',');
    assert_eq!(h.store.is_cluster(), cluster_configured);
    if cluster_configured {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query_async(&mut h.store.conn()).await.unwrap();
        assert!(info.contains("cluster_size:3"), "{info}");
    }
}
