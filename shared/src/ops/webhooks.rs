//! Webhook subscriptions and deliveries: writing a subscription, queueing deliveries, claiming
//! them, recording attempts, and the system events the dispatcher writes.

use redis::AsyncCommands;
use serde::Deserialize;
use serde_json::{json, Value};

use super::records::{read_records, Record, RecordAnswer};
use super::{lua_list, script, Nothing};
use crate::domain::now_ms;
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;
use crate::webhooks::{Subscription, DELIVERY_RETENTION};

script! {
    /// Create, update (compare-and-set; status CHANGED when it lost) or delete a subscription
    /// (`lua/webhook_write.lua`).
    pub struct WriteSubscription = webhook_write -> RecordAnswer {
        keys: [tenant, subscription, subscription_index, events, audit_log],
        args: [context, mode, fields, expected_updated_at_ms, owner, subscription_id],
    }
}

script! {
    /// Creates PENDING deliveries, each at most once (`lua/delivery_enqueue.lua`): `delivery_keys`
    /// holds per delivery its record, its subscription's delivery index and queue.
    pub struct Enqueue = delivery_enqueue -> Enqueued {
        keys: [due_subscriptions; delivery_keys],
        args: [retention_ms; deliveries],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Enqueued {
    pub created: u64,
}

script! {
    /// Claims due deliveries of one owner with a lease (`lua/delivery_claim.lua`):
    /// `subscriptions` holds per subscription its queue and in-flight set.
    pub struct Claim = delivery_claim -> Claimed {
        keys: [due_subscriptions, legacy_queue; subscriptions],
        args: [lease_ms, max, per_subscription; subscription_ids],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Claimed {
    /// (delivery id, subscription id; '' from the legacy queue)
    #[serde(deserialize_with = "lua_list")]
    pub claimed: Vec<(String, String)>,
}

script! {
    /// Records one attempt (or a pre-check failure) and its effect on the subscription
    /// (`lua/delivery_record.lua`); the status is the delivery's new one.
    pub struct RecordAttempt = delivery_record -> Nothing {
        keys: [delivery, legacy_queue, subscription, events, queue, in_flight, due_subscriptions],
        args: [mode, http_status, response_ms, error, max_retries, retry_delay_ms, disable_after, delivery_id,
            subscription_id],
    }
}

script! {
    /// Writes one event into the system stream (`lua/system_event.lua`).
    pub struct SystemEvent = system_event -> Nothing {
        keys: [events],
        args: [event_type, data, context],
    }
}

/// A tenant's subscriptions (or the system-wide ones), decoded.
pub async fn subscriptions(store: &Store, owner: &str) -> ApiResult<Vec<Subscription>> {
    let keys = TenantKeys::new(owner);
    let ids: Vec<String> = store.conn().smembers(keys.webhook_index()).await?;
    let record_keys: Vec<String> = ids.iter().map(|id| keys.webhook(id)).collect();
    Ok(read_records(store, &record_keys).await?.into_iter().map(Subscription::from_record).collect())
}

/// Creates PENDING deliveries of `event` for `subs` (all of one owner). Live dispatch passes
/// deterministic ids so a repeated fan-out creates nothing twice; replay passes fresh ones.
pub async fn enqueue(
    store: &Store,
    owner: &str,
    event: &Value,
    flags: Option<&str>,
    subs: &[(&Subscription, String)],
) -> ApiResult<u64> {
    if subs.is_empty() {
        return Ok(0);
    }
    let keys = TenantKeys::new(owner);
    let mut call = Enqueue {
        due_subscriptions: keys.due_subscriptions(),
        retention_ms: DELIVERY_RETENTION.as_millis().to_string(),
        ..Default::default()
    };
    let body = event.to_string();
    // Due at the event's stream position (ms plus seq/1000): already due, and in event order.
    let due = event["event_id"]
        .as_str()
        .and_then(super::events::parse_event_id)
        .and_then(|(_, entry)| {
            let (ms, seq) = entry.split_once('-')?;
            Some(format!("{}.{:03}", ms.parse::<i64>().ok()?, seq.parse::<u64>().ok()?.min(999)))
        })
        .unwrap_or_else(|| now_ms().to_string());
    for (sub, delivery_id) in subs {
        call.delivery_keys.extend([
            keys.delivery(delivery_id),
            keys.subscription_deliveries(&sub.id),
            keys.subscription_queue(&sub.id),
        ]);
        let mut f = json!({
            "delivery_id": delivery_id,
            "subscription_id": sub.id,
            "event_id": event["event_id"],
            "event_type": event["event_type"],
            "event": body,
            "due": due,
        });
        if let Some(t) = event["trace_id"].as_str() {
            f["trace_id"] = json!(t);
        }
        f["traceparent_inbound_valid"] = json!(if flags.is_some() { "true" } else { "false" });
        if let Some(fl) = flags {
            f["trace_flags"] = json!(fl);
        }
        call.deliveries.push(f.to_string());
    }
    Ok(store.run(call).await?.value.created)
}

/// Reads one owner's delivery rows.
pub async fn read_deliveries(store: &Store, owner: &str, ids: &[String]) -> ApiResult<Vec<Record>> {
    let keys = TenantKeys::new(owner);
    read_records(store, &ids.iter().map(|id| keys.delivery(id)).collect::<Vec<_>>()).await
}
