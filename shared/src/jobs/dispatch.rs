//! The webhook dispatcher (the `deliver-webhooks` function, a background task in
//! `cycles-local`): fan-out of each tenant's event stream into per-subscription delivery queues,
//! then claim -> send -> record, at least once, many sends at a time.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use serde::Serialize;
use serde_json::{json, Value};

use crate::config::WebhookConfig;
use crate::domain::now_ms;
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::ops::events::SYSTEM_TENANT;
use crate::ops::records::{field, int_field, read_hashes, Record};
use crate::ops::webhooks::{
    enqueue, live_delivery_id, subscriptions, Claim, RecordAttempt, Subscription, SystemEvent, MAX_DELIVERY_AGE_MS,
};
use crate::store::Store;
use crate::webhooks::{Attempt, Sender};

/// Event batches (of 200) one tenant's fan-out handles per pass.
const FAN_OUT_BATCHES: usize = 5;

/// What one dispatcher pass did.
#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct DeliveryReport {
    pub events_matched: u64,
    pub deliveries_created: u64,
    pub delivered: u64,
    pub retrying: u64,
    pub failed: u64,
}

impl DeliveryReport {
    /// One structured log line with every counter.
    pub fn log(&self, message: &str) {
        tracing::info!(
            created = self.deliveries_created,
            delivered = self.delivered,
            retrying = self.retrying,
            failed = self.failed,
            "{message}"
        );
    }

    fn add(&mut self, o: &DeliveryReport) {
        self.events_matched += o.events_matched;
        self.deliveries_created += o.deliveries_created;
        self.delivered += o.delivered;
        self.retrying += o.retrying;
        self.failed += o.failed;
    }
}

/// The dispatcher: safe to run concurrently with itself (claims are leased, enqueues idempotent).
/// Sends run concurrently, at most `config.concurrency` in this process and at most
/// `config.per_subscription` per subscription across all dispatchers, so a slow or dead
/// endpoint holds back only its own deliveries.
pub struct Dispatcher {
    pub store: Store,
    pub config: WebhookConfig,
    sender: Sender,
    /// Where the next claiming round starts among the owners (round-robin, so no tenant is
    /// always served first).
    turn: AtomicUsize,
}

/// A claimed delivery, ready to send.
pub struct Claimed {
    pub owner: String,
    pub delivery: Record,
    pub subscription: Option<Subscription>,
}

impl Dispatcher {
    pub fn new(store: Store, config: WebhookConfig) -> Dispatcher {
        Dispatcher { store, sender: Sender::new(&config, config.egress.clone()), config, turn: AtomicUsize::new(0) }
    }

    /// One pass over every registered tenant, waiting for its sends.
    pub async fn pass(self: &Arc<Self>) -> ApiResult<DeliveryReport> {
        let tenants = crate::ops::tenants::registry(&self.store).await?;
        self.pass_tenants(&tenants).await
    }

    /// One pass over the given tenants (and the system-wide owner): match their new events,
    /// then claim and send what is due, concurrently, and wait for every send.
    pub async fn pass_tenants(self: &Arc<Self>, tenants: &[String]) -> ApiResult<DeliveryReport> {
        // An operator's change of the SSRF rules is in force from the next pass on.
        self.sender.set_rules(crate::ops::settings::egress_rules(&self.store, &self.config.egress).await?);
        let mut report = self.fan_out_all(tenants).await?;
        let mut sends = tokio::task::JoinSet::new();
        self.claim_and_spawn(tenants, self.config.concurrency, &mut sends).await?;
        while let Some(done) = sends.join_next().await {
            report.add(&done.unwrap_or_default());
        }
        Ok(report)
    }

    /// Fan-out of the given tenants' new events (and the system-wide owner's).
    async fn fan_out_all(&self, tenants: &[String]) -> ApiResult<DeliveryReport> {
        let system = subscriptions(&self.store, SYSTEM_TENANT).await?;
        let mut report = DeliveryReport::default();
        for tenant in tenants.iter().map(String::as_str).chain([SYSTEM_TENANT]) {
            report.add(&self.fan_out(tenant, &system).await?);
        }
        Ok(report)
    }

    /// Claims up to `room` due deliveries across the owners and starts a task sending each.
    /// Fair across owners: each round starts at the next owner, and one owner gets at most
    /// `per_tenant` sends in flight (across dispatchers: the claim script keeps the count and
    /// claims no more).
    async fn claim_and_spawn(
        self: &Arc<Self>,
        tenants: &[String],
        mut room: usize,
        sends: &mut tokio::task::JoinSet<DeliveryReport>,
    ) -> ApiResult<()> {
        let owners: Vec<&str> = tenants.iter().map(String::as_str).chain([SYSTEM_TENANT]).collect();
        let start = self.turn.fetch_add(1, Ordering::Relaxed) % owners.len();
        for owner in owners[start..].iter().chain(&owners[..start]) {
            if room == 0 {
                break;
            }
            for claimed in self.claim(owner, room).await? {
                room -= 1;
                let this = self.clone();
                sends.spawn(async move { this.deliver(claimed).await });
            }
        }
        Ok(())
    }

    /// Sends one claimed delivery and records the outcome.
    pub async fn deliver(&self, c: Claimed) -> DeliveryReport {
        let mut report = DeliveryReport::default();
        match self.send_and_record(&c.owner, &c.delivery, c.subscription.as_ref()).await {
            Ok(status) => match status.as_str() {
                "SUCCESS" => report.delivered += 1,
                "RETRYING" => report.retrying += 1,
                _ => report.failed += 1,
            },
            // Not recorded: the claim's lease ends and the delivery is sent again.
            Err(e) => tracing::error!(error = %e.message, owner = %c.owner, "could not record a delivery attempt"),
        }
        report
    }

    /// Matches a tenant's events past its cursor against its own and the system-wide ACTIVE
    /// subscriptions; the cursor moves only after every delivery row exists. At most
    /// `FAN_OUT_BATCHES` batches per pass, so a tenant with a flood of events cannot hold the
    /// pass from the others (the rest is matched next pass).
    pub async fn fan_out(&self, tenant: &str, system: &[Subscription]) -> ApiResult<DeliveryReport> {
        let keys = TenantKeys::new(tenant);
        let mut conn = self.store.conn();
        let mut report = DeliveryReport::default();
        let own = subscriptions(&self.store, tenant).await?;
        let system: &[Subscription] = if tenant == SYSTEM_TENANT { &[] } else { system };
        for _ in 0..FAN_OUT_BATCHES {
            let cursor: Option<String> = conn.get(keys.dispatch_cursor()).await?;
            let start = cursor.map(|c| format!("({c}")).unwrap_or_else(|| "-".to_string());
            let reply: StreamRangeReply = conn.xrange_count(keys.events(), &start, "+", 200).await?;
            let Some(last) = reply.ids.last().map(|e| e.id.clone()) else { return Ok(report) };
            let full = reply.ids.len() == 200;
            for entry in &reply.ids {
                let Some(event) = entry.get::<String>("event").and_then(|j| serde_json::from_str::<Value>(&j).ok())
                else {
                    continue;
                };
                let ts = entry.id.split('-').next().and_then(|m| m.parse::<i64>().ok()).unwrap_or(0);
                let live = |s: &&Subscription| s.status == "ACTIVE" && s.created_at_ms <= ts && s.selects(&event);
                let event_id = event["event_id"].as_str().unwrap_or_default();
                let flags: Option<String> = entry.get("flags");
                for (owner, subs) in [
                    (tenant, own.iter().filter(live).collect::<Vec<_>>()),
                    (SYSTEM_TENANT, system.iter().filter(live).collect()),
                ] {
                    if subs.is_empty() {
                        continue;
                    }
                    report.events_matched += 1;
                    let with_ids: Vec<_> = subs.into_iter().map(|s| (s, live_delivery_id(event_id, &s.id))).collect();
                    report.deliveries_created +=
                        enqueue(&self.store, owner, &event, flags.as_deref(), &with_ids).await?;
                }
            }
            let _: () = conn.set(keys.dispatch_cursor(), &last).await?;
            if !full {
                break;
            }
        }
        Ok(report)
    }

    /// Claims up to `max` due deliveries of one owner (leased), with their subscriptions: the
    /// subscriptions due now, each up to its in-flight limit, then the legacy queue.
    pub async fn claim(&self, owner: &str, max: usize) -> ApiResult<Vec<Claimed>> {
        let keys = TenantKeys::new(owner);
        let due: Vec<String> = redis::cmd("ZRANGE")
            .arg(keys.due_subscriptions())
            .arg("-inf")
            .arg(now_ms())
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(100)
            .query_async(&mut self.store.conn())
            .await?;
        let call = Claim {
            due_subscriptions: keys.due_subscriptions(),
            legacy_queue: keys.legacy_delivery_queue(),
            owner_in_flight: keys.owner_in_flight(),
            subscriptions: due
                .iter()
                .flat_map(|id| [keys.subscription_queue(id), keys.subscription_in_flight(id)])
                .collect(),
            lease_ms: self.config.lease.as_millis().to_string(),
            max: max.to_string(),
            per_subscription: self.config.per_subscription.to_string(),
            per_owner: self.config.per_tenant.to_string(),
            subscription_ids: due,
        };
        let claimed = self.store.run(call).await?.value.claimed;
        if claimed.is_empty() {
            return Ok(vec![]);
        }
        let record_keys: Vec<String> = claimed.iter().map(|(id, _)| keys.delivery(id)).collect();
        let records = read_hashes(&self.store, &record_keys).await?;
        let subs: HashMap<String, Subscription> =
            subscriptions(&self.store, owner).await?.into_iter().map(|s| (s.id.clone(), s)).collect();
        let mut out = vec![];
        for ((id, sub_id), delivery) in claimed.into_iter().zip(records) {
            if field(&delivery, "delivery_id").is_none() {
                // the row is gone (retention): its claim ends here
                let _: () = self.store.conn().zrem(keys.legacy_delivery_queue(), &id).await?;
                let _: () = self.store.conn().zrem(keys.subscription_in_flight(&sub_id), &id).await?;
                let _: () = self.store.conn().zrem(keys.owner_in_flight(), &id).await?;
                continue;
            }
            let subscription = field(&delivery, "subscription_id").and_then(|id| subs.get(id)).cloned();
            out.push(Claimed { owner: owner.to_string(), delivery, subscription });
        }
        Ok(out)
    }

    /// Pre-checks, sends one attempt, records it. Returns the delivery's new status.
    pub async fn send_and_record(
        &self,
        owner: &str,
        delivery: &Record,
        sub: Option<&Subscription>,
    ) -> ApiResult<String> {
        let outcome = self.send(delivery, sub).await;
        self.record(owner, delivery, sub, outcome).await
    }

    /// The attempt itself (no store writes): Err(message) for a pre-check failure.
    pub async fn send(&self, delivery: &Record, sub: Option<&Subscription>) -> Result<Attempt, String> {
        let event: Value =
            field(delivery, "event").and_then(|e| serde_json::from_str(e).ok()).ok_or("event not found")?;
        let sub = sub.ok_or("subscription not found")?;
        if sub.status != "ACTIVE" {
            return Err(format!("subscription is {}", sub.status));
        }
        if now_ms() - int_field(delivery, "attempted_at_ms").unwrap_or(0) > MAX_DELIVERY_AGE_MS {
            return Err("expired: older than the maximum delivery age".into());
        }
        if !sub.may_receive(&event) {
            return Err("event is not accessible to a tenant-owned subscription".into());
        }
        Ok(self.sender.post(&sub.url, &event, field(delivery, "trace_flags"), sub).await)
    }

    /// Writes an attempt's outcome (or a pre-check failure) and its effect on the subscription.
    pub async fn record(
        &self,
        owner: &str,
        delivery: &Record,
        sub: Option<&Subscription>,
        outcome: Result<Attempt, String>,
    ) -> ApiResult<String> {
        let keys = TenantKeys::new(owner);
        let id = field(delivery, "delivery_id").unwrap_or_default();
        let sub_id = field(delivery, "subscription_id").unwrap_or_default();

        let retry = sub.map(|s| s.retry).unwrap_or_default();
        let attempts = int_field(delivery, "attempts").unwrap_or(0) + 1;
        let (mode, status, ms, error) = match outcome {
            Ok(a) => ("sent", a.status, a.ms, a.error.unwrap_or_default()),
            Err(e) => ("precheck", 0, 0, e),
        };
        let failure = json!({"component": "webhook_dispatcher", "severity": "warning",
            "message": format!("webhook delivery failed after {attempts} attempts: {error}"),
            "details": {"delivery_id": id, "subscription_id": sub_id, "owner": owner,
                "event_id": field(delivery, "event_id").unwrap_or_default(), "response_status": status}});
        let call = RecordAttempt {
            delivery: keys.delivery(id),
            legacy_queue: keys.legacy_delivery_queue(),
            owner_in_flight: keys.owner_in_flight(),
            subscription: keys.webhook(sub_id),
            events: keys.events(),
            queue: keys.subscription_queue(sub_id),
            in_flight: keys.subscription_in_flight(sub_id),
            due_subscriptions: keys.due_subscriptions(),
            mode: mode.to_string(),
            http_status: status.to_string(),
            response_ms: ms.to_string(),
            error,
            max_retries: retry.max_retries.to_string(),
            retry_delay_ms: retry.delay_ms(attempts).to_string(),
            disable_after: sub.map(|s| s.disable_after).unwrap_or(10).to_string(),
            delivery_id: id.to_string(),
            subscription_id: sub_id.to_string(),
        };
        let outcome = self.store.run(call).await?.status;
        if outcome == "FAILED" && mode == "sent" {
            // A separate step (the system stream is another slot): a lost one only costs the alert.
            let event = SystemEvent {
                events: TenantKeys::new(SYSTEM_TENANT).events(),
                event_type: "system.webhook_delivery_failed".to_string(),
                data: failure.to_string(),
                context: json!({"actor": "system"}).to_string(),
            };
            if let Err(e) = self.store.run(event).await {
                tracing::error!(error = %e.message, delivery_id = id, "could not write system.webhook_delivery_failed");
            }
        }
        Ok(outcome)
    }

    /// Runs until `deadline` (a Lambda invocation) or forever (local gateway): every `interval`
    /// it matches new events and claims what is due, up to the free room of the send pool, and
    /// starts the sends without waiting for them, so a slow endpoint never holds a pass. It
    /// claims nothing it could not send before the deadline, and returns once the last send
    /// has been recorded.
    pub async fn run_loop(self: Arc<Self>, interval: Duration, deadline: Option<Instant>) -> DeliveryReport {
        let mut total = DeliveryReport::default();
        let mut sends = tokio::task::JoinSet::new();
        loop {
            while let Some(done) = sends.try_join_next() {
                total.add(&done.unwrap_or_default());
            }
            let claiming = deadline.is_none_or(|d| Instant::now() + self.config.timeout + interval < d);
            if claiming {
                if let Err(e) = self.tick(&mut sends).await {
                    tracing::error!(error = %e.message, "webhook dispatch pass failed");
                }
            } else if sends.is_empty() {
                return total;
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// One step of the loop: fan-out of every tenant, then claims for the pool's free room.
    async fn tick(self: &Arc<Self>, sends: &mut tokio::task::JoinSet<DeliveryReport>) -> ApiResult<()> {
        let tenants = crate::ops::tenants::registry(&self.store).await?;
        let report = self.fan_out_all(&tenants).await?;
        if report.deliveries_created > 0 {
            report.log("webhook fan-out");
        }
        let room = self.config.concurrency.saturating_sub(sends.len());
        self.claim_and_spawn(&tenants, room, sends).await
    }
}
