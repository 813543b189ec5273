//! Operator roles, what each route asks of an operator credential, and the tenant patterns that
//! limit an operator key to some tenants.

/// An operator key's role; each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Every read of the operator plane, nothing else.
    Viewer,
    /// Every operation except operator-key management and the deployment-wide webhook
    /// security configuration.
    Operator,
    /// Everything.
    Owner,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Operator, Role::Owner];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Owner => "owner",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// What a route asks of an operator credential (`X-Admin-API-Key`). Every route of the table
/// names one, so a route cannot ship without a decision about who may call it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// No credential at all (health, version, the evidence key set).
    Open,
    /// Tenant API keys only: an operator credential is not honoured.
    Tenant,
    /// An operator credential of at least this role (a tenant key, where the route also takes
    /// one, is judged by its permissions instead).
    Viewer,
    Operator,
    Owner,
}

impl Access {
    /// The least role an operator credential needs here; `None` where none is honoured.
    pub fn role(self) -> Option<Role> {
        match self {
            Access::Open | Access::Tenant => None,
            Access::Viewer => Some(Role::Viewer),
            Access::Operator => Some(Role::Operator),
            Access::Owner => Some(Role::Owner),
        }
    }
}

/// The longest tenant pattern an operator key may carry.
pub const MAX_TENANT_PATTERN: usize = 128;

/// Checks a tenant pattern: tenant-id characters and `*` (any run of characters), at most
/// `MAX_TENANT_PATTERN` long.
pub fn validate_tenant_pattern(pattern: &str) -> Result<(), String> {
    let ok = !pattern.is_empty()
        && pattern.len() <= MAX_TENANT_PATTERN
        && pattern.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'*'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tenant_pattern must be 1 to {MAX_TENANT_PATTERN} characters of letters, digits, '-', '_', '.' and '*'"
        ))
    }
}

/// Whether a text (a tenant id, an IAM principal ARN) matches a pattern: `*` matches any run of
/// characters, none included.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if parts.len() == 1 {
        return pattern == text;
    }
    if text.len() < first.len() + last.len() || !text.starts_with(first) || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(i) => rest = &rest[i + middle.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_include_the_ones_before_them() {
        assert!(Role::Viewer < Role::Operator && Role::Operator < Role::Owner);
        for r in Role::ALL {
            assert_eq!(Role::parse(r.as_str()), Some(r));
        }
        assert_eq!(Role::parse("admin"), None);
    }

    #[test]
    fn tenant_patterns_match_as_globs() {
        assert!(glob_matches("acme", "acme"));
        assert!(!glob_matches("acme", "acme2"));
        assert!(glob_matches("acme-*", "acme-eu"));
        assert!(glob_matches("acme-*", "acme-"));
        assert!(!glob_matches("acme-*", "globex"));
        assert!(glob_matches("*-eu", "acme-eu"));
        assert!(glob_matches("*", "anyone"));
        assert!(glob_matches("a*b*c", "axxbyyc"));
        assert!(!glob_matches("a*b*c", "axxc"));
        assert!(!glob_matches("ab*ba", "aba"));
        assert!(validate_tenant_pattern("acme-*").is_ok());
        assert!(validate_tenant_pattern("").is_err());
        assert!(validate_tenant_pattern("a/b").is_err());
    }
}
