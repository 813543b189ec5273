//! The audit log: one stream per owner (`cy:{<owner>}:auditlog`), owners being tenants and two
//! sentinels: `__admin__` (admin-key requests not about one tenant, and their failures) and
//! `__unauth__` (requests that failed before authentication). A change's entry is written by
//! the script that makes the change (`audit` in `lua/lib/events.lua`); every other operator-plane
//! request (reads, refusals, failures) gets its entry from the dispatcher after it answered.

use redis::streams::StreamRangeReply;
use redis::AsyncCommands;
use serde_json::{json, Map, Value};

use crate::domain::{format_rfc3339_ms, now_ms};
use crate::error::ApiResult;
use crate::keys::TenantKeys;
use crate::store::Store;

/// The owner of entries of admin-key requests that concern no single tenant.
pub const ADMIN_OWNER: &str = "__admin__";
/// The owner of entries of requests that failed before authentication.
pub const UNAUTH_OWNER: &str = "__unauth__";
/// The sentinel streams are capped (approximately) at this many entries, so a flood of bad
/// requests cannot grow them without bound; tenant streams are bounded by retention.
pub const SENTINEL_CAP: usize = 100_000;
/// At most this many entries are read per owner for one query (newest first in its window).
pub const SCAN_LIMIT: usize = 20_000;

/// The status an operation answers when it succeeds (what its in-script entry records).
pub fn success_status(operation: &str) -> u16 {
    match operation {
        "replayEvents" => 202,
        "deleteWebhookSubscription" | "deleteTenantWebhook" => 204,
        op if op.starts_with("create") => 201,
        _ => 200,
    }
}

/// The kind of resource an operation acts on, as the spec names it.
pub fn resource_type(operation: &str) -> &'static str {
    let op = operation.to_ascii_lowercase();
    let kinds = [
        ("apikey", "api_key"),
        ("tenant", "tenant"),
        ("budget", "budget"),
        ("balance", "budget"),
        ("polic", "policy"),
        ("config", "config"),
        ("webhook", "webhook"),
        ("event", "event"),
        ("audit", "audit"),
        ("overview", "overview"),
        ("reservation", "reservation"),
        ("auth", "api_key"),
    ];
    // tenant webhooks are webhooks, tenant events are events
    let op = op.replace("tenantwebhook", "webhook").replace("tenantevent", "event");
    kinds.iter().find(|(part, _)| op.contains(part)).map(|(_, kind)| *kind).unwrap_or("config")
}

/// One audit entry as stored (JSON in the stream entry's `entry` field).
#[derive(Debug, Clone, Default)]
pub struct AuditRecord {
    pub timestamp_ms: i64,
    pub tenant_id: String,
    pub operation: String,
    pub status: u16,
    pub key_id: String,
    pub resource_type: String,
    pub resource_id: String,
    pub request_id: String,
    pub trace_id: String,
    pub user_agent: Option<String>,
    pub source_ip: Option<String>,
    pub error_code: Option<String>,
    pub actor_type: String,
    pub metadata: Map<String, Value>,
}

impl AuditRecord {
    fn to_json(&self) -> String {
        let mut v = json!({
            "timestamp_ms": self.timestamp_ms, "tenant_id": self.tenant_id, "operation": self.operation,
            "status": self.status, "key_id": self.key_id, "resource_type": self.resource_type,
            "resource_id": self.resource_id, "request_id": self.request_id, "trace_id": self.trace_id,
            "actor_type": self.actor_type,
        });
        for (name, value) in
            [("user_agent", &self.user_agent), ("source_ip", &self.source_ip), ("error_code", &self.error_code)]
        {
            if let Some(x) = value {
                v[name] = json!(x);
            }
        }
        if !self.metadata.is_empty() {
            v["details"] = Value::Object(self.metadata.clone());
        }
        v.to_string()
    }
}

/// Appends a dispatcher-written entry to `owner`'s stream (the sentinels' capped).
pub async fn append(store: &Store, owner: &str, mut record: AuditRecord) -> ApiResult<()> {
    record.timestamp_ms = now_ms();
    let key = TenantKeys::new(owner).audit_log();
    let mut cmd = redis::cmd("XADD");
    cmd.arg(&key);
    if owner == ADMIN_OWNER || owner == UNAUTH_OWNER {
        cmd.arg("MAXLEN").arg("~").arg(SENTINEL_CAP);
    }
    cmd.arg("*").arg("entry").arg(record.to_json());
    let _: String = store.write(cmd, &key).await?;
    Ok(())
}

/// The wire `AuditLogEntry` of a stored entry (`log_id` names the owner and stream entry).
pub(crate) fn wire(owner: &str, entry_id: &str, stored: &Value) -> Value {
    let text = |name: &str| stored[name].as_str().filter(|s| !s.is_empty());
    let ms = stored["timestamp_ms"].as_i64().unwrap_or(0);
    let mut out = json!({
        "log_id": format!("aud_{entry_id}.{owner}"),
        "timestamp": format_rfc3339_ms(ms),
        "tenant_id": text("tenant_id").unwrap_or(owner),
        // entries written before the audit log carried operations name only their action
        "operation": text("operation").or(text("action")).unwrap_or("unknown"),
        "status": stored["status"].as_u64().unwrap_or(200),
    });
    for name in
        ["key_id", "user_agent", "source_ip", "resource_type", "resource_id", "request_id", "trace_id", "error_code"]
    {
        if let Some(v) = text(name) {
            out[name] = json!(v);
        }
    }
    let mut metadata = Map::new();
    for name in ["actor_type", "action", "correlation_id"] {
        if let Some(v) = text(name) {
            metadata.insert(name.to_string(), json!(v));
        }
    }
    match &stored["details"] {
        Value::Object(d) => metadata.extend(d.clone()),
        Value::Null => {}
        other => {
            metadata.insert("details".to_string(), other.clone());
        }
    }
    if !metadata.is_empty() {
        out["metadata"] = Value::Object(metadata);
    }
    out
}

/// The entries of one owner, newest first, whose time lies in `[from, to]`, as wire entries
/// with their time for sorting: at most `SCAN_LIMIT` stream entries are read, plus the
/// owner's entries from before the audit stream (a list, read the same way).
pub async fn entries(store: &Store, owner: &str, from: Option<i64>, to: Option<i64>) -> ApiResult<Vec<(i64, Value)>> {
    let keys = TenantKeys::new(owner);
    let key = keys.audit_log();
    let start = from.map(|f| f.max(0).to_string()).unwrap_or_else(|| "-".into());
    let mut end = to.map(|t| format!("{}-18446744073709551615", t.max(0))).unwrap_or_else(|| "+".into());
    let mut out = vec![];
    while out.len() < SCAN_LIMIT {
        let reply: StreamRangeReply = store.conn().xrevrange_count(&key, &end, &start, 500).await?;
        let full = reply.ids.len() == 500;
        let Some(last) = reply.ids.last().map(|e| e.id.clone()) else { break };
        for e in reply.ids {
            let Some(stored) = e.get::<String>("entry").and_then(|j| serde_json::from_str::<Value>(&j).ok()) else {
                continue;
            };
            out.push((stored["timestamp_ms"].as_i64().unwrap_or(0), wire(owner, &e.id, &stored)));
        }
        end = format!("({last}");
        if !full {
            break;
        }
    }
    // entries written before the audit stream existed: a list, oldest first
    let legacy: Vec<String> = store.conn().lrange(keys.legacy_audit_log(), -(SCAN_LIMIT as isize), -1).await?;
    for (i, raw) in legacy.iter().enumerate() {
        let Ok(stored) = serde_json::from_str::<Value>(raw) else { continue };
        let ms = stored["timestamp_ms"].as_i64().unwrap_or(0);
        if from.is_some_and(|f| ms < f) || to.is_some_and(|t| ms > t) {
            continue;
        }
        out.push((ms, wire(owner, &format!("{ms}-L{i}"), &stored)));
    }
    Ok(out)
}

/// Drops an owner's entries older than `horizon_ms` (retention); returns how many went.
pub async fn trim(store: &Store, owner: &str, horizon_ms: i64) -> ApiResult<u64> {
    let keys = TenantKeys::new(owner);
    let dropped = super::trim_stream(store, &keys.audit_log(), horizon_ms).await?;
    // the list from before the stream is in time order: drop its expired head
    let legacy = keys.legacy_audit_log();
    let mut old = 0;
    loop {
        let head: Vec<String> = store.conn().lrange(&legacy, 0, 99).await?;
        let expired = head
            .iter()
            .take_while(|raw| {
                serde_json::from_str::<Value>(raw).ok().and_then(|v| v["timestamp_ms"].as_i64()).unwrap_or(0)
                    < horizon_ms
            })
            .count();
        if expired == 0 {
            break;
        }
        let _: () = store.conn().ltrim(&legacy, expired as isize, -1).await?;
        old += expired as u64;
        if expired < head.len() {
            break;
        }
    }
    Ok(dropped + old)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_map_to_resource_types_and_success_statuses() {
        assert_eq!(resource_type("createApiKey"), "api_key");
        assert_eq!(resource_type("listTenantWebhooks"), "webhook");
        assert_eq!(resource_type("listTenantEvents"), "event");
        assert_eq!(resource_type("updateTenant"), "tenant");
        assert_eq!(resource_type("getBalances"), "budget");
        assert_eq!(resource_type("updateWebhookSecurityConfig"), "config");
        assert_eq!(resource_type("listWebhookDeliveries"), "webhook");
        assert_eq!(resource_type("listPolicies"), "policy");
        assert_eq!(resource_type("getAdminOverview"), "overview");
        assert_eq!(resource_type("validateApiKey"), "api_key");
        assert_eq!((success_status("createBudget"), success_status("deleteTenantWebhook")), (201, 204));
        assert_eq!((success_status("replayEvents"), success_status("fundBudget")), (202, 200));
    }

    #[test]
    fn stored_entries_become_wire_entries() {
        let stored = json!({"timestamp_ms": 1_000, "tenant_id": "acme", "operation": "createBudget", "status": 201,
            "key_id": "", "resource_type": "budget", "resource_id": "led_1", "request_id": "r", "trace_id": "t",
            "actor_type": "admin", "action": "budget.create", "details": {"reason": "x"}});
        let w = wire("acme", "1000-0", &stored);
        assert_eq!(w["log_id"], "aud_1000-0.acme");
        assert_eq!(w["timestamp"], "1970-01-01T00:00:01.000Z");
        assert_eq!((w["operation"].as_str(), w["status"].as_u64()), (Some("createBudget"), Some(201)));
        assert!(w.get("key_id").is_none(), "blank fields are omitted");
        assert_eq!(w["metadata"], json!({"actor_type": "admin", "action": "budget.create", "reason": "x"}));
        // an entry from before the audit stream: its action stands in for the operation
        let old = json!({"timestamp_ms": 5, "action": "tenant.create", "resource_type": "tenant", "resource_id": "t"});
        let w = wire("t", "5-L0", &old);
        assert_eq!(
            (w["operation"].as_str(), w["tenant_id"].as_str(), w["status"].as_u64()),
            (Some("tenant.create"), Some("t"), Some(200))
        );
    }
}
