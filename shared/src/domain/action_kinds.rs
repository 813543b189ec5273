//! The canonical action-kind registry of protocol v0.1.26 (`action_kinds.json`, the spec's
//! `x-action-kind-registry`): 62 built-in kinds in 5 risk classes, served by
//! `GET /v1/action-kinds`, and the MCP tool-name normalisation that maps a tool to its kind.

use std::sync::LazyLock;

use serde_json::Value;
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
}
