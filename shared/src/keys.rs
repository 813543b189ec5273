//! The cluster-native key schema. Every key of a tenant carries the tenant's hash tag, so each
//! operation's script touches one slot. Client text (idempotency keys) is hashed before it goes
//! into a key name, so it can never inject a `{` or collide across namespaces.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use sha2::{Digest, Sha256};

use crate::model::Unit;

/// The key the readiness probe writes (a short-lived string of its own slot).
pub const HEALTH_PROBE: &str = "cy:{health}:probe";

/// Global, immutable `key_id -> tenant` lookup (the only global record on the hot path).
pub fn key_lookup(key_id: &str) -> String {
    format!("cy:keyid:{key_id}")
}

/// Global, immutable `subscription_id -> owner` lookup.
pub fn webhook_lookup(id: &str) -> String {
    format!("cy:whid:{id}")
}

/// Global, immutable `policy_id -> tenant` lookup.
pub fn policy_lookup(id: &str) -> String {
    format!("cy:polid:{id}")
}

/// Failed authentications of one key id (`kind` "k") or one source address ("s") in one
/// minute (epoch minutes).
pub fn auth_failures(kind: &str, who: &str, minute: i64) -> String {
    format!("cy:af:{kind}:{}:{minute}", encode_component(who))
}

/// Requests of one source address to the public (unauthenticated) endpoints in one minute.
pub fn public_requests(source: &str, minute: i64) -> String {
    format!("cy:pub:{}:{minute}", encode_component(source))
}

/// A signed CyclesEvidence envelope, by its content id (global: `GET /v1/evidence/{id}` knows
/// nothing else; the ids spread over every slot).
pub fn evidence(evidence_id: &str) -> String {
    format!("cy:ev:{evidence_id}")
}

/// Global registry of tenants (for sweeps and operator listings).
pub const TENANT_REGISTRY: &str = "cy:tenants";

/// Global set of the hash slots that hold a registered tenant: the sweep looks for due work in
/// these slots' due indexes only (`TenantKeys::due_index`).
pub const SWEEP_SLOTS: &str = "cy:sweep:slots";

/// Where the sweep's retention crawl over the tenant registry stands (an SSCAN cursor).
pub const TRIM_CURSOR: &str = "cy:sweep:trim-cursor";

/// The cluster hash slot of a hash tag (CRC16/XMODEM of the tag, as Redis computes it).
pub fn slot_of_tag(tag: &str) -> u16 {
    let mut crc: u16 = 0;
    for b in tag.bytes() {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc & 16383
}

/// For every hash slot, a short tag that hashes to it: keys under `{<tag>}` live in that slot,
/// so a tenant's script can maintain a per-slot index atomically with the tenant's own keys.
static SLOT_TAGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
    let mut tags = vec![String::new(); 16384];
    let mut missing = tags.len();
    let mut n = 0u32;
    while missing > 0 {
        let tag = format!("s{n}");
        let slot = usize::from(slot_of_tag(&tag));
        if tags[slot].is_empty() {
            tags[slot] = tag;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

/// Due index of one hash slot: tenant -> the earliest time one of its reservations may expire
/// (never later than the truth; earlier only costs the sweep a look).
pub fn due_index(slot: u16) -> String {
    format!("cy:sweep:{{{}}}:due", SLOT_TAGS[usize::from(slot)])
}

/// Percent-encodes everything outside `[A-Za-z0-9._-]`; injective, and never yields `{` or `}`.
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    push_encoded(&mut out, s);
    out
}

/// Appends `s` percent-encoded as `encode_component` does (a name needing none is copied whole).
fn push_encoded(out: &mut String, s: &str) {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if s.bytes().all(plain) {
        out.push_str(s);
        return;
    }
    for b in s.bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            const HEX: &[u8; 16] = b"0123456789ABCDEF";
            out.extend(['%', HEX[usize::from(b >> 4)] as char, HEX[usize::from(b & 15)] as char]);
        }
    }
}

/// sha256 of the parts (NUL-separated), base64url without padding.
pub fn digest(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(p.as_bytes());
    }
    URL_SAFE_NO_PAD.encode(h.finalize())
}

/// 8-character code of a budget ledger (scope, unit): names its key and is carried inside
/// reservation ids, so commit/release/extend can declare the budget keys without a lookup.
/// Budget records store their scope, and scripts verify it, so a code collision can never
/// mix up two ledgers.
pub fn budget_code(scope: &str, unit: Unit) -> String {
    digest(&["budget", scope, unit.as_str()])[..8].to_string()
}

/// The ledger codes of `scopes` in `unit`: computed once per request and handed to whatever
/// needs them (each is a digest).
pub fn budget_codes(scopes: &[String], unit: Unit) -> Vec<String> {
    scopes.iter().map(|s| budget_code(s, unit)).collect()
}

/// All keys of one tenant.
#[derive(Debug, Clone)]
pub struct TenantKeys {
    prefix: String,
}

impl TenantKeys {
    pub fn new(tenant: &str) -> Self {
        let mut prefix = String::with_capacity(tenant.len() + 5);
        prefix.push_str("cy:{");
        push_encoded(&mut prefix, tenant);
        prefix.push('}');
        Self { prefix }
    }
    /// The prefix every key of this tenant starts with (`cy:{<tenant>}`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
    /// The hash slot of every key of this tenant.
    pub fn slot(&self) -> u16 {
        slot_of_tag(self.prefix.trim_start_matches("cy:{").trim_end_matches('}'))
    }
    /// The due index of this tenant's slot (see `due_index`).
    pub fn due_index(&self) -> String {
        due_index(self.slot())
    }
    pub fn budget(&self, scope: &str, unit: Unit) -> String {
        self.budget_by_code(budget_code(scope, unit))
    }
    /// Idempotency record of namespace `ns` (e.g. `reserve`, `decide`, `event`).
    pub fn idempotency(&self, ns: &str, parts: &[&str]) -> String {
        let mut all = vec![ns];
        all.extend_from_slice(parts);
        [&self.prefix, ":i:", ns, ":", &digest(&all)].concat()
    }
}

/// Room for what follows the tenant's prefix in a key (its longest suffixes, an idempotency
/// record's 43 characters of digest or a counter's member, may grow it once).
const KEY_SUFFIX_ROOM: usize = 64;

/// The key of a slot no one writes, after the hash tag of any key in it: a script reads it first
/// to tell that its slot is migrating away (`SLOT.moving` in `lua/lib/reply.lua`).
pub const SLOT_CHECK_SUFFIX: &str = ":slot-check";

/// The never-written key of the slot of `key` (None for a key without a hash tag: Redis hashes
/// such a key, or one whose first braces are empty, whole).
pub fn slot_check(key: &str) -> Option<String> {
    let open = key.find('{')?;
    let close = open + key[open..].find('}')?;
    (close > open + 1).then(|| [&key[..=close], SLOT_CHECK_SUFFIX].concat())
}

/// Declares the keys of a tenant's slot once, for both languages: each line is a key's name, its
/// parameters and its suffix after the tenant's prefix (literals and parameters in order). It
/// gives `TenantKeys` one method per key and the script library its `KEY` table (`lua_table`),
/// whose functions take the prefix (`prefix_of` any key of the tenant) and the same parameters:
/// no key is spelled anywhere else.
macro_rules! tenant_keys {
    ($($(#[$doc:meta])* $name:ident($($param:ident),*) => [$($part:tt)+];)*) => {
        impl TenantKeys {
            $($(#[$doc])* pub fn $name(&self, $($param: impl std::fmt::Display),*) -> String {
                // (made at its size once: a request builds a dozen keys)
                let mut key = String::with_capacity(self.prefix.len() + KEY_SUFFIX_ROOM);
                key.push_str(&self.prefix);
                $(tenant_keys!(@push key, $part);)+
                key
            })*
        }

        /// The `KEY` table of the script library: one function per key of a tenant's slot,
        /// `KEY.prefix_of(key)`, the tenant prefix of any of them, `KEY.tag_of(prefix)`, the
        /// tenant's (encoded) name in it, and `KEY.slot_check(key)`, the key of `key`'s slot
        /// that no one writes (`slot_check`).
        pub fn lua_table() -> String {
            let mut out = String::from(
                "local KEY = {\n  prefix_of = function(key) return string.match(key, '^(cy:{[^}]*})') end,\n  \
                 tag_of = function(prefix) return string.match(prefix, '^cy:{(.*)}$') end,\n",
            );
            out.push_str("  slot_check = function(key) local t = string.match(key, '^[^{]*{[^}]+}') return t and (t .. '");
            out.push_str(SLOT_CHECK_SUFFIX);
            out.push_str("') end,\n");
            $(
                let params: &[&str] = &[$(stringify!($param)),*];
                let mut body = String::from("p");
                $(body.push_str(&tenant_keys!(@lua $part));)+
                out.push_str(&format!("  {} = function({}) return {} end,\n", stringify!($name),
                    std::iter::once("p").chain(params.iter().copied()).collect::<Vec<_>>().join(", "), body));
            )*
            out.push_str("}\n");
            out
        }
    };
    (@push $key:ident, $lit:literal) => { $key.push_str($lit) };
    (@push $key:ident, $param:ident) => {{
        use std::fmt::Write as _;
        let _ = write!($key, "{}", $param);
    }};
    (@lua $lit:literal) => { format!(" .. '{}'", $lit) };
    (@lua $param:ident) => { format!(" .. {}", stringify!($param)) };
}

tenant_keys! {
    /// Tenant record (status and reservation defaults).
    tenant() => [":tenant"];
    api_key(key_id) => [":key:" key_id];
    /// Set of the tenant's API key ids (listing and the close cascade).
    api_key_index() => [":keys"];
    /// An operator key (`X-Admin-API-Key`), under the `__admin__` owner only (`ops::operators`),
    /// beside the audit stream its changes write.
    operator_key(key_id) => [":opkey:" key_id];
    /// Set of the operator key ids (`__admin__` only).
    operator_key_index() => [":opkeys"];
    /// The ids of the operator keys with the owner role that are not revoked (`__admin__` only).
    operator_owners() => [":opowners"];
    /// A webhook subscription owned by this tenant (or by `__system__`).
    webhook(id) => [":wh:" id];
    /// The lock of a replay of events to one subscription.
    webhook_replay_lock(id) => [":wh:" id ":replay"];
    /// Set of the subscription ids this tenant owns.
    webhook_index() => [":whs"];
    /// Stream id up to which this tenant's events were matched against subscriptions.
    dispatch_cursor() => [":whcursor"];
    /// A delivery of one of this owner's subscriptions.
    delivery(id) => [":dl:" id];
    /// Due deliveries of this owner's subscriptions (score: when they are due), as queued
    /// before deliveries were queued per subscription; only drained now.
    legacy_delivery_queue() => [":dq"];
    /// Due deliveries of one subscription (score: when they are due).
    subscription_queue(id) => [":dq:" id];
    /// Claimed deliveries of one subscription (score: when the claim's lease ends).
    subscription_in_flight(id) => [":df:" id];
    /// Claimed deliveries of all this owner's subscriptions (score: when the claim's lease
    /// ends): what bounds one owner's sends in flight across every dispatcher.
    owner_in_flight() => [":dfo"];
    /// This owner's subscriptions that have deliveries queued or in flight (score: the next time
    /// one may be claimable; early is harmless, late never happens).
    due_subscriptions() => [":dsubs"];
    /// Deliveries of one subscription (score: created ms), for listing.
    subscription_deliveries(id) => [":wdl:" id];
    /// A budget ledger, by its code (`budget_code`).
    budget_by_code(code) => [":b:" code];
    /// Hash scope -> ",UNIT,UNIT," of the units budgeted at that scope.
    scope_units() => [":scopes"];
    reservation(token) => [":r:" token];
    /// A reservation's metadata and commit metadata (hash), beside its record, so that listings
    /// read records without it.
    reservation_metadata(token) => [":rm:" token];
    /// The evidence ids of a reservation's operations (hash: reserve, commit, release).
    reservation_evidence(token) => [":rev:" token];
    /// The listing index: a status member and three value members per reservation (see
    /// `lua/lib/listing.lua`), all scored 0 and read with ZRANGE BYLEX.
    listing_index() => [":li"];
    /// How far the listing index backfill of reservations written before it has come: the last
    /// created-index member done, or `done`.
    listing_backfill() => [":li:backfill"];
    /// How far the listing index has been written from the created stream (`lua/list_flush.lua`):
    /// the last stream entry id done (absent: none yet).
    listing_flushed() => [":li:flushed"];
    /// The listing index's compacted part: the directory of its chunks (each chunk's lower
    /// bound, scored 0) and a chunk (a small sorted set named by its bound's SHA-1), see
    /// `CHUNKED` in `lua/lib/listing.lua`.
    listing_chunks() => [":lc"];
    listing_chunk(bound_sha) => [":lc:" bound_sha];
    /// The members a move into the chunks is placing, sorted by Redis (written and deleted
    /// within the one script that moves them: never seen outside it).
    listing_staged() => [":lc:staged"];
    /// Sorted set of ACTIVE reservation ids scored by expires_at + grace.
    expiry_index() => [":exp"];
    /// The tenant's reservations in the order they were created: a stream whose entry ids are
    /// their creation times (ms), each entry holding a token (field `t`; see `reservation`).
    created_stream() => [":cs"];
    /// The same as a sorted set, written before the stream (members `<13-digit created_at ms>
    /// <token>`, all scored 0, read with ZRANGE BYLEX): read and trimmed, no longer written.
    created_index() => [":created"];
    /// Stream of the tenant's events (the spec's `Event` JSON per entry), in time order.
    events() => [":events"];
    /// The overview's counters of one hour of events: "<minute>|<category>" and
    /// "<minute>|denied|<reason>" counts (`emit`).
    event_stats(hour) => [":events:stats:" hour];
    /// The ten latest events of one type (reservation.denied, reservation.expired).
    event_recent(event_type) => [":events:recent:" event_type];
    /// The marker that a system alert was written (once across containers).
    system_alert_marker(name) => [":events:alert:" name];
    /// Reservations the sweep could not read: id -> reason. Never refunded automatically.
    quarantine() => [":quarantine"];
    /// The tenant's policies: policy_id -> the stored `Policy` (JSON).
    policies() => [":pol"];
    /// What the runtime scripts read of each policy: policy_id -> its runtime projection
    /// (JSON).
    policy_rules() => [":pol:rt"];
    /// Per-minute rate counters of the policies (one hash per calendar minute).
    policy_rate(minute) => [":pol:rt:rate:" minute];
    /// Policy names in use: lower-case name -> policy_id.
    policy_names() => [":pol:names"];
    /// The tenant's recurring ledgers by the end of their period (score), for the sweep's rolls.
    periods() => [":periods"];
    /// The tenant's v0.1.26 action-quota counters: the index by member
    /// ("<scope>|<kind or __risk__:class>|<window>|<bucket>", lexicographic), the same by
    /// cleanup deadline, and the counters, one field per member (`count_actions` in
    /// `lua/lib/quotas.lua` writes them). A counter of before had a hash of its own that expired
    /// (`quota_counter`): moved into the counters where it is first read, never written.
    quota_index() => [":quotas"];
    quota_due() => [":quotas:due"];
    quota_counters() => [":qc"];
    quota_counter(member) => [":q:" member];
    /// One tenth of the alerts' rate window (`size` ms): counts of attempts, denials, expiries,
    /// other writes and authentication failures (`lua/lib/alerts.lua`).
    alert_window(size, tenth) => [":rt:" size ":" tenth];
    /// The runaway-agent guards (`lua/lib/guards.lua`): ACTIVE reservations per policy and
    /// matched scope ("<policy_id>|<scope>" -> n), amounts spent per policy and matched scope in
    /// one calendar minute ("m<minute>") or hour ("h<hour>") window, the ledgers made by budget
    /// templates (budget code, scored by the last time they were known touched) and how many
    /// each policy has made (policy_id -> n).
    active_holds() => [":g:act"];
    spend_window(window) => [":g:sp:" window];
    template_ledgers() => [":g:tpl"];
    template_counts() => [":g:tpln"];
    /// Spend analytics (`lua/lib/usage.lua`): the usage log (a stream: one entry per charge
    /// and per ending of a reservation, until folded) and the rollups, one hash per bucket
    /// ("h<epoch hour>", "d<epoch day>", "m<year * 12 + month - 1>").
    usage_log() => [":u"];
    usage_bucket(bucket) => [":u:" bucket];
    /// The export's cursor of one of the owner's streams ("events", "audit", "bus": the alerts
    /// put on EventBridge): `done` (the last entry id exported) and `pending` (`jobs::export`).
    export_cursor(stream) => [":x:" stream];
    /// The ids of the tenant's evidence envelopes in the order they were signed (a stream,
    /// written only while an archive is configured, for the export).
    evidence_log() => [":evlog"];
    /// When each rate-spike alert of the tenant was last raised.
    alerted() => [":alerted"];
    /// The audit stream of this owner (a tenant, or a sentinel of `ops::audit`).
    audit_log() => [":auditlog"];
    /// The audit entries written before the audit stream: a list (read and trimmed, never
    /// written).
    legacy_audit_log() => [":audit"];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_tag_never_contains_client_braces() {
        let k = TenantKeys::new("a{b}c:*");
        assert_eq!(k.tenant(), "cy:{a%7Bb%7Dc%3A%2A}:tenant");
    }

    #[test]
    fn encoding_is_injective_on_escapes() {
        assert_ne!(encode_component("a%7B"), encode_component("a{"));
    }

    #[test]
    fn slots_are_redis_slots_and_every_slot_has_a_tag() {
        // reference values from Redis's CLUSTER KEYSLOT
        assert_eq!(slot_of_tag("foo"), 12182);
        assert_eq!(slot_of_tag("123456789"), 0x31c3 & 16383);
        for slot in [0u16, 1, 8000, 16383] {
            let key = due_index(slot);
            let tag = key.trim_start_matches("cy:sweep:{").split('}').next().unwrap();
            assert_eq!(slot_of_tag(tag), slot);
        }
        let t = TenantKeys::new("acme");
        assert_eq!(t.slot(), slot_of_tag("acme"));
    }

    #[test]
    fn budget_codes_differ_by_unit_and_scope() {
        let a = budget_code("tenant:t", Unit::Tokens);
        assert_eq!(a.len(), 8);
        assert_ne!(a, budget_code("tenant:t", Unit::Credits));
        assert_ne!(a, budget_code("tenant:u", Unit::Tokens));
    }

    #[test]
    fn the_lua_key_table_spells_keys_as_rust_does() {
        let table = lua_table();
        let k = TenantKeys::new("t");
        assert!(table.contains("  tenant = function(p) return p .. ':tenant' end,"), "{table}");
        assert!(
            table.contains("  alert_window = function(p, size, tenth) return p .. ':rt:' .. size .. ':' .. tenth end,")
        );
        assert_eq!(k.alert_window(30000, 7), "cy:{t}:rt:30000:7");
        assert_eq!(k.webhook_replay_lock("w1"), "cy:{t}:wh:w1:replay");
        assert_eq!(k.tenant(), format!("{}:tenant", k.prefix()));
    }

    #[test]
    fn idempotency_namespaces_never_collide() {
        let k = TenantKeys::new("t");
        assert_ne!(k.idempotency("reserve", &["x"]), k.idempotency("decide", &["x"]));
        assert_ne!(k.idempotency("extend", &["a", "bc"]), k.idempotency("extend", &["ab", "c"]));
    }
}
