//! Why a sandbox's container, or a process in it, died: the facts behind
//! `status.lastTermination`. Docker's events say it as it happens: `oom` when the kernel's OOM
//! killer struck in the container's memory cgroup (a command killed inside a running container
//! leaves the container's `State.OOMKilled` false, so this event is the only word of it; Docker
//! sends it under runc and runsc alike), `kill` when someone asked Docker to stop or kill the
//! container (with the signal). [`Terminations`] keeps the last of these per container until the
//! sandbox's reconcile turns them into a [`Termination`]; the container's own state (exit code,
//! `OOMKilled`, `FinishedAt`) completes them. When this server was down as it happened, the
//! container's state is all there is: a stop of the helper's container that nobody is known to
//! have asked for is then reported as the helper's loss. This module neither talks to Docker nor
//! writes status; it only remembers and classifies.

use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Utc};

use crate::docker::{ContainerDetails, EngineEvent};
use crate::resource::{Termination, TerminationReason};

/// Containers remembered at most (the oldest observation goes first).
const KEEP: usize = 4096;

#[derive(Clone, Debug, Default)]
struct Seen {
    /// The last OOM kill not yet reported.
    oom: Option<DateTime<Utc>>,
    /// The last stop or kill someone asked Docker for: signal and when.
    kill: Option<(Option<i64>, DateTime<Utc>)>,
    /// When this entry last changed, to forget the oldest.
    touched: DateTime<Utc>,
}

/// What Docker's events said about each managed container lately.
#[derive(Debug, Default)]
pub(super) struct Terminations {
    seen: Mutex<HashMap<String, Seen>>,
}

impl Terminations {
    /// Takes note of one Docker event (only `oom`, `kill` and `destroy` of containers matter).
    pub(super) fn observe(&self, event: &EngineEvent) {
        let Some(container) = event.container.as_deref() else {
            return;
        };
        let at = event.at.unwrap_or_else(Utc::now);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        match event.action.as_str() {
            "oom" | "kill" => {
                if seen.len() >= KEEP && !seen.contains_key(container) {
                    let oldest = seen
                        .iter()
                        .min_by_key(|(_, s)| s.touched)
                        .map(|(id, _)| id.clone());
                    if let Some(oldest) = oldest {
                        seen.remove(&oldest);
                    }
                }
                let entry = seen.entry(container.to_string()).or_default();
                entry.touched = at;
                if event.action == "oom" {
                    entry.oom = Some(at);
                } else {
                    entry.kill = Some((event.signal, at));
                }
            }
            "destroy" => {
                seen.remove(container);
            }
            _ => {}
        }
    }

    /// An OOM kill in `container` (still running) that was not reported yet: a command died.
    pub(super) fn command_oom(&self, container: &str) -> Option<Termination> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let at = seen.get_mut(container)?.oom.take()?;
        Some(Termination {
            reason: TerminationReason::OomKilled,
            exit_code: None,
            signal: Some(SIGKILL),
            container_id: Some(container.to_string()),
            at,
        })
    }

    /// Why `details`, a container that ran and has stopped, stopped.
    pub(super) fn stopped(&self, details: &ContainerDetails) -> Termination {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let remembered = seen.remove(&details.id).unwrap_or_default();
        // Only what happened during the last run counts.
        let this_run = |at: &DateTime<Utc>| details.started_at.is_none_or(|start| *at >= start);
        let oom = remembered.oom.filter(this_run);
        let kill = remembered.kill.filter(|(_, at)| this_run(at));
        classify(details, oom, kill)
    }
}

const SIGKILL: i64 = 9;

/// The signal an exit code reports (a shell's and an init's `128 + n`).
fn signal_of(exit_code: Option<i64>) -> Option<i64> {
    exit_code
        .filter(|c| (129..=128 + 64).contains(c))
        .map(|c| c - 128)
}

fn classify(
    details: &ContainerDetails,
    oom: Option<DateTime<Utc>>,
    kill: Option<(Option<i64>, DateTime<Utc>)>,
) -> Termination {
    let exit_code = details.exit_code;
    let at = details
        .finished_at
        .or(kill.map(|(_, at)| at))
        .or(oom)
        .unwrap_or_else(Utc::now);
    let (reason, signal) = if details.oom_killed || oom.is_some() {
        (TerminationReason::OomKilled, signal_of(exit_code))
    } else if let Some((signal, _)) = kill {
        (TerminationReason::Killed, signal.or(signal_of(exit_code)))
    } else if details.helper_main {
        (TerminationReason::HelperLost, signal_of(exit_code))
    } else {
        (TerminationReason::Exited, signal_of(exit_code))
    };
    Termination {
        reason,
        exit_code,
        signal,
        container_id: Some(details.id.clone()),
        at,
    }
}

/// The event message for a termination (numbers and reasons only: nothing a process printed).
pub(super) fn message(t: &Termination) -> String {
    let how = match (t.exit_code, t.signal) {
        (Some(code), Some(signal)) => format!(" (exit code {code}, signal {signal})"),
        (Some(code), None) => format!(" (exit code {code})"),
        (None, Some(signal)) => format!(" (signal {signal})"),
        (None, None) => String::new(),
    };
    match (t.reason, t.exit_code) {
        (TerminationReason::OomKilled, None) => {
            format!("a process was killed for want of memory{how}; the sandbox runs on")
        }
        (TerminationReason::OomKilled, Some(_)) => {
            format!("the container was killed for want of memory{how}; it was started again")
        }
        (TerminationReason::Killed, _) => {
            format!("the container was stopped from outside{how}; it was started again")
        }
        (TerminationReason::HelperLost, _) => format!(
            "the in-sandbox helper ended without being asked{how}; the container was started \
             again and its processes are lost"
        ),
        (TerminationReason::Exited, _) => {
            format!("the container's main process exited{how}; it was started again")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn details(exit: i64, helper: bool) -> ContainerDetails {
        ContainerDetails {
            id: "c1".into(),
            name: "agent-sandbox-s".into(),
            state: "exited".into(),
            running: false,
            paused: false,
            exit_code: Some(exit),
            oom_killed: false,
            finished_at: Some(Utc::now()),
            helper_main: helper,
            error: String::new(),
            started_at: Some(Utc::now() - chrono::Duration::seconds(60)),
            pid: 0,
            runtime: None,
            labels: Default::default(),
            workspace_source: None,
        }
    }

    fn event(action: &str, signal: Option<i64>, ago: i64) -> EngineEvent {
        EngineEvent {
            object: "container".into(),
            action: action.into(),
            container: Some("c1".into()),
            signal,
            at: Some(Utc::now() - chrono::Duration::seconds(ago)),
            ..Default::default()
        }
    }

    #[test]
    fn a_stop_nobody_asked_for_is_the_helpers_loss() {
        let t = Terminations::default();
        let lost = t.stopped(&details(137, true));
        assert_eq!(lost.reason, TerminationReason::HelperLost);
        assert_eq!((lost.exit_code, lost.signal), (Some(137), Some(9)));
        assert_eq!(
            t.stopped(&details(3, false)).reason,
            TerminationReason::Exited
        );
        assert_eq!(t.stopped(&details(3, false)).signal, None);
    }

    #[test]
    fn a_kill_during_the_run_is_a_kill_and_an_older_one_is_not() {
        let t = Terminations::default();
        t.observe(&event("kill", Some(15), 5));
        let killed = t.stopped(&details(143, true));
        assert_eq!(killed.reason, TerminationReason::Killed);
        assert_eq!(killed.signal, Some(15));
        t.observe(&event("kill", Some(9), 600));
        assert_eq!(
            t.stopped(&details(137, true)).reason,
            TerminationReason::HelperLost,
            "a kill before the last start is not why it stopped"
        );
    }

    #[test]
    fn oom_kills_are_reported_once() {
        let t = Terminations::default();
        t.observe(&event("oom", None, 1));
        let oom = t.command_oom("c1").unwrap();
        assert_eq!(oom.reason, TerminationReason::OomKilled);
        assert!(message(&oom).contains("runs on"));
        assert!(t.command_oom("c1").is_none());
        let mut d = details(137, true);
        d.oom_killed = true;
        assert_eq!(t.stopped(&d).reason, TerminationReason::OomKilled);
        t.observe(&event("oom", None, 1));
        t.observe(&event("destroy", None, 0));
        assert!(t.command_oom("c1").is_none());
    }
}
