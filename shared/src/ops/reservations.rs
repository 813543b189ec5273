//! Reservations: reserve, commit, release, extend, read, evaluate (dry_run and decide), and the
//! direct charge (createEvent's post-only debit); the reservation record.

use serde::Deserialize;
use serde_json::Value;

use super::{script, LedgerState};
use crate::domain::derive_scopes;
use crate::error::{ApiError, ApiResult};
use crate::ids::ReservationId;
use crate::keys::TenantKeys;
use crate::model::{Subject, Unit};
use crate::store::{Call, Script};

/// The keys every call on one reservation names alike (commit, release, extend).
pub struct Target<'a> {
    pub keys: TenantKeys,
    /// The reservation id as given, and parsed.
    pub raw: &'a str,
    pub id: &'a ReservationId,
    /// The key record the script checks (for admin-key calls, the tenant record: unchecked).
    pub auth_key: String,
}

impl<'a> Target<'a> {
    /// The calls on reservation `id` (as given: `raw`), checked against `auth_key`.
    pub fn new(raw: &'a str, id: &'a ReservationId, auth_key: String) -> Target<'a> {
        Target { keys: TenantKeys::new(&id.tenant), raw, id, auth_key }
    }

    fn budget_keys(&self) -> Vec<String> {
        self.id.budget_codes.iter().map(|c| self.keys.budget_by_code(c)).collect()
    }
}

/// The budget keys of `scopes` (their ledger `codes`, `keys::budget_codes`), and the scripts'
/// arguments: `<scope>|<ledger code>` of each, in canonical order (the scripts read the scope's
/// budget under the code's key and check the scope stored there).
fn budgets_and_scopes(keys: &TenantKeys, scopes: &[String], codes: &[String]) -> (Vec<String>, Vec<String>) {
    scopes.iter().zip(codes).map(|(s, code)| (keys.budget_by_code(code), [s, "|", code].concat())).unzip()
}

script! {
    /// Live reservation (`lua/reserve.lua`): a plain tenant's; it hands a tenant with policies,
    /// or observing, to `RESERVE_GOVERNED`.
    pub struct Reserve = reserve -> Reserved {
        keys: [tenant, api_key, reservation, dry_run_record, expiry_index, created_stream, due_index, events; budgets],
        args: [digest, accepted, payload_hash, id_prefix, unit, amount, ttl_ms, grace_ms, overage_policy,
            idempotency_key, subject, action, metadata, reclaimed, context, observe, governance, record_ttl_ms; scopes],
    }
}

/// The live reservation of a tenant with policies, or observing (`lua/reserve_governed.lua`):
/// `Reserve`'s keys and arguments, run in its stead when it answers `HANDOVER`.
pub const RESERVE_GOVERNED: Script =
    Script { name: "reserve_governed", body: include_str!("../../../lua/reserve_governed.lua"), ..Reserve::SCRIPT };

impl Reserve {
    /// The keys of a reserve of `token` of `tenant` by `key_id` over the derived `scopes` (their
    /// ledger `codes` in the reserve's unit).
    pub fn keys(
        mut self,
        tenant: &str,
        key_id: &str,
        token: &str,
        idempotency_key: &str,
        scopes: &[String],
        codes: &[String],
    ) -> Reserve {
        let keys = TenantKeys::new(tenant);
        self.tenant = keys.tenant();
        self.api_key = keys.api_key(key_id);
        self.reservation = keys.reservation(token);
        self.dry_run_record = keys.idempotency("reserve-dry-run", &[idempotency_key]);
        self.expiry_index = keys.expiry_index();
        self.created_stream = keys.created_stream();
        self.due_index = keys.due_index();
        self.events = keys.events();
        (self.budgets, self.scopes) = budgets_and_scopes(&keys, scopes, codes);
        self
    }
}

/// A reserve's answer: the hold, (status RECLAIM) the overdue reservations to expire first, or
/// (status OBSERVED) the evaluation of a reserve in observe mode.
/// (Told apart by their fields in one pass: a hold has a reservation id, a reclaim the ids to
/// expire; an untagged enum would buffer the answer and try each in turn.)
#[derive(Debug, Clone)]
pub enum Reserved {
    Held(Hold),
    Reclaim { reclaim: Vec<String> },
    Observed(Evaluated),
}

impl<'de> Deserialize<'de> for Reserved {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Reserved, D::Error> {
        // (a missing optional field is None; the rest default to empty)
        #[derive(Deserialize)]
        struct Fields {
            reclaim: Option<Vec<String>>,
            reservation_id: Option<String>,
            expires_at_ms: Option<String>,
            decision: Option<String>,
            reason_code: Option<String>,
            caps: Option<String>,
            #[serde(default)]
            codes: String,
            #[serde(default, deserialize_with = "super::ledger_states")]
            balances: Vec<LedgerState>,
            deny_detail: Option<Value>,
            #[serde(default)]
            observed: bool,
        }
        let f = Fields::deserialize(d)?;
        let missing = |field| serde::de::Error::custom(format!("a reserve's answer without {field}"));
        let decision = || f.decision.ok_or_else(|| missing("decision"));
        Ok(match (f.reclaim, f.reservation_id) {
            (Some(reclaim), _) => Reserved::Reclaim { reclaim },
            (None, Some(reservation_id)) => Reserved::Held(Hold {
                reservation_id,
                expires_at_ms: f.expires_at_ms.ok_or_else(|| missing("expires_at_ms"))?,
                decision: decision()?,
                caps: f.caps,
                balances: f.balances,
            }),
            (None, None) => Reserved::Observed(Evaluated {
                decision: decision()?,
                reason_code: f.reason_code,
                caps: f.caps,
                codes: f.codes,
                balances: f.balances,
                deny_detail: f.deny_detail,
                observed: f.observed,
            }),
        })
    }
}

#[derive(Debug, Clone)]
pub struct Hold {
    pub reservation_id: String,
    pub decision: String,
    pub expires_at_ms: String,
    pub caps: Option<String>,
    pub balances: Vec<LedgerState>,
}

script! {
    /// Commit (`lua/commit.lua`).
    pub struct Commit = commit -> Settled {
        keys: [tenant, api_key, reservation, expiry_index, events, listing_index, due_index; budgets],
        args: [digest, accepted, reservation_id, idempotency_key, payload_hash, unit, amount, metrics, metadata,
            record_ttl_ms, context],
    }
}

impl Commit {
    pub fn target(mut self, t: &Target) -> Commit {
        self.tenant = t.keys.tenant();
        self.api_key = t.auth_key.clone();
        self.reservation = t.keys.reservation(&t.id.token);
        self.expiry_index = t.keys.expiry_index();
        self.events = t.keys.events();
        self.listing_index = t.keys.listing_index();
        self.due_index = t.keys.due_index();
        self.budgets = t.budget_keys();
        self
    }
}

script! {
    /// Release (`lua/release.lua`).
    pub struct Release = release -> Settled {
        keys: [tenant, api_key, reservation, expiry_index, events, listing_index, due_index; budgets],
        args: [digest, accepted, reservation_id, idempotency_key, payload_hash, reason, record_ttl_ms, audit],
    }
}

impl Release {
    pub fn target(mut self, t: &Target) -> Release {
        self.tenant = t.keys.tenant();
        self.api_key = t.auth_key.clone();
        self.reservation = t.keys.reservation(&t.id.token);
        self.expiry_index = t.keys.expiry_index();
        self.events = t.keys.events();
        self.listing_index = t.keys.listing_index();
        self.due_index = t.keys.due_index();
        self.budgets = t.budget_keys();
        self
    }
}

/// The answer of a commit or a release, with the reservation's subject and unit.
#[derive(Debug, Clone, Deserialize)]
pub struct Settled {
    #[serde(default)]
    pub charged: Option<String>,
    #[serde(default)]
    pub released: Option<String>,
    #[serde(deserialize_with = "super::ledger_states")]
    pub balances: Vec<LedgerState>,
    pub subject: String,
    pub unit: String,
}

impl Settled {
    pub fn subject(&self) -> ApiResult<Subject> {
        serde_json::from_str(&self.subject).map_err(|_| ApiError::fault("malformed subject in a reservation record"))
    }
    pub fn unit(&self) -> ApiResult<Unit> {
        Unit::parse(&self.unit).ok_or_else(|| ApiError::fault("malformed unit in a reservation record"))
    }
}

script! {
    /// Extend (`lua/extend.lua`).
    pub struct Extend = extend -> Extended {
        keys: [tenant, api_key, reservation, expiry_index, extend_record, events, listing_index; budgets],
        args: [digest, accepted, reservation_id, payload_hash, extend_by_ms, record_ttl_ms],
    }
}

impl Extend {
    pub fn target(mut self, t: &Target, idempotency_key: &str) -> Extend {
        self.tenant = t.keys.tenant();
        self.api_key = t.auth_key.clone();
        self.reservation = t.keys.reservation(&t.id.token);
        self.expiry_index = t.keys.expiry_index();
        self.extend_record = t.keys.idempotency("extend", &[t.raw, idempotency_key]);
        self.events = t.keys.events();
        self.listing_index = t.keys.listing_index();
        self.budgets = t.budget_keys();
        self
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Extended {
    pub expires_at_ms: String,
}

script! {
    /// Read one reservation (`lua/get_reservation.lua`); status OVERDUE when it is past its
    /// expiry and grace (nothing else in the answer then).
    pub struct GetReservation = get_reservation read_only -> Stored {
        keys: [auth, reservation, meta, evidence],
        args: [digest, accepted, reservation_id, with_evidence],
    }
}

impl GetReservation {
    /// The read of reservation `token` of `tenant`, checked against the caller's `auth_record`
    /// (`None` for an operator: the record itself stands in, unchecked).
    pub fn on(tenant: &str, token: &str, auth_record: Option<String>) -> GetReservation {
        let keys = TenantKeys::new(tenant);
        let reservation = keys.reservation(token);
        GetReservation {
            auth: auth_record.unwrap_or_else(|| reservation.clone()),
            reservation,
            meta: keys.reservation_metadata(token),
            evidence: keys.reservation_evidence(token),
            ..Default::default()
        }
    }
}

/// What an evaluation answers: a reserve's dry run (replayed from its own record; a live
/// reservation of the same idempotency key answers as that reservation) or a decide, each by
/// its idempotency key.
#[derive(Debug, Clone, Copy)]
pub enum Asked<'a> {
    DryRun(&'a str),
    Decide(&'a str),
}

impl Asked<'_> {
    /// The key the evaluation's answer is kept under, for replays.
    pub fn idempotency_key(&self) -> &str {
        match self {
            Asked::DryRun(k) | Asked::Decide(k) => k,
        }
    }
}

impl Evaluate {
    /// The keys of an evaluation by `key_id` of `tenant` over the derived `scopes` (their ledger
    /// `codes` in the evaluation's unit).
    pub fn on(tenant: &str, key_id: &str, asked: Asked<'_>, scopes: &[String], codes: &[String]) -> Evaluate {
        let keys = TenantKeys::new(tenant);
        let (record, live) = match asked {
            Asked::DryRun(k) => {
                (keys.idempotency("reserve-dry-run", &[k]), keys.reservation(ReservationId::token_for(k)))
            }
            Asked::Decide(k) => {
                let record = keys.idempotency("decide", &[k]);
                (record.clone(), record)
            }
        };
        let (budgets, scopes) = budgets_and_scopes(&keys, scopes, codes);
        Evaluate {
            tenant: keys.tenant(),
            api_key: keys.api_key(key_id),
            record,
            live,
            events: keys.events(),
            due_index: keys.due_index(),
            budgets,
            scopes,
            ..Default::default()
        }
    }
}

impl Charge {
    /// The keys of a post-only charge by `key_id` of `tenant` over the derived `scopes` (their
    /// ledger `codes` in the charge's unit).
    pub fn on(tenant: &str, key_id: &str, idempotency_key: &str, scopes: &[String], codes: &[String]) -> Charge {
        let keys = TenantKeys::new(tenant);
        let (budgets, scopes) = budgets_and_scopes(&keys, scopes, codes);
        Charge {
            tenant: keys.tenant(),
            api_key: keys.api_key(key_id),
            record: keys.idempotency("event", &[idempotency_key]),
            events: keys.events(),
            due_index: keys.due_index(),
            budgets,
            scopes,
            ..Default::default()
        }
    }
}

/// The stored record of a reservation, if there is one.
pub async fn stored(store: &crate::store::Store, id: &ReservationId) -> ApiResult<Option<ReservationRecord>> {
    let key = TenantKeys::new(&id.tenant).reservation(&id.token);
    let raw = store.run(super::listing::ReadRecords { records: vec![key] }).await?.value.records;
    Ok(raw.first().and_then(|r| ReservationRecord::parse(r)))
}

/// A reservation's scope path and metadata (its record, as stored, is the reply's attachment).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Stored {
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub metadata: Option<String>,
    #[serde(default)]
    pub committed_metadata: Option<String>,
    /// Operation -> evidence id, when asked for and recorded.
    #[serde(default)]
    pub evidence: Option<std::collections::HashMap<String, String>>,
}

script! {
    /// Evaluation without a reservation: dry_run and decide (`lua/evaluate.lua`).
    pub struct Evaluate = evaluate -> Evaluated {
        keys: [tenant, api_key, record, live, events, due_index; budgets],
        args: [digest, accepted, payload_hash, unit, amount, idempotency_key, record_ttl_ms, context, subject, action,
            observe, governance; scopes],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Evaluated {
    pub decision: String,
    #[serde(default)]
    pub reason_code: Option<String>,
    #[serde(default)]
    pub caps: Option<String>,
    #[serde(default)]
    pub codes: String,
    #[serde(default, deserialize_with = "super::ledger_states")]
    pub balances: Vec<LedgerState>,
    /// v0.1.26 `DenyDetail` of a DENY.
    #[serde(default)]
    pub deny_detail: Option<Value>,
    /// Evaluated in observe mode.
    #[serde(default)]
    pub observed: bool,
}

script! {
    /// Direct charge, createEvent's post-only debit (`lua/charge.lua`).
    pub struct Charge = charge -> Charged {
        keys: [tenant, api_key, record, events, due_index; budgets],
        args: [digest, accepted, payload_hash, event_id, unit, amount, overage_policy, record_ttl_ms, context, body, action;
            scopes],
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct Charged {
    pub event_id: String,
    /// Present only when the policy capped the charge below the actual amount.
    #[serde(default)]
    pub charged: Option<String>,
    pub codes: String,
    #[serde(deserialize_with = "super::ledger_states")]
    pub balances: Vec<LedgerState>,
}

/// A reservation record, decoded in this one place: the layout of `RECORD` in
/// `lua/lib/record.lua` (a JSON array of strings), or the JSON object of the first layout.
/// Listing and getReservation read it alike.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ReservationRecord {
    pub codes: String,
    pub status: String,
    #[serde(default)]
    pub ik: String,
    pub unit: String,
    pub estimate: String,
    pub subject: String,
    pub action: String,
    pub created: String,
    pub expires: String,
    #[serde(default)]
    pub finalized: Option<String>,
    #[serde(default)]
    pub charged: Option<String>,
    /// The scope path (absent in records written before 2026-12-03: derived from the subject).
    #[serde(default)]
    pub scope: Option<String>,
}

/// How many fields an ACTIVE reservation's record has (the finishing fields follow), and how
/// many a script on one reservation reads first (`head_record`).
pub const RECORD_ACTIVE_FIELDS: usize = 22;
pub const RECORD_HEAD_FIELDS: usize = 15;

/// The fields of a record of today's layout, by position (the script library's `RECORD`, from
/// here): joined by \x1f, the status one character (A, C, R, E).
pub const RECORD_FIELDS: [&str; 29] = [
    "version",
    "status",
    "codes",
    "estimate",
    "unit",
    "policy",
    "created",
    "expires",
    "grace",
    "ext",
    "max_ext",
    "scope",
    "m",
    "qrun",
    "subject",
    "ik",
    "ph",
    "decision",
    "caps",
    "first_expires",
    "balances",
    "action",
    "fkey",
    "fhash",
    "fbalances",
    "charged",
    "finished",
    "metrics",
    "reason",
];

/// Client text as records keep it (`stored_text` in `lua/lib/record.lua`): `%` and control
/// characters percent-encoded, so no field ever holds the record's separator.
pub fn stored_text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c == '%' || c.is_ascii_control() {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

/// The client text of a `stored_text`.
pub fn from_stored_text(s: &str) -> String {
    if !s.contains('%') {
        return s.to_string();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex =
            (bytes[i] == b'%').then(|| s.get(i + 1..i + 3)).flatten().and_then(|h| u8::from_str_radix(h, 16).ok());
        match hex {
            Some(b) => {
                out.push(b);
                i += 3;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The position of field `name` in `RECORD_FIELDS`, found when compiling.
const fn record_field(name: &str) -> usize {
    let mut i = 0;
    while i < RECORD_FIELDS.len() {
        let (f, n) = (RECORD_FIELDS[i].as_bytes(), name.as_bytes());
        if f.len() == n.len() {
            let mut j = 0;
            while j < f.len() && f[j] == n[j] {
                j += 1;
            }
            if j == f.len() {
                return i;
            }
        }
        i += 1;
    }
    panic!("not a record field")
}

impl ReservationRecord {
    pub fn parse(raw: &str) -> Option<ReservationRecord> {
        let Some(packed) = raw.strip_prefix("2\x1f") else { return serde_json::from_str(raw).ok() };
        let mut fields = [""; RECORD_FIELDS.len()];
        for (slot, v) in fields.iter_mut().skip(1).zip(packed.split('\x1f')) {
            *slot = v;
        }
        macro_rules! at {
            ($name:literal) => {{
                const I: usize = record_field($name);
                Some(fields[I]).filter(|v| !v.is_empty()).map(str::to_string)
            }};
        }
        let status = match at!("status")?.as_str() {
            "A" => "ACTIVE",
            "C" => "COMMITTED",
            "R" => "RELEASED",
            "E" => "EXPIRED",
            _ => return None,
        }
        .to_string();
        let finished = at!("finished");
        Some(ReservationRecord {
            codes: at!("codes")?,
            ik: at!("ik").map(|k| from_stored_text(&k)).unwrap_or_default(),
            unit: at!("unit")?,
            estimate: at!("estimate")?,
            subject: at!("subject")?,
            action: at!("action")?,
            created: at!("created")?,
            expires: at!("expires")?,
            finalized: finished.filter(|_| status == "COMMITTED" || status == "RELEASED"),
            charged: at!("charged"),
            scope: at!("scope"),
            status,
        })
    }

    fn int(s: &str) -> Option<i64> {
        s.parse().ok()
    }

    /// The reservation as the API shows it (`ReservationDetail`, which listing rows share).
    pub fn detail(&self, tenant: &str, token: &str) -> Option<crate::model::ReservationDetail> {
        use crate::model::{Amount, ReservationDetail};
        let unit = Unit::parse(&self.unit)?;
        let subject: Value = serde_json::from_str(&self.subject).ok()?;
        // (typed from the parsed value: the text is read once)
        let scopes = derive_scopes(&serde::Deserialize::deserialize(&subject).ok()?);
        let finished = self.status == "COMMITTED" || self.status == "RELEASED";
        Some(ReservationDetail {
            reservation_id: format!("{tenant}.{token}.{}", self.codes),
            status: self.status.clone(),
            idempotency_key: self.ik.clone(),
            subject,
            action: serde_json::from_str(&self.action).ok()?,
            reserved: Amount { unit, amount: Self::int(&self.estimate)? },
            committed: if self.status == "COMMITTED" {
                self.charged.as_deref().and_then(Self::int).map(|amount| Amount { unit, amount })
            } else {
                None
            },
            created_at_ms: Self::int(&self.created)?,
            expires_at_ms: Self::int(&self.expires)?,
            finalized_at_ms: if finished { self.finalized.as_deref().and_then(Self::int) } else { None },
            scope_path: self.scope.clone().or_else(|| scopes.last().cloned())?,
            affected_scopes: scopes,
            metadata: None,
            committed_metadata: None,
            evidence: None,
        })
    }
}
