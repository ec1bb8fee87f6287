//! What a sandbox may reach, and how that becomes a `NetworkPolicy` (for a `Sandbox`) or the
//! `networkPolicy` of a `SandboxTemplate`.
//!
//! [`Egress`] is the one input: today it comes from `network: true|false`; the allow-list variant
//! is where a future `spec.egress` plugs in, so that every exported object already goes through
//! the code that says what NetworkPolicy can and cannot hold. NetworkPolicy selects peers by IP
//! block and port only: a CIDR with ports maps to one egress rule, a host name has no
//! equivalent and is reported, never silently widened to "anywhere".

use serde_json::{json, Value};

use super::{Gap, GapKind};
use crate::resource::{AllowRule, EgressSpec, Target};

/// The label every exported sandbox pod carries, which its NetworkPolicy selects.
pub const SANDBOX_LABEL: &str = "agent-sandbox.io/sandbox";

/// Outbound access of a sandbox.
#[derive(Clone, Debug, PartialEq)]
pub enum Egress {
    /// `network: false`: loopback only. Everything in and out is denied.
    Denied,
    /// `network: true`: anywhere the node can reach, like the Docker bridge. Ingress stays denied,
    /// which is what keeps sandboxes from reaching each other (the bridge's disabled
    /// inter-container traffic).
    Open,
    /// Only these destinations (the shape a `spec.egress` allow-list takes).
    AllowList(Vec<EgressRule>),
}

/// One allowed destination and its ports (no ports: every port).
#[derive(Clone, Debug, PartialEq)]
pub struct EgressRule {
    pub to: EgressTarget,
    pub ports: Vec<EgressPort>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum EgressTarget {
    /// An IPv4 or IPv6 block, e.g. `10.0.0.0/8` or `2001:db8::/32`.
    Cidr(String),
    /// A DNS name, e.g. `pypi.org`. NetworkPolicy cannot select by name.
    Host(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EgressPort {
    pub protocol: Protocol,
    pub port: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}

impl Egress {
    /// The egress of a pool, or of a sandbox without an allow-list.
    pub fn from_network(network: bool) -> Egress {
        if network {
            Egress::Open
        } else {
            Egress::Denied
        }
    }

    /// The egress of a sandbox: its `spec.egress` allow-list when it has one (on the network),
    /// else what `network` says. A list that does not parse (refused on every write, so only a
    /// hand-made object) allows nothing rather than everything.
    pub fn from_spec(network: bool, egress: Option<&EgressSpec>) -> Egress {
        let Some(egress) = egress.filter(|_| network) else {
            return Egress::from_network(network);
        };
        match egress.rules() {
            Ok(rules) => Egress::AllowList(rules.iter().map(allow_rule).collect()),
            Err(_) => Egress::Denied,
        }
    }
}

/// One entry of an allow-list as a destination: a CIDR is an IP block, a name (or `*.suffix`)
/// stays a name, which NetworkPolicy cannot select and `egress_rules` reports.
fn allow_rule(rule: &AllowRule) -> EgressRule {
    let to = match &rule.target {
        Target::Cidr(cidr) => EgressTarget::Cidr(format!("{}/{}", cidr.network, cidr.prefix)),
        Target::Host(host) => EgressTarget::Host(host.clone()),
        Target::Suffix(suffix) => EgressTarget::Host(format!("*.{suffix}")),
    };
    let ports = rule
        .port
        .map(|port| {
            vec![EgressPort {
                protocol: Protocol::Tcp,
                port,
            }]
        })
        .unwrap_or_default();
    EgressRule { to, ports }
}

/// The NetworkPolicy egress rules for `egress`: `None` when egress is not restricted at all.
/// Targets that cannot be expressed are left out and reported in `gaps` against `object`.
pub fn egress_rules(egress: &Egress, object: &str, gaps: &mut Vec<Gap>) -> Option<Vec<Value>> {
    match egress {
        Egress::Open => None,
        Egress::Denied => Some(Vec::new()),
        Egress::AllowList(rules) => {
            let mut out = Vec::new();
            for rule in rules {
                match &rule.to {
                    EgressTarget::Cidr(cidr) => {
                        let mut value = json!({ "to": [{ "ipBlock": { "cidr": cidr } }] });
                        if !rule.ports.is_empty() {
                            value["ports"] = rule
                                .ports
                                .iter()
                                .map(|p| json!({ "protocol": p.protocol.as_str(), "port": p.port }))
                                .collect();
                        }
                        out.push(value);
                    }
                    EgressTarget::Host(host) => gaps.push(Gap {
                        object: object.to_string(),
                        field: Some("spec.egress".into()),
                        kind: GapKind::NotExpressed,
                        reason: format!(
                            "NetworkPolicy selects destinations by IP block and port only, so host \
                             {host:?} is not allowed (a CNI with DNS-aware policy, such as Cilium's \
                             toFQDNs, or an egress proxy can express it)"
                        ),
                    }),
                }
            }
            Some(out)
        }
    }
}

/// The `NetworkPolicy` isolating the pods labeled `SANDBOX_LABEL=<selector>`: ingress always
/// denied, egress as `egress` says.
pub fn network_policy(
    name: &str,
    namespace: Option<&str>,
    selector: &str,
    egress: &Egress,
    object: &str,
    gaps: &mut Vec<Gap>,
) -> Value {
    let mut metadata = json!({ "name": name, "labels": { SANDBOX_LABEL: selector } });
    if let Some(ns) = namespace {
        metadata["namespace"] = json!(ns);
    }
    let mut spec = json!({
        "podSelector": { "matchLabels": { SANDBOX_LABEL: selector } },
        "policyTypes": ["Ingress"],
    });
    if let Some(rules) = egress_rules(egress, object, gaps) {
        spec["policyTypes"] = json!(["Ingress", "Egress"]);
        if !rules.is_empty() {
            spec["egress"] = Value::Array(rules);
        }
    }
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata,
        "spec": spec,
    })
}

/// The `networkPolicy` of a `SandboxTemplate`. Its controller always sets both policy types, so
/// an empty object denies everything, and an empty egress rule (`{}`) allows every destination.
pub fn template_network_policy(egress: &Egress, object: &str, gaps: &mut Vec<Gap>) -> Value {
    match egress_rules(egress, object, gaps) {
        None => json!({ "egress": [{}] }),
        Some(rules) if rules.is_empty() => json!({}),
        Some(rules) => json!({ "egress": rules }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_means_both_directions_without_rules() {
        let mut gaps = Vec::new();
        let p = network_policy(
            "a-network",
            None,
            "a",
            &Egress::Denied,
            "sandbox/a",
            &mut gaps,
        );
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert!(p["spec"].get("egress").is_none());
        assert!(p["spec"].get("ingress").is_none());
        assert!(gaps.is_empty());
        assert_eq!(
            template_network_policy(&Egress::Denied, "x", &mut gaps),
            json!({})
        );
    }

    #[test]
    fn open_restricts_ingress_only() {
        let mut gaps = Vec::new();
        let p = network_policy(
            "a-network",
            Some("ns"),
            "a",
            &Egress::Open,
            "sandbox/a",
            &mut gaps,
        );
        assert_eq!(p["spec"]["policyTypes"], json!(["Ingress"]));
        assert_eq!(p["metadata"]["namespace"], "ns");
        assert_eq!(
            template_network_policy(&Egress::Open, "x", &mut gaps),
            json!({ "egress": [{}] })
        );
    }

    #[test]
    fn cidrs_map_to_rules_and_hosts_are_reported() {
        let list = Egress::AllowList(vec![
            EgressRule {
                to: EgressTarget::Cidr("10.1.0.0/16".into()),
                ports: vec![EgressPort {
                    protocol: Protocol::Tcp,
                    port: 443,
                }],
            },
            EgressRule {
                to: EgressTarget::Host("pypi.org".into()),
                ports: vec![],
            },
            EgressRule {
                to: EgressTarget::Cidr("2001:db8::/32".into()),
                ports: vec![],
            },
        ]);
        let mut gaps = Vec::new();
        let p = network_policy("a-network", None, "a", &list, "sandbox/a", &mut gaps);
        assert_eq!(
            p["spec"]["egress"],
            json!([
                { "to": [{ "ipBlock": { "cidr": "10.1.0.0/16" } }],
                  "ports": [{ "protocol": "TCP", "port": 443 }] },
                { "to": [{ "ipBlock": { "cidr": "2001:db8::/32" } }] },
            ])
        );
        assert_eq!(gaps.len(), 1);
        assert_eq!(gaps[0].kind, GapKind::NotExpressed);
        assert!(gaps[0].reason.contains("pypi.org"));

        // A list of names only denies everything rather than allowing anything.
        let names = Egress::AllowList(vec![EgressRule {
            to: EgressTarget::Host("example.org".into()),
            ports: vec![],
        }]);
        let t = template_network_policy(&names, "sandboxpool/p", &mut gaps);
        assert_eq!(t, json!({}));
    }
}
