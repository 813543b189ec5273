//! Request ids, trace ids (W3C precedence) and the self-describing reservation id.

use http::HeaderMap;
use rand::RngCore;

use crate::keys::digest;

/// A v4 UUID from the thread-local generator (`Uuid::new_v4` makes a getrandom syscall).
pub fn random_uuid() -> uuid::Uuid {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    uuid::Builder::from_random_bytes(bytes).into_uuid()
}

pub fn new_request_id() -> String {
    // (encoded straight into a buffer: `to_string` goes through the formatter, every request)
    random_uuid().hyphenated().encode_lower(&mut uuid::Uuid::encode_buffer()).to_owned()
}

fn is_lower_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn all_zero(s: &str) -> bool {
    s.bytes().all(|b| b == b'0')
}

/// The trace context of one request: the trace id and the inbound `traceparent` flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    pub trace_id: String,
    /// Flags byte of a valid inbound `traceparent`, if there was one.
    pub inbound_flags: Option<String>,
}

/// Parses a W3C `traceparent` (version 00, lower-case hex, non-zero ids); None if malformed.
pub fn parse_traceparent(v: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = v.split('-').collect();
    if parts.len() != 4 || parts[0] != "00" {
        return None;
    }
    let (trace, span, flags) = (parts[1], parts[2], parts[3]);
    if !is_lower_hex(trace, 32) || !is_lower_hex(span, 16) || !is_lower_hex(flags, 2) {
        return None;
    }
    if all_zero(trace) || all_zero(span) {
        return None;
    }
    Some((trace.to_string(), flags.to_string()))
}

/// Chooses the trace id: valid `traceparent`, else valid `X-Cycles-Trace-Id`, else a fresh one.
/// Malformed values are treated as absent, never rejected.
pub fn trace_from_headers(headers: &HeaderMap) -> Trace {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim);
    if let Some((trace_id, flags)) = header("traceparent").and_then(parse_traceparent) {
        return Trace { trace_id, inbound_flags: Some(flags) };
    }
    if let Some(t) = header("x-cycles-trace-id") {
        if is_lower_hex(t, 32) && !all_zero(t) {
            return Trace { trace_id: t.to_string(), inbound_flags: None };
        }
    }
    Trace { trace_id: new_trace_id(), inbound_flags: None }
}

pub fn new_trace_id() -> String {
    let mut bytes = [0u8; 16];
    loop {
        rand::thread_rng().fill_bytes(&mut bytes);
        if bytes.iter().any(|b| *b != 0) {
            return lower_hex(&bytes);
        }
    }
}

/// Lowercase hex of `bytes`, written into a buffer made at its size (on every request:
/// `hex::encode` collects its digits one `char` at a time, three times the work).
pub fn lower_hex(bytes: &[u8]) -> String {
    let mut out = vec![0; bytes.len() * 2];
    hex::encode_to_slice(bytes, &mut out).expect("the buffer is twice the input");
    String::from_utf8(out).expect("hex digits are ASCII")
}

/// A reservation id: `<tenant>.<token>.<budget codes>`. It pins the owning tenant (its hash
/// slot) and names the reservation's budget ledgers, so every later operation knows all the
/// keys its script touches without a lookup. The token is derived from the reserve
/// idempotency key, which makes the reservation record its own idempotency record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReservationId {
    pub tenant: String,
    pub token: String,
    pub budget_codes: Vec<String>,
}

pub const TOKEN_LEN: usize = 14;
const CODE_LEN: usize = 8;

impl ReservationId {
    /// The token of the reservation a reserve with this idempotency key creates.
    pub fn token_for(idempotency_key: &str) -> String {
        digest(&["reservation", idempotency_key])[..TOKEN_LEN].to_string()
    }

    /// The id prefix the reserve script completes with the budget codes it charged.
    pub fn prefix(tenant: &str, token: &str) -> String {
        [tenant, ".", token, "."].concat()
    }

    pub fn parse(id: &str) -> Option<ReservationId> {
        let mut parts = id.split('.');
        let (tenant, token, codes) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || tenant.is_empty() || token.len() != TOKEN_LEN {
            return None;
        }
        if codes.is_empty() || codes.len() % CODE_LEN != 0 || !codes.is_ascii() {
            return None;
        }
        let budget_codes =
            (0..codes.len() / CODE_LEN).map(|i| codes[i * CODE_LEN..(i + 1) * CODE_LEN].to_string()).collect();
        Some(ReservationId { tenant: tenant.to_string(), token: token.to_string(), budget_codes })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn lower_hex_is_hex_encode() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(lower_hex(&all), hex::encode(&all));
        assert_eq!(lower_hex(&[]), "");
        let id = new_trace_id();
        assert!(is_lower_hex(&id, 32) && !all_zero(&id), "{id}");
    }

    #[test]
    fn traceparent_wins_over_cycles_header() {
        let t = trace_from_headers(&headers(&[
            ("traceparent", TP),
            ("x-cycles-trace-id", "11111111111111111111111111111111"),
        ]));
        assert_eq!(t.trace_id, "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(t.inbound_flags.as_deref(), Some("01"));
    }

    #[test]
    fn malformed_values_fall_through() {
        let upper = "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01";
        let t = trace_from_headers(&headers(&[
            ("traceparent", upper),
            ("x-cycles-trace-id", "22222222222222222222222222222222"),
        ]));
        assert_eq!(t.trace_id, "22222222222222222222222222222222");
        let zero = "00-00000000000000000000000000000000-b7ad6b7169203331-01";
        assert!(parse_traceparent(zero).is_none());
        assert!(parse_traceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01").is_none());
        let t = trace_from_headers(&headers(&[("x-cycles-trace-id", "ABCDEF")]));
        assert_eq!(t.trace_id.len(), 32);
        assert!(is_lower_hex(&t.trace_id, 32) && !all_zero(&t.trace_id));
    }

    #[test]
    fn reservation_id_round_trips() {
        let token = ReservationId::token_for("k1");
        let id = format!("{}{}{}", ReservationId::prefix("acme", &token), "AAAAAAAA", "BBBBBBBB");
        let parsed = ReservationId::parse(&id).unwrap();
        assert_eq!(parsed.tenant, "acme");
        assert_eq!(parsed.budget_codes, vec!["AAAAAAAA", "BBBBBBBB"]);
        assert!(ReservationId::parse("nope").is_none());
        assert!(ReservationId::parse(&format!("acme.{token}.AAAA")).is_none());
    }
}
