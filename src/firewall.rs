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
    for (chain, rule) in rules(bridge) {
        let mut check = vec!["-C".to_string(), chain.to_string()];
        check.extend(rule.iter().cloned());
        if iptables(&check).await?.status.success() {
            continue;
        }
        let mut insert = vec!["-I".to_string(), chain.to_string(), "1".to_string()];
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
        assert!(rules[2..]
            .iter()
            .all(|(chain, r)| *chain == "INPUT" && r.join(" ").contains("--ctstate NEW")));
    }
}
