//! What a status change means as events. Every status the reconcilers write passes through the
//! one status write (`status.rs`), which hands the status before and after to [`Lifecycle`] and
//! records what it finds: a sandbox `Started`, `Paused`, `RolledBack`, a snapshot `SnapshotReady`,
//! anything `Failed` with its reason. Deriving events from the written status, rather than
//! recording them beside each step, means an event is recorded exactly when the step's result is
//! committed, and never for a step that a crash undid. This module decides what happened; the
//! store's event log names, counts and keeps it.

use crate::resource::{
    Condition, ConditionStatus, EventSeverity, ForkPhase, ForkStatus, SandboxPhase,
    SandboxPoolStatus, SandboxStatus, SnapshotPhase, SnapshotStatus,
};

/// The condition a sandbox carries while and once its image is pulled (written by `status.rs`).
pub(super) const IMAGE_PULLED: &str = "ImagePulled";

/// One thing that happened, before it is tied to its object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Note {
    pub severity: EventSeverity,
    pub reason: &'static str,
    pub message: String,
}

fn normal(reason: &'static str, message: impl Into<String>) -> Note {
    Note {
        severity: EventSeverity::Normal,
        reason,
        message: message.into(),
    }
}

fn warning(reason: &'static str, message: impl Into<String>) -> Note {
    Note {
        severity: EventSeverity::Warning,
        reason,
        message: message.into(),
    }
}

/// A status whose changes are events.
pub(super) trait Lifecycle {
    /// What happened between `old` (none before the first status) and `self`.
    fn notes(&self, old: Option<&Self>) -> Vec<Note>;
}

fn ready(conditions: &[Condition]) -> Option<&Condition> {
    conditions.iter().find(|c| c.type_ == "Ready")
}

/// `Failed` with the reason and message of the `Ready` condition.
fn failed(conditions: &[Condition], fallback: &str) -> Note {
    match ready(conditions) {
        Some(c) if c.message.is_empty() => warning("Failed", c.reason.clone()),
        Some(c) => warning("Failed", format!("{}: {}", c.reason, c.message)),
        None => warning("Failed", fallback.to_string()),
    }
}

/// A failure is news when the resource was not failing, or fails now for another reason.
fn fails_anew(new: &[Condition], old: Option<&[Condition]>, was_failed: bool) -> bool {
    let key = |c: Option<&Condition>| c.map(|c| (c.reason.clone(), c.message.clone()));
    !was_failed || key(ready(new)) != key(old.and_then(ready))
}

fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

impl Lifecycle for SandboxStatus {
    fn notes(&self, old: Option<&SandboxStatus>) -> Vec<Note> {
        let mut notes = Vec::new();
        let old_phase = old.map(|s| s.phase);
        let old_container = old.and_then(|s| s.container_id.as_deref());
        let old_rollback = old.and_then(|s| s.last_rollback.as_ref());
        let pulled = |s: &SandboxStatus| {
            s.conditions
                .iter()
                .any(|c| c.type_ == IMAGE_PULLED && c.status == ConditionStatus::True)
        };
        if pulled(self) && !old.is_some_and(pulled) {
            notes.push(normal("ImagePulled", "the image was pulled"));
        }
        let rolled_back = self
            .last_rollback
            .as_ref()
            .filter(|r| old_rollback.is_none_or(|o| o.request_id != r.request_id));
        if let Some(rollback) = rolled_back {
            notes.push(normal(
                "RolledBack",
                format!(
                    "the workspace was rolled back to snapshot {}",
                    rollback.snapshot
                ),
            ));
        }
        if let Some(new) = self
            .container_id
            .as_deref()
            .filter(|id| Some(*id) != old_container)
        {
            let claimed = self
                .claimed_from
                .as_deref()
                .filter(|pool| old.and_then(|s| s.claimed_from.as_deref()) != Some(*pool));
            match (claimed, old_container) {
                (Some(pool), _) => notes.push(normal(
                    "Claimed",
                    format!("claimed warm container {} from pool {pool}", short(new)),
                )),
                (None, None) => notes.push(normal(
                    "Created",
                    format!("created container {}", short(new)),
                )),
                // A rollback brings its own container; the RolledBack event says why.
                (None, Some(_)) if rolled_back.is_some() => {}
                (None, Some(previous)) => notes.push(normal(
                    "Replaced",
                    format!("container {} replaced by {}", short(previous), short(new)),
                )),
            }
        }
        if let Some(t) = self
            .last_termination
            .as_ref()
            .filter(|t| old.and_then(|o| o.last_termination.as_ref()) != Some(*t))
        {
            notes.push(warning(t.reason.as_str(), super::termination::message(t)));
        }
        let was_failed = old_phase == Some(SandboxPhase::Failed);
        if old_phase != Some(self.phase) || self.phase == SandboxPhase::Failed {
            match self.phase {
                SandboxPhase::Running => match old_phase {
                    Some(from @ (SandboxPhase::Paused | SandboxPhase::Stopped)) => notes.push(
                        normal("Resumed", format!("resumed from {}", phase_word(from))),
                    ),
                    _ => notes.push(normal("Started", "the sandbox is running")),
                },
                SandboxPhase::Paused => notes.push(normal("Paused", held_message(self, "paused"))),
                SandboxPhase::Stopped => {
                    notes.push(normal("Stopped", held_message(self, "stopped")))
                }
                SandboxPhase::Expired => notes.push(normal(
                    "Expired",
                    match self.expires_at {
                        Some(at) => format!("its lifetime ended at {}", at.to_rfc3339()),
                        None => "its lifetime ended".to_string(),
                    },
                )),
                SandboxPhase::Terminating => notes.push(normal(
                    "Killed",
                    "the sandbox was deleted: its container is killed and removed",
                )),
                SandboxPhase::Failed => {
                    if fails_anew(&self.conditions, old.map(|s| &s.conditions[..]), was_failed) {
                        notes.push(failed(&self.conditions, &self.message));
                    }
                }
                SandboxPhase::Pending | SandboxPhase::Creating => {}
            }
        }
        notes
    }
}

fn phase_word(phase: SandboxPhase) -> &'static str {
    match phase {
        SandboxPhase::Paused => "paused",
        SandboxPhase::Stopped => "stopped",
        _ => "another state",
    }
}

fn held_message(status: &SandboxStatus, word: &str) -> String {
    match status.idle_since {
        Some(since) => format!("{word}: idle since {}", since.to_rfc3339()),
        None => format!("{word} as its spec asks"),
    }
}

impl Lifecycle for SnapshotStatus {
    fn notes(&self, old: Option<&SnapshotStatus>) -> Vec<Note> {
        let old_phase = old.map(|s| s.phase);
        match self.phase {
            SnapshotPhase::Ready if old_phase != Some(SnapshotPhase::Ready) => {
                let size = self
                    .size_bytes
                    .map(|b| format!("{b} bytes"))
                    .unwrap_or_else(|| "stored".to_string());
                vec![normal(
                    "SnapshotReady",
                    format!("the snapshot is ready: {size}"),
                )]
            }
            SnapshotPhase::Failed
                if fails_anew(
                    &self.conditions,
                    old.map(|s| &s.conditions[..]),
                    old_phase == Some(SnapshotPhase::Failed),
                ) =>
            {
                vec![failed(&self.conditions, &self.message)]
            }
            _ => Vec::new(),
        }
    }
}

impl Lifecycle for ForkStatus {
    fn notes(&self, old: Option<&ForkStatus>) -> Vec<Note> {
        let mut notes = Vec::new();
        if !self.children.is_empty() && old.is_none_or(|s| s.children.is_empty()) {
            notes.push(normal(
                "Forked",
                format!(
                    "created {} sandboxes: {}",
                    self.children.len(),
                    list(&self.children)
                ),
            ));
        }
        let old_phase = old.map(|s| s.phase);
        if self.phase == ForkPhase::Failed
            && fails_anew(
                &self.conditions,
                old.map(|s| &s.conditions[..]),
                old_phase == Some(ForkPhase::Failed),
            )
        {
            notes.push(failed(&self.conditions, &self.message));
        }
        notes
    }
}

/// The first few names, and how many more.
fn list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// Whether a Secret has a value is status, not news.
impl Lifecycle for crate::resource::SecretStatus {
    fn notes(&self, _old: Option<&Self>) -> Vec<Note> {
        Vec::new()
    }
}

impl Lifecycle for crate::resource::ResourceQuotaStatus {
    fn notes(&self, _old: Option<&Self>) -> Vec<Note> {
        Vec::new()
    }
}

impl Lifecycle for crate::resource::SandboxTemplateStatus {
    fn notes(&self, _old: Option<&Self>) -> Vec<Note> {
        Vec::new()
    }
}

impl Lifecycle for SandboxPoolStatus {
    fn notes(&self, old: Option<&SandboxPoolStatus>) -> Vec<Note> {
        let failing = |conditions: &[Condition]| {
            ready(conditions)
                .is_some_and(|c| c.status == ConditionStatus::False && c.reason != "Filling")
        };
        if failing(&self.conditions)
            && fails_anew(
                &self.conditions,
                old.map(|s| &s.conditions[..]),
                old.is_some_and(|s| failing(&s.conditions)),
            )
        {
            vec![failed(&self.conditions, &self.message)]
        } else {
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::RollbackRecord;

    fn reasons(notes: Vec<Note>) -> Vec<&'static str> {
        notes.into_iter().map(|n| n.reason).collect()
    }

    fn running(container: &str) -> SandboxStatus {
        SandboxStatus {
            phase: SandboxPhase::Running,
            container_id: Some(container.into()),
            ..SandboxStatus::default()
        }
    }

    #[test]
    fn a_sandbox_lifecycle_reads_as_events() {
        let creating = SandboxStatus {
            phase: SandboxPhase::Creating,
            ..SandboxStatus::default()
        };
        assert!(creating.notes(None).is_empty());
        assert_eq!(
            reasons(running("c1").notes(Some(&creating))),
            ["Created", "Started"]
        );
        assert!(
            running("c1").notes(Some(&running("c1"))).is_empty(),
            "nothing new"
        );
        assert_eq!(
            reasons(running("c2").notes(Some(&running("c1")))),
            ["Replaced"]
        );
        let paused = SandboxStatus {
            phase: SandboxPhase::Paused,
            ..running("c2")
        };
        assert_eq!(reasons(paused.notes(Some(&running("c2")))), ["Paused"]);
        let resumed = running("c2").notes(Some(&paused));
        assert_eq!(resumed[0].reason, "Resumed");
        assert_eq!(resumed[0].message, "resumed from paused");
        let rolled = SandboxStatus {
            last_rollback: Some(RollbackRecord {
                request_id: "r1".into(),
                snapshot: "snap".into(),
                completed_at: chrono::Utc::now(),
            }),
            ..running("c3")
        };
        assert_eq!(reasons(rolled.notes(Some(&running("c2")))), ["RolledBack"]);
        let claimed = SandboxStatus {
            claimed_from: Some("warm".into()),
            ..running("c9")
        };
        assert_eq!(
            reasons(claimed.notes(Some(&creating))),
            ["Claimed", "Started"]
        );
        let expired = SandboxStatus {
            phase: SandboxPhase::Expired,
            ..running("c2")
        };
        assert_eq!(reasons(expired.notes(Some(&running("c2")))), ["Expired"]);
    }

    #[test]
    fn a_failure_carries_its_reason_and_is_news_only_once() {
        let mut failed = SandboxStatus {
            phase: SandboxPhase::Failed,
            ..SandboxStatus::default()
        };
        crate::resource::set_condition(
            &mut failed.conditions,
            Condition {
                type_: "Ready".into(),
                status: ConditionStatus::False,
                reason: "ImageNotAllowed".into(),
                message: "image x is not allowed".into(),
                last_transition_time: chrono::Utc::now(),
                observed_generation: Some(1),
            },
        );
        let notes = failed.notes(None);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0].severity, EventSeverity::Warning);
        assert_eq!(notes[0].message, "ImageNotAllowed: image x is not allowed");
        assert!(failed.notes(Some(&failed)).is_empty());
    }

    #[test]
    fn snapshots_and_forks() {
        let ready = SnapshotStatus {
            phase: SnapshotPhase::Ready,
            size_bytes: Some(10),
            ..SnapshotStatus::default()
        };
        assert_eq!(reasons(ready.notes(None)), ["SnapshotReady"]);
        assert!(ready.notes(Some(&ready)).is_empty());
        let fork = ForkStatus {
            children: vec!["a".into(), "b".into()],
            ..ForkStatus::default()
        };
        let notes = fork.notes(Some(&ForkStatus::default()));
        assert_eq!(notes[0].reason, "Forked");
        assert_eq!(notes[0].message, "created 2 sandboxes: a, b");
    }
}
