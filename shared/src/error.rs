//! One error type for the whole service, mapped to the spec's `ErrorResponse`.

use serde_json::Value;

/// `ErrorCode` values, each with its usual HTTP status. The first 17 are the runtime plane's
/// enum (cycles-protocol-v0.yaml); the rest exist only on the operator plane (admin spec), and
/// no runtime script ever produces them.
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
}

impl ErrorCode {
    pub const ALL: [ErrorCode; 28] = [
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

/// An error answer: code, human message and optional `details`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    pub details: Option<Value>,
    /// Set where the spec declares another status for this code (e.g. 400 TENANT_NOT_FOUND
    /// on createApiKey and createBudget).
    pub status: Option<u16>,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), details: None, status: None }
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
        body
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> Self {
        tracing::error!(error = %e, "redis failure");
        // Never echo store internals to callers; the log carries them.
        Self::internal("The budget store is unavailable; retry with the same idempotency_key")
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
