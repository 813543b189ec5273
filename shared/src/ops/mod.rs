//! The typed seam between Rust and Lua. Each script (`lua/<name>.lua`) has one call type here:
//! a struct whose fields are its keys and arguments by name, in the order the script receives
//! them, and the reply type its answer decodes into (in one place, `store::Reply::decode`).
//! The script body sees the same names (`K.tenant`, `A.digest`). Modules group the scripts by
//! the stored objects they change; each stored object has one record type. The HTTP handlers
//! (`api`) and the scheduled jobs (`jobs`) call these, and nothing below them.

pub mod audit;
pub mod auth;
pub mod bulk;
pub mod events;
pub mod evidence;
pub mod export;
pub mod ledgers;
pub mod listing;
pub mod maintenance;
pub mod operators;
pub mod overview;
pub mod policies;
pub mod quotas;
pub mod records;
pub mod reservations;
pub mod settings;
pub mod tenants;
pub mod transfer;
pub mod usage;
pub mod webhooks;

use std::sync::LazyLock;

use serde::{Deserialize, Deserializer};

use crate::store::{Call, Library, Script};

/// Declares one script's call: the struct (keys, then arguments, each a `String`; a name after
/// `;` takes the rest as a list), its reply type, and whether it only reads (`read_only`,
/// registered `no-writes`).
macro_rules! script {
    (
        $(#[$doc:meta])*
        $vis:vis struct $name:ident = $file:ident $($ro:ident)? -> $reply:ty {
            keys: [$($key:ident),* $(; $keys:ident)?],
            args: [$($arg:ident),* $(; $args:ident)?] $(,)?
        }
    ) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Default)]
        $vis struct $name {
            $(pub $key: String,)*
            $(pub $keys: Vec<String>,)?
            $(pub $arg: String,)*
            $(pub $args: Vec<String>,)?
        }

        impl $crate::store::Call for $name {
            const SCRIPT: $crate::store::Script = $crate::store::Script {
                name: stringify!($file),
                body: include_str!(concat!("../../../lua/", stringify!($file), ".lua")),
                keys: &[$(stringify!($key),)* $(concat!(stringify!($keys), ".."))?],
                args: &[$(stringify!($arg),)* $(concat!(stringify!($args), ".."))?],
                read_only: script!(@read_only $($ro)?),
            };
            type Reply = $reply;

            fn library() -> &'static $crate::store::Library {
                &$crate::ops::LIBRARY
            }

            fn into_parts(self) -> (Vec<String>, Vec<String>) {
                #[allow(unused_mut)]
                let mut keys = vec![$(self.$key),*];
                $(keys.extend(self.$keys);)?
                #[allow(unused_mut)]
                let mut args = vec![$(self.$arg),*];
                $(args.extend(self.$args);)?
                (keys, args)
            }
        }
    };
    (@read_only read_only) => { true };
    (@read_only) => { false };
}
pub(crate) use script;

/// Every script, for the library.
const SCRIPTS: &[Script] = &[
    reservations::Reserve::SCRIPT,
    reservations::RESERVE_GOVERNED,
    reservations::Commit::SCRIPT,
    reservations::Release::SCRIPT,
    reservations::Extend::SCRIPT,
    reservations::GetReservation::SCRIPT,
    reservations::Evaluate::SCRIPT,
    reservations::Charge::SCRIPT,
    listing::List::SCRIPT,
    listing::ReadRecords::SCRIPT,
    listing::ReadMetadata::SCRIPT,
    listing::Backfill::SCRIPT,
    listing::Compact::SCRIPT,
    listing::Flush::SCRIPT,
    ledgers::ListLedgers::SCRIPT,
    ledgers::ReadLedgers::SCRIPT,
    ledgers::CreateBudget::SCRIPT,
    ledgers::UpdateBudget::SCRIPT,
    ledgers::FundBudget::SCRIPT,
    auth::Authenticate::SCRIPT,
    auth::Validate::SCRIPT,
    auth::CreateApiKey::SCRIPT,
    auth::UpdateApiKey::SCRIPT,
    auth::CountMinute::SCRIPT,
    auth::AuthFailure::SCRIPT,
    auth::ExpireKeys::SCRIPT,
    operators::CreateOperatorKey::SCRIPT,
    operators::UpdateOperatorKey::SCRIPT,
    operators::CheckOperatorKey::SCRIPT,
    tenants::CreateTenant::SCRIPT,
    tenants::UpdateTenant::SCRIPT,
    tenants::CascadeStep::SCRIPT,
    webhooks::WriteSubscription::SCRIPT,
    webhooks::Enqueue::SCRIPT,
    webhooks::Claim::SCRIPT,
    webhooks::RecordAttempt::SCRIPT,
    webhooks::SystemEvent::SCRIPT,
    webhooks::SystemAlert::SCRIPT,
    maintenance::Expire::SCRIPT,
    maintenance::Trim::SCRIPT,
    maintenance::Schedule::SCRIPT,
    maintenance::RollPeriods::SCRIPT,
    maintenance::ReclaimTemplateLedgers::SCRIPT,
    maintenance::Health::SCRIPT,
    records::ReadHashes::SCRIPT,
    settings::WriteWebhookSecurity::SCRIPT,
    policies::WritePolicy::SCRIPT,
    quotas::ListCounters::SCRIPT,
    quotas::ResetCounter::SCRIPT,
    transfer::ReadTenant::SCRIPT,
    transfer::WriteTenant::SCRIPT,
    usage::FoldUsage::SCRIPT,
    export::MarkExport::SCRIPT,
    usage::ReadUsage::SCRIPT,
];

/// The header of the library: the rules, messages, key schema and record layouts the Rust side
/// owns.
fn library_header() -> String {
    // (a library's top level may call no function: patterns are spelled out here)
    let field = "([^\\31]*)";
    let names = |fields: &[&str]| fields.iter().map(|f| format!("'{f}'")).collect::<Vec<_>>().join(", ");
    let joined = |n: usize| vec![field; n].join("\\31");
    let record = &reservations::RECORD_FIELDS;
    // a record by position: the version, then the status character, then the rest
    let record_pattern = |n: usize| format!("^2\\31(.)\\31{}$", joined(n - 2));
    let first_expires = record.iter().position(|f| *f == "first_expires").expect("a record field");
    // a record's first n fields as text, each by name in layout order (`s`: the status
    // character), written out rather than looped over the names (-2.6% of a reserve), as one
    // concatenation (no table of the fields to join)
    let text = |n: usize| {
        let fields: Vec<String> = record[2..n].iter().map(|f| format!("(r.{f} or '')")).collect();
        format!("[{n}] = function(r, s) return '2\\31' .. s .. '\\31' .. {} end", fields.join(" .. '\\31' .. "))
    };
    let texts =
        [reservations::RECORD_HEAD_FIELDS, reservations::RECORD_ACTIVE_FIELDS, record.len()].map(text).join(",\n    ");
    // `RECORD.metadata_key(key)`: the metadata key beside a record's, for the scripts that
    // reach it rarely and so do not name it (each key a call names costs it ~1.7k instructions)
    format!(
        "{}{}{}local LEDGER_VIEW = {{fields = {{{}}}, pattern = '^{}$', memo = {{known = {{}}, texts = {{}}, kept = 0, max = 2000}}}}\n\
         local RECORD = {{fields = {{{}}}, active_fields = {}, head_fields = {},\n  text = {{{}}},\n  \
         active = '{}',\n  \
         finished = '{}',\n  \
         head = '^2\\31(.)\\31{}\\31()',\n  \
         before_first_expires = '^({})([^\\31]*)(.*)$', metadata_key = function(key) local p = KEY.prefix_of(key) \
         return KEY.reservation_metadata(p, string.sub(key, #KEY.reservation(p, '') + 1)) end}}\n",
        crate::domain::rules::lua_table(),
        crate::domain::messages::lua_table(),
        crate::keys::lua_table(),
        names(&ledgers::VIEW_FIELDS),
        joined(ledgers::VIEW_FIELDS.len()),
        names(record),
        reservations::RECORD_ACTIVE_FIELDS,
        reservations::RECORD_HEAD_FIELDS,
        texts,
        record_pattern(reservations::RECORD_ACTIVE_FIELDS),
        record_pattern(record.len()),
        joined(reservations::RECORD_HEAD_FIELDS - 2),
        // the fields between the head and first_expires (an extension rewrites that one)
        "[^\\31]*\\31".repeat(first_expires - reservations::RECORD_HEAD_FIELDS),
    )
}

macro_rules! modules {
    ($($name:literal),* $(,)?) => {
        /// The helper modules of the library (`lua/lib/<name>.lua`), one concern each, in the
        /// order they are loaded: a module uses only what it defines and what the modules it names
        /// on its `-- needs:` line (all earlier) define (`tests::library_modules_declare_what_they_use`).
        pub const MODULES: &[(&str, &str)] = &[$(($name, include_str!(concat!("../../../lua/lib/", $name, ".lua")))),*];
    };
}
modules![
    "decimal",
    "reply",
    "calendar",
    "access",
    "record",
    "tenant",
    "events",
    "ledger",
    "alerts",
    "periods",
    "policies",
    "quotas",
    "guards",
    "usage",
    "listing",
    "reservation",
    "decision",
    "governance",
    "deliveries"
];

/// The shared helpers of every script: the header, then the modules in order.
pub fn helpers() -> String {
    let mut out = library_header();
    for (_, text) in MODULES {
        out.push_str(text);
        out.push('\n');
    }
    out
}

/// The Cycles script library: the helpers and every script.
pub static LIBRARY: LazyLock<Library> = LazyLock::new(|| Library::new("cycles", helpers(), SCRIPTS));

/// A list in a script's answer. Lua's JSON encoder writes an empty table as `{}`, so an empty
/// list may come as an empty object. (Read as it comes: an untagged enum would buffer it.)
pub(crate) fn lua_list<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    d.deserialize_any(LuaList(|seq| seq, std::marker::PhantomData))
}

/// Reads a Lua list (`lua_list`) and makes it into `V` by `make`, which sees its items.
struct LuaList<T, F>(F, std::marker::PhantomData<T>);

impl<'de, T: Deserialize<'de>, V, F: FnOnce(Vec<T>) -> V> serde::de::Visitor<'de> for LuaList<T, F> {
    type Value = V;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list (or an empty object)")
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<V, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(64));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok((self.0)(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<V, A::Error> {
        match map.next_key::<serde::de::IgnoredAny>()? {
            None => Ok((self.0)(Vec::new())),
            Some(_) => Err(serde::de::Error::custom("expected a list, found an object with members")),
        }
    }
}

/// Drops a stream's entries older than `horizon_ms` (retention): how many went.
pub async fn trim_stream(store: &crate::store::Store, key: &str, horizon_ms: i64) -> crate::error::ApiResult<u64> {
    Ok(redis::cmd("XTRIM").arg(key).arg("MINID").arg(horizon_ms.max(0)).query_async(&mut store.conn()).await?)
}

/// An answer that carries nothing but its status.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Nothing {}

/// A ledger's amounts as answers carry them (`balances` in `lua/lib/record.lua`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerState {
    pub allocated: i64,
    pub remaining: i64,
    pub reserved: i64,
    pub spent: i64,
    pub debt: i64,
    pub overdraft_limit: i64,
    pub over_limit: bool,
}

impl LedgerState {
    /// One ledger from its amounts in order (allocated, remaining, reserved, spent, debt,
    /// overdraft limit, "1" when over the limit); `None` unless exactly those, well formed.
    fn from_parts<'a>(parts: impl IntoIterator<Item = &'a str>) -> Option<LedgerState> {
        let parts: Vec<&str> = parts.into_iter().collect();
        let [a, r, res, s, d, o, over] = parts.as_slice() else { return None };
        let n = |v: &str| v.parse::<i64>().ok();
        Some(LedgerState {
            allocated: n(a)?,
            remaining: n(r)?,
            reserved: n(res)?,
            spent: n(s)?,
            debt: n(d)?,
            overdraft_limit: n(o)?,
            over_limit: match *over {
                "1" => true,
                "0" => false,
                _ => return None,
            },
        })
    }

    /// The ledgers of a `balances` text: each as its amounts separated by spaces, ledgers
    /// separated by commas ('' for none).
    pub fn parse_all(text: &str) -> Option<Vec<LedgerState>> {
        text.split(',').filter(|l| !l.is_empty()).map(|l| Self::from_parts(l.split(' '))).collect()
    }

    /// The wire `Balance` of this ledger at `scope` in `unit` (debt and overdraft limit only
    /// when not zero, the over-limit flag only when set).
    pub fn balance(&self, scope: &str, unit: crate::model::Unit) -> crate::model::Balance {
        use crate::model::{Amount, Balance};
        let amount = |amount| Amount { unit, amount };
        let optional = |n: i64| (n != 0).then_some(amount(n));
        Balance {
            scope: crate::domain::leaf_segment(scope).to_string(),
            scope_path: scope.to_string(),
            remaining: amount(self.remaining),
            reserved: Some(amount(self.reserved)),
            spent: Some(amount(self.spent)),
            allocated: Some(amount(self.allocated)),
            debt: optional(self.debt),
            overdraft_limit: optional(self.overdraft_limit),
            is_over_limit: self.over_limit.then_some(true),
        }
    }
}

/// Balances in a script's answer: the text `balances` writes, or (answers stored by earlier
/// versions) a list of 7-string lists. Anything else is malformed: the reply is a fault.
pub(crate) fn ledger_states<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<LedgerState>, D::Error> {
    d.deserialize_any(BalancesText)
}

struct BalancesText;

impl<'de> serde::de::Visitor<'de> for BalancesText {
    type Value = Vec<LedgerState>;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("balances (text, or a list of 7-string lists)")
    }
    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Vec<LedgerState>, E> {
        LedgerState::parse_all(text).ok_or_else(|| E::custom("malformed balances"))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<LedgerState>, A::Error> {
        let rows = |rows: Vec<Vec<String>>| -> Option<Vec<LedgerState>> {
            rows.iter().map(|row| LedgerState::from_parts(row.iter().map(String::as_str))).collect()
        };
        let lists = LuaList(rows, std::marker::PhantomData);
        lists.visit_seq(seq)?.ok_or_else(|| serde::de::Error::custom("malformed balances"))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Vec<LedgerState>, A::Error> {
        LuaList(|_: Vec<Vec<String>>| Vec::new(), std::marker::PhantomData).visit_map(map)
    }
}

impl<'de> Deserialize<'de> for LedgerState {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<LedgerState, D::Error> {
        match ledger_states(d)?.as_slice() {
            [one] => Ok(one.clone()),
            _ => Err(serde::de::Error::custom("expected one ledger")),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{HashMap, HashSet};

    use super::{helpers, MODULES, SCRIPTS};
    use crate::store::{definitions, identifiers};

    /// Keys are spelled in `keys.rs` only: Lua gets them as its keys or from the generated `KEY`
    /// table, and never builds one (no literal that starts a key's suffix, such as ':tenant').
    #[test]
    fn no_script_builds_a_key() {
        let sources = MODULES.iter().map(|(name, text)| (*name, *text)).chain(SCRIPTS.iter().map(|s| (s.name, s.body)));
        for (name, text) in sources {
            for line in text.lines().map(|l| l.split("--").next().unwrap_or_default()) {
                for quote in ['\'', '"'] {
                    for literal in line.split(quote).skip(1).step_by(2) {
                        let suffix =
                            literal.strip_prefix(':').is_some_and(|r| r.starts_with(|c: char| c.is_ascii_alphabetic()));
                        assert!(!suffix && !literal.contains("cy:"), "{name} builds a key: {line}");
                    }
                }
            }
        }
    }

    /// Lua (5.1, as Redis runs it) allows 200 locals in one function, and the library's top
    /// level is one function: past the limit FUNCTION LOAD fails and every script falls back to
    /// EVALSHA, which costs more per call. The bound keeps room for growth and for a script body
    /// evaluated with the whole library (as the decimal tests do); past it, group constants
    /// into a table or a helper's private functions under one name (as `long_amount`).
    #[test]
    fn the_library_top_level_keeps_room_under_the_lua_local_limit() {
        let names: usize = definitions(&helpers()).iter().map(|(names, _)| names.len()).sum();
        assert!(names <= 180, "the library's top level defines {names} locals (at most 180)");
    }

    /// Whether a line of Lua writes into `K` or `A` (or `ask.K`, `ask.A`): assigns one of their
    /// fields, or hands one of their lists to a table function that changes it.
    fn writes_into_k_or_a(line: &str) -> bool {
        let code = line.split("--").next().unwrap_or_default();
        let word = |c: char| c.is_alphanumeric() || c == '_';
        for table in ["K", "A"] {
            for (at, _) in code.match_indices(table) {
                let before = code[..at].chars().next_back();
                let free = |c: Option<char>| c.is_none_or(|c| !word(c) && c != '.');
                let owned = free(before) || (code[..at].ends_with("ask.") && free(code[..at - 4].chars().next_back()));
                let rest = &code[at + 1..];
                if !owned || !(rest.starts_with('.') || rest.starts_with('[')) {
                    continue;
                }
                // past the field and its indexes
                let end = rest.char_indices().skip(1).find(|&(_, c)| !(word(c) || "[].#".contains(c)));
                let after = rest[end.map_or(rest.len(), |(i, _)| i)..].trim_start();
                if after.starts_with('=') && !after.starts_with("==") {
                    return true;
                }
                // one target of several (`A.x, y = ...`): an assignment's list of targets opens
                // the statement, before any `=`, bracket or keyword
                let lead = code[..at].trim_start();
                let targets = lead.chars().all(|c| word(c) || " .,[]".contains(c))
                    && !["local ", "return ", "if ", "elseif ", "for ", "while "].iter().any(|k| lead.starts_with(k));
                if after.starts_with(',') && targets {
                    let tail = &after[1..];
                    let eq = tail.find('=').filter(|&i| !tail[i..].starts_with("=="));
                    if eq.is_some_and(|i| tail[..i].chars().all(|c| word(c) || " .,[]".contains(c))) {
                        return true;
                    }
                }
            }
        }
        ["table.insert(", "table.remove(", "table.sort("].iter().any(|call| {
            code.match_indices(call).any(|(at, _)| {
                let arg = code[at + call.len()..].trim_start();
                let arg = arg.strip_prefix("ask.").unwrap_or(arg);
                arg.starts_with("K.") || arg.starts_with("A.")
            })
        })
    }

    /// A library function's `K` and `A` tables outlive its calls (`Script::kept_prologue`), so no
    /// script or helper writes into them.
    #[test]
    fn scripts_never_write_into_k_or_a() {
        for line in
            ["A.amount = '1'", "  ask.K.budgets[1] = x", "K.x=1", "table.insert(ask.A.scopes, s)", "A.m, b = 1, 2"]
        {
            assert!(writes_into_k_or_a(line), "not caught: {line}");
        }
        let fine =
            ["if A.amount == '1' then", "local x = A.amount", "B.x = 1", "ask.B = 1", "-- A.x = 1", "mask.A.x = 1"];
        for line in fine.into_iter().chain(["local a, b = A.m, A.n", "f({x = K.a, y = 2})", "x, y = A.m, 2"]) {
            assert!(!writes_into_k_or_a(line), "caught wrongly: {line}");
        }
        let texts = SCRIPTS.iter().map(|s| (s.name, s.body)).chain(MODULES.iter().copied());
        for (name, text) in texts {
            for line in text.lines() {
                assert!(!writes_into_k_or_a(line), "{name} writes into K or A: {line}");
            }
        }
    }

    /// Every helper a module uses is its own (defined before the use) or comes from a module its
    /// `-- needs:` line names, which loads earlier; every module it names is used; nothing is
    /// declared ahead of its definition; no module grows past 350 lines.
    #[test]
    fn library_modules_declare_what_they_use() {
        let mut owner: HashMap<&str, &str> = HashMap::new();
        let mut problems = Vec::new();
        for (module, text) in MODULES {
            for (names, _) in definitions(text) {
                for name in names {
                    if let Some(other) = owner.insert(name, module) {
                        problems.push(format!("{name} is defined in {other} and in {module}"));
                    }
                }
            }
        }
        let mut loaded: Vec<&str> = Vec::new();
        for (module, text) in MODULES {
            let lines = text.lines().count();
            if lines > 350 {
                problems.push(format!("{module}.lua has {lines} lines (at most 350)"));
            }
            let needs: Vec<&str> = text
                .lines()
                .find_map(|l| l.strip_prefix("-- needs: "))
                .map(|l| l.split(',').map(str::trim).filter(|n| *n != "nothing").collect())
                .unwrap_or_else(|| {
                    problems.push(format!("{module}.lua does not say what it needs"));
                    Vec::new()
                });
            for n in &needs {
                if !loaded.contains(n) {
                    problems.push(format!("{module} needs {n}, which is not loaded before it"));
                }
            }
            for line in text.lines() {
                let forward =
                    line.strip_prefix("local ").is_some_and(|r| r.chars().all(|c| c.is_alphanumeric() || c == '_'))
                        || line
                            .split_once(" = function")
                            .is_some_and(|(n, _)| !n.starts_with("local") && !n.contains(' ') && !n.is_empty());
                if forward {
                    problems.push(format!("{module}: forward declaration {line:?}"));
                }
            }
            let mut defined_here: HashSet<&str> = HashSet::new();
            let mut used_modules: HashSet<&str> = HashSet::new();
            for (names, body) in definitions(text) {
                // a definition may use itself (recursion), what its module defined before it, and
                // what the modules it needs define
                let own: HashSet<&str> = names.iter().copied().collect();
                for id in identifiers(&body) {
                    let Some(&from) = owner.get(id) else { continue };
                    if own.contains(id) {
                        continue;
                    }
                    if from == *module {
                        if !defined_here.contains(id) {
                            problems.push(format!("{module}: {:?} uses {id} before it is defined", names));
                        }
                    } else if needs.contains(&from) {
                        used_modules.insert(from);
                    } else {
                        problems.push(format!("{module}: {:?} uses {id} of {from}, which it does not name", names));
                    }
                }
                defined_here.extend(names);
            }
            for n in &needs {
                if !used_modules.contains(n) {
                    problems.push(format!("{module} names {n} but uses nothing of it"));
                }
            }
            loaded.push(module);
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
    /// Script answers are read in one pass: a reserve's three answers told apart by their
    /// fields, balances as text or as lists, Lua's empty table as an empty list; anything else
    /// is an error (a fault), never a silently empty value.
    #[test]
    fn script_answers_decode_in_one_pass_and_refuse_what_is_malformed() {
        use super::reservations::Reserved;
        let states =
            |v: serde_json::Value| -> Result<Vec<super::LedgerState>, serde_json::Error> { super::ledger_states(v) };
        let held: Reserved = serde_json::from_str(
            r#"{"reservation_id":"t.x.c","decision":"ALLOW","expires_at_ms":"17","balances":"10 9 1 0 0 0 0"}"#,
        )
        .unwrap();
        let Reserved::Held(h) = held else { panic!("{held:?}") };
        assert_eq!((h.reservation_id.as_str(), h.expires_at_ms.as_str(), h.balances.len()), ("t.x.c", "17", 1));
        assert_eq!((h.balances[0].allocated, h.balances[0].remaining, h.balances[0].reserved), (10, 9, 1));
        let reclaim: Reserved = serde_json::from_str(r#"{"reclaim":["a","b"]}"#).unwrap();
        assert!(matches!(reclaim, Reserved::Reclaim { ref reclaim } if reclaim == &["a", "b"]), "{reclaim:?}");
        let observed: Reserved = serde_json::from_str(
            r#"{"decision":"DENY","reason_code":"BUDGET_EXCEEDED","balances":{},"observed":true}"#,
        )
        .unwrap();
        let Reserved::Observed(e) = observed else { panic!("{observed:?}") };
        assert_eq!(
            (e.decision.as_str(), e.reason_code.as_deref(), e.observed),
            ("DENY", Some("BUDGET_EXCEEDED"), true)
        );
        for bad in [r#"{"reservation_id":"t.x.c","decision":"ALLOW","balances":""}"#, r#"{"balances":""}"#] {
            assert!(serde_json::from_str::<Reserved>(bad).is_err(), "{bad}");
        }
        let listed = states(serde_json::json!([["1", "2", "3", "4", "5", "6", "1"]])).unwrap();
        assert_eq!((listed[0].allocated, listed[0].debt, listed[0].over_limit), (1, 5, true));
        assert!(states(serde_json::json!({})).unwrap().is_empty());
        for bad in
            [serde_json::json!({"a": 1}), serde_json::json!("1 2"), serde_json::json!([["1"]]), serde_json::json!(7)]
        {
            assert!(states(bad.clone()).is_err(), "{bad}");
        }
        let list = |v: serde_json::Value| super::lua_list::<_, String>(v);
        assert_eq!(list(serde_json::json!(["a"])).unwrap(), ["a"]);
        assert!(list(serde_json::json!({})).unwrap().is_empty());
        assert!(list(serde_json::json!({"a": "b"})).is_err());
    }
}

#[cfg(test)]
mod reserve_size {
    /// How many lines a script runs, as a server without Functions gets it: the script and the
    /// helpers it uses (comments and blank lines not counted).
    fn as_run(name: &str) -> usize {
        let s = super::SCRIPTS.iter().find(|s| s.name == name).unwrap();
        let body = format!("{}{}", s.prologue("KEYS", "ARGV"), s.body);
        let linked = crate::store::link(&super::helpers(), &body);
        linked.lines().filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with("--")).count()
    }

    /// A reserve as run must not grow unexplained: BENCHMARKS.md ("A reserve as run") records
    /// each raise of these bounds and its reason. A plain tenant's reserve carries none of the
    /// governance (policies, action rules, guards, templates, periods, observe mode): that is
    /// the governed reserve's, which it hands such calls to.
    #[test]
    fn a_reserve_as_run_does_not_grow() {
        let plain = as_run("reserve");
        assert!(plain <= 795, "a plain tenant's reserve as run is {plain} lines of code (at most 795; target 700)");
        let governed = as_run("reserve_governed");
        assert!(governed <= 1_619, "a governed reserve as run is {governed} lines of code (at most 1,619)");
    }
}
