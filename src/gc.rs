//! `agent-sandbox gc`: removes labeled containers and volumes that no running server claims, and
//! the heartbeat by which a running server claims its own. It owns the claim rule and the
//! heartbeat's names and labels; it talks to Docker only through [`crate::docker::Engine`], and
//! it never reads a data directory or touches an object of a live server.
//!
//! The controller's own garbage collection only removes objects carrying its server label whose
//! resources are gone. Objects of a server identity that no longer runs (its data directory was
//! lost or reset, so it came back with a new identity) and objects of the reference server
//! (`io.agent-sandbox.managed=true` without a server label) are left to this command.
//!
//! **Heartbeat.** Docker cannot change an object's labels, and a lock file is only visible on one
//! host's file system (the daemon may be remote, and data directories are not discoverable), so
//! a running server claims its identity with a marker volume on the daemon itself:
//! `agent-sandbox-heartbeat-<server>-<unix seconds>`, labeled [`LABEL_HEARTBEAT`] (the server
//! identity) and [`LABEL_HEARTBEAT_AT`]. Every [`HEARTBEAT_INTERVAL`] it creates a new one and
//! then removes its older ones, so one always exists. Nothing mounts them (they hold no data), and
//! they carry no `managed` label, so no garbage collection of sandboxes ever sees them. A beat also
//! removes other servers' heartbeats long past stale ([`HEARTBEAT_FORGOTTEN`]): a killed server
//! leaves its last one behind. A server
//! beats once before its controller starts, so it has a heartbeat before it creates anything.
//! An identity is alive while its newest heartbeat is younger than [`HEARTBEAT_STALE`], six
//! intervals. The command lists the objects first and the heartbeats second, so an object made
//! by a server that started in between is seen with that server's heartbeat.
//!
//! A server of a version without the heartbeat looks dead to this command: upgrade every server
//! on the daemon first (or narrow the command with `--selector`). A stopped server is not
//! running: its sandboxes are not claimed either.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::docker::{
    Engine, EngineError, ManagedContainer, ManagedVolume, LABEL_MANAGED, LABEL_ROLE, LABEL_SERVER,
};

/// Label on a heartbeat volume: the identity of the server that keeps it.
pub const LABEL_HEARTBEAT: &str = "io.agent-sandbox.heartbeat";
/// Label on a heartbeat volume: when it was made, in Unix seconds of the server's clock.
pub const LABEL_HEARTBEAT_AT: &str = "io.agent-sandbox.heartbeat-at";
/// How often a running server renews its heartbeat.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(15);
/// A heartbeat older than this no longer claims anything.
pub const HEARTBEAT_STALE: Duration = Duration::from_secs(90);

#[derive(clap::Args, Debug)]
pub struct GcArgs {
    /// Also remove objects of the reference server (`io.agent-sandbox.managed=true` without a
    /// server label).
    #[arg(long)]
    pub all_servers: bool,
    /// List what would be removed; remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Only objects carrying this label (`key=value`); may be repeated, all must match.
    #[arg(long = "selector", short = 'l', value_name = "KEY=VALUE", value_parser = parse_selector)]
    pub selector: Vec<(String, String)>,
}

fn parse_selector(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.to_string(), value.to_string())),
        _ => Err(format!("{text:?} is not key=value")),
    }
}

fn heartbeat_name(server: &str, at: u64) -> String {
    format!("agent-sandbox-heartbeat-{server}-{at}")
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn beat_time(volume: &ManagedVolume) -> Option<u64> {
    volume.labels.get(LABEL_HEARTBEAT_AT)?.parse().ok()
}

/// How old another server's heartbeat must be before a beat removes it: far past stale (it
/// claims nothing since [`HEARTBEAT_STALE`]), so that clocks apart by minutes do not matter.
pub const HEARTBEAT_FORGOTTEN: Duration = Duration::from_secs(15 * 60);

/// Renews `server`'s heartbeat: a new marker first, then its older ones go, and those of other
/// servers older than [`HEARTBEAT_FORGOTTEN`] (a server killed without a chance to remove its
/// own; `agent-sandbox gc` would take them too, but nothing else would).
pub async fn beat(engine: &dyn Engine, server: &str) -> Result<(), EngineError> {
    let at = unix_now();
    let labels = BTreeMap::from([
        (LABEL_HEARTBEAT.to_string(), server.to_string()),
        (LABEL_HEARTBEAT_AT.to_string(), at.to_string()),
    ]);
    let name = heartbeat_name(server, at);
    engine.create_marker_volume(&name, &labels).await?;
    for old in engine.list_volumes_with_label(LABEL_HEARTBEAT).await? {
        let mine = old.labels.get(LABEL_HEARTBEAT).map(String::as_str) == Some(server);
        let replaced = mine && old.name != name && beat_time(&old).is_none_or(|t| t <= at);
        let forgotten = !mine
            && beat_time(&old)
                .is_some_and(|t| at.saturating_sub(t) > HEARTBEAT_FORGOTTEN.as_secs());
        if replaced || forgotten {
            engine.remove_volume(&old.name).await?;
        }
    }
    Ok(())
}

/// Renews the heartbeat every [`HEARTBEAT_INTERVAL`] until dropped; failures are logged.
pub async fn keep_beating(engine: Arc<dyn Engine>, server: String) {
    loop {
        tokio::time::sleep(HEARTBEAT_INTERVAL).await;
        if let Err(e) = beat(engine.as_ref(), &server).await {
            tracing::warn!("cannot renew the server's heartbeat: {e}");
        }
    }
}

/// Server identities whose newest heartbeat is fresh at `now`.
pub fn live_servers(heartbeats: &[ManagedVolume], now: u64) -> BTreeSet<String> {
    heartbeats
        .iter()
        .filter(|v| beat_time(v).is_some_and(|t| now.saturating_sub(t) < HEARTBEAT_STALE.as_secs()))
        .filter_map(|v| v.labels.get(LABEL_HEARTBEAT).cloned())
        .collect()
}

/// What the command may take, decided from labels alone.
#[derive(Debug, Default, PartialEq)]
pub struct Unclaimed {
    pub containers: Vec<ManagedContainer>,
    pub volumes: Vec<ManagedVolume>,
    /// Stale heartbeats of servers that are gone.
    pub heartbeats: Vec<ManagedVolume>,
}

/// The claim rule. An object is taken when it matches `selector`, is managed, has no role (the
/// helper volume and the volume fillers are shared by every server), and either carries the
/// label of a server that is not live or — only with `all_servers` — carries no server label.
pub fn unclaimed(
    containers: Vec<ManagedContainer>,
    volumes: Vec<ManagedVolume>,
    heartbeats: Vec<ManagedVolume>,
    live: &BTreeSet<String>,
    all_servers: bool,
    selector: &[(String, String)],
) -> Unclaimed {
    let selected = |labels: &BTreeMap<String, String>| {
        selector
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
    };
    let take = |labels: &BTreeMap<String, String>| {
        let managed = labels.get(LABEL_MANAGED).map(String::as_str) == Some("true");
        let unowned = match labels.get(LABEL_SERVER) {
            Some(server) => !live.contains(server),
            None => all_servers,
        };
        managed && !labels.contains_key(LABEL_ROLE) && unowned && selected(labels)
    };
    Unclaimed {
        containers: containers.into_iter().filter(|c| take(&c.labels)).collect(),
        volumes: volumes.into_iter().filter(|v| take(&v.labels)).collect(),
        heartbeats: heartbeats
            .into_iter()
            .filter(|v| {
                v.labels
                    .get(LABEL_HEARTBEAT)
                    .is_some_and(|s| !live.contains(s))
                    && selected(&v.labels)
            })
            .collect(),
    }
}

fn owner(labels: &BTreeMap<String, String>) -> String {
    match labels.get(LABEL_SERVER) {
        Some(server) => format!("server {server}"),
        None => "reference server".to_string(),
    }
}

/// Lists, then (without `--dry-run`) removes: containers first, since Docker keeps a volume a
/// container still uses.
pub async fn run(engine: &dyn Engine, args: &GcArgs) -> Result<usize, EngineError> {
    let containers = engine.list_containers().await?;
    let volumes = engine.list_volumes().await?;
    let heartbeats = engine.list_volumes_with_label(LABEL_HEARTBEAT).await?;
    let live = live_servers(&heartbeats, unix_now());
    let found = unclaimed(
        containers,
        volumes,
        heartbeats,
        &live,
        args.all_servers,
        &args.selector,
    );
    let verb = if args.dry_run {
        "would remove"
    } else {
        "removed"
    };
    let mut failures = 0;
    for c in &found.containers {
        let outcome = if args.dry_run {
            Ok(())
        } else {
            engine.remove_container(&c.id).await
        };
        report(
            outcome,
            verb,
            "container",
            &c.name,
            &owner(&c.labels),
            &mut failures,
        );
    }
    for v in found.volumes.iter().chain(&found.heartbeats) {
        let outcome = if args.dry_run {
            Ok(())
        } else {
            engine.remove_volume(&v.name).await
        };
        let whose = match v.labels.get(LABEL_HEARTBEAT) {
            Some(server) => format!("heartbeat of server {server}"),
            None => owner(&v.labels),
        };
        report(outcome, verb, "volume", &v.name, &whose, &mut failures);
    }
    println!(
        "{} {} container(s) and {} volume(s); live servers: {}",
        verb,
        found.containers.len(),
        found.volumes.len() + found.heartbeats.len(),
        if live.is_empty() {
            "none".to_string()
        } else {
            live.into_iter().collect::<Vec<_>>().join(", ")
        }
    );
    Ok(failures)
}

fn report(
    outcome: Result<(), EngineError>,
    verb: &str,
    what: &str,
    name: &str,
    whose: &str,
    failures: &mut usize,
) {
    match outcome {
        Ok(()) => println!("{verb} {what} {name} ({whose})"),
        Err(e) => {
            *failures += 1;
            eprintln!("error: cannot remove {what} {name} ({whose}): {e}");
        }
    }
}

/// The `gc` command: connects to the daemon, collects, and says how it went in the exit code.
pub async fn command(args: GcArgs) -> ExitCode {
    let engine = match crate::docker::BollardEngine::connect().await {
        Ok(engine) => engine,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&engine, &args).await {
        Ok(0) => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn container(name: &str, pairs: &[(&str, &str)]) -> ManagedContainer {
        ManagedContainer {
            id: name.into(),
            name: name.into(),
            labels: labels(pairs),
            state: "running".into(),
        }
    }

    fn volume(name: &str, pairs: &[(&str, &str)]) -> ManagedVolume {
        ManagedVolume {
            name: name.into(),
            labels: labels(pairs),
        }
    }

    #[test]
    fn live_servers_keep_theirs_dead_and_reference_ones_go_as_asked() {
        let now = 10_000;
        let beats = vec![
            volume(
                "hb-live",
                &[(LABEL_HEARTBEAT, "live"), (LABEL_HEARTBEAT_AT, "9990")],
            ),
            volume(
                "hb-dead",
                &[(LABEL_HEARTBEAT, "dead"), (LABEL_HEARTBEAT_AT, "9000")],
            ),
        ];
        let live = live_servers(&beats, now);
        assert_eq!(live, BTreeSet::from(["live".to_string()]));
        let m = (LABEL_MANAGED, "true");
        let containers = vec![
            container("of-live", &[m, (LABEL_SERVER, "live")]),
            container("of-dead", &[m, (LABEL_SERVER, "dead")]),
            container("of-reference", &[m]),
            container("helper-filler", &[m, (LABEL_ROLE, "volume-filler")]),
            container("unmanaged", &[(LABEL_SERVER, "dead")]),
        ];
        let volumes = vec![
            volume("helper", &[m, (LABEL_ROLE, "helper")]),
            volume("ws-dead", &[m, (LABEL_SERVER, "dead")]),
            volume("ws-reference", &[m]),
        ];
        let names = |u: &Unclaimed| {
            let mut n: Vec<String> = u.containers.iter().map(|c| c.name.clone()).collect();
            n.extend(
                u.volumes
                    .iter()
                    .chain(&u.heartbeats)
                    .map(|v| v.name.clone()),
            );
            n
        };
        let found = unclaimed(
            containers.clone(),
            volumes.clone(),
            beats.clone(),
            &live,
            false,
            &[],
        );
        assert_eq!(names(&found), ["of-dead", "ws-dead", "hb-dead"]);
        let found = unclaimed(
            containers.clone(),
            volumes.clone(),
            beats.clone(),
            &live,
            true,
            &[],
        );
        assert_eq!(
            names(&found),
            [
                "of-dead",
                "of-reference",
                "ws-dead",
                "ws-reference",
                "hb-dead"
            ]
        );
        // A selector narrows everything, heartbeats included.
        let selector = [(LABEL_SERVER.to_string(), "dead".to_string())];
        let found = unclaimed(containers, volumes, beats, &live, true, &selector);
        assert_eq!(names(&found), ["of-dead", "ws-dead"]);
    }

    #[test]
    fn a_beat_replaces_the_older_heartbeats_of_its_server_and_forgotten_ones_of_others() {
        let engine = crate::docker::fake::FakeEngine::new();
        let old = labels(&[(LABEL_HEARTBEAT, "me"), (LABEL_HEARTBEAT_AT, "1")]);
        // Stale (it claims nothing) but not yet forgotten: a server whose clock is minutes
        // behind, or one stopped for a while, keeps it.
        let stale = (unix_now() - 2 * HEARTBEAT_STALE.as_secs()).to_string();
        let other = labels(&[(LABEL_HEARTBEAT, "other"), (LABEL_HEARTBEAT_AT, &stale)]);
        let killed = labels(&[(LABEL_HEARTBEAT, "killed"), (LABEL_HEARTBEAT_AT, "1")]);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async {
            engine.create_marker_volume("hb-old", &old).await.unwrap();
            engine
                .create_marker_volume("hb-other", &other)
                .await
                .unwrap();
            engine
                .create_marker_volume("hb-killed", &killed)
                .await
                .unwrap();
            beat(&engine, "me").await.unwrap();
            let left = engine
                .list_volumes_with_label(LABEL_HEARTBEAT)
                .await
                .unwrap();
            let mut names: Vec<_> = left.iter().map(|v| v.name.as_str()).collect();
            names.sort();
            assert_eq!(names.len(), 2, "{names:?}");
            assert!(names.contains(&"hb-other"));
            assert!(!names.contains(&"hb-killed"));
            assert!(names
                .iter()
                .any(|n| n.starts_with("agent-sandbox-heartbeat-me-")));
            assert_eq!(
                live_servers(&left, unix_now()),
                BTreeSet::from(["me".to_string()])
            );
        });
    }

    #[test]
    fn selectors_are_key_value() {
        assert_eq!(parse_selector("a=b"), Ok(("a".into(), "b".into())));
        assert_eq!(parse_selector("a="), Ok(("a".into(), String::new())));
        assert!(parse_selector("=b").is_err());
        assert!(parse_selector("ab").is_err());
    }
}
