//! Pure rules: canonical scope derivation, payload hashing for idempotency, permissions, scope
//! filters, timestamps, the grammar of tenant ids and scopes; with the rules and defaults
//! (`rules`) and the client-error messages (`messages`) that the scripts share.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

use crate::error::{ApiError, ApiResult};
use crate::model::Subject;

/// Canonical scope identifiers of a subject, shortest first: levels in canonical order, gaps
/// skipped (never filled), values lower-cased, `level:value` segments joined by `/`.
pub fn derive_scopes(subject: &Subject) -> Vec<String> {
    let mut scopes = Vec::with_capacity(6);
    let mut path = String::new();
    for (level, value) in subject.levels() {
        if let Some(v) = value {
            if !path.is_empty() {
                path.push('/');
            }
            path.push_str(level);
            path.push(':');
            path.push_str(&v.to_ascii_lowercase());
            scopes.push(path.clone());
        }
    }
    scopes
}

/// The last segment of a scope path (`Balance.scope`).
pub fn leaf_segment(scope_path: &str) -> &str {
    scope_path.rsplit('/').next().unwrap_or(scope_path)
}

/// sha256 (first 128 bits, base64url) of the canonical JSON of a request: object keys sorted (serde_json's map is
/// ordered), defaults for `grace_period_ms` and `dry_run` materialized, `client_time_ms`
/// excluded (it must not take part in idempotency decisions).
pub fn payload_hash(body: &Value, defaults: &[(&str, Value)]) -> String {
    // Serialized borrowed (the map is sorted, so this is the same JSON as a cloned, edited map).
    let bytes = match body {
        Value::Object(map) => {
            let mut canonical: BTreeMap<&str, &Value> =
                map.iter().filter(|(k, _)| *k != "client_time_ms").map(|(k, v)| (k.as_str(), v)).collect();
            for (field, default) in defaults {
                canonical.entry(field).or_insert(default);
            }
            serde_json::to_vec(&canonical)
        }
        other => serde_json::to_vec(other),
    }
    .expect("JSON values always serialize");
    URL_SAFE_NO_PAD.encode(&Sha256::digest(&bytes)[..16])
}

pub mod action_kinds;
pub mod messages;
pub mod periods;
pub mod policies;
pub mod roles;
pub mod rules;
pub mod usage;

/// Key permissions (the admin spec's `Permission`), for both planes. An operation names the
/// one it needs; a key holding it, or a wildcard that covers it, may proceed.
macro_rules! permissions {
    ($($variant:ident = $name:literal $(, also $($wider:literal),+)?;)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Permission {
            $($variant,)*
        }

        impl Permission {
            pub const ALL: [Permission; permissions!(@count $($variant)*)] = [$(Permission::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Permission::$variant => $name,)*
                }
            }

            /// The held permissions that satisfy this one, comma-separated (first: itself), as
            /// the scripts' key check takes them.
            pub fn accepted(self) -> &'static str {
                match self {
                    $(Permission::$variant => concat!($name $($(, ",", $wider)+)?),)*
                }
            }

            pub fn parse(s: &str) -> Option<Permission> {
                Self::ALL.into_iter().find(|p| p.as_str() == s)
            }
        }
    };
    (@count) => { 0 };
    (@count $head:ident $($rest:ident)*) => { 1 + permissions!(@count $($rest)*) };
}

permissions! {
    ReservationsCreate = "reservations:create", also "admin:write";
    ReservationsCommit = "reservations:commit", also "admin:write";
    ReservationsRelease = "reservations:release", also "admin:write";
    ReservationsExtend = "reservations:extend", also "admin:write";
    ReservationsList = "reservations:list", also "admin:read";
    BalancesRead = "balances:read", also "admin:read";
    BudgetsRead = "budgets:read", also "admin:read", "admin:budgets:read";
    BudgetsWrite = "budgets:write", also "admin:write", "admin:budgets:write";
    PoliciesRead = "policies:read", also "admin:read", "admin:policies:read";
    PoliciesWrite = "policies:write", also "admin:write", "admin:policies:write";
    WebhooksRead = "webhooks:read", also "admin:read", "admin:webhooks:read";
    WebhooksWrite = "webhooks:write", also "admin:write", "admin:webhooks:write";
    EventsRead = "events:read", also "admin:read", "admin:events:read";
    AdminRead = "admin:read";
    AdminWrite = "admin:write";
    AdminTenantsRead = "admin:tenants:read", also "admin:read";
    AdminTenantsWrite = "admin:tenants:write", also "admin:write";
    AdminBudgetsRead = "admin:budgets:read", also "admin:read";
    AdminBudgetsWrite = "admin:budgets:write", also "admin:write";
    AdminPoliciesRead = "admin:policies:read", also "admin:read";
    AdminPoliciesWrite = "admin:policies:write", also "admin:write";
    AdminApikeysRead = "admin:apikeys:read", also "admin:read";
    AdminApikeysWrite = "admin:apikeys:write", also "admin:write";
    AdminWebhooksRead = "admin:webhooks:read", also "admin:read";
    AdminWebhooksWrite = "admin:webhooks:write", also "admin:write";
    AdminEventsRead = "admin:events:read", also "admin:read";
    AdminAuditRead = "admin:audit:read", also "admin:read";
    // v0.1.26, with balances:read as its deprecated fallback (removed in v0.1.27)
    ActionQuotasRead = "action_quotas:read", also "admin:read", "balances:read";
}

/// The default permission set of a new tenant key: the runtime plane's six.
pub const DEFAULT_PERMISSIONS: [Permission; 6] = [
    Permission::ReservationsCreate,
    Permission::ReservationsCommit,
    Permission::ReservationsRelease,
    Permission::ReservationsExtend,
    Permission::ReservationsList,
    Permission::BalancesRead,
];

const LEVELS: [&str; 6] = ["tenant", "workspace", "app", "workflow", "agent", "toolset"];

/// Tenant ids follow the governance spec: `^[a-z0-9-]+$`, 3 to 64 characters.
pub fn validate_tenant_id(id: &str) -> ApiResult<()> {
    let ok =
        (3..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid("tenant_id must match ^[a-z0-9-]+$ and be 3 to 64 characters"))
    }
}

/// A budget scope: `tenant:<id>` first, then canonical levels in strictly increasing order,
/// values of `[a-z0-9._-]` (stored lower-case, as the runtime derives them).
pub fn validate_scope(scope: &str, tenant_id: &str) -> ApiResult<String> {
    let scope = scope.to_ascii_lowercase();
    let bad = |why: &str| ApiError::invalid(format!("scope {scope:?} is invalid: {why}"));
    let mut last_level = None;
    for (i, segment) in scope.split('/').enumerate() {
        let (level, value) = segment.split_once(':').ok_or_else(|| bad("segments are level:value"))?;
        let rank = LEVELS.iter().position(|l| *l == level).ok_or_else(|| bad("unknown level"))?;
        if i == 0 && level != "tenant" {
            return Err(bad("the first segment must be tenant:<id>"));
        }
        if i == 0 && value != tenant_id {
            return Err(bad("the tenant segment must name the budget's tenant"));
        }
        if last_level.is_some_and(|l| rank <= l) {
            return Err(bad("levels must follow tenant > workspace > app > workflow > agent > toolset"));
        }
        let value_ok = !value.is_empty()
            && value.len() <= 128
            && value.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !value_ok {
            return Err(bad("values must match ^[a-z0-9_.-]+$ and be at most 128 characters"));
        }
        last_level = Some(rank);
    }
    Ok(scope)
}

/// Milliseconds since the Unix epoch, by this host's clock (scripts use Redis's).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn subject(v: Value) -> Subject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn gaps_are_skipped_and_values_lowercased() {
        let s = subject(json!({"tenant": "Acme", "agent": "Bot"}));
        assert_eq!(derive_scopes(&s), vec!["tenant:acme", "tenant:acme/agent:bot"]);
    }

    #[test]
    fn full_chain_in_canonical_order() {
        let s = subject(json!({"toolset": "t", "agent": "a", "workflow": "f", "app": "p",
            "workspace": "w", "tenant": "x"}));
        let scopes = derive_scopes(&s);
        assert_eq!(scopes.len(), 6);
        assert_eq!(scopes[5], "tenant:x/workspace:w/app:p/workflow:f/agent:a/toolset:t");
        assert_eq!(leaf_segment(&scopes[5]), "toolset:t");
    }

    #[test]
    fn subject_without_tenant_gets_no_injected_tenant() {
        let s = subject(json!({"workspace": "prod"}));
        assert_eq!(derive_scopes(&s), vec!["workspace:prod"]);
    }

    #[test]
    fn hash_ignores_key_order_and_client_time_and_materializes_defaults() {
        let d = [("grace_period_ms", json!(5000))];
        let a = payload_hash(&json!({"a": 1, "b": 2, "client_time_ms": 5}), &d);
        let b = payload_hash(&json!({"b": 2, "a": 1, "grace_period_ms": 5000}), &d);
        assert_eq!(a, b);
        let c = payload_hash(&json!({"b": 2, "a": 1, "grace_period_ms": 4000}), &d);
        assert_ne!(a, c);
    }

    #[test]
    fn hash_is_stable_across_versions() {
        // Stored idempotency records compare against this value: it must never change.
        let body = json!({"idempotency_key": "k-1", "subject": {"tenant": "t", "agent": "a"},
            "action": {"kind": "llm.completion", "name": "m", "tags": ["x", "y"]},
            "estimate": {"unit": "TOKENS", "amount": 100}, "client_time_ms": 1, "metadata": {"z": null, "é": 1.5}});
        let d = [("grace_period_ms", json!(5000)), ("dry_run", json!(false))];
        assert_eq!(payload_hash(&body, &d), "N4hyXxkX1v5EudyDh3ioug");
        assert_eq!(payload_hash(&body, &[]), "CwlTXw3l7ej3-E4OziakyQ");
    }
}

/// Whether a key's `scope_filter` admits a scope: no entries admit everything; an entry
/// `kind:value` admits scopes containing exactly that segment, `kind:*` any segment of that kind.
pub fn scope_admitted(filter: &[String], scope: &str) -> bool {
    filter.is_empty()
        || filter.iter().any(|entry| {
            let entry = entry.to_ascii_lowercase();
            scope.split('/').any(|segment| match entry.strip_suffix('*') {
                Some(kind) if kind.ends_with(':') => segment.starts_with(kind),
                _ => segment == entry,
            })
        })
}

/// The UTC date (year, month, day) of a day number (days since 1970-01-01): civil-from-days
/// (H. Hinnant), as `lua/lib/calendar.lua` computes it too.
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Epoch milliseconds as an RFC 3339 UTC timestamp with millisecond precision.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let (secs, millis) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Parses an RFC 3339 date-time (`2026-05-02T10:15:30Z`, fractional seconds and numeric
/// offsets allowed) into epoch milliseconds.
pub fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        part.bytes().all(|c| c.is_ascii_digit()).then(|| part.parse().ok())?
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let ms: String = frac[..digits].chars().chain("000".chars()).take(3).collect();
        millis = ms.parse::<i64>().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        o if o.len() == 6 && (o.starts_with('+') || o.starts_with('-')) && &o[3..4] == ":" => {
            let h: i64 = o[1..3].parse().ok()?;
            let m: i64 = o[4..6].parse().ok()?;
            let v = h * 60 + m;
            if o.starts_with('-') {
                -v
            } else {
                v
            }
        }
        _ => return None,
    };
    // days from civil (Howard Hinnant)
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hour * 3_600 + minute * 60 + second) - offset_min * 60) * 1_000 + millis)
}

#[cfg(test)]
mod time_tests {
    use super::{format_rfc3339_ms, parse_rfc3339_ms, scope_admitted};

    #[test]
    fn rfc3339_formats_and_round_trips() {
        assert_eq!(format_rfc3339_ms(0), "1970-01-01T00:00:00.000Z");
        for ms in [1_780_000_123_456, 951_782_400_000, 4_107_542_399_999] {
            assert_eq!(parse_rfc3339_ms(&format_rfc3339_ms(ms)), Some(ms));
        }
    }

    #[test]
    fn scope_filters_admit_segments_and_kinds() {
        let f = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(scope_admitted(&[], "tenant:a"));
        assert!(scope_admitted(&f(&["workspace:eng"]), "tenant:a/workspace:eng/agent:x"));
        assert!(!scope_admitted(&f(&["workspace:eng"]), "tenant:a/workspace:engineering"));
        assert!(scope_admitted(&f(&["agent:*"]), "tenant:a/agent:bot"));
        assert!(!scope_admitted(&f(&["agent:*"]), "tenant:a/workspace:w"));
    }

    #[test]
    fn rfc3339_parses_to_epoch_ms() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339_ms("2026-05-02T10:15:30.412Z"), Some(1_777_716_930_412));
        assert_eq!(parse_rfc3339_ms("2026-05-02T12:15:30.412+02:00"), Some(1_777_716_930_412));
        assert_eq!(parse_rfc3339_ms("2000-02-29T00:00:00.5Z"), Some(951_782_400_500));
        for bad in
            ["", "2026-05-02", "2026-13-02T00:00:00Z", "2026-05-02T00:00:00", "yesterday", "2026-05-02T00:00:00.Z"]
        {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
