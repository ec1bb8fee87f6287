//! Deciding one connection: whether a sandbox's allow list names the destination, and whether
//! the address it leads to is one no sandbox reaches unless told so (private ranges, link-local
//! and its metadata endpoints, loopback, the host's own addresses). Pure functions: the gateway
//! gathers the facts (the name asked for, the addresses it resolves to) and logs the verdict.

use std::net::IpAddr;

use crate::resource::{canonical, AllowRule, Cidr, Target};

/// The verdict on one destination, with the rule that decided it (as written, or the reason of a
/// refusal) for the decision log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    pub rule: String,
}

impl Verdict {
    fn allow(rule: &AllowRule) -> Verdict {
        Verdict {
            allowed: true,
            rule: rule.text.clone(),
        }
    }

    fn deny(rule: String) -> Verdict {
        Verdict {
            allowed: false,
            rule,
        }
    }
}

/// What is refused whatever a list's host entries say, and the server-wide exceptions.
#[derive(Clone, Debug, Default)]
pub struct Protected {
    /// `AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW`.
    pub private_allow: Vec<Cidr>,
    /// The host's own addresses (every interface, the sandbox bridges' gateways included).
    pub host_addresses: Vec<IpAddr>,
}

/// Blocks no sandbox reaches by default: private, shared (CGNAT), loopback, link-local (cloud
/// metadata lives there), benchmarking, multicast, reserved, and their IPv6 counterparts
/// (NAT64's well-known prefix too, since it can lead back to any IPv4 address).
const PROTECTED_BLOCKS: &[&str] = &[
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::/128",
    "::1/128",
    "64:ff9b::/96",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
];

/// The protected block holding `address`, if any: the host's own addresses count as blocks of
/// one address.
pub fn protected_block(address: IpAddr, protected: &Protected) -> Option<Cidr> {
    let address = canonical(address);
    if protected
        .host_addresses
        .iter()
        .any(|host| canonical(*host) == address)
    {
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        return Some(Cidr {
            network: address,
            prefix,
        });
    }
    PROTECTED_BLOCKS
        .iter()
        .filter_map(|text| text.parse::<Cidr>().ok())
        .find(|block| block.contains(address))
}

/// Whether a sandbox may open a connection to `address`, reached through `by` (the rule that
/// allowed the name it asked for, or `None` for a bare address). A protected address is refused
/// unless the server's private allow list holds it, or a CIDR entry of the sandbox's list at least
/// as narrow as the protected block names it: `10.20.0.0/16` opens that part of `10/8`, while
/// `0.0.0.0/0` opens no private range and no metadata address.
pub fn decide_address(
    rules: &[AllowRule],
    protected: &Protected,
    address: IpAddr,
    port: u16,
    by: Option<&AllowRule>,
) -> Verdict {
    let address = canonical(address);
    let cidr_rule = rules
        .iter()
        .find(|rule| rule.port_matches(port) && rule.address_matches(address));
    let allowing = match (by, cidr_rule) {
        (Some(rule), _) => rule,
        (None, Some(rule)) => rule,
        (None, None) => return Verdict::deny(format!("no entry allows {address} port {port}")),
    };
    if let Some(block) = protected_block(address, protected) {
        let server_allows = protected.private_allow.iter().any(|c| c.contains(address));
        let entry_names_it = rules.iter().any(|rule| {
            rule.port_matches(port)
                && matches!(&rule.target, Target::Cidr(c) if c.contains(address) && c.prefix >= block.prefix)
        });
        if !server_allows && !entry_names_it {
            return Verdict::deny(format!("protected address {address} (in {block})"));
        }
    }
    Verdict::allow(allowing)
}

/// The rule that allows name `host` (any case, trailing dot ignored) at `port`, if one does.
pub fn rule_for_name<'a>(rules: &'a [AllowRule], host: &str, port: u16) -> Option<&'a AllowRule> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    rules
        .iter()
        .find(|rule| rule.port_matches(port) && rule.host_matches(&host))
}

/// The rule that allows name `host` at some port (what DNS answers for), if one does.
pub fn rule_for_lookup<'a>(rules: &'a [AllowRule], host: &str) -> Option<&'a AllowRule> {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    rules.iter().find(|rule| rule.host_matches(&host))
}

/// The verdict on a connection to name `host` at `port` whose name resolved to `addresses`: the
/// name must be allowed and every address it leads to must pass [`decide_address`] (so that a
/// name that resolves to a private address, by design or by rebinding, gets nowhere).
pub fn decide_name(
    rules: &[AllowRule],
    protected: &Protected,
    host: &str,
    port: u16,
    addresses: &[IpAddr],
) -> Verdict {
    let Some(rule) = rule_for_name(rules, host, port) else {
        return Verdict::deny(format!("no entry allows {host} port {port}"));
    };
    if addresses.is_empty() {
        return Verdict::deny(format!("{host} does not resolve"));
    }
    for address in addresses {
        let verdict = decide_address(rules, protected, *address, port, Some(rule));
        if !verdict.allowed {
            return Verdict::deny(format!("{host} resolves to a {}", verdict.rule));
        }
    }
    Verdict::allow(rule)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::parse_allow_list;

    fn rules(list: &[&str]) -> Vec<AllowRule> {
        parse_allow_list(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn names_need_an_entry_and_public_addresses() {
        let list = rules(&["pypi.org", "*.pythonhosted.org:443"]);
        let none = Protected::default();
        let public = [ip("192.0.2.10")];
        let verdict = decide_name(&list, &none, "PyPI.org.", 80, &public);
        assert_eq!(
            verdict,
            Verdict {
                allowed: true,
                rule: "pypi.org".into()
            }
        );
        assert!(decide_name(&list, &none, "files.pythonhosted.org", 443, &public).allowed);
        let wrong_port = decide_name(&list, &none, "files.pythonhosted.org", 80, &public);
        assert!(!wrong_port.allowed);
        assert!(
            wrong_port.rule.contains("no entry allows"),
            "{wrong_port:?}"
        );
        assert!(!decide_name(&list, &none, "evil.example", 80, &public).allowed);
        let rebound = decide_name(&list, &none, "pypi.org", 80, &[public[0], ip("10.0.0.5")]);
        assert!(!rebound.allowed);
        assert!(rebound.rule.contains("10.0.0.0/8"), "{rebound:?}");
        let metadata = decide_name(&list, &none, "pypi.org", 80, &[ip("169.254.169.254")]);
        assert!(!metadata.allowed, "{metadata:?}");
        assert!(!decide_name(&list, &none, "pypi.org", 80, &[]).allowed);
    }

    #[test]
    fn bare_addresses_need_a_cidr_entry_narrow_enough_for_protected_blocks() {
        let none = Protected::default();
        let list = rules(&["10.20.0.0/16:5432", "0.0.0.0/0:443", "pypi.org"]);
        assert!(decide_address(&list, &none, ip("10.20.1.1"), 5432, None).allowed);
        assert!(!decide_address(&list, &none, ip("10.20.1.1"), 5433, None).allowed);
        assert!(decide_address(&list, &none, ip("192.0.2.1"), 443, None).allowed);
        for refused in [
            "10.30.0.1",
            "169.254.169.254",
            "127.0.0.1",
            "172.17.0.1",
            "::ffff:10.1.1.1",
        ] {
            let verdict = decide_address(&list, &none, ip(refused), 443, None);
            assert!(!verdict.allowed, "{refused}: {verdict:?}");
            assert!(verdict.rule.starts_with("protected address"), "{verdict:?}");
        }
        assert!(!decide_address(&list, &none, ip("fe80::1"), 443, None).allowed);
        assert!(!decide_address(&rules(&["pypi.org"]), &none, ip("192.0.2.1"), 80, None).allowed);
    }

    #[test]
    fn the_server_setting_and_host_addresses() {
        let list = rules(&["db.internal.example", "0.0.0.0/0"]);
        let mut protected = Protected {
            private_allow: vec!["10.9.0.0/16".parse().unwrap()],
            host_addresses: vec![ip("192.0.2.99")],
        };
        assert!(
            decide_name(
                &list,
                &protected,
                "db.internal.example",
                5432,
                &[ip("10.9.3.4")]
            )
            .allowed
        );
        assert!(
            !decide_name(
                &list,
                &protected,
                "db.internal.example",
                5432,
                &[ip("10.8.3.4")]
            )
            .allowed
        );
        let host = decide_address(&list, &protected, ip("192.0.2.99"), 22, None);
        assert!(!host.allowed);
        assert!(host.rule.contains("192.0.2.99/32"), "{host:?}");
        assert!(decide_address(&list, &protected, ip("192.0.2.98"), 22, None).allowed);
        protected.host_addresses.clear();
        assert!(decide_address(&list, &protected, ip("192.0.2.99"), 22, None).allowed);
        let exact = rules(&["192.0.2.99/32:22"]);
        protected.host_addresses.push(ip("192.0.2.99"));
        assert!(decide_address(&exact, &protected, ip("192.0.2.99"), 22, None).allowed);
    }

    #[test]
    fn lookups_answer_names_allowed_at_any_port() {
        let list = rules(&["github.com:443", "*.example.org"]);
        assert!(rule_for_lookup(&list, "github.com.").is_some());
        assert!(rule_for_lookup(&list, "a.example.org").is_some());
        assert!(rule_for_lookup(&list, "example.org").is_none());
        assert!(rule_for_lookup(&list, "gitlab.com").is_none());
    }
}
