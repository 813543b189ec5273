//! Wire types of the runtime spec (cycles-protocol-v0.yaml). Requests are strict: unknown
//! fields are rejected, and `validate` enforces every bound with a message naming the field.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Unit {
    UsdMicrocents,
    Tokens,
    Credits,
    RiskPoints,
}

impl Unit {
    pub const ALL: [Unit; 4] = [Unit::UsdMicrocents, Unit::Tokens, Unit::Credits, Unit::RiskPoints];
    pub fn as_str(self) -> &'static str {
        match self {
            Unit::UsdMicrocents => "USD_MICROCENTS",
            Unit::Tokens => "TOKENS",
            Unit::Credits => "CREDITS",
            Unit::RiskPoints => "RISK_POINTS",
        }
    }
    pub fn parse(s: &str) -> Option<Unit> {
        Unit::ALL.into_iter().find(|u| u.as_str() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OveragePolicy {
    Reject,
    AllowIfAvailable,
    AllowWithOverdraft,
}

impl OveragePolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OveragePolicy::Reject => "REJECT",
            OveragePolicy::AllowIfAvailable => "ALLOW_IF_AVAILABLE",
            OveragePolicy::AllowWithOverdraft => "ALLOW_WITH_OVERDRAFT",
        }
    }
    pub fn parse(s: &str) -> Option<OveragePolicy> {
        [Self::Reject, Self::AllowIfAvailable, Self::AllowWithOverdraft].into_iter().find(|p| p.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Amount {
    pub unit: Unit,
    pub amount: i64,
}

/// `SignedAmount`: same shape, the amount may be negative (only `Balance.remaining`).
pub type SignedAmount = Amount;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub toolset: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<BTreeMap<String, String>>,
}

impl Subject {
    /// The standard fields in canonical order: tenant > workspace > app > workflow > agent > toolset.
    pub fn levels(&self) -> [(&'static str, Option<&str>); 6] {
        [
            ("tenant", self.tenant.as_deref()),
            ("workspace", self.workspace.as_deref()),
            ("app", self.app.as_deref()),
            ("workflow", self.workflow.as_deref()),
            ("agent", self.agent.as_deref()),
            ("toolset", self.toolset.as_deref()),
        ]
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Vec<String>>,
    /// v0.1.26 `ActionPolicyKeys`: routing dimensions for policy matching.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_keys: Option<ActionPolicyKeys>,
}

/// v0.1.26 `ActionPolicyKeys`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActionPolicyKeys {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<BTreeMap<String, String>>,
}

/// v0.1.26 `ObserveModeEnum` (DISABLED is ENFORCE).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ObserveMode {
    Disabled,
    Observe,
    Enforce,
}

impl ObserveMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ObserveMode::Disabled => "DISABLED",
            ObserveMode::Observe => "OBSERVE",
            ObserveMode::Enforce => "ENFORCE",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StandardMetrics {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_input: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_output: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<Map<String, Value>>,
}

pub type Metadata = Map<String, Value>;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationCreateRequest {
    pub idempotency_key: String,
    pub subject: Subject,
    pub action: Action,
    pub estimate: Amount,
    #[serde(default)]
    pub ttl_ms: Option<i64>,
    #[serde(default)]
    pub grace_period_ms: Option<i64>,
    #[serde(default)]
    pub overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    pub dry_run: Option<bool>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
    /// v0.1.26: overrides the tenant's observe mode for this request.
    #[serde(default)]
    pub observe_mode: Option<ObserveMode>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    pub idempotency_key: String,
    pub actual: Amount,
    #[serde(default)]
    pub metrics: Option<StandardMetrics>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    pub idempotency_key: String,
    #[serde(default)]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReservationExtendRequest {
    pub idempotency_key: String,
    pub extend_by_ms: i64,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecisionRequest {
    pub idempotency_key: String,
    pub subject: Subject,
    pub action: Action,
    pub estimate: Amount,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventCreateRequest {
    pub idempotency_key: String,
    pub subject: Subject,
    pub action: Action,
    pub actual: Amount,
    #[serde(default)]
    pub overage_policy: Option<OveragePolicy>,
    #[serde(default)]
    pub metrics: Option<StandardMetrics>,
    #[serde(default)]
    pub client_time_ms: Option<i64>,
    #[serde(default)]
    pub metadata: Option<Metadata>,
}

// ---------------------------------------------------------------------------------------------
// Validation

/// Every request type checks its own bounds after strict deserialization.
pub trait Validate {
    fn validate(&self) -> ApiResult<()>;
    /// The idempotency key every mutating request carries.
    fn idempotency_key(&self) -> &str;
}

pub const TTL_MS: (i64, i64) = (1_000, 86_400_000);
pub const GRACE_MS: (i64, i64) = (0, 60_000);
pub const EXTEND_MS: (i64, i64) = (1, 86_400_000);

/// (`field` is written only into an error: callers name it with `format_args!`, free when valid)
fn check_len(field: impl std::fmt::Display, value: &str, min: usize, max: usize) -> ApiResult<()> {
    let n = value.chars().count();
    if n < min || n > max {
        return Err(ApiError::invalid(format!("{field} must be between {min} and {max} characters (got {n})")));
    }
    Ok(())
}

fn check_range(field: &str, value: i64, (min, max): (i64, i64)) -> ApiResult<()> {
    if value < min || value > max {
        return Err(ApiError::invalid(format!("{field} must be between {min} and {max} (got {value})")));
    }
    Ok(())
}

fn check_non_negative(field: impl std::fmt::Display, value: Option<i64>) -> ApiResult<()> {
    match value {
        Some(v) if v < 0 => Err(ApiError::invalid(format!("{field} must be >= 0 (got {v})"))),
        _ => Ok(()),
    }
}

fn check_not_blank(field: &str, value: &str) -> ApiResult<()> {
    if value.trim().is_empty() {
        return Err(ApiError::invalid(format!("{field} must not be blank")));
    }
    Ok(())
}

fn is_scope_value(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

impl Amount {
    pub fn validate(&self, field: &str) -> ApiResult<()> {
        check_non_negative(format_args!("{field}.amount"), Some(self.amount))
    }
}

impl Subject {
    pub fn validate(&self) -> ApiResult<()> {
        let mut any = false;
        for (level, value) in self.levels() {
            if let Some(v) = value {
                any = true;
                check_len(format_args!("subject.{level}"), v, 1, 128)?;
                if !is_scope_value(v) {
                    return Err(ApiError::invalid(format!("subject.{level} must match ^[a-zA-Z0-9_.-]+$")));
                }
            }
        }
        if !any {
            return Err(ApiError::invalid(
                "subject must contain at least one of tenant, workspace, app, workflow, agent, toolset",
            ));
        }
        if let Some(dims) = &self.dimensions {
            if dims.len() > 16 {
                return Err(ApiError::invalid("subject.dimensions must have at most 16 entries"));
            }
            for (k, v) in dims {
                check_len(format_args!("subject.dimensions.{k}"), v, 0, 256)?;
            }
        }
        Ok(())
    }
}

impl Action {
    pub fn validate(&self) -> ApiResult<()> {
        check_len("action.kind", &self.kind, 1, 64)?;
        if !crate::domain::action_kinds::is_canonical_kind(&self.kind) {
            return Err(ApiError::invalid(format!(
                "action.kind {:?} is not a canonical action kind: lower-case ASCII letters, digits, '_' and '-' \
                 in dot-separated segments (e.g. llm.completion)",
                self.kind
            )));
        }
        check_len("action.name", &self.name, 1, 256)?;
        check_not_blank("action.name", &self.name)?;
        if let Some(tags) = &self.tags {
            if tags.len() > 10 {
                return Err(ApiError::invalid("action.tags must have at most 10 items"));
            }
            for t in tags {
                check_len("action.tags[]", t, 0, 64)?;
            }
        }
        if let Some(k) = &self.policy_keys {
            let fields = [("host", &k.host, 253), ("recipient_domain", &k.recipient_domain, 253)];
            let more = [("resource_type", &k.resource_type, 128), ("path_prefix", &k.path_prefix, 512)];
            for (name, v, max) in fields.into_iter().chain(more) {
                if let Some(v) = v {
                    check_len(format_args!("action.policy_keys.{name}"), v, 0, max)?;
                }
            }
            if let Some(custom) = &k.custom {
                if custom.len() > 8 {
                    return Err(ApiError::invalid("action.policy_keys.custom must have at most 8 entries"));
                }
                for (name, v) in custom {
                    check_len(format_args!("action.policy_keys.custom.{name}"), v, 0, 256)?;
                }
            }
        }
        Ok(())
    }
}

impl StandardMetrics {
    pub fn validate(&self) -> ApiResult<()> {
        check_non_negative("metrics.tokens_input", self.tokens_input)?;
        check_non_negative("metrics.tokens_output", self.tokens_output)?;
        check_non_negative("metrics.latency_ms", self.latency_ms)?;
        if let Some(v) = &self.model_version {
            check_len("metrics.model_version", v, 0, 128)?;
        }
        Ok(())
    }
}

fn check_idempotency_key(key: &str) -> ApiResult<()> {
    check_len("idempotency_key", key, 1, 256)
}

impl Validate for ReservationCreateRequest {
    fn validate(&self) -> ApiResult<()> {
        check_idempotency_key(&self.idempotency_key)?;
        self.subject.validate()?;
        self.action.validate()?;
        self.estimate.validate("estimate")?;
        if let Some(ttl) = self.ttl_ms {
            check_range("ttl_ms", ttl, TTL_MS)?;
        }
        if let Some(grace) = self.grace_period_ms {
            check_range("grace_period_ms", grace, GRACE_MS)?;
        }
        Ok(())
    }
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

impl Validate for DecisionRequest {
    fn validate(&self) -> ApiResult<()> {
        check_idempotency_key(&self.idempotency_key)?;
        self.subject.validate()?;
        self.action.validate()?;
        self.estimate.validate("estimate")
    }
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

impl Validate for EventCreateRequest {
    fn validate(&self) -> ApiResult<()> {
        check_idempotency_key(&self.idempotency_key)?;
        self.subject.validate()?;
        self.action.validate()?;
        self.actual.validate("actual")?;
        if let Some(m) = &self.metrics {
            m.validate()?;
        }
        check_non_negative("client_time_ms", self.client_time_ms)
    }
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

impl Validate for CommitRequest {
    fn validate(&self) -> ApiResult<()> {
        check_idempotency_key(&self.idempotency_key)?;
        self.actual.validate("actual")?;
        if let Some(m) = &self.metrics {
            m.validate()?;
        }
        Ok(())
    }
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

impl Validate for ReleaseRequest {
    fn validate(&self) -> ApiResult<()> {
        check_idempotency_key(&self.idempotency_key)?;
        if let Some(reason) = &self.reason {
            check_len("reason", reason, 0, 256)?;
        }
        Ok(())
    }
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

impl Validate for ReservationExtendRequest {
    fn validate(&self) -> ApiResult<()> {
        check_idempotency_key(&self.idempotency_key)?;
        check_range("extend_by_ms", self.extend_by_ms, EXTEND_MS)
    }
    fn idempotency_key(&self) -> &str {
        &self.idempotency_key
    }
}

/// Parses a JSON body strictly: malformed JSON, non-objects, unknown fields and wrong types
/// are all 400 INVALID_REQUEST with the offending field path in the message. Returns the typed
/// request and the raw JSON value (used for the idempotency payload hash).
///
/// Protocol requests follow one rule for `null`: an optional field sent as `null` is absent
/// (`without_nulls`), so no stored request, replay fingerprint or receipt ever holds one; a
/// required field sent as `null` is missing (400).
pub fn parse_body<T: DeserializeOwned + Validate>(body: &[u8]) -> ApiResult<(T, Value)> {
    let mut value = parse_object(body)?;
    without_nulls(&mut value);
    let (typed, value) = typed_from::<T>(value)?;
    typed.validate()?;
    Ok((typed, value))
}

/// Fields whose values are the caller's own JSON, kept as sent (a `null` inside is data).
const FREE_FORM: &[&str] = &["metadata", "custom"];

/// Removes every member whose value is `null` from a protocol request, at any depth but inside
/// its free-form values (`metadata`, `metrics.custom`).
pub fn without_nulls(v: &mut Value) {
    match v {
        Value::Object(map) => {
            map.retain(|_, m| !m.is_null());
            for (name, m) in map.iter_mut() {
                if !FREE_FORM.contains(&name.as_str()) {
                    without_nulls(m);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(without_nulls),
        _ => {}
    }
}

/// The largest integer a receipt can sign exactly: JCS writes numbers as IEEE doubles.
pub const MAX_SIGNABLE_INTEGER: u64 = 1 << 53;

/// The first integer of a protocol request beyond `MAX_SIGNABLE_INTEGER` in magnitude (outside
/// its free-form values), with its path: such a request cannot get a receipt that holds what
/// was submitted. (The path is built only for the one found.)
pub fn unsignable_integer(v: &Value) -> Option<String> {
    match v {
        Value::Number(n) => {
            let big = match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u > MAX_SIGNABLE_INTEGER,
                (None, Some(i)) => i.unsigned_abs() > MAX_SIGNABLE_INTEGER,
                _ => false,
            };
            big.then(String::new)
        }
        Value::Object(map) => {
            map.iter().filter(|(name, _)| !FREE_FORM.contains(&name.as_str())).find_map(|(name, m)| {
                unsignable_integer(m).map(|rest| if rest.is_empty() { name.clone() } else { format!("{name}.{rest}") })
            })
        }
        Value::Array(items) => items.iter().enumerate().find_map(|(i, m)| {
            unsignable_integer(m).map(|rest| format!("[{i}]{}", if rest.is_empty() { "" } else { "." }) + &rest)
        }),
        _ => None,
    }
}

/// The most a request's free-form `metadata` (and `metrics`) may take, as compact JSON: it is
/// stored and listed, so it must stay small (the body limit alone is 1 MiB).
pub const MAX_METADATA_BYTES: usize = 16_384;

/// `metadata` and `metrics` of any request body, on both planes, within `MAX_METADATA_BYTES`.
fn check_free_form_sizes(body: &Value) -> ApiResult<()> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 += b.len();
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    for field in ["metadata", "metrics"] {
        if let Some(v) = body.get(field) {
            let mut n = Count(0);
            serde_json::to_writer(&mut n, v).expect("counting never fails");
            if n.0 > MAX_METADATA_BYTES {
                return Err(ApiError::invalid(format!(
                    "{field} must be at most {MAX_METADATA_BYTES} bytes as JSON (got {})",
                    n.0
                )));
            }
        }
    }
    Ok(())
}

/// `parse_body` without the `Validate` step (operator-plane bodies check their own bounds).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> ApiResult<(T, Value)> {
    typed_from(parse_object(body)?)
}

/// A body as a JSON object (duplicate keys refused), its free-form values within bounds.
fn parse_object(body: &[u8]) -> ApiResult<Value> {
    let value = crate::json::parse(body).map_err(|e| ApiError::invalid(format!("Malformed request body: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::invalid("Malformed request body: expected a JSON object"));
    }
    check_free_form_sizes(&value)?;
    Ok(value)
}

/// The typed request of a JSON object: a field in error is named by its path.
fn typed_from<T: DeserializeOwned>(value: Value) -> ApiResult<(T, Value)> {
    // The path of a field in error is tracked only when there is an error to report.
    if let Ok(typed) = T::deserialize(&value) {
        return Ok((typed, value));
    }
    let typed: T = serde_path_to_error::deserialize(&value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            ApiError::invalid(format!("Invalid request body: {inner}"))
        } else {
            ApiError::invalid(format!("Invalid request body: {path}: {inner}"))
        }
    })?;
    Ok((typed, value))
}

// ---------------------------------------------------------------------------------------------
// Responses

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Balance {
    pub scope: String,
    pub scope_path: String,
    pub remaining: SignedAmount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spent: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub debt: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overdraft_limit: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_over_limit: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Decision {
    Allow,
    AllowWithCaps,
    Deny,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReservationCreateResponse {
    pub decision: Decision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reservation_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope_path: Option<String>,
    pub affected_scopes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caps: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance>>,
    /// v0.1.26 `DenyDetail` (on a DENY, where v0.1.26 is in play).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny_detail: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DecisionResponse {
    pub decision: Decision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub caps: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
    pub affected_scopes: Vec<String>,
    /// v0.1.26 `DenyDetail` (on a DENY, where v0.1.26 is in play).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny_detail: Option<Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct EventCreateResponse {
    pub status: &'static str,
    pub event_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub charged: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct CommitResponse {
    pub status: &'static str,
    pub charged: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<Amount>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReleaseResponse {
    pub status: &'static str,
    pub released: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReservationExtendResponse {
    pub status: &'static str,
    pub expires_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining_ttl_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub balances: Option<Vec<Balance>>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReservationDetail {
    pub reservation_id: String,
    pub status: String,
    pub idempotency_key: String,
    pub subject: Value,
    pub action: Value,
    pub reserved: Amount,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed: Option<Amount>,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finalized_at_ms: Option<i64>,
    pub scope_path: String,
    pub affected_scopes: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub committed_metadata: Option<Value>,
    /// `ReservationEvidence`: the receipts of its operations (CyclesEvidence, when on).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Value>,
}
