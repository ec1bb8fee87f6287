//! `spec.egress` of a sandbox: the list of destinations it may reach, and the grammar of one
//! entry. An entry is a host (`pypi.org`), a suffix wildcard (`*.pythonhosted.org`, one or more
//! labels in front of the suffix) or a CIDR (`10.20.0.0/16`, `fd00::/8`), each with an optional
//! `:port` (IPv6 CIDRs take it as `[fd00::/8]:443`). This module only says what an entry means;
//! enforcing it is the gateway's business (`crate::egress`).

use std::fmt;
use std::net::IpAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The destinations a sandbox may reach. With it set the sandbox reaches nothing else.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EgressSpec {
    /// Entries: `host`, `*.suffix` or a CIDR, each with an optional `:port` (default: any).
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub allow: Vec<String>,
}

/// One parsed entry of an allow list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowRule {
    pub target: Target,
    /// `None`: any port.
    pub port: Option<u16>,
    /// The entry as written, for decision logs.
    pub text: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// Exactly this name (lowercase, no trailing dot).
    Host(String),
    /// Any name with one or more labels in front of this suffix (not the suffix itself).
    Suffix(String),
    Cidr(Cidr),
}

/// An address block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub network: IpAddr,
    pub prefix: u8,
}

/// Why an entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec.egress.allow[{index}] {entry:?}: {reason}")]
pub struct AllowEntryError {
    pub index: usize,
    pub entry: String,
    pub reason: String,
}

impl Cidr {
    pub fn contains(&self, address: IpAddr) -> bool {
        match (self.network, canonical(address)) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                u32::from(net) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                u128::from(net) & mask == u128::from(a) & mask
            }
            _ => false,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl std::str::FromStr for Cidr {
    type Err = String;

    /// `a.b.c.d/n`, `v6::/n`, or a bare address (a /32 or /128). Host bits must be zero, so
    /// that `10.0.0.1/8` (likely a typo) is refused rather than silently widened.
    fn from_str(text: &str) -> Result<Cidr, String> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let network: IpAddr = address
            .parse()
            .map_err(|_| format!("{address:?} is not an IP address"))?;
        let network = canonical(network);
        let max = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max && !p.starts_with('+') => n,
                _ => return Err(format!("prefix length {p:?} is not 0..={max}")),
            },
        };
        let cidr = Cidr { network, prefix };
        let host_bits_clear = match network {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(a) & !mask == 0
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(a) & !mask == 0
            }
        };
        if !host_bits_clear {
            return Err(format!("{text} has host bits set"));
        }
        Ok(cidr)
    }
}

/// IPv4-mapped IPv6 addresses (`::ffff:10.0.0.1`) are the IPv4 address they carry, so a rule or a
/// refusal written for one holds for the other.
pub fn canonical(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V6(v6) => v6
            .to_ipv4_mapped()
            .map(IpAddr::V4)
            .unwrap_or(IpAddr::V6(v6)),
        v4 => v4,
    }
}

impl EgressSpec {
    /// Every entry parsed, or the first one that is not an entry.
    pub fn rules(&self) -> Result<Vec<AllowRule>, AllowEntryError> {
        parse_allow_list(&self.allow)
    }
}

/// Parses a list of entries (a sandbox's `egress.allow`, or the server's default list).
pub fn parse_allow_list(entries: &[String]) -> Result<Vec<AllowRule>, AllowEntryError> {
    entries
        .iter()
        .enumerate()
        .map(|(index, entry)| {
            parse_entry(entry).map_err(|reason| AllowEntryError {
                index,
                entry: entry.clone(),
                reason,
            })
        })
        .collect()
}

fn parse_entry(entry: &str) -> Result<AllowRule, String> {
    if entry.is_empty() || entry.len() > 300 {
        return Err("an entry is 1 to 300 characters".into());
    }
    if entry.trim() != entry {
        return Err("leading or trailing spaces".into());
    }
    let (body, port) = split_port(entry)?;
    let target = if body.contains('/') || body.parse::<IpAddr>().is_ok() {
        Target::Cidr(body.parse::<Cidr>()?)
    } else if let Some(suffix) = body.strip_prefix("*.") {
        check_host(suffix)?;
        Target::Suffix(suffix.to_ascii_lowercase())
    } else {
        if body.contains('*') {
            return Err("a wildcard is only allowed as a leading `*.`".into());
        }
        check_host(body)?;
        Target::Host(body.to_ascii_lowercase())
    };
    Ok(AllowRule {
        target,
        port,
        text: entry.to_string(),
    })
}

/// Splits `body:port`; an IPv6 CIDR with a port is written `[fd00::/8]:443`.
fn split_port(entry: &str) -> Result<(&str, Option<u16>), String> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (inside, after) = rest
            .split_once(']')
            .ok_or_else(|| "`[` without `]`".to_string())?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(after.strip_prefix(':').ok_or_else(|| {
                format!("expected `:port` after `]`, found {after:?}")
            })?)?),
        };
        return Ok((inside, port));
    }
    match entry.matches(':').count() {
        0 => Ok((entry, None)),
        1 => {
            let (body, port) = entry.split_once(':').unwrap_or((entry, ""));
            Ok((body, Some(parse_port(port)?)))
        }
        // Several colons: an IPv6 address or CIDR without a port.
        _ => Ok((entry, None)),
    }
}

fn parse_port(text: &str) -> Result<u16, String> {
    match text.parse::<u16>() {
        Ok(port) if port > 0 && text.bytes().all(|b| b.is_ascii_digit()) => Ok(port),
        _ => Err(format!("port {text:?} is not 1..=65535")),
    }
}

/// A DNS name: dot-separated labels of letters, digits and hyphens (underscores too, as some
/// service names use them), at least two labels, no label starting or ending with a hyphen.
fn check_host(host: &str) -> Result<(), String> {
    if host.is_empty() || host.len() > 253 {
        return Err("a host name is 1 to 253 characters".into());
    }
    let labels: Vec<&str> = host.split('.').collect();
    for label in &labels {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(format!("{label:?} is not a DNS label"));
        }
    }
    if labels.len() < 2 {
        return Err("a host name needs at least two labels (a bare suffix such as `com` would allow too much)".into());
    }
    if labels
        .last()
        .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err("looks like an IP address but is not one".into());
    }
    Ok(())
}

impl AllowRule {
    /// Whether this rule allows `port`.
    pub fn port_matches(&self, port: u16) -> bool {
        self.port.is_none_or(|p| p == port)
    }

    /// Whether this rule names `host` (lowercase, no trailing dot).
    pub fn host_matches(&self, host: &str) -> bool {
        match &self.target {
            Target::Host(h) => h == host,
            Target::Suffix(suffix) => host
                .strip_suffix(suffix.as_str())
                .is_some_and(|front| front.len() > 1 && front.ends_with('.')),
            Target::Cidr(_) => false,
        }
    }

    /// Whether this rule's block holds `address`.
    pub fn address_matches(&self, address: IpAddr) -> bool {
        matches!(&self.target, Target::Cidr(c) if c.contains(address))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(text: &str) -> AllowRule {
        parse_entry(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn parses_every_shape_of_the_contract() {
        let list: Vec<String> = [
            "pypi.org",
            "*.pythonhosted.org",
            "github.com:443",
            "10.20.0.0/16:5432",
        ]
        .map(String::from)
        .to_vec();
        let rules = parse_allow_list(&list).unwrap();
        assert_eq!(rules[0].target, Target::Host("pypi.org".into()));
        assert_eq!(rules[0].port, None);
        assert_eq!(rules[1].target, Target::Suffix("pythonhosted.org".into()));
        assert_eq!(rules[2].port, Some(443));
        assert_eq!(
            rules[3].target,
            Target::Cidr(Cidr {
                network: "10.20.0.0".parse().unwrap(),
                prefix: 16
            })
        );
        assert_eq!(rules[3].port, Some(5432));
        assert_eq!(rule("fd00::/8").port, None);
        assert_eq!(rule("[fd00::/8]:443").port, Some(443));
        assert_eq!(rule("192.0.2.7").target, rule("192.0.2.7/32").target);
        assert_eq!(rule("PyPI.org").target, Target::Host("pypi.org".into()));
    }

    #[test]
    fn errors_name_the_entry_and_its_index() {
        for bad in [
            "",
            " pypi.org",
            "pypi.org:0",
            "pypi.org:70000",
            "pypi.org:",
            "pypi.org:+1",
            "com",
            "*.com",
            "*",
            "py*.org",
            "a..b",
            "-a.b",
            "10.0.0.1/8",
            "10.0.0.0/33",
            "10.0.0.0/",
            "300.1.2.3/8",
            "[fd00::/8",
            "[fd00::/8]443",
            "1.2.3",
            "a b.c",
        ] {
            let list = vec!["ok.example".to_string(), bad.to_string()];
            let error = parse_allow_list(&list).expect_err(bad);
            assert_eq!(error.index, 1, "{bad}");
            assert_eq!(error.entry, bad);
            let text = error.to_string();
            assert!(text.starts_with("spec.egress.allow[1] "), "{text}");
            assert!(text.contains(&format!("{bad:?}")), "{text}");
        }
    }

    #[test]
    fn suffixes_need_at_least_one_label_in_front() {
        let r = rule("*.pythonhosted.org");
        assert!(r.host_matches("files.pythonhosted.org"));
        assert!(r.host_matches("a.b.pythonhosted.org"));
        assert!(!r.host_matches("pythonhosted.org"));
        assert!(!r.host_matches("evilpythonhosted.org"));
        assert!(!r.host_matches("pythonhosted.org.evil.com"));
        let exact = rule("pypi.org:443");
        assert!(exact.host_matches("pypi.org") && exact.port_matches(443));
        assert!(!exact.port_matches(80));
        assert!(!exact.host_matches("www.pypi.org"));
    }

    #[test]
    fn cidrs_hold_their_addresses_and_mapped_ones() {
        let r = rule("10.20.0.0/16");
        assert!(r.address_matches("10.20.255.1".parse().unwrap()));
        assert!(r.address_matches("::ffff:10.20.0.9".parse().unwrap()));
        assert!(!r.address_matches("10.21.0.1".parse().unwrap()));
        assert!(!r.host_matches("10.20.0.1"));
        let all = rule("0.0.0.0/0");
        assert!(all.address_matches("192.0.2.1".parse().unwrap()));
        assert!(!all.address_matches("2001:db8::1".parse().unwrap()));
        let v6 = rule("2001:db8::/32");
        assert!(v6.address_matches("2001:db8:1::1".parse().unwrap()));
    }
}
