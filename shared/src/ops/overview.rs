//! getAdminOverview: the operator's dashboard in one request. A request reads one stored
//! snapshot (one GET, whatever the size of the deployment); the snapshot is rebuilt by the
//! maintenance sweep on each pass and by a request that finds it older than its maximum age.
//! A rebuild reads each tenant's ledgers and subscriptions, and the event counters and latest
//! denials and expiries that `emit` (in `lua/lib/events.lua`) keeps beside each event stream, never the
//! streams themselves: its cost does not grow with the number of events.

use std::collections::BTreeMap;

use std::collections::HashMap;

use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::domain::{format_rfc3339_ms, now_ms};
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;

/// Where the snapshot is kept (JSON of the AdminOverviewResponse, with `as_of`).
pub const SNAPSHOT: &str = "cy:{__admin__}:overview";
/// The window of the event summaries.
pub const WINDOW_SECONDS: i64 = 3600;
/// Top-offender and recent-event lists hold at most this many items.
const TOP: usize = 10;

/// When an operator last changed something (ms): set after every successful operator-plane
/// write, so the next read rebuilds the snapshot (same slot as the snapshot: one MGET reads both).
pub const STALE_SINCE: &str = "cy:{__admin__}:overview:stale";
/// Held (1 s) by the read that rebuilds a snapshot an operator change made stale, so such
/// rebuilds happen at most once a second across containers.
const REBUILDING: &str = "cy:{__admin__}:overview:rebuilding";
/// A snapshot younger than this is served even after a change (the rebuilds' bound).
const MIN_REBUILD_MS: i64 = 1_000;

/// Marks the snapshot stale: an operator just changed something.
pub async fn mark_stale(store: &Store) -> ApiResult<()> {
    let _: () = store.conn().set(STALE_SINCE, now_ms()).await?;
    Ok(())
}

/// The stored snapshot, with whether it must be rebuilt: older than `max_age_ms`, or older
/// than the last operator change (and than `MIN_REBUILD_MS`).
async fn stored(store: &Store, max_age_ms: i64) -> ApiResult<(Option<Value>, Rebuild)> {
    let (snapshot, stale_since): (Option<String>, Option<i64>) =
        redis::cmd("MGET").arg(SNAPSHOT).arg(STALE_SINCE).query_async(&mut store.conn()).await?;
    let Some(v) = snapshot.and_then(|s| serde_json::from_str::<Value>(&s).ok()) else {
        return Ok((None, Rebuild::Now));
    };
    let at = v["as_of_ms"].as_i64().unwrap_or(0);
    let age = now_ms() - at;
    let rebuild = if age >= max_age_ms {
        Rebuild::Now
    } else if stale_since.is_some_and(|s| s >= at) && age >= MIN_REBUILD_MS {
        Rebuild::IfFirst
    } else {
        Rebuild::No
    };
    Ok((Some(v), rebuild))
}

#[derive(PartialEq)]
enum Rebuild {
    No,
    /// An operator changed something: rebuilt by the first read to take the lock.
    IfFirst,
    Now,
}

/// The stored snapshot when it needs no rebuild.
async fn fresh(store: &Store, max_age_ms: i64) -> ApiResult<Option<Value>> {
    Ok(match stored(store, max_age_ms).await? {
        (v, Rebuild::No) => v,
        _ => None,
    })
}

/// The overview: the stored snapshot, rebuilt first when older than `max_age_ms` or than an
/// operator's change.
pub async fn overview(store: &Store, max_age_ms: i64) -> ApiResult<Value> {
    let (v, rebuild) = stored(store, max_age_ms).await?;
    let first = || async {
        let taken: Option<String> = redis::cmd("SET")
            .arg(REBUILDING)
            .arg(1)
            .arg("NX")
            .arg("PX")
            .arg(MIN_REBUILD_MS)
            .query_async(&mut store.conn())
            .await?;
        ApiResult::Ok(taken.is_some())
    };
    match (v, rebuild) {
        (Some(v), Rebuild::No) => Ok(strip(v)),
        (Some(v), Rebuild::IfFirst) if !first().await? => Ok(strip(v)),
        _ => Ok(strip(refresh(store).await?)),
    }
}

/// The sweep's part: rebuilds the snapshot when older than `max_age_ms` (true when it did).
pub async fn refresh_if_older(store: &Store, max_age_ms: i64) -> ApiResult<bool> {
    if fresh(store, max_age_ms).await?.is_some() {
        return Ok(false);
    }
    refresh(store).await?;
    Ok(true)
}

fn strip(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("as_of_ms");
    }
    v
}

/// Rebuilds and stores the snapshot.
pub async fn refresh(store: &Store) -> ApiResult<Value> {
    let v = build(store).await?;
    let _: () = store.conn().set(SNAPSHOT, v.to_string()).await?;
    Ok(v)
}

/// One owner's events of the last hour, to the minute, from the counters its scripts keep.
#[derive(Default)]
struct Window {
    categories: BTreeMap<String, i64>,
    reasons: BTreeMap<String, i64>,
    denials: Vec<Value>,
    expiries: Vec<Value>,
}

async fn window(store: &Store, owner: &str, now: i64) -> ApiResult<Window> {
    let keys = TenantKeys::new(owner);
    let last = now / 60_000;
    let first = last - (WINDOW_SECONDS / 60 - 1);
    let mut w = Window::default();
    let mut hours = vec![first / 60, last / 60];
    hours.dedup();
    for hour in hours {
        let counts: HashMap<String, i64> = store.conn().hgetall(keys.event_stats(hour)).await?;
        for (field, n) in counts {
            let Some((minute, what)) = field.split_once('|') else { continue };
            if !minute.parse::<i64>().is_ok_and(|m| (first..=last).contains(&m)) {
                continue;
            }
            match what.strip_prefix("denied|") {
                Some(reason) => *w.reasons.entry(reason.to_string()).or_default() += n,
                None => *w.categories.entry(what.to_string()).or_default() += n,
            }
        }
    }
    let since = format_rfc3339_ms(first * 60_000);
    for (kind, into) in [("reservation.denied", &mut w.denials), ("reservation.expired", &mut w.expiries)] {
        let latest: Vec<String> = store.conn().lrange(keys.event_recent(kind), 0, TOP as isize - 1).await?;
        into.extend(
            latest
                .iter()
                .filter_map(|e| serde_json::from_str::<Value>(e).ok())
                .filter(|e| e["timestamp"].as_str().is_some_and(|t| t >= since.as_str())),
        );
    }
    Ok(w)
}

fn count(map: &mut BTreeMap<String, i64>, key: &str) {
    *map.entry(key.to_string()).or_default() += 1;
}

/// The most quota counters of one tenant the overview looks at.
const QUOTA_SCAN: usize = 1_000;

async fn build(store: &Store) -> ApiResult<Value> {
    let now = now_ms();
    let tenants = super::tenants::all(store).await?;
    let mut tenant_status = BTreeMap::new();
    let (mut budgets, mut by_unit, mut over, mut debt) = (BTreeMap::new(), BTreeMap::new(), vec![], vec![]);
    let (mut hooks, mut failing) = (BTreeMap::new(), vec![]);
    let (mut categories, mut reasons, mut denials, mut expiries, mut recent) = (
        BTreeMap::<String, i64>::new(),
        BTreeMap::<String, i64>::new(),
        Vec::<Value>::new(),
        Vec::<Value>::new(),
        0i64,
    );
    let owners = tenants.iter().map(|t| t.tenant_id.as_str()).chain([super::events::SYSTEM_TENANT]);
    // v0.1.26: observe mode, access lists, quota counters
    let (mut observing, mut with_allow, mut with_deny, mut above_80, mut at_limit, mut offenders) =
        (0, 0, 0, 0, 0, Vec::<Value>::new());
    for t in &tenants {
        count(&mut tenant_status, &t.status);
        if t.observe_mode == "OBSERVE" {
            observing += 1;
        }
        for p in super::policies::all(store, &t.tenant_id).await? {
            with_allow += i64::from(!p.allowed_action_kinds.is_empty());
            with_deny += i64::from(!p.denied_action_kinds.is_empty());
        }
        for c in super::quotas::live(store, &t.tenant_id, QUOTA_SCAN).await? {
            let s = c.state();
            let (used, limit) = (s["used"].as_i64().unwrap_or(0), s["limit"].as_i64().unwrap_or(1));
            above_80 += i64::from(used * 5 >= limit * 4);
            at_limit += i64::from(used >= limit);
            offenders.push(json!({"scope": s["scope"], "action_kind": s["action_kind"], "window": s["window"],
                "used": used, "limit": limit, "utilization_pct": used as f64 / limit as f64}));
        }
        for l in super::ledgers::of_tenant(store, &t.tenant_id).await? {
            count(&mut budgets, &l.status);
            count(&mut by_unit, &l.unit);
            if l.is_over_limit {
                count(&mut budgets, "over_limit");
                over.push(json!({"scope": l.scope, "unit": l.unit, "allocated": l.allocated,
                    "remaining": l.remaining, "debt": l.debt}));
            }
            if l.debt > 0 {
                count(&mut budgets, "with_debt");
                debt.push(
                    json!({"scope": l.scope, "unit": l.unit, "debt": l.debt, "overdraft_limit": l.overdraft_limit}),
                );
            }
        }
    }
    for owner in owners {
        for s in super::webhooks::subscriptions(store, owner).await? {
            count(&mut hooks, &s.status);
            if s.consecutive_failures > 0 {
                count(&mut hooks, "with_failures");
                let mut f =
                    json!({"subscription_id": s.id, "url": s.url, "consecutive_failures": s.consecutive_failures});
                if let Some(at) = s.last_failure_at_ms {
                    f["last_failure_at"] = json!(format_rfc3339_ms(at));
                }
                failing.push(f);
            }
        }
        let w = window(store, owner, now).await?;
        recent += w.categories.values().sum::<i64>();
        for (map, counts) in [(&mut categories, w.categories), (&mut reasons, w.reasons)] {
            for (k, n) in counts {
                *map.entry(k).or_default() += n;
            }
        }
        denials.extend(w.denials);
        expiries.extend(w.expiries);
    }
    let newest_first = |v: &mut Vec<Value>| {
        v.sort_by(|a, b| b["timestamp"].as_str().cmp(&a["timestamp"].as_str()));
        v.truncate(TOP);
    };
    newest_first(&mut denials);
    newest_first(&mut expiries);
    let worst_first = |v: &mut Vec<Value>, by: &str| {
        v.sort_by_key(|x| std::cmp::Reverse(x[by].as_i64().unwrap_or(0)));
        v.truncate(TOP);
    };
    worst_first(&mut over, "debt");
    worst_first(&mut debt, "debt");
    worst_first(&mut failing, "consecutive_failures");
    offenders.sort_by(|a, b| b["utilization_pct"].as_f64().partial_cmp(&a["utilization_pct"].as_f64()).unwrap());
    offenders.truncate(TOP);
    let n = |m: &BTreeMap<String, i64>, k: &str| m.get(k).copied().unwrap_or(0);
    Ok(json!({
        "as_of": format_rfc3339_ms(now), "as_of_ms": now, "event_window_seconds": WINDOW_SECONDS,
        "tenant_counts": {"total": tenants.len(), "active": n(&tenant_status, "ACTIVE"),
            "suspended": n(&tenant_status, "SUSPENDED"), "closed": n(&tenant_status, "CLOSED"),
            "in_observe_mode": observing},
        "quota_health": {"counters_above_80pct": above_80, "counters_at_limit": at_limit, "top_offenders": offenders},
        "access_control_stats": {"policies_with_allow_list": with_allow, "policies_with_deny_list": with_deny},
        "budget_counts": {"total": by_unit.values().sum::<i64>(), "active": n(&budgets, "ACTIVE"),
            "frozen": n(&budgets, "FROZEN"), "closed": n(&budgets, "CLOSED"), "over_limit": n(&budgets, "over_limit"),
            "with_debt": n(&budgets, "with_debt"), "by_unit": by_unit},
        "over_limit_scopes": over, "debt_scopes": debt,
        "webhook_counts": {"total": hooks.iter().filter(|(k, _)| *k != "with_failures").map(|(_, v)| v).sum::<i64>(),
            "active": n(&hooks, "ACTIVE"), "disabled": n(&hooks, "DISABLED"), "with_failures": n(&hooks, "with_failures")},
        "failing_webhooks": failing,
        "event_counts": {"total_recent": recent, "by_category": categories},
        "recent_denials": denials, "recent_expiries": expiries, "recent_denials_by_reason": reasons,
    }))
}
