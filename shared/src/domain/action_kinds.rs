//! The canonical action-kind registry of protocol v0.1.26 (`action_kinds.json`, the spec's
//! `x-action-kind-registry`): 62 built-in kinds in 5 risk classes, served by
//! `GET /v1/action-kinds`, and the MCP tool-name normalisation that maps a tool to its kind.

use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

/// The risk classes, in ascending risk.
pub const RISK_CLASSES: [&str; 5] = ["read_only", "local_mutation", "side_effect", "external_side_effect", "high_risk"];

/// The kind an MCP tool falls back to when nothing maps it.
pub const UNKNOWN_KIND: &str = "unknown.call";

/// The registry as published.
pub struct Registry {
    pub version: String,
    /// Every built-in kind (the spec's `ActionKind` objects), in the published order.
    pub kinds: Vec<Value>,
    /// Strong validator of the published registry (a hash of its text).
    pub etag: String,
}

const TEXT: &str = include_str!("action_kinds.json");

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| {
    let doc: Value = serde_json::from_str(TEXT).expect("the action-kind registry is valid JSON");
    let kinds = doc["kinds"].as_array().cloned().unwrap_or_default();
    let etag = format!("\"{}\"", hex::encode(&Sha256::digest(TEXT.as_bytes())[..12]));
    Registry { version: doc["version"].as_str().unwrap_or_default().to_string(), kinds, etag }
});

pub fn registry() -> &'static Registry {
    &REGISTRY
}

impl Registry {
    /// One kind by its exact string.
    pub fn get(&self, kind: &str) -> Option<&Value> {
        self.kinds.iter().find(|k| k["kind"] == kind)
    }

    /// The kinds of a risk class (or all), deprecated ones only when asked for.
    pub fn select(&self, risk_class: Option<&str>, deprecated: bool) -> Vec<&Value> {
        self.kinds
            .iter()
            .filter(|k| risk_class.is_none_or(|r| k["risk_class"] == r))
            .filter(|k| deprecated || k["deprecated"] != true)
            .collect()
    }

    /// The registered kind of an MCP tool name by the conventional prefixes (the longest
    /// matching prefix wins), else `unknown.call`.
    pub fn mcp_kind(&self, tool: &str) -> &str {
        let tool = tool.to_ascii_lowercase();
        self.kinds
            .iter()
            .flat_map(|k| {
                let prefixes = k["mcp_tool_prefixes"].as_array().into_iter().flatten().filter_map(Value::as_str);
                prefixes.map(move |p| (p, k["kind"].as_str().unwrap_or(UNKNOWN_KIND)))
            })
            .filter(|(p, _)| tool.starts_with(&p.to_ascii_lowercase()))
            .max_by_key(|(p, _)| p.len())
            .map(|(_, kind)| kind)
            .unwrap_or(UNKNOWN_KIND)
    }
}

/// The risk class of a kind neither registered nor declared (`proprietary.action`).
pub const UNREGISTERED_RISK: &str = "side_effect";

/// An operator's declaration of a `custom.<org>.<operation>[.<qualifier>]` kind
/// (`CYCLES_CUSTOM_ACTION_KINDS`, a JSON array of these, validated at start-up).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CustomKind {
    pub kind: String,
    pub risk_class: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub policy_key_spec: Option<Map<String, Value>>,
    #[serde(default)]
    pub mcp_tool_prefixes: Option<Vec<String>>,
}

/// The one grammar of action kinds, applied before any rule on every request (reserve,
/// dry_run, decide, events) and in policy lists: dot-separated segments of lower-case ASCII
/// letters, digits, `_` and `-` (`llm.completion`, `code.exec.shell`), at most 64 characters.
/// So no other spelling of a kind (case, whitespace, control or zero-width characters,
/// look-alike letters, a trailing dot, a prefix such as `mcp:`) can pass a deny list or a
/// quota as a different kind.
pub fn is_canonical_kind(kind: &str) -> bool {
    kind.len() <= 64
        && kind.split('.').all(|s| {
            !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
        })
}

/// Whether a string has the shape of a kind in a policy list or a declaration: canonical, of
/// at least two segments (`<category>.<operation>[.<qualifier>...]`).
pub fn is_kind_shaped(kind: &str) -> bool {
    is_canonical_kind(kind) && kind.contains('.')
}

/// Parses and validates the custom-kind declarations: each kind `custom.<org>.<operation>...`,
/// a known risk class, a policy key spec of the spec's four dimensions, declared once. A tool
/// prefix a built-in kind already claims is logged and left to the built-in.
pub fn parse_custom_kinds(text: &str) -> Result<Vec<CustomKind>, String> {
    let kinds: Vec<CustomKind> = serde_json::from_str(text)
        .map_err(|e| format!("CYCLES_CUSTOM_ACTION_KINDS is not a list of declarations: {e}"))?;
    let mut seen = std::collections::HashSet::new();
    for k in &kinds {
        let bad = |why: &str| Err(format!("CYCLES_CUSTOM_ACTION_KINDS: {:?} {why}", k.kind));
        if !k.kind.starts_with("custom.") || k.kind.split('.').count() < 3 || !is_kind_shaped(&k.kind) {
            return bad("is not custom.<org>.<operation>[.<qualifier>] (lower-case letters, digits, _)");
        }
        if !RISK_CLASSES.contains(&k.risk_class.as_str()) {
            return bad("has no valid risk_class");
        }
        if k.description.as_ref().is_some_and(|d| d.chars().count() > 512) {
            return bad("has a description over 512 characters");
        }
        let dims = ["host", "recipient_domain", "resource_type", "path_prefix"];
        if k.policy_key_spec.as_ref().is_some_and(|s| s.keys().any(|d| !dims.contains(&d.as_str()))) {
            return bad(
                "has a policy_key_spec dimension other than host, recipient_domain, resource_type, path_prefix",
            );
        }
        if !seen.insert(k.kind.clone()) {
            return bad("is declared twice");
        }
        for p in k.mcp_tool_prefixes.iter().flatten() {
            if registry().mcp_kind(p) != UNKNOWN_KIND {
                tracing::warn!(kind = %k.kind, prefix = %p, "a custom kind's MCP prefix overlaps a built-in kind's; the built-in wins");
            }
        }
    }
    Ok(kinds)
}

/// What the reservation path knows of a request's kind: its risk class, the policy keys that
/// matter for it (`None`: no policy-key matching), and the replacement of a deprecated kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindInfo {
    pub risk_class: String,
    pub key_spec: Option<Map<String, Value>>,
    pub replacement: Option<String>,
}

/// Resolves a request's kind: a built-in, a declared custom kind, an unregistered kind
/// (`side_effect`, no policy-key matching), or, for an undeclared `custom.*` kind, the
/// 400 message (custom kinds are governed: no default applies to them).
pub fn kind_info(kind: &str, custom: &[CustomKind]) -> Result<KindInfo, String> {
    registry().kind_info(kind, custom)
}

impl Registry {
    /// `kind_info` against this registry.
    pub fn kind_info(&self, kind: &str, custom: &[CustomKind]) -> Result<KindInfo, String> {
        if let Some(k) = self.get(kind) {
            return Ok(KindInfo {
                risk_class: k["risk_class"].as_str().unwrap_or(UNREGISTERED_RISK).to_string(),
                key_spec: k["policy_key_spec"].as_object().cloned(),
                replacement: (k["deprecated"] == true)
                    .then(|| k["replacement_kind"].as_str().unwrap_or(UNKNOWN_KIND).to_string()),
            });
        }
        if let Some(c) = custom.iter().find(|c| c.kind == kind) {
            return Ok(KindInfo {
                risk_class: c.risk_class.clone(),
                key_spec: c.policy_key_spec.clone(),
                replacement: None,
            });
        }
        if kind.starts_with("custom.") {
            return Err(format!(
                "action.kind {kind:?} is not registered: custom.* kinds must be declared by the operator"
            ));
        }
        tracing::info!(kind, "unregistered action kind (risk class side_effect)");
        Ok(KindInfo { risk_class: UNREGISTERED_RISK.to_string(), key_spec: None, replacement: None })
    }
}

impl KindInfo {
    /// The request's policy keys that take part in matching: only the dimensions the kind's
    /// policy key spec declares (hosts and domains lower-cased); `{}` when none.
    pub fn matching_keys(&self, keys: Option<&Value>) -> Value {
        let mut out = Map::new();
        let (Some(spec), Some(keys)) = (&self.key_spec, keys) else { return Value::Object(out) };
        for dim in ["host", "recipient_domain", "resource_type"] {
            let declared = match &spec.get(dim) {
                Some(Value::Bool(b)) => *b,
                Some(Value::String(_)) => true,
                _ => false,
            };
            if let (true, Some(v)) = (declared, keys.get(dim).and_then(Value::as_str)) {
                let v = if dim == "resource_type" { v.to_string() } else { v.to_ascii_lowercase() };
                out.insert(dim.to_string(), json!(v));
            }
        }
        Value::Object(out)
    }
}

/// Whether a kind may be named by a policy's quota: a built-in or a declared custom kind.
pub fn is_known(kind: &str, custom: &[CustomKind]) -> bool {
    registry().get(kind).is_some() || custom.iter().any(|c| c.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_has_62_kinds_in_5_risk_classes() {
        let r = registry();
        assert_eq!((r.version.as_str(), r.kinds.len()), ("0.1.26", 62));
        for k in &r.kinds {
            let (kind, risk) = (k["kind"].as_str().unwrap(), k["risk_class"].as_str().unwrap());
            assert!(RISK_CLASSES.contains(&risk), "{kind}: {risk}");
            assert!(kind.len() <= 64 && kind.split('.').count() >= 2, "{kind}");
            assert!(k["description"].as_str().is_none_or(|d| d.chars().count() <= 512), "{kind}");
        }
        let counts: Vec<usize> = RISK_CLASSES.iter().map(|c| r.select(Some(c), true).len()).collect();
        assert_eq!(counts.iter().sum::<usize>(), 62);
        assert!(counts.iter().all(|n| *n > 0));
        assert_eq!(r.get("llm.completion").unwrap()["risk_class"], "side_effect");
        assert!(r.get("llm").is_none() && r.get("LLM.completion").is_none(), "exact match only");
    }

    #[test]
    fn mcp_tools_map_by_their_longest_prefix() {
        let r = registry();
        assert_eq!(r.mcp_kind("openai_embed_text"), "llm.embedding", "openai_embed beats nothing shorter");
        assert_eq!(r.mcp_kind("web_search_news"), "web.search");
        assert_eq!(r.mcp_kind("frobnicate"), UNKNOWN_KIND);
        assert_eq!(r.get(UNKNOWN_KIND).unwrap()["risk_class"], "side_effect");
        // no prefix is claimed by two kinds (ambiguous resolution is not allowed)
        let mut seen = std::collections::HashMap::new();
        for k in &r.kinds {
            for p in k["mcp_tool_prefixes"].as_array().into_iter().flatten() {
                let p = p.as_str().unwrap();
                assert!(seen.insert(p, k["kind"].clone()).is_none(), "prefix {p} claimed twice");
            }
        }
    }

    #[test]
    fn kinds_resolve_to_their_risk_class_and_declared_keys() {
        let custom = parse_custom_kinds(
            r#"[{"kind":"custom.acme.erp.post","risk_class":"high_risk","policy_key_spec":{"resource_type":"ledger"}}]"#,
        )
        .unwrap();
        let email = kind_info("message.email.send", &custom).unwrap();
        assert_eq!(email.risk_class, "external_side_effect");
        let keys =
            json!({"host": "SMTP.Example.com", "recipient_domain": "x.org", "resource_type": "t", "path_prefix": "/a"});
        assert_eq!(email.matching_keys(Some(&keys)), json!({"host": "smtp.example.com", "recipient_domain": "x.org"}));
        let unregistered = kind_info("proprietary.action", &custom).unwrap();
        assert_eq!(unregistered.risk_class, "side_effect");
        assert_eq!(unregistered.matching_keys(Some(&keys)), json!({}), "no policy-key matching");
        let erp = kind_info("custom.acme.erp.post", &custom).unwrap();
        assert_eq!(
            (erp.risk_class.as_str(), erp.matching_keys(Some(&keys))),
            ("high_risk", json!({"resource_type": "t"}))
        );
        assert!(kind_info("custom.acme.other", &custom).unwrap_err().contains("not registered"));
        assert!(is_known("llm.completion", &custom) && is_known("custom.acme.erp.post", &custom));
        assert!(!is_known("proprietary.action", &custom));
    }

    #[test]
    fn a_deprecated_kind_is_kept_and_names_its_replacement() {
        let r = Registry {
            version: "x".into(),
            kinds: vec![json!({"kind": "old.call", "risk_class": "read_only", "deprecated": true,
                "replacement_kind": "new.call"})],
            etag: String::new(),
        };
        let info = r.kind_info("old.call", &[]).unwrap();
        assert_eq!((info.risk_class.as_str(), info.replacement.as_deref()), ("read_only", Some("new.call")));
        assert_eq!(registry().kind_info("llm.completion", &[]).unwrap().replacement, None);
    }

    #[test]
    fn custom_declarations_are_validated_at_load() {
        for bad in [
            r#"[{"kind":"acme.erp.post","risk_class":"high_risk"}]"#,
            r#"[{"kind":"custom.acme","risk_class":"high_risk"}]"#,
            r#"[{"kind":"custom.acme.Post","risk_class":"high_risk"}]"#,
            r#"[{"kind":"custom.acme.post","risk_class":"scary"}]"#,
            r#"[{"kind":"custom.acme.post","risk_class":"read_only","policy_key_spec":{"color":true}}]"#,
            r#"[{"kind":"custom.acme.post","risk_class":"read_only"},{"kind":"custom.acme.post","risk_class":"read_only"}]"#,
            r#"{"kind":"custom.acme.post"}"#,
        ] {
            assert!(parse_custom_kinds(bad).is_err(), "{bad}");
        }
        let ok = parse_custom_kinds(
            r#"[{"kind":"custom.acme.sap.query","risk_class":"read_only","mcp_tool_prefixes":["llm_x"]}]"#,
        );
        assert_eq!(ok.unwrap().len(), 1, "an overlapping prefix is a warning, not an error");
    }
}
