//! `GET /v1/reservations`: filters, sort keys, windows, cursors and tenancy.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::Value;

use cycles_tests::*;

fn ids(r: &Resp) -> Vec<String> {
    r.body["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["reservation_id"].as_str().unwrap().to_string())
        .collect()
}

/// Follows cursors from `first` and returns every id visited (`walk_rows`).
async fn walk(h: &Harness, key: &str, first: &str) -> Vec<String> {
    walk_rows(h, key, first).await.iter().map(|r| r["reservation_id"].as_str().unwrap().to_string()).collect()
}

#[tokio::test]
async fn listing_filters_and_orders() {
    let h = Harness::start().await;
    let t = h.funded(100_000).await;
    let other = h.funded(100_000).await;
    h.reserve_ok(&other, 1, json!({})).await;
    let mut created = Vec::new();
    for i in 0..6 {
        let agent = if i % 2 == 0 { "even" } else { "odd" };
        let rid = h
            .reserve_ok(
                &t,
                10 + i,
                json!({"subject": {"tenant": t.id, "agent": agent}, "metadata": {"i": i},
            "idempotency_key": format!("list-{i}")}),
            )
            .await;
        created.push(rid);
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    h.commit(&t, &created[0], 5).await.assert_ok();
    let body = json!({"idempotency_key": "cm", "actual": {"unit": "TOKENS", "amount": 5}, "metadata": {"done": true}});
    h.post(&t.key, &format!("/v1/reservations/{}/commit", created[2]), &body).await.assert_ok();
    h.release(&t, &created[1]).await.assert_ok();

    // Only this tenant, newest first by default.
    let r = h.get(&t.key, "/v1/reservations").await;
    let mut newest_first = created.clone();
    newest_first.reverse();
    assert_eq!(ids(&r), newest_first);
    // Committed shows without include; heavy fields only with include.
    let rows = r.body["reservations"].as_array().unwrap();
    let c0 = rows.iter().find(|x| x["reservation_id"] == created[0].as_str()).unwrap();
    assert_eq!(c0["committed"]["amount"], 5);
    assert!(c0["finalized_at_ms"].is_i64());
    assert!(c0.get("metadata").is_none());
    let active = rows.iter().find(|x| x["reservation_id"] == created[5].as_str()).unwrap();
    assert!(active.get("finalized_at_ms").is_none() && active.get("committed").is_none());
    let r = h.get(&t.key, "/v1/reservations?include=metadata,,COMMITTED_METADATA,bogus").await;
    let c2 = r.body["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["reservation_id"] == created[2].as_str())
        .unwrap()
        .clone();
    assert_eq!(c2["metadata"], json!({"i": 2}));
    assert_eq!(c2["committed_metadata"], json!({"done": true}));
    // Filters: status, subject fields, idempotency key.
    assert_eq!(ids(&h.get(&t.key, "/v1/reservations?status=ACTIVE&sort_dir=asc").await), created[3..].to_vec());
    assert_eq!(ids(&h.get(&t.key, "/v1/reservations?status=RELEASED").await), vec![created[1].clone()]);
    let odd = ids(&h.get(&t.key, "/v1/reservations?agent=ODD&sort_dir=asc").await);
    assert_eq!(odd, vec![created[1].clone(), created[3].clone(), created[5].clone()]);
    assert_eq!(ids(&h.get(&t.key, "/v1/reservations?idempotency_key=list-4").await), vec![created[4].clone()]);
    assert!(ids(&h.get(&t.key, "/v1/reservations?workspace=none").await).is_empty());
    // Other sort keys, both directions.
    let by_amount = ids(&h.get(&t.key, "/v1/reservations?sort_by=reserved&sort_dir=asc").await);
    assert_eq!(by_amount, created);
    let by_id = ids(&h.get(&t.key, "/v1/reservations?sort_by=RESERVATION_ID&sort_dir=asc").await);
    let mut sorted = created.clone();
    sorted.sort();
    assert_eq!(by_id, sorted);
    let by_status = ids(&h.get(&t.key, "/v1/reservations?sort_by=status").await);
    assert_eq!(by_status.first(), Some(&created[1])); // RELEASED sorts last asc, first desc
}

#[tokio::test]
async fn listing_time_windows() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let a = h.reserve_ok(&t, 1, json!({})).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = h.reserve_ok(&t, 1, json!({})).await;
    let detail = |id: String| {
        let h = &h;
        let key = t.key.clone();
        async move { h.get(&key, &format!("/v1/reservations/{id}")).await.body }
    };
    let (da, db) = (detail(a.clone()).await, detail(b.clone()).await);
    let iso = cycles_shared::domain::format_rfc3339_ms;
    let ca = da["created_at_ms"].as_i64().unwrap();
    let cb = db["created_at_ms"].as_i64().unwrap();
    // Inclusive bounds on created_at_ms.
    let r = h.get(&t.key, &format!("/v1/reservations?from={}&to={}", iso(ca), iso(ca))).await;
    assert_eq!(ids(&r), vec![a.clone()]);
    let r = h.get(&t.key, &format!("/v1/reservations?from={}", iso(cb))).await;
    assert_eq!(ids(&r), vec![b.clone()]);
    let ea = da["expires_at_ms"].as_i64().unwrap();
    let r = h.get(&t.key, &format!("/v1/reservations?expires_to={}", iso(ea))).await;
    assert_eq!(ids(&r), vec![a.clone()]);
    // Finalized bounds exclude ACTIVE rows.
    h.commit(&t, &a, 1).await.assert_ok();
    let r = h.get(&t.key, "/v1/reservations?finalized_from=2000-01-01T00:00:00Z").await;
    assert_eq!(ids(&r), vec![a.clone()]);
    // Inverted windows; blank bounds are absent; bad dates are 400.
    h.get(&t.key, &format!("/v1/reservations?from={}&to={}", iso(cb), iso(ca)))
        .await
        .assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, "/v1/reservations?expires_from=2030-01-01T00:00:00Z&expires_to=2020-01-01T00:00:00Z")
        .await
        .assert_error(400, "INVALID_REQUEST");
    assert_eq!(ids(&h.get(&t.key, "/v1/reservations?from=&finalized_to=&to=").await).len(), 2);
    h.get(&t.key, "/v1/reservations?from=yesterday").await.assert_error(400, "INVALID_REQUEST");
    let r = h.get(&t.key, "/v1/reservations?from=2000-01-01T01:00:00%2B01:00").await;
    assert_eq!(ids(&r).len(), 2);
}

#[tokio::test]
async fn listing_pagination_and_cursor_binding() {
    let h = Harness::start().await;
    let t = h.funded(100_000).await;
    let mut all = HashSet::new();
    for _ in 0..23 {
        all.insert(h.reserve_ok(&t, 1, json!({})).await);
    }
    // Default 50, bounds 1..200.
    assert_eq!(ids(&h.get(&t.key, "/v1/reservations").await).len(), 23);
    for bad in ["0", "201", "x", "-1"] {
        h.get(&t.key, &format!("/v1/reservations?limit={bad}")).await.assert_error(400, "INVALID_REQUEST");
    }
    // Every row exactly once across pages, in both modes.
    for first in [
        "/v1/reservations?limit=5",
        "/v1/reservations?limit=4&sort_dir=asc",
        "/v1/reservations?limit=6&sort_by=reserved",
    ] {
        let seen = walk(&h, &t.key, first).await;
        assert_eq!(seen.len(), 23, "{first}");
        assert_eq!(seen.iter().cloned().collect::<HashSet<_>>(), all, "{first}");
    }
    // Cursors are stable under concurrent inserts: new rows do not duplicate old ones.
    let page = h.get(&t.key, "/v1/reservations?limit=10").await;
    let c = page.body["next_cursor"].as_str().unwrap().to_string();
    h.reserve_ok(&t, 1, json!({})).await;
    let next = ids(&h.get(&t.key, &format!("/v1/reservations?limit=10&cursor={c}&include=metadata")).await);
    assert!(next.iter().all(|id| !ids(&page).contains(id)), "include does not break the cursor");
    // Other windows, filters or sort with a cursor -> 400; a garbage cursor -> 400.
    for changed in ["from=2000-01-01T00:00:00Z", "status=ACTIVE", "sort_by=reserved", "sort_dir=asc", "agent=x"] {
        h.get(&t.key, &format!("/v1/reservations?limit=10&cursor={c}&{changed}"))
            .await
            .assert_error(400, "INVALID_REQUEST");
    }
    h.get(&t.key, "/v1/reservations?cursor=not-a-cursor").await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, "/v1/reservations?sort_by=bogus").await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, "/v1/reservations?sort_dir=up").await.assert_error(400, "INVALID_REQUEST");
    h.get(&t.key, "/v1/reservations?status=DONE").await.assert_error(400, "INVALID_REQUEST");
    // Blank enum and integer values are invalid values, not absent ones (only date bounds).
    for blank in ["status=", "sort_by=", "sort_dir=", "limit=", "idempotency_key="] {
        h.get(&t.key, &format!("/v1/reservations?{blank}")).await.assert_error(400, "INVALID_REQUEST");
    }
}

#[tokio::test]
async fn listing_tenancy_and_admin() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let other = h.funded(1000).await;
    let mine = h.reserve_ok(&t, 1, json!({})).await;
    let theirs = h.reserve_ok(&other, 1, json!({})).await;
    // A tenant key lists only its own tenant; naming another tenant is forbidden.
    h.get(&t.key, &format!("/v1/reservations?tenant={}", other.id)).await.assert_error(403, "FORBIDDEN");
    assert_eq!(ids(&h.get(&t.key, &format!("/v1/reservations?tenant={}", t.id)).await), vec![mine.clone()]);
    // The admin key must name the tenant and then sees only that tenant.
    let admin = [("x-admin-api-key", ADMIN_KEY)];
    let r = h.send("GET", "/v1/reservations", &admin, None).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert_eq!(r.body["message"], "tenant query parameter is required when using admin key authentication");
    let r = h.send("GET", &format!("/v1/reservations?tenant={}", other.id), &admin, None).await;
    assert_eq!(ids(&r), vec![theirs]);
    let r = h.send("GET", "/v1/reservations?tenant=nobody-here", &admin, None).await;
    assert!(ids(&r).is_empty());
    // listing needs reservations:list
    let no_list = h.key(&t.id, Some(vec!["reservations:create".into()])).await;
    h.get(&no_list.secret, "/v1/reservations").await.assert_error(403, "FORBIDDEN");
}

#[tokio::test]
async fn expired_reservations_are_listed_with_their_status() {
    let h = Harness::start().await;
    let t = h.funded(1000).await;
    let rid = h.reserve_ok(&t, 10, json!({"ttl_ms": 1000, "grace_period_ms": 0})).await;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    h.get(&t.key, &format!("/v1/reservations/{rid}")).await.assert_error(410, "RESERVATION_EXPIRED");
    // The list still shows it, as EXPIRED.
    let r = h.get(&t.key, "/v1/reservations?status=EXPIRED").await;
    assert_eq!(ids(&r), vec![rid]);
    assert!(r.body["reservations"][0].get("finalized_at_ms").is_none());
}

/// A page costs work in proportion to the page, for every sort key: with 300 reservations that
/// carry near-limit metadata, a one-row page reads a handful of records and no metadata unless
/// `include` asks (then only the page's). Metadata above the limit is refused on write.
#[tokio::test]
async fn listing_work_is_bounded_by_the_page_for_every_sort_key() {
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1_000_000_000).await;
    let big = "m".repeat(cycles_shared::model::MAX_METADATA_BYTES - 40);
    let before = h.root(&t).await;
    let r = h.reserve(&t, 1, json!({"metadata": {"blob": format!("{big}{big}")}})).await;
    r.assert_error(400, "INVALID_REQUEST");
    assert!(r.body["message"].as_str().unwrap().starts_with("metadata must be at most 16384 bytes"), "{}", r.raw);
    assert_eq!(h.root(&t).await, before, "nothing was reserved");
    let mut ids = Vec::new();
    for i in 0..300 {
        let id = h.reserve_ok(&t, 1000 + (i * 7919) % 301, json!({"metadata": {"blob": big, "i": i}})).await;
        ids.push(id);
    }
    let body = json!({"idempotency_key": "big-commit", "actual": {"unit": "TOKENS", "amount": 1},
        "metadata": {"blob": format!("{big}{big}")}});
    h.post(&t.key, &format!("/v1/reservations/{}/commit", ids[0]), &body).await.assert_error(400, "INVALID_REQUEST");
    h.commit(&t, &ids[1], 1).await.assert_ok();
    h.release(&t, &ids[2]).await.assert_ok();
    // (the listing members of reservations made since the sweep's last visit are written once,
    // by the sweep or the first listing that walks the index: `listing_index_is_written_from_the_created_stream`)
    assert!(cycles_shared::ops::listing::flush(&h.store, &t.id, 10, true).await.unwrap());
    for sort in ["created_at_ms", "reservation_id", "tenant", "scope_path", "status", "reserved", "expires_at_ms"] {
        for dir in ["asc", "desc"] {
            let (gets, reads) = (h.command_calls("get").await, h.command_calls("hmget").await);
            let r = h.get(&t.key, &format!("/v1/reservations?sort_by={sort}&sort_dir={dir}&limit=1")).await;
            let page = r.assert_ok();
            assert_eq!(page["reservations"].as_array().unwrap().len(), 1, "{sort} {dir}");
            assert!(r.raw.len() < 2_000, "{sort} {dir}: no metadata shipped ({} bytes)", r.raw.len());
            let got = h.command_calls("get").await - gets;
            assert!(got <= 8, "{sort} {dir}: {got} records read for a one-row page");
            // key checks (one HMGET per chunk read) only: no metadata hash is read
            assert!(h.command_calls("hmget").await - reads <= 8, "{sort} {dir}");
        }
    }
    let r = h.get(&t.key, "/v1/reservations?sort_by=reserved&limit=2&include=metadata").await;
    let rows = r.assert_ok()["reservations"].as_array().unwrap().clone();
    assert!(rows.iter().all(|row| row["metadata"]["blob"].as_str().is_some_and(|b| b.len() == big.len())));
    // the largest reservations come first, and they are the largest
    assert_eq!(rows[0]["reserved"]["amount"], 1300);
}

/// Every sort order is total and stable across pages: the walk of each key in both directions
/// equals sorting the whole set by (key, reservation_id ascending), with rows whose subject has
/// No tenant last ascending and first descending.
#[tokio::test]
async fn every_sort_order_matches_a_full_sort_with_ascending_ties() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000).await;
    // subjects without a tenant: their ledgers cannot be made through the API (a scope starts
    // with the tenant), so they are staged in the store
    let agents = ["a", "Z_9", "-x.y"];
    for agent in agents {
        let scope = format!("agent:{}", agent.to_ascii_lowercase());
        let fields = [("scope", scope.as_str()), ("unit", "TOKENS"), ("allocated", "1000"), ("remaining", "1000")];
        h.set_budget(&t.id, &scope, cycles_shared::model::Unit::Tokens, &fields).await;
    }
    let mut created = Vec::new();
    for i in 0..14i64 {
        let agent = agents[(i % 3) as usize];
        let mut subject = json!({ "agent": agent });
        if i % 4 != 0 {
            subject["tenant"] = json!(t.id);
        }
        let extra = json!({"subject": subject, "ttl_ms": 60_000 + (i % 2) * 1000});
        created.push(h.reserve_ok(&t, 10 + (i % 3), extra).await);
    }
    h.commit(&t, &created[3], 1).await.assert_ok();
    h.release(&t, &created[5]).await.assert_ok();
    h.extend(&t, &created[6], 5000).await.assert_ok();
    let all = walk(&h, &t.key, "/v1/reservations?limit=200&sort_dir=asc").await;
    assert_eq!(all.len(), 14);
    let mut rows = Vec::new();
    for id in &all {
        rows.push(h.get(&t.key, &format!("/v1/reservations/{id}")).await.assert_ok().clone());
    }
    let key = |r: &serde_json::Value, sort: &str| -> (u8, serde_json::Value) {
        match sort {
            "reserved" => (0, r["reserved"]["amount"].clone()),
            "tenant" => match r["subject"].get("tenant") {
                Some(t) => (0, t.clone()),
                None => (1, json!(null)),
            },
            "reservation_id" => (0, json!(null)),
            other => (0, r[other].clone()),
        }
    };
    let cmp = |a: &serde_json::Value, b: &serde_json::Value| match (a.as_i64(), b.as_i64()) {
        (Some(x), Some(y)) => x.cmp(&y),
        _ => a.as_str().unwrap_or("").cmp(b.as_str().unwrap_or("")),
    };
    for sort in ["reservation_id", "tenant", "scope_path", "status", "reserved", "expires_at_ms", "created_at_ms"] {
        for desc in [false, true] {
            let mut expected = rows.clone();
            expected.sort_by(|a, b| {
                let (ka, kb) = (key(a, sort), key(b, sort));
                let by_key = ka.0.cmp(&kb.0).then_with(|| cmp(&ka.1, &kb.1));
                let by_key = if desc { by_key.reverse() } else { by_key };
                let (ia, ib) = (a["reservation_id"].as_str().unwrap(), b["reservation_id"].as_str().unwrap());
                let by_id = if sort == "reservation_id" && desc { ib.cmp(ia) } else { ia.cmp(ib) };
                by_key.then(by_id)
            });
            let expected: Vec<String> =
                expected.iter().map(|r| r["reservation_id"].as_str().unwrap().to_string()).collect();
            let dir = if desc { "desc" } else { "asc" };
            for limit in [1, 3, 50] {
                let got =
                    walk(&h, &t.key, &format!("/v1/reservations?sort_by={sort}&sort_dir={dir}&limit={limit}")).await;
                assert_eq!(got, expected, "{sort} {dir} limit {limit}");
            }
        }
    }
}

/// Every sort order of a tenant's listing, both directions, walked with small pages.
async fn every_walk(h: &Harness, key: &str) -> Vec<Vec<String>> {
    let mut walks = Vec::new();
    for sort in ["reservation_id", "tenant", "scope_path", "status", "reserved", "expires_at_ms", "created_at_ms"] {
        for dir in ["asc", "desc"] {
            for limit in [7, 200] {
                walks
                    .push(walk(h, key, &format!("/v1/reservations?sort_by={sort}&sort_dir={dir}&limit={limit}")).await);
            }
        }
    }
    walks
}

/// The listing index's compacted part and what stays in the index itself.
async fn chunks(h: &Harness, tenant: &str) -> (Vec<String>, Vec<String>) {
    let keys = cycles_shared::keys::TenantKeys::new(tenant);
    let mut conn = h.store.conn();
    let bounds: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.listing_chunks()).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    let live: Vec<String> =
        redis::cmd("ZRANGE").arg(keys.listing_index()).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    (bounds, live)
}

/// Finished reservations' listing members move into compact chunks (the sweep's compaction,
/// unless switched off):
/// every sort order walks the same before, during (part moved) and after, with reservations
/// finished after a compaction; each chunk stays a compact listpack of at most 32 members;
/// only live reservations and members too long for a chunk stay in the index; a second pass
/// moves nothing; retention removes the members from the chunks too, leaving no chunk behind.
#[tokio::test]
async fn compacting_the_listing_keeps_every_sort_order() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000_000).await;
    let long_scope = "a-workspace-whose-name-is-long-enough-for-the-index";
    let mut made = Vec::new();
    for i in 0..330i64 {
        let mut subject = json!({"tenant": t.id});
        match i % 5 {
            0 => subject["workspace"] = json!("w1"),
            1 => subject["workspace"] = json!(long_scope),
            _ => {}
        }
        let extra = json!({"subject": subject, "ttl_ms": 60_000 + (i % 4) * 1000});
        made.push(h.reserve_ok(&t, 1 + (i * 7919) % 97, extra).await);
    }
    // indexed while all are live (a listing writes the members first), so every member is in
    // the index when they finish
    assert_eq!(every_walk(&h, &t.key).await[0].len(), 330);
    for (i, id) in made.iter().enumerate() {
        match i % 6 {
            0..=2 => h.commit(&t, id, 1).await.assert_ok(),
            3 => h.release(&t, id).await.assert_ok(),
            _ => continue,
        };
    }
    let before = every_walk(&h, &t.key).await;
    assert_eq!(before[0].len(), 330);
    // switched off (CYCLES_LISTING_COMPACTION=off), the sweep leaves the index as it is
    let off = cycles_shared::config::SweepOptions { compact_listing: false, ..Default::default() };
    assert_eq!(h.sweep_tenant(&t, &off).await.compacted, 0);
    assert!(chunks(&h, &t.id).await.0.is_empty());
    // part of them (one call moves 200), then the rest
    let moved = cycles_shared::ops::listing::compact(&h.store, &t.id, 1).await.unwrap();
    assert_eq!(moved, 200);
    assert_eq!(every_walk(&h, &t.key).await, before, "partly compacted");
    assert_chunks_placed(&h, &t.id).await;
    assert_eq!(cycles_shared::ops::listing::compact(&h.store, &t.id, 10).await.unwrap(), 20);
    assert_eq!(every_walk(&h, &t.key).await, before, "compacted");
    assert_chunks_placed(&h, &t.id).await;
    let (bounds, live) = chunks(&h, &t.id).await;
    assert!(bounds.len() > 6, "chunks split as they filled: {}", bounds.len());
    let mut conn = h.store.conn();
    let mut packed = 0;
    for (bound, chunk) in bounds.iter().zip(chunk_keys(&h, &t.id, &bounds).await) {
        let encoding: String = redis::cmd("OBJECT").arg("ENCODING").arg(&chunk).query_async(&mut conn).await.unwrap();
        let card: usize = redis::cmd("ZCARD").arg(&chunk).query_async(&mut conn).await.unwrap();
        assert_eq!(encoding, "listpack", "{bound:?}");
        assert!((1..=32).contains(&card), "{bound:?}: {card}");
        packed += card;
    }
    // 220 finished: 4 members each, but for the 44 with the long workspace the scope member
    // stays; the 110 live reservations keep their 4 members each in the index
    assert_eq!(packed, 220 * 4 - 44);
    assert_eq!(live.len(), 110 * 4 + 44);
    assert!(live.iter().all(|m| !m.starts_with(['C', 'E', 'R'])), "no finished status member stays");
    assert_eq!(cycles_shared::ops::listing::compact(&h.store, &t.id, 10).await.unwrap(), 0);
    // reservations finished after a compaction: moved by the next one
    for id in made.iter().skip(4).step_by(6) {
        h.commit(&t, id, 2).await.assert_ok();
    }
    let before = every_walk(&h, &t.key).await;
    let swept = h.sweep_tenant(&t, &cycles_shared::config::SweepOptions::default()).await;
    assert_eq!(swept.compacted, 55, "the sweep compacts");
    assert_eq!(every_walk(&h, &t.key).await, before, "compacted again");
    assert_chunks_placed(&h, &t.id).await;
    let r = h.get(&t.key, "/v1/reservations?status=ACTIVE&limit=200").await;
    assert_eq!(ids(&r).len(), 55);
    // retention: every finished reservation goes, with its members in the chunks
    let opts =
        cycles_shared::config::SweepOptions { retention: Duration::from_millis(1), batch: 1000, ..Default::default() };
    tokio::time::sleep(Duration::from_millis(5)).await;
    h.sweep_tenant(&t, &opts).await;
    let (bounds, live) = chunks(&h, &t.id).await;
    assert!(bounds.is_empty(), "{bounds:?}");
    assert_eq!(live.len(), 55 * 4);
    let left = walk(&h, &t.key, "/v1/reservations?sort_by=reserved&limit=50").await;
    assert_eq!(left.len(), 55);
}

/// Compacted, a page still costs work in proportion to the page: with 400 finished reservations
/// in chunks, a one-row page of every sort order reads a handful of records and of sorted-set
/// ranges (the chunk that holds the position and its neighbours, never the whole directory).
#[tokio::test]
async fn compacted_listing_work_is_bounded_by_the_page() {
    let redis = cycles_shared::local::EmbeddedRedis::start(&[]).await.expect("redis-server");
    let h = Harness::start_on(redis.url(), Some(redis)).await;
    let t = h.funded(1_000_000_000).await;
    for i in 0..400 {
        let id = h.reserve_ok(&t, 1000 + (i * 7919) % 401, json!({})).await;
        h.commit(&t, &id, 1).await.assert_ok();
    }
    // ended before the index was written: their members go straight into the chunks
    assert!(cycles_shared::ops::listing::flush(&h.store, &t.id, 10, true).await.unwrap());
    assert_eq!(cycles_shared::ops::listing::compact(&h.store, &t.id, 10).await.unwrap(), 0);
    let (bounds, live) = chunks(&h, &t.id).await;
    assert!(bounds.len() > 40 && live.is_empty(), "{} chunks, {} live members", bounds.len(), live.len());
    for sort in ["reservation_id", "tenant", "scope_path", "status", "reserved", "expires_at_ms"] {
        for dir in ["asc", "desc"] {
            let (gets, ranges) = (h.command_calls("get").await, h.command_calls("zrange").await);
            let r = h.get(&t.key, &format!("/v1/reservations?sort_by={sort}&sort_dir={dir}&limit=1")).await;
            assert_eq!(r.assert_ok()["reservations"].as_array().unwrap().len(), 1, "{sort} {dir}");
            let got = h.command_calls("get").await - gets;
            assert!(got <= 8, "{sort} {dir}: {got} records read for a one-row page");
            let ranges = h.command_calls("zrange").await - ranges;
            // each of a chunk's ~20 neighbours read would show: the status-member sorts walk
            // eight ranges (four statuses, with and without a tenant), the others one
            let most = if ["reservation_id", "tenant", "status"].contains(&sort) { 40 } else { 10 };
            assert!(ranges <= most, "{sort} {dir}: {ranges} range reads for a one-row page");
        }
    }
}

/// The listing members of a reservation are written from the created stream, not by the
/// reserve: a reserve (and a creation-time listing) leaves the index empty; a flush call reads
/// at most 200 reservations and says when it has not caught up; a listing that walks the index
/// catches up first, a finished reservation's members straight into the chunks with its final
/// status and an ACTIVE one's into the index, where its ending and its extension then move
/// them; with compaction off every member goes into the index; more waiting than
/// `CYCLES_LISTING_CATCH_UP` is a 503 for such a listing, never a partial one.
#[tokio::test]
async fn listing_index_is_written_from_the_created_stream() {
    let h = Harness::start().await;
    let t = h.funded(1_000_000_000).await;
    let keys = cycles_shared::keys::TenantKeys::new(&t.id);
    let mut made = Vec::new();
    for i in 0..450i64 {
        made.push(h.reserve_ok(&t, 1 + i % 7, json!({})).await);
    }
    for id in &made[..100] {
        h.commit(&t, id, 1).await.assert_ok();
    }
    for id in &made[100..150] {
        h.release(&t, id).await.assert_ok();
    }
    for id in &made[150..160] {
        h.extend(&t, id, 5_000).await.assert_ok();
    }
    let card = |key: String| {
        let h = &h;
        async move { redis::cmd("ZCARD").arg(key).query_async::<usize>(&mut h.store.conn()).await.unwrap() }
    };
    assert_eq!(card(keys.listing_index()).await, 0, "a reserve writes no listing member");
    assert_eq!(walk(&h, &t.key, "/v1/reservations?limit=200").await.len(), 450);
    assert_eq!(card(keys.listing_index()).await, 0, "a creation-time listing writes none");

    // one call reads one batch: not caught up with 450
    assert!(!cycles_shared::ops::listing::flush(&h.store, &t.id, 1, true).await.unwrap());
    let (bounds, live) = chunks(&h, &t.id).await;
    assert_eq!(live.len() + chunk_members(&h, &t.id, &bounds).await, 200 * 4);
    // a listing by status catches up first: every reservation, each in its status group
    let statuses =
        |rows: Vec<Value>| rows.iter().map(|r| r["status"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    let rows = walk_rows(&h, &t.key, "/v1/reservations?sort_by=status&sort_dir=asc&limit=200").await;
    let got = statuses(rows.clone());
    let expected: Vec<&str> =
        [("ACTIVE", 300), ("COMMITTED", 100), ("RELEASED", 50)].iter().flat_map(|(s, n)| vec![*s; *n]).collect();
    assert_eq!(got, expected);
    // the ended ones' members are in the chunks (their final status), the live ones' in the index
    let (bounds, live) = chunks(&h, &t.id).await;
    assert_eq!(live.len(), 300 * 4);
    assert!(live.iter().all(|m| !m.starts_with(['C', 'E', 'R'])));
    assert_eq!(chunk_members(&h, &t.id, &bounds).await, 150 * 4);
    // an extension before the flush: its expiry member has the new expiry
    let rows = walk_rows(&h, &t.key, "/v1/reservations?sort_by=expires_at_ms&sort_dir=desc&limit=200").await;
    let expiries: Vec<i64> = rows.iter().map(|r| r["expires_at_ms"].as_i64().unwrap()).collect();
    assert!(expiries.windows(2).all(|w| w[0] >= w[1]), "expires_at_ms descending");
    let top: HashSet<String> = rows[..10].iter().map(|r| r["reservation_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(top, made[150..160].iter().cloned().collect::<HashSet<_>>(), "the extended ones expire last");

    // after the flush, an ending moves the status member and an extension the expiry member
    let token = |id: &str| id.split('.').nth(1).unwrap().to_string();
    h.commit(&t, &made[160], 1).await.assert_ok();
    h.extend(&t, &made[161], 60_000).await.assert_ok();
    let (_, live) = chunks(&h, &t.id).await;
    assert!(live.contains(&format!("C0{}", token(&made[160]))) && !live.contains(&format!("A0{}", token(&made[160]))));
    let rows = walk_rows(&h, &t.key, "/v1/reservations?sort_by=expires_at_ms&sort_dir=desc&limit=1").await;
    assert_eq!(rows[0]["reservation_id"], made[161].as_str());
    assert_eq!(rows.len(), 450);

    // compaction off: the flush puts every member into the index
    let off = Harness::start_beside(&h, |c| c.sweep_compact_listing = false).await;
    let u = off.funded(1_000).await;
    let id = off.reserve_ok(&u, 1, json!({})).await;
    off.commit(&u, &id, 1).await.assert_ok();
    assert_eq!(walk(&off, &u.key, "/v1/reservations?sort_by=reserved").await, vec![id.clone()]);
    let (bounds, live) = chunks(&off, &u.id).await;
    assert!(bounds.is_empty() && live.len() == 4 && live.contains(&format!("C0{}", token(&id))), "{live:?}");

    // more waiting than CYCLES_LISTING_CATCH_UP: a 503 for a walk of the index, nothing partial;
    // a creation-time listing still answers, and once the sweep caught up the walk does too
    let tight = Harness::start_beside(&h, |c| c.listing_catch_up = 200).await;
    let v = tight.funded(1_000_000).await;
    for _ in 0..201 {
        tight.reserve_ok(&v, 1, json!({})).await;
    }
    let r = tight.get(&v.key, "/v1/reservations?sort_by=reserved&limit=5").await;
    r.assert_error(503, "INTERNAL_ERROR");
    assert!(r.body["message"].as_str().unwrap().contains("catching up"), "{}", r.raw);
    tight.get(&v.key, "/v1/reservations?limit=5").await.assert_ok();
    tight.sweep_tenant(&v, &cycles_shared::config::SweepOptions::default()).await;
    assert_eq!(walk(&tight, &v.key, "/v1/reservations?sort_by=reserved&limit=200").await.len(), 201);
}

/// The chunk key of each of `bounds` (named by its bound's SHA-1, as `CHUNKED.key` names it).
/// Every member of the chunks lies where a walk looks for it: from its chunk's bound (of its
/// own kind: the same first byte) up to the next bound.
async fn assert_chunks_placed(h: &Harness, tenant: &str) {
    let (bounds, _) = chunks(h, tenant).await;
    let mut conn = h.store.conn();
    for (i, key) in chunk_keys(h, tenant, &bounds).await.iter().enumerate() {
        let members: Vec<Vec<u8>> = redis::cmd("ZRANGE").arg(key).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
        let (bound, next) = (bounds[i].as_bytes(), bounds.get(i + 1).map(|b| b.as_bytes()));
        for m in &members {
            assert!(
                m.as_slice() >= bound && next.is_none_or(|n| m.as_slice() < n),
                "{m:?} outside its chunk {bound:?}"
            );
            assert_eq!(m[0], bound[0], "{m:?} in a chunk of another kind ({bound:?})");
        }
    }
}

async fn chunk_keys(h: &Harness, tenant: &str, bounds: &[String]) -> Vec<String> {
    let keys = cycles_shared::keys::TenantKeys::new(tenant);
    let mut conn = h.store.conn();
    let mut out = Vec::new();
    for bound in bounds {
        let sha: String = redis::cmd("EVAL")
            .arg("return redis.sha1hex(ARGV[1])")
            .arg(0)
            .arg(bound)
            .query_async(&mut conn)
            .await
            .unwrap();
        out.push(keys.listing_chunk(&sha[..20]));
    }
    out
}

/// Members in the chunks named by `bounds`.
async fn chunk_members(h: &Harness, tenant: &str, bounds: &[String]) -> usize {
    let mut conn = h.store.conn();
    let mut n = 0;
    for chunk in chunk_keys(h, tenant, bounds).await {
        let card: usize = redis::cmd("ZCARD").arg(chunk).query_async(&mut conn).await.unwrap();
        n += card;
    }
    n
}

/// Follows cursors from `first` and returns every row visited, asserting on each page that
/// `has_more` says whether a cursor follows.
async fn walk_rows(h: &Harness, key: &str, first: &str) -> Vec<Value> {
    let mut rows = Vec::new();
    let mut path = first.to_string();
    loop {
        let r = h.get(key, &path).await;
        let b = r.assert_ok().clone();
        rows.extend(b["reservations"].as_array().unwrap().iter().cloned());
        assert_eq!(b["has_more"].as_bool().unwrap(), b.get("next_cursor").is_some());
        match b.get("next_cursor").and_then(|c| c.as_str()) {
            Some(c) => path = format!("{first}&cursor={c}"),
            None => return rows,
        }
    }
}
