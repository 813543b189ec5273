//! The messages of client errors that both sides give, each written once: the Rust side uses
//! these constants, and the script library receives them as its `MSG` table. A message that
//! ends in a space is followed by what it names (a scope, a status).

macro_rules! messages {
    ($($(#[$doc:meta])* $name:ident = $text:literal;)*) => {
        $($(#[$doc])* pub const $name: &str = $text;)*

        /// The `MSG` table of the script library.
        pub fn lua_table() -> String {
            let entries: Vec<String> =
                [$((stringify!($name), $text)),*].iter().map(|(n, t)| format!("{n} = {t:?}")).collect();
            format!("local MSG = {{{}}}\n", entries.join(", "))
        }
    };
}

messages! {
    /// Every key failure answers alike (the reason goes to the log only).
    UNAUTHORIZED = "Invalid or missing API key";
    PERMISSION_MISSING = "API key lacks the permission this operation requires: ";
    SCOPE_NOT_ADMITTED = "The API key's scope_filter does not admit scope ";
    TENANT_CLOSED = "Tenant is closed";
    TENANT_CLOSED_UNCHANGEABLE = "Tenant is closed; a closed tenant cannot be changed";
    TENANT_SUSPENDED_SPENDING = "Tenant is suspended; new reservations and spending are not accepted";
    TENANT_SUSPENDED = "Tenant is suspended";
    TENANT_MALFORMED = "Tenant record is malformed; status cannot be determined";
    TENANT_NOT_FOUND = "Tenant not found";
    TENANT_NOT_ACTIVE = "Tenant is not ACTIVE (status ";
    TENANT_NOT_CLOSED = "Tenant is not closed";
    IDEMPOTENCY_MISMATCH = "idempotency_key was already used with a different request payload";
    IDEMPOTENCY_MISMATCH_DRY_RUN = "idempotency_key was already used with a different request payload (dry_run)";
    IDEMPOTENCY_MISMATCH_LIVE = "idempotency_key was already used with a different request payload (live reservation)";
    RESERVATION_NOT_FOUND = "Reservation not found";
    RESERVATION_CORRUPT = "Reservation record is corrupt";
    RESERVATION_EXPIRED = "Reservation has expired";
    RESERVATION_EXPIRED_NO_GRACE = "Reservation has expired (extend allows no grace period)";
    RESERVATION_FINALIZED = "Reservation is already ";
    RESERVATION_FOREIGN = "Reservation belongs to another tenant";
    RESERVATION_ID_COLLISION = "Reservation id collision; retry with another idempotency_key";
    BUDGET_NOT_FOUND = "Budget not found for provided scope: ";
    BUDGET_MISSING = "Budget not found";
    BUDGET_FROZEN = "Budget is frozen for scope ";
    BUDGET_CLOSED = "Budget is closed for scope ";
    BUDGET_FROZEN_PLAIN = "Budget is frozen";
    BUDGET_CLOSED_PLAIN = "Budget is closed";
    OVER_LIMIT = "Over the overdraft limit on scope ";
    DEBT_OUTSTANDING = "Outstanding debt on scope ";
    INSUFFICIENT_BUDGET = "Insufficient budget on scope ";
    LEDGER_OVERFLOW = "The operation would overflow the ledger (int64)";
    API_KEY_ID_COLLISION = "API key id collision; retry";
    API_KEY_NOT_FOUND = "API key not found";
    API_KEY_ALREADY_REVOKED = "API key is already revoked";
    API_KEY_EXPIRED = "API key has expired; create a new one";
    WEBHOOK_NOT_FOUND = "Webhook subscription not found";
    OPERATOR_KEY_NOT_FOUND = "Operator key not found";
    OPERATOR_KEY_ALREADY_REVOKED = "Operator key is already revoked";
    OPERATOR_KEY_EXPIRED = "Operator key has expired; create a new one";
    OWNER_UNLIMITED = "An owner key cannot be limited to some tenants (tenant_pattern): it could create keys without the limit";
    LAST_OWNER = "This is the last owner key and the bootstrap ADMIN_API_KEY is off: revoking or demoting it would leave no one able to manage operator keys";
    OPERATOR_KEYS_FULL = "At most 1000 operator keys may exist (revoked ones included)";
}
