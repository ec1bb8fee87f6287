//! The host firewall rules that narrow what an open network (`network: true` without `egress`)
//! reaches: from the open network's bridge, link-local destinations (cloud metadata services
//! live there) and the host's own addresses are refused, with a reset for TCP so that a
//! connection fails at once rather than hanging.
//!
//! It owns the `iptables` calls, and nothing else: it never talks to Docker (the controller
//! hands it the bridge's interface, learned from Docker) and decides no policy. Rules are
//! inserted at the top of `DOCKER-USER` (Docker's chain for rules of its users, looked at before
//! its own forwarding rules) and of `INPUT`, each checked first (`-C`), so that applying them is
//! idempotent: after a crash, or by a second server on the same host, nothing is duplicated.
//! Every rule carries a comment naming the project, so that `iptables -S` says whose it is.
//!
//! Rules naming a bridge the host no longer has (its network was removed) are taken out again
//! by [`forget_gone_bridges`], which the controller calls with every resync.
//!
//! For the internal network of policed sandboxes it adds `nat` rules: TCP from that bridge to
//! anywhere but the gateway's DNS server and proxy is redirected to the gateway's transparent listener
//! (which reads the original destination and decides), so that clients ignoring the proxy
//! variables reach what their list allows and fail fast, logged, on everything else.

use tokio::process::Command;

/// The comment on every rule this module adds.
const COMMENT: &str = "agent-sandbox open network guard";

#[derive(Debug, thiserror::Error)]
pub enum FirewallError {
    #[error("cannot run iptables: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("iptables {args} failed: {stderr}")]
    Failed { args: String, stderr: String },
}

/// The rules for sandboxes on `bridge`: each a chain and the arguments after it. They are
/// inserted one by one at the top of their chain, so in each chain the TCP rule, inserted last,
/// comes before the catch-all.
fn rules(bridge: &str) -> Vec<(&'static str, Vec<String>)> {
    let rule = |matches: &str, target: &str| -> Vec<String> {
        format!("-i {bridge} {matches} -m comment --comment")
            .split(' ')
            .map(String::from)
            .chain([COMMENT.to_string()])
            .chain(
                format!("-j REJECT --reject-with {target}")
                    .split(' ')
                    .map(String::from),
            )
            .collect()
    };
    let link_local = "-d 169.254.0.0/16";
    let new = "-m conntrack --ctstate NEW";
    vec![
        ("DOCKER-USER", rule(link_local, "icmp-port-unreachable")),
        (
            "DOCKER-USER",
            rule(&format!("{link_local} -p tcp"), "tcp-reset"),
        ),
        ("INPUT", rule(new, "icmp-port-unreachable")),
        ("INPUT", rule(&format!("{new} -p tcp"), "tcp-reset")),
    ]
}

async fn iptables(args: &[String]) -> Result<std::process::Output, FirewallError> {
    Ok(Command::new("iptables")
        .arg("-w")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await?)
}

/// Whether the rules could be put in place here: `iptables` runs and both chains exist (it only
/// lists them).
pub async fn check() -> Result<(), FirewallError> {
    for chain in ["DOCKER-USER", "INPUT"] {
        let args = ["-S".to_string(), chain.to_string()];
        let out = iptables(&args).await?;
        if !out.status.success() {
            return Err(FirewallError::Failed {
                args: args.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(())
}

/// Makes sure the rules for the open bridge `bridge` are in place.
pub async fn guard_open_bridge(bridge: &str) -> Result<(), FirewallError> {
    ensure(&[], rules(bridge)).await
}

/// The comment on the rules of the internal network of policed sandboxes.
const REDIRECT_COMMENT: &str = "agent-sandbox egress redirect";

/// The `nat` rules sending TCP from the policed bridge `bridge` to `port` on the host, except
/// what goes to the gateway's own DNS server and proxy at `gateway` (the host's address there).
/// Inserted in order at the top of `PREROUTING`, so the exception, last, comes first. Every other
/// port of the host's addresses is redirected too, so no service of the host is reachable.
fn redirect_rules(
    bridge: &str,
    gateway: std::net::IpAddr,
    port: u16,
) -> Vec<(&'static str, Vec<String>)> {
    let rule = |matches: &str, target: &str| -> Vec<String> {
        let mut rule: Vec<String> = format!("-i {bridge} -p tcp {matches}-m comment --comment")
            .split(' ')
            .map(String::from)
            .collect();
        rule.push(REDIRECT_COMMENT.to_string());
        rule.extend(target.split(' ').map(String::from));
        rule
    };
    vec![
        (
            "PREROUTING",
            rule("", &format!("-j REDIRECT --to-ports {port}")),
        ),
        (
            "PREROUTING",
            rule(
                &format!(
                    "-d {gateway} -m multiport --dports 53,{} ",
                    crate::egress::PROXY_PORT
                ),
                "-j RETURN",
            ),
        ),
    ]
}

/// Makes sure TCP from the policed bridge `bridge` goes to the gateway's transparent listener
/// at `gateway:port`.
pub async fn redirect_policed_bridge(
    bridge: &str,
    gateway: std::net::IpAddr,
    port: u16,
) -> Result<(), FirewallError> {
    ensure(&["-t", "nat"], redirect_rules(bridge, gateway, port)).await
}

/// The comment on the rules refusing UDP and ICMP from the policed bridge.
const REFUSE_COMMENT: &str = "agent-sandbox egress refuse";

/// The rules refusing everything but TCP (which the `nat` rules redirect) from the policed bridge
/// `bridge`, except DNS to the gateway at `gateway`: each refused packet is first copied to NFLOG
/// `group` (when there is one, for the decision log), then rejected, so that the sender fails at
/// once. In `INPUT` (to the host's addresses) and `DOCKER-USER` (anywhere else, other sandboxes
/// included). Listed in reverse: each is inserted at the top.
fn refuse_rules(
    bridge: &str,
    gateway: std::net::IpAddr,
    group: Option<u16>,
) -> Vec<(&'static str, Vec<String>)> {
    let rule = |matches: &str, target: &str| -> Vec<String> {
        let mut rule: Vec<String> = format!("-i {bridge} {matches} -m comment --comment")
            .split(' ')
            .map(String::from)
            .collect();
        rule.push(REFUSE_COMMENT.to_string());
        rule.extend(target.split(' ').map(String::from));
        rule
    };
    let mut rules = Vec::new();
    for chain in ["DOCKER-USER", "INPUT"] {
        rules.push((
            chain,
            rule("! -p tcp", "-j REJECT --reject-with icmp-port-unreachable"),
        ));
        if let Some(group) = group {
            rules.push((
                chain,
                rule("! -p tcp", &format!("-j NFLOG --nflog-group {group}")),
            ));
        }
    }
    rules.push((
        "INPUT",
        rule(
            &format!("-d {gateway} -p udp -m udp --dport 53"),
            "-j RETURN",
        ),
    ));
    rules
}

/// Makes sure UDP (but DNS to the gateway at `gateway`) and ICMP from the policed bridge `bridge`
/// are refused, and copied to NFLOG `group` first. Rules of an earlier run naming another group
/// for the bridge are removed first.
pub async fn refuse_policed_bridge(
    bridge: &str,
    gateway: std::net::IpAddr,
    group: Option<u16>,
) -> Result<(), FirewallError> {
    let wanted = refuse_rules(bridge, gateway, group);
    for chain in ["DOCKER-USER", "INPUT"] {
        delete_rules_where("filter", chain, |args| {
            args.iter().any(|a| a == REFUSE_COMMENT)
                && interface_of(args) == Some(bridge)
                && args.iter().any(|a| a == "NFLOG")
                && !wanted.iter().any(|(c, r)| *c == chain && r == args)
        })
        .await?;
    }
    ensure(&[], wanted).await
}

/// The arguments of a rule as `iptables -S` prints it (double quotes around an argument with
/// spaces).
fn split_rule(rule: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in rule.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !current.is_empty() {
                    args.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        args.push(current);
    }
    args
}

/// Removes the rules of this module (by their comments) that name an interface this host no
/// longer has: a network removed since its rules were put in place (a bridge's name is never
/// reused: Docker names it after the network's ID). Returns how many went. Rules of bridges that
/// exist, another server's included, are left alone.
pub async fn forget_gone_bridges() -> Result<usize, FirewallError> {
    forget_rules_of(|interface| !interface_exists(interface)).await
}

fn interface_exists(interface: &str) -> bool {
    // An interface name has no '/' and is never "." or "..", so this names one entry.
    !interface.contains('/')
        && !matches!(interface, "" | "." | "..")
        && std::path::Path::new("/sys/class/net")
            .join(interface)
            .exists()
}

/// Deletes this module's rules whose `-i` interface `gone` says is gone.
async fn forget_rules_of(gone: impl Fn(&str) -> bool) -> Result<usize, FirewallError> {
    let mut removed = 0;
    for (table, chain) in [
        ("filter", "DOCKER-USER"),
        ("filter", "INPUT"),
        ("nat", "PREROUTING"),
    ] {
        removed += delete_rules_where(table, chain, |args| {
            let ours = args
                .iter()
                .any(|a| [COMMENT, REDIRECT_COMMENT, REFUSE_COMMENT].contains(&a.as_str()));
            ours && interface_of(args).is_some_and(&gone)
        })
        .await?;
    }
    Ok(removed)
}

/// The interface a rule's `-i` names.
fn interface_of(args: &[String]) -> Option<&str> {
    args.windows(2)
        .find(|w| w[0] == "-i")
        .map(|w| w[1].as_str())
}

/// Deletes the rules of `chain` (of `table`) whose arguments, as `iptables -S` prints them,
/// `doomed` picks; returns how many went. A chain this host does not have holds none.
async fn delete_rules_where(
    table: &str,
    chain: &str,
    doomed: impl Fn(&[String]) -> bool,
) -> Result<usize, FirewallError> {
    let listed = iptables(&["-t".into(), table.into(), "-S".into(), chain.into()]).await?;
    if !listed.status.success() {
        return Ok(0);
    }
    let mut removed = 0;
    for line in String::from_utf8_lossy(&listed.stdout).lines() {
        let Some(rule) = line.strip_prefix(&format!("-A {chain} ")) else {
            continue;
        };
        let args = split_rule(rule);
        if !doomed(&args) {
            continue;
        }
        let mut delete = vec!["-t".into(), table.into(), "-D".into(), chain.into()];
        delete.extend(args);
        if iptables(&delete).await?.status.success() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// Inserts each rule at the top of its chain (of `table`) unless `-C` finds it there already.
async fn ensure(
    table: &[&str],
    rules: Vec<(&'static str, Vec<String>)>,
) -> Result<(), FirewallError> {
    let table: Vec<String> = table.iter().map(|a| a.to_string()).collect();
    for (chain, rule) in rules {
        let mut check = table.clone();
        check.extend(["-C".to_string(), chain.to_string()]);
        check.extend(rule.iter().cloned());
        if iptables(&check).await?.status.success() {
            continue;
        }
        let mut insert = table.clone();
        insert.extend(["-I".to_string(), chain.to_string(), "1".to_string()]);
        insert.extend(rule);
        let out = iptables(&insert).await?;
        if !out.status.success() {
            return Err(FirewallError::Failed {
                args: insert.join(" "),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_name_the_bridge_carry_the_comment_and_reset_tcp() {
        let rules = rules("br-0123456789ab");
        assert_eq!(rules.len(), 4);
        let (chain, tcp) = &rules[1];
        assert_eq!(*chain, "DOCKER-USER");
        assert_eq!(
            tcp.join(" "),
            "-i br-0123456789ab -d 169.254.0.0/16 -p tcp -m comment --comment \
             agent-sandbox open network guard -j REJECT --reject-with tcp-reset"
        );
        // The comment stays one argument.
        assert!(tcp.iter().any(|a| a == COMMENT));
        let redirect = redirect_rules("br-1", "172.30.0.1".parse().unwrap(), 3129);
        assert!(redirect.iter().all(|(chain, _)| *chain == "PREROUTING"));
        assert_eq!(
            redirect[0].1.join(" "),
            "-i br-1 -p tcp -m comment --comment \
             agent-sandbox egress redirect -j REDIRECT --to-ports 3129"
        );
        assert_eq!(
            redirect[1].1.join(" "),
            "-i br-1 -p tcp -d 172.30.0.1 -m multiport --dports 53,3128 -m comment --comment \
             agent-sandbox egress redirect -j RETURN"
        );
        let refuse = refuse_rules("br-1", "172.30.0.1".parse().unwrap(), Some(16723));
        assert_eq!(
            refuse.last().unwrap().1.join(" "),
            "-i br-1 -d 172.30.0.1 -p udp -m udp --dport 53 -m comment --comment \
             agent-sandbox egress refuse -j RETURN"
        );
        assert_eq!(
            refuse[1].1.join(" "),
            "-i br-1 ! -p tcp -m comment --comment agent-sandbox egress refuse \
             -j NFLOG --nflog-group 16723"
        );
        assert_eq!(
            split_rule(
                r#"-i br-1 ! -p tcp -m comment --comment "agent-sandbox egress refuse" -j X"#
            ),
            refuse[0].1[..9]
                .iter()
                .cloned()
                .chain(["-j".to_string(), "X".to_string()])
                .collect::<Vec<_>>()
        );
        assert!(rules[2..]
            .iter()
            .all(|(chain, r)| *chain == "INPUT" && r.join(" ").contains("--ctstate NEW")));
    }
}
