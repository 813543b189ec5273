//! Policy scope patterns: their grammar, and which scope paths they match. The scripts match
//! with `pattern_matches` in `lua/lib/policies.lua`; this is the same rule, for validation and tests.
//!
//! A pattern is `/`-separated segments. `level:value` matches that segment exactly,
//! `level:*` any value of that level, and `*` one or more whole segments. A pattern that does
//! not start with `tenant:` or `*` is matched against the end of the path (`agent:*` matches
//! every path whose last segment is an agent). Matching is case-insensitive (scope paths are
//! lower-case).

use super::LEVELS;

/// The longest scope pattern accepted.
pub const MAX_PATTERN_LEN: usize = 512;

/// The pattern in its stored (lower-case) form, or why it is not one. A pattern that names a
/// tenant must name `tenant` (a policy governs its own tenant's scopes only).
pub fn validate_pattern(pattern: &str, tenant: &str) -> Result<String, String> {
    let p = pattern.trim().to_ascii_lowercase();
    if p.is_empty() || p.len() > MAX_PATTERN_LEN {
        return Err(format!("scope_pattern must be 1 to {MAX_PATTERN_LEN} characters"));
    }
    for (i, segment) in p.split('/').enumerate() {
        if segment == "*" {
            continue;
        }
        let Some((level, value)) = segment.split_once(':') else {
            return Err(format!("scope_pattern segment {segment:?} is neither level:value, level:* nor *"));
        };
        if !LEVELS.contains(&level) || value.is_empty() || value.contains('*') && value != "*" {
            return Err(format!("scope_pattern segment {segment:?} is neither level:value, level:* nor *"));
        }
        if level == "tenant" && (i != 0 || (value != "*" && value != tenant)) {
            return Err(format!("scope_pattern may name only its own tenant, first ({tenant:?})"));
        }
    }
    Ok(p)
}

/// Whether a (lower-case) pattern matches a scope path.
pub fn pattern_matches(pattern: &str, path: &str) -> bool {
    let mut p: Vec<&str> = pattern.split('/').collect();
    if p[0] != "*" && !p[0].starts_with("tenant:") {
        p.insert(0, "*");
    }
    let s: Vec<&str> = path.split('/').collect();
    fn segment_ok(p: &str, s: &str) -> bool {
        p == s || p.strip_suffix('*').is_some_and(|level| level.ends_with(':') && s.starts_with(level))
    }
    fn walk(p: &[&str], s: &[&str]) -> bool {
        match p.split_first() {
            None => s.is_empty(),
            Some((&"*", rest)) => (1..=s.len()).any(|k| walk(rest, &s[k..])),
            Some((first, rest)) => s.split_first().is_some_and(|(x, tail)| segment_ok(first, x) && walk(rest, tail)),
        }
    }
    walk(&p, &s)
}

/// A pattern's anchor: its fixed prefix, the segments before the first wildcard
/// (`tenant:acme/workspace:eng/*` -> `tenant:acme/workspace:eng`); None when the pattern is not
/// rooted at a tenant (`agent:*`, `*`), whose anchor is the tenant's root. Quotas and rate
/// limits of a policy that counts at its anchor count every matching scope path together.
pub fn anchor(pattern: &str) -> Option<String> {
    let pattern = pattern.to_ascii_lowercase();
    if !pattern.starts_with("tenant:") {
        return None;
    }
    let fixed: Vec<&str> = pattern.split('/').take_while(|s| !s.ends_with('*')).collect();
    Some(fixed.join("/"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn anchors_are_the_fixed_prefix() {
        assert_eq!(super::anchor("tenant:T/*").as_deref(), Some("tenant:t"));
        assert_eq!(super::anchor("tenant:acme/workspace:eng/agent:*").as_deref(), Some("tenant:acme/workspace:eng"));
        assert_eq!(super::anchor("tenant:acme/workspace:eng").as_deref(), Some("tenant:acme/workspace:eng"));
        assert_eq!(super::anchor("tenant:acme/*/agent:x").as_deref(), Some("tenant:acme"));
        assert_eq!(super::anchor("agent:*"), None);
        assert_eq!(super::anchor("*"), None);
    }

    use super::*;

    #[test]
    fn the_spec_examples_match_as_documented() {
        let path = "tenant:acme/workspace:eng/agent:summarizer";
        assert!(pattern_matches("tenant:acme", "tenant:acme"));
        assert!(!pattern_matches("tenant:acme", path), "exact means exact");
        assert!(pattern_matches("tenant:acme/*", path));
        assert!(!pattern_matches("tenant:acme/*", "tenant:acme"), "descendants only");
        assert!(pattern_matches("agent:*", path));
        assert!(!pattern_matches("agent:*", "tenant:acme/agent:a/toolset:t"), "the path must end in an agent");
        assert!(pattern_matches("*/agent:summarizer", path));
        assert!(pattern_matches("tenant:acme/*/agent:summarizer", path));
        assert!(!pattern_matches("tenant:acme/workspace:ops/*", path));
        assert!(pattern_matches("workspace:eng/*", path));
    }

    #[test]
    fn the_grammar_is_checked() {
        assert_eq!(validate_pattern("Tenant:ACME/*", "acme").unwrap(), "tenant:acme/*");
        assert!(validate_pattern("tenant:other/*", "acme").is_err());
        assert!(validate_pattern("agent:*/tenant:acme", "acme").is_err());
        assert!(validate_pattern("robot:x", "acme").is_err());
        assert!(validate_pattern("agent:a*", "acme").is_err());
        assert!(validate_pattern("", "acme").is_err());
        assert!(validate_pattern("agent:", "acme").is_err());
        assert!(validate_pattern("*", "acme").is_ok());
    }
}
