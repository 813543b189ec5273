//! The webhook egress guard (SSRF): which URLs the service may call, and the DNS resolver its
//! HTTP client connects through, so a connection only ever goes to an address that was checked
//! (a name that resolves to a public address when a subscription is written and to a private
//! one when it is delivered reaches nothing).
//!
//! Every address is first reduced to the IPv4 address it carries, if any (IPv4-mapped,
//! IPv4-compatible and IPv4-translated IPv6, NAT64 `64:ff9b::/96`, 6to4 `2002::/16`), then
//! matched against the built-in unsafe ranges (a floor no configuration lowers) and the
//! operator's own blocked ranges.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// A CIDR range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `a.b.c.d/n` or `x:y::/n`; the prefix length must fit the family.
    pub fn parse(s: &str) -> Option<Cidr> {
        let (ip, bits) = s.trim().split_once('/')?;
        let (net, bits): (IpAddr, u8) = (ip.parse().ok()?, bits.parse().ok()?);
        let max = if net.is_ipv4() { 32 } else { 128 };
        (bits <= max).then_some(Cidr { net, bits })
    }

    /// Whether `ip` (of the same family) lies in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (ip, self.net) {
            (IpAddr::V4(a), IpAddr::V4(n)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.bits)).unwrap_or(0);
                u32::from(a) & mask == u32::from(n) & mask
            }
            (IpAddr::V6(a), IpAddr::V6(n)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.bits)).unwrap_or(0);
                u128::from(a) & mask == u128::from(n) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.net, self.bits)
    }
}

/// Parses a comma-separated CIDR list; the first entry that does not parse is the error.
pub fn parse_cidrs(s: &str) -> Result<Vec<Cidr>, String> {
    s.split(',').map(str::trim).filter(|c| !c.is_empty()).map(|c| Cidr::parse(c).ok_or_else(|| c.to_string())).collect()
}

/// Ranges no webhook endpoint may resolve into, whatever the configuration: unspecified,
/// loopback, private, link-local (cloud metadata services live there), CGNAT (and the
/// metadata addresses some clouds put there), ULA, multicast, documentation and reserved
/// ranges of both families.
pub const UNSAFE_RANGES: [&str; 26] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.0.2.0/24",
    "192.88.99.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "198.51.100.0/24",
    "203.0.113.0/24",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "64:ff9b:1::/48",
    "100::/64",
    "2001::/23",
    "2001:db8::/32",
    "fc00::/7",
    "fe80::/10",
    "fec0::/10",
    "ff00::/8",
    // IPv4-mapped addresses are reduced to IPv4 first; any left over are refused outright.
    "::ffff:0:0/96",
];

/// The spec's default `blocked_cidr_ranges` (all inside the unsafe floor; an operator's list
/// adds to the floor, it never replaces it).
pub const DEFAULT_BLOCKED: &str = "10.0.0.0/8,172.16.0.0/12,192.168.0.0/16,127.0.0.0/8,169.254.0.0/16,::1/128,fc00::/7";

static FLOOR: std::sync::LazyLock<Vec<Cidr>> = std::sync::LazyLock::new(|| {
    UNSAFE_RANGES.iter().map(|c| Cidr::parse(c).expect("a valid built-in range")).collect()
});

/// The IPv4 address an IPv6 address carries, if it carries one: IPv4-mapped `::ffff:a.b.c.d`,
/// IPv4-translated `::ffff:0:a.b.c.d`, IPv4-compatible `::a.b.c.d`, NAT64 `64:ff9b::a.b.c.d`
/// and 6to4 `2002:AABB:CCDD::/48`.
pub fn embedded_ipv4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] | [0, 0, 0, 0, 0xffff, 0, _, _] | [0, 0, 0, 0, 0, 0, _, _] => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)),
        _ => None,
    }
}

/// What the guard allows. The floor of `UNSAFE_RANGES` always applies, except under
/// `private_targets`, a development switch that only `cycles-local --dev-webhooks` and the
/// test harness turn on (never a deployed function: no environment variable sets it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRules {
    /// `http://` endpoints as well as `https://`.
    pub allow_http: bool,
    /// Ranges blocked on top of the floor.
    pub blocked: Vec<Cidr>,
    /// When not empty, a URL must match one of these globs (`*` any run of characters).
    pub allowed_url_patterns: Vec<String>,
    /// Development only: private and loopback endpoints are reachable (the floor and the
    /// blocked ranges are not applied).
    pub private_targets: bool,
}

impl Default for EgressRules {
    fn default() -> Self {
        EgressRules {
            allow_http: false,
            blocked: parse_cidrs(DEFAULT_BLOCKED).expect("valid defaults"),
            allowed_url_patterns: Vec::new(),
            private_targets: false,
        }
    }
}

/// The most entries a stored webhook security configuration may list, each.
pub const MAX_SETTINGS_ENTRIES: usize = 256;

/// The operator's webhook security configuration as the spec shapes it (WebhookSecurityConfig).
/// The built-in unsafe ranges apply beyond `blocked_cidr_ranges` whatever it lists.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookSecurity {
    #[serde(default = "spec_default_blocked")]
    pub blocked_cidr_ranges: Vec<String>,
    #[serde(default)]
    pub allowed_url_patterns: Vec<String>,
    #[serde(default)]
    pub allow_http: bool,
}

fn spec_default_blocked() -> Vec<String> {
    DEFAULT_BLOCKED.split(',').map(String::from).collect()
}

impl WebhookSecurity {
    /// Every range a CIDR, every pattern a non-empty URL glob, each list bounded; the first
    /// problem is the error.
    pub fn validate(&self) -> Result<(), String> {
        for (name, list) in
            [("blocked_cidr_ranges", &self.blocked_cidr_ranges), ("allowed_url_patterns", &self.allowed_url_patterns)]
        {
            if list.len() > MAX_SETTINGS_ENTRIES {
                return Err(format!("{name} must have at most {MAX_SETTINGS_ENTRIES} entries"));
            }
        }
        if let Some(bad) = self.blocked_cidr_ranges.iter().find(|c| Cidr::parse(c).is_none()) {
            return Err(format!("blocked_cidr_ranges entry {bad:?} is not a CIDR range"));
        }
        if let Some(bad) = self.allowed_url_patterns.iter().find(|p| p.trim().is_empty() || p.len() > 2048) {
            return Err(format!("allowed_url_patterns entry {bad:?} must be 1 to 2048 characters"));
        }
        Ok(())
    }
}

/// Why a URL was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The URL itself (syntax, scheme, length, allow-list): safe to tell the caller in full.
    Url(String),
    /// The host resolves (or is) a blocked address.
    Blocked(IpAddr),
    /// The host does not resolve.
    Unresolvable(String),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Url(m) => f.write_str(m),
            Refusal::Blocked(ip) => write!(f, "url resolves to a blocked address ({ip})"),
            Refusal::Unresolvable(host) => write!(f, "url host {host} does not resolve"),
        }
    }
}

impl std::error::Error for Refusal {}

impl EgressRules {
    /// The rules for local development and tests: http and private targets allowed.
    pub fn development() -> EgressRules {
        EgressRules { allow_http: true, private_targets: true, ..EgressRules::default() }
    }

    /// The configuration these rules stand for, as in force: under the development switch no
    /// range is blocked, so none is listed (an operator reads the rules that apply).
    pub fn settings(&self) -> WebhookSecurity {
        let blocked = if self.private_targets { &[][..] } else { &self.blocked[..] };
        WebhookSecurity {
            blocked_cidr_ranges: blocked.iter().map(Cidr::to_string).collect(),
            allowed_url_patterns: self.allowed_url_patterns.clone(),
            allow_http: self.allow_http,
        }
    }

    /// These rules with an operator's stored configuration in place of the environment's
    /// defaults. The floor of unsafe ranges stays (`blocking_range` always applies it), and so
    /// does the development switch, which only the process itself sets.
    pub fn with_settings(&self, s: &WebhookSecurity) -> EgressRules {
        EgressRules {
            allow_http: s.allow_http,
            blocked: s.blocked_cidr_ranges.iter().filter_map(|c| Cidr::parse(c)).collect(),
            allowed_url_patterns: s.allowed_url_patterns.clone(),
            private_targets: self.private_targets,
        }
    }

    /// The range that blocks `ip`, if one does (after reducing it to the IPv4 it carries).
    pub fn blocking_range(&self, ip: IpAddr) -> Option<Cidr> {
        if self.private_targets {
            return None;
        }
        let mut candidates = vec![ip];
        if let IpAddr::V6(v6) = ip {
            candidates.extend(embedded_ipv4(v6).map(IpAddr::V4));
        }
        candidates.into_iter().find_map(|ip| FLOOR.iter().chain(&self.blocked).find(|c| c.contains(ip)).copied())
    }

    /// Everything that can be checked without resolving: length, syntax, scheme, allow-list,
    /// and an IP-literal host. Returns the parsed URL.
    pub fn check_static(&self, url: &str) -> Result<reqwest::Url, Refusal> {
        let invalid = |m: String| Refusal::Url(m);
        if url.len() > 2048 {
            return Err(invalid("url must be at most 2048 characters".into()));
        }
        let parsed = reqwest::Url::parse(url).map_err(|e| invalid(format!("url is not a valid URL: {e}")))?;
        match parsed.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            s => return Err(invalid(format!("url scheme {s} is not allowed (https only)"))),
        }
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(invalid("url must not carry credentials".into()));
        }
        if !self.allowed_url_patterns.is_empty() && !self.allowed_url_patterns.iter().any(|p| glob(p, parsed.as_str()))
        {
            return Err(invalid("url matches none of the allowed url patterns".into()));
        }
        let ip = match parsed.host() {
            None => return Err(invalid("url has no host".into())),
            Some(url::Host::Ipv4(ip)) => Some(IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(IpAddr::V6(ip)),
            Some(url::Host::Domain(_)) => None,
        };
        if let Some(ip) = ip.filter(|ip| self.blocking_range(*ip).is_some()) {
            return Err(Refusal::Blocked(ip));
        }
        Ok(parsed)
    }

    /// The full check a subscription's URL gets when it is written: the static checks, then
    /// every address its host resolves to.
    pub async fn check_url(&self, url: &str) -> Result<(), Refusal> {
        let parsed = self.check_static(url)?;
        if let Some(url::Host::Domain(host)) = parsed.host() {
            let port = parsed.port_or_known_default().unwrap_or(443);
            self.resolve_checked(host, port).await?;
        }
        Ok(())
    }

    /// Resolves `host` once and checks every address; refuses the host when any is blocked (a
    /// name that answers with a mix of public and private addresses is not trusted).
    pub async fn resolve_checked(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, Refusal> {
        let addrs: Vec<SocketAddr> =
            tokio::net::lookup_host((host, port)).await.map_err(|_| Refusal::Unresolvable(host.to_string()))?.collect();
        if addrs.is_empty() {
            return Err(Refusal::Unresolvable(host.to_string()));
        }
        match addrs.iter().find(|a| self.blocking_range(a.ip()).is_some()) {
            Some(a) => Err(Refusal::Blocked(a.ip())),
            None => Ok(addrs),
        }
    }
}

/// The resolver of the delivery client: resolves once, checks, and hands the HTTP client only
/// the checked addresses, so the connection is pinned to them (the URL's host still goes out
/// as the `Host` header and the TLS server name).
pub struct GuardedResolver {
    pub rules: SharedRules,
}

/// Rules a long-lived client reads at each connection, replaced when the stored configuration
/// changes.
pub type SharedRules = Arc<std::sync::RwLock<Arc<EgressRules>>>;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let rules = self.rules.read().expect("rules lock").clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let addrs = rules.resolve_checked(&host, 0).await?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Glob match of a URL: `?` is one character, `*` a run of characters within one `/`-separated
/// part (so `https://*.example.com/*` never matches `https://evil.org/.example.com/`), and a
/// `*` that ends the pattern matches the whole rest.
pub fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    fn walk(p: &[char], t: &[char]) -> bool {
        match p.split_first() {
            None => t.is_empty(),
            Some(('*', [])) => true,
            Some(('*', rest)) => {
                let run = t.iter().take_while(|c| **c != '/').count();
                (0..=run).any(|i| walk(rest, &t[i..]))
            }
            Some((c, rest)) => t.split_first().is_some_and(|(x, tr)| (*c == '?' || c == x) && walk(rest, tr)),
        }
    }
    walk(&p, &t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployed() -> EgressRules {
        EgressRules::default()
    }

    /// Every address of the adversarial report, and more of the same families, is refused.
    #[test]
    fn unsafe_addresses_are_refused_in_every_spelling() {
        let rules = EgressRules { blocked: vec![], ..deployed() };
        for url in [
            "https://[::ffff:127.0.0.1]:1/h",
            "https://[::ffff:7f00:1]/",
            "https://[::ffff:169.254.169.254]/",
            "https://[::ffff:10.0.0.1]/",
            "https://[::ffff:192.168.1.1]/",
            "https://0.0.0.0/",
            "https://0/",
            "https://[::]/",
            "https://[fe80::1]/",
            "https://[64:ff9b::a9fe:a9fe]/",
            "https://100.100.100.200/",
            "https://[::127.0.0.1]/",
            "https://[::ffff:0:127.0.0.1]/",
            "https://[2002:7f00:1::]/",
            "https://[2002:a9fe:a9fe::1]/",
            "https://2130706433/",
            "https://0x7f.1/",
            "https://127.1/",
            "https://169.254.169.254/latest/meta-data",
            "https://[fd00::1]/",
            "https://[ff02::1]/",
            "https://224.0.0.1/",
            "https://255.255.255.255/",
            "https://[::1]/",
            "https://[2001:db8::1]/",
            "https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/",
        ] {
            assert!(matches!(rules.check_static(url), Err(Refusal::Blocked(_))), "{url} must be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for url in
            ["https://93.184.216.34/h", "https://[2606:2800:220:1:248:1893:25c8:1946]/", "https://[2002:5db8:d822::1]/"]
        {
            assert_eq!(deployed().check_static(url).map(|_| ()), Ok(()), "{url}");
        }
        // 6to4 of a public address carries that address; NAT64 likewise
        assert_eq!(embedded_ipv4("64:ff9b::5db8:d822".parse().unwrap()), Some(Ipv4Addr::new(93, 184, 216, 34)));
    }

    #[test]
    fn operator_ranges_add_to_the_floor_never_replace_it() {
        let rules = EgressRules { blocked: parse_cidrs("93.184.216.0/24").unwrap(), ..deployed() };
        assert!(rules.check_static("https://93.184.216.34/").is_err());
        assert!(rules.check_static("https://[::ffff:93.184.216.34]/").is_err());
        assert!(rules.check_static("https://127.0.0.1/").is_err());
        assert!(rules.check_static("https://8.8.8.8/").is_ok());
    }

    #[test]
    fn schemes_credentials_and_patterns() {
        let r = deployed();
        assert!(matches!(r.check_static("http://8.8.8.8/"), Err(Refusal::Url(_))));
        assert!(matches!(r.check_static("ftp://8.8.8.8/"), Err(Refusal::Url(_))));
        assert!(matches!(r.check_static("https://u:p@8.8.8.8/"), Err(Refusal::Url(_))));
        let r = EgressRules { allowed_url_patterns: vec!["https://*.example.com/*".into()], ..deployed() };
        assert!(r.check_static("https://hooks.example.com/a/b").is_ok());
        assert!(r.check_static("https://example.org/a").is_err());
    }

    #[test]
    fn development_rules_allow_private_targets() {
        let r = EgressRules::development();
        assert!(r.check_static("http://127.0.0.1:8080/h").is_ok());
        assert!(r.check_static("http://[::1]:8080/h").is_ok());
    }

    #[tokio::test]
    async fn the_resolver_refuses_names_of_blocked_addresses() {
        let r = deployed();
        assert!(matches!(r.resolve_checked("localhost", 443).await, Err(Refusal::Blocked(_))));
        assert!(matches!(r.check_url("https://localhost:9/h").await, Err(Refusal::Blocked(_))));
        let name: Name = "localhost".parse().unwrap();
        assert!(GuardedResolver { rules: Arc::new(std::sync::RwLock::new(Arc::new(r))) }.resolve(name).await.is_err());
    }

    #[test]
    fn cidr_parsing_and_matching() {
        assert!(Cidr::parse("10.0.0.0/33").is_none());
        assert!(Cidr::parse("::/129").is_none());
        assert!(Cidr::parse("0.0.0.0/0").unwrap().contains("8.8.8.8".parse().unwrap()));
        assert!(!Cidr::parse("0.0.0.0/0").unwrap().contains("::1".parse().unwrap()));
        assert_eq!(parse_cidrs("10.0.0.0/8, bad").unwrap_err(), "bad");
    }

    #[test]
    fn globs() {
        assert!(glob("https://*.example.com/*", "https://a.b.example.com/x/y"));
        assert!(!glob("https://*.example.com/*", "https://example.com.evil.org/x"));
        assert!(!glob("https://*.example.com/*", "https://evil.org/.example.com/"));
        assert!(glob("a?c", "abc") && !glob("a?c", "ac"));
    }

    #[test]
    fn stored_settings_never_loosen_the_floor() {
        let open = WebhookSecurity { blocked_cidr_ranges: vec![], allowed_url_patterns: vec![], allow_http: true };
        let rules = deployed().with_settings(&open);
        for url in ["http://127.0.0.1/h", "https://169.254.169.254/latest", "https://[::1]/h", "https://10.1.2.3/h"] {
            assert!(matches!(rules.check_static(url), Err(Refusal::Blocked(_))), "{url} must stay refused");
        }
        assert!(rules.check_static("http://93.184.216.34/h").is_ok(), "http allowed as stored");
        // tightening works: an extra range and an allow-list
        let tight = WebhookSecurity {
            blocked_cidr_ranges: vec!["93.184.216.0/24".into()],
            allowed_url_patterns: vec!["https://hooks.example.com/*".into()],
            allow_http: false,
        };
        let rules = deployed().with_settings(&tight);
        assert!(matches!(rules.check_static("https://93.184.216.34/h"), Err(Refusal::Url(_))));
        let no_list = WebhookSecurity { allowed_url_patterns: vec![], ..tight };
        assert!(matches!(
            deployed().with_settings(&no_list).check_static("https://93.184.216.34/h"),
            Err(Refusal::Blocked(_))
        ));
        assert!(deployed().with_settings(&no_list).check_static("http://8.8.8.8/h").is_err(), "http refused");
        // the development switch is the process's, not the stored configuration's
        assert!(EgressRules::development().with_settings(&no_list).private_targets);
        assert_eq!(deployed().settings().blocked_cidr_ranges.join(","), DEFAULT_BLOCKED);
    }
}
