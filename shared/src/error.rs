//! One error type for the whole service, mapped to the spec's `ErrorResponse`.

use serde_json::Value;

/// `ErrorCode` values, each with its usual HTTP status. The first 17 are the runtime plane's
/// enum (cycles-protocol-v0.yaml), the next 3 its v0.1.26 extension (action authority, 409);
/// the rest exist only on the operator plane (admin spec), and no runtime script ever produces
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    InvalidRequest,
    UnitMismatch,
    Unauthorized,
    Forbidden,
    NotFound,
    BudgetExceeded,
    BudgetFrozen,
    BudgetClosed,
    ReservationFinalized,
    IdempotencyMismatch,
    OverdraftLimitExceeded,
    DebtOutstanding,
    MaxExtensionsExceeded,
    TenantClosed,
    ReservationExpired,
    LimitExceeded,
    InternalError,
    ActionQuotaExceeded,
    ActionKindNotAllowed,
    ActionKindDenied,
    TenantNotFound,
    TenantSuspended,
    BudgetNotFound,
    InsufficientPermissions,
    KeyRevoked,
    KeyExpired,
    DuplicateResource,
    EventNotFound,
    WebhookNotFound,
    WebhookUrlInvalid,
    ReplayInProgress,
    CountMismatch,
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 32] = [
        Self::InvalidRequest,
        Self::UnitMismatch,
        Self::Unauthorized,
        Self::Forbidden,
        Self::NotFound,
        Self::BudgetExceeded,
        Self::BudgetFrozen,
        Self::BudgetClosed,
        Self::ReservationFinalized,
        Self::IdempotencyMismatch,
        Self::OverdraftLimitExceeded,
        Self::DebtOutstanding,
        Self::MaxExtensionsExceeded,
        Self::TenantClosed,
        Self::ReservationExpired,
        Self::LimitExceeded,
        Self::InternalError,
        Self::ActionQuotaExceeded,
        Self::ActionKindNotAllowed,
        Self::ActionKindDenied,
        Self::TenantNotFound,
        Self::TenantSuspended,
        Self::BudgetNotFound,
        Self::InsufficientPermissions,
        Self::KeyRevoked,
        Self::KeyExpired,
        Self::DuplicateResource,
        Self::EventNotFound,
        Self::WebhookNotFound,
        Self::WebhookUrlInvalid,
        Self::ReplayInProgress,
        Self::CountMismatch,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "INVALID_REQUEST",
            Self::UnitMismatch => "UNIT_MISMATCH",
            Self::Unauthorized => "UNAUTHORIZED",
            Self::Forbidden => "FORBIDDEN",
            Self::NotFound => "NOT_FOUND",
            Self::BudgetExceeded => "BUDGET_EXCEEDED",
            Self::BudgetFrozen => "BUDGET_FROZEN",
            Self::BudgetClosed => "BUDGET_CLOSED",
            Self::ReservationFinalized => "RESERVATION_FINALIZED",
            Self::IdempotencyMismatch => "IDEMPOTENCY_MISMATCH",
            Self::OverdraftLimitExceeded => "OVERDRAFT_LIMIT_EXCEEDED",
            Self::DebtOutstanding => "DEBT_OUTSTANDING",
            Self::MaxExtensionsExceeded => "MAX_EXTENSIONS_EXCEEDED",
            Self::TenantClosed => "TENANT_CLOSED",
            Self::ReservationExpired => "RESERVATION_EXPIRED",
            Self::LimitExceeded => "LIMIT_EXCEEDED",
            Self::InternalError => "INTERNAL_ERROR",
            Self::ActionQuotaExceeded => "ACTION_QUOTA_EXCEEDED",
            Self::ActionKindNotAllowed => "ACTION_KIND_NOT_ALLOWED",
            Self::ActionKindDenied => "ACTION_KIND_DENIED",
            Self::TenantNotFound => "TENANT_NOT_FOUND",
            Self::TenantSuspended => "TENANT_SUSPENDED",
            Self::BudgetNotFound => "BUDGET_NOT_FOUND",
            Self::InsufficientPermissions => "INSUFFICIENT_PERMISSIONS",
            Self::KeyRevoked => "KEY_REVOKED",
            Self::KeyExpired => "KEY_EXPIRED",
            Self::DuplicateResource => "DUPLICATE_RESOURCE",
            Self::EventNotFound => "EVENT_NOT_FOUND",
            Self::WebhookNotFound => "WEBHOOK_NOT_FOUND",
            Self::WebhookUrlInvalid => "WEBHOOK_URL_INVALID",
            Self::ReplayInProgress => "REPLAY_IN_PROGRESS",
            Self::CountMismatch => "COUNT_MISMATCH",
        }
    }

    /// Parses the code names the Lua scripts return.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }

    pub fn status(self) -> u16 {
        match self {
            Self::InvalidRequest | Self::UnitMismatch | Self::WebhookUrlInvalid => 400,
            Self::Unauthorized => 401,
            Self::Forbidden | Self::TenantSuspended | Self::InsufficientPermissions => 403,
            Self::NotFound
            | Self::TenantNotFound
            | Self::BudgetNotFound
            | Self::EventNotFound
            | Self::WebhookNotFound => 404,
            Self::ReservationExpired => 410,
            Self::LimitExceeded => 429,
            Self::InternalError => 500,
            _ => 409,
        }
    }
}

/// An error answer: code, human message and optional `details`. Two channels share it: client
/// errors (4xx, the message says what to change) and internal faults (500, the message says
/// whether a retry can help; `cause` carries what went wrong for the log, never to the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    /// Set where the spec declares another status for this code (e.g. 400 TENANT_NOT_FOUND
    /// on createApiKey and createBudget).
    pub status: Option<u16>,
    /// What the server log records about this error (logged once, when the answer is sent).
    pub cause: Option<String>,
    /// The `CyclesEvidenceRef` of the error receipt made for this denial, if any.
    pub evidence: Option<Value>,
}

/// The answer to a store that cannot be reached: a retry with the same idempotency key is safe.
pub const STORE_UNAVAILABLE: &str = "The budget store is unavailable; retry with the same idempotency_key";
/// The answer to an internal fault a retry cannot mend (its cause is in the server log).
pub const INTERNAL_FAULT: &str = "Internal error; the server log records its cause";

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: None, status: None, cause: None, evidence: None }
    }
    /// An internal fault: a corrupt record, a script that raised, a malformed reply.
    pub fn fault(cause: impl Into<String>) -> Self {
        Self { cause: Some(cause.into()), ..Self::new(ErrorCode::InternalError, INTERNAL_FAULT) }
    }
    /// 429 LIMIT_EXCEEDED of a per-minute limit, to retry when the minute of `now` (epoch ms)
    /// ends (the answer then carries `Retry-After` and `X-RateLimit-Reset`).
    pub fn minute_limit(limit: u64, message: &str, now: i64) -> Self {
        let reset_ms = (now / 60_000 + 1) * 60_000;
        let retry = ((reset_ms - now + 999) / 1000).max(1);
        Self::new(ErrorCode::LimitExceeded, format!("{message}; retry in {retry} s")).with_status(429).with_details(
            serde_json::json!({"limit": limit, "retry_after_seconds": retry, "reset_at": reset_ms / 1000}),
        )
    }

    pub fn with_status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }
    pub fn status(&self) -> u16 {
        self.status.unwrap_or_else(|| self.code.status())
    }
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, message)
    }
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Unauthorized, message)
    }
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Forbidden, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InternalError, message)
    }

    /// The `ErrorResponse` body (request and trace ids are added by the caller).
    pub fn body(&self, request_id: &str, trace_id: &str) -> Value {
        let mut body = serde_json::json!({
            "error": self.code.as_str(),
            "message": self.message,
            "request_id": request_id,
            "trace_id": trace_id,
        });
        if let Some(details) = &self.details {
            body["details"] = details.clone();
        }
        if let Some(r) = &self.evidence {
            body["cycles_evidence"] = r.clone();
        }
        body
    }
}

impl From<redis::RedisError> for ApiError {
    /// A store that cannot be reached (a retry may go through) or one that refused the command
    /// (an error raised inside a script, say: a retry meets the same refusal). Store internals
    /// go to the log, never to the caller.
    fn from(e: redis::RedisError) -> Self {
        let unreachable = e.is_io_error()
            || e.is_timeout()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.is_cluster_error()
            || matches!(
                e.code(),
                Some("TRYAGAIN" | "CLUSTERDOWN" | "LOADING" | "BUSY" | "MASTERDOWN" | "OOM" | "READONLY" | "MISCONF")
            );
        if unreachable {
            Self { cause: Some(format!("redis unavailable: {e}")), ..Self::internal(STORE_UNAVAILABLE) }
        } else {
            Self::fault(format!("redis refused: {e}"))
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
