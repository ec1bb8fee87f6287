//! Reconciling one `Fork`: exactly `spec.replicas` child Sandboxes named `<fork>-<index>`, each
//! started from the snapshot (its captured spec plus the fork's overrides, `source` set to the
//! snapshot), owned by the Fork through an owner reference. Scaling down deletes the highest
//! indices; deleting the Fork deletes its children first. This module only writes desired state:
//! the children's own reconciles (run by the workers in parallel) build their containers.

use std::time::Duration;

use super::context::ForkContext;
use super::error::ReconcileError;
use super::policy::Outcome;
use super::status::{generation, set_ready, write_status};
use crate::resource::{
    is_valid_key, AnyResource, ConditionStatus, Fork, ForkPhase, ForkStatus, Kind, OwnerReference,
    Sandbox, SandboxPhase, SandboxSource, SandboxSpec, SnapshotPhase, API_VERSION,
};
use crate::store::{StoreError, WriteOptions};

/// How often a fork waiting for its snapshot, or for children to go, looks again.
const WAIT: Duration = Duration::from_secs(1);
const MISSING_RETRY: Duration = Duration::from_secs(10);

pub(super) async fn reconcile(
    ctl: &ForkContext<'_>,
    name: &str,
) -> Result<Outcome, ReconcileError> {
    let Some(entry) = ctl.store.get(Kind::Fork, name) else {
        return Ok(Outcome::done());
    };
    let Some(fork) = entry.resource.as_fork().cloned() else {
        return Ok(Outcome::done());
    };
    let children = children_of(ctl, &fork);
    if fork.metadata.deletion_timestamp.is_some() {
        return delete(ctl, &fork, &children).await;
    }

    let generation = generation(&fork.metadata);
    let mut status = fork.status.clone().unwrap_or_default();
    status.observed_generation = Some(generation);

    // Scaling down works whatever the snapshot's state.
    let replicas = fork.spec.replicas;
    for child in &children {
        if index_of(name, &child.metadata.key()).is_none_or(|i| i >= replicas)
            && child.metadata.deletion_timestamp.is_none()
        {
            delete_child(ctl, &child.metadata.key()).await?;
        }
    }

    let (template, problem) = match template(ctl, &fork) {
        Ok(template) => (Some(template), None),
        Err(problem) => (None, Some(problem)),
    };
    let mut conflicts = Vec::new();
    if let Some(template) = &template {
        let mut missing = Vec::new();
        for index in 0..replicas {
            let child_name = child_name(name, index);
            if !is_valid_key(&child_name) {
                conflicts.push(format!("child name {child_name:?} is not a valid name"));
                continue;
            }
            match ctl.store.get(Kind::Sandbox, &child_name) {
                None => missing.push(child_name),
                Some(existing) => {
                    let owned = existing
                        .resource
                        .as_sandbox()
                        .is_some_and(|s| is_owned_by(s, &fork));
                    if !owned {
                        conflicts.push(format!(
                            "sandbox {child_name:?} exists and does not belong to this fork"
                        ));
                    } else if existing
                        .resource
                        .as_sandbox()
                        .is_some_and(|s| &s.spec != template)
                    {
                        update_child(ctl, &child_name, template).await?;
                    }
                }
            }
        }
        create_children(ctl, &fork, missing, template).await?;
    }

    let children = children_of(ctl, &fork);
    let current: Vec<&Sandbox> = children
        .iter()
        .filter(|c| index_of(name, &c.metadata.key()).is_some_and(|i| i < replicas))
        .collect();
    status.children = current.iter().map(|c| c.metadata.name.clone()).collect();
    status.ready_replicas = current
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .is_some_and(|s| s.phase == SandboxPhase::Running)
        })
        .count() as u32;

    let outcome;
    let (phase, verdict, reason, message) = if let Some(problem) = problem {
        outcome = Outcome::after(problem.retry);
        (
            problem.phase,
            ConditionStatus::False,
            problem.reason,
            problem.message,
        )
    } else if !conflicts.is_empty() {
        outcome = Outcome::after(MISSING_RETRY);
        (
            ForkPhase::Failed,
            ConditionStatus::False,
            "ChildConflict",
            conflicts.join("; "),
        )
    } else if status.ready_replicas == replicas && status.children.len() == replicas as usize {
        outcome = Outcome::done();
        (
            ForkPhase::Ready,
            ConditionStatus::True,
            "Ready",
            String::new(),
        )
    } else {
        // Children report their progress as status changes, which requeue this fork.
        outcome = Outcome::done();
        let message = format!("{} of {replicas} children running", status.ready_replicas);
        (
            ForkPhase::Progressing,
            ConditionStatus::False,
            "Progressing",
            message,
        )
    };
    status.phase = phase;
    status.message.clone_from(&message);
    set_ready(
        &mut status.conditions,
        verdict,
        reason,
        &message,
        generation,
    );
    let progressing = status.phase == ForkPhase::Progressing;
    if progressing && only_progress_changed(fork.status.as_ref(), &status) {
        if let Some(wait) = ctl.fork_progress.wait(name) {
            return Ok(Outcome::after(wait));
        }
    }
    write_status(ctl.store, ctl.events, &fork, &status).await?;
    if progressing {
        ctl.fork_progress.wrote(name);
    } else {
        ctl.fork_progress.forget(name);
    }
    Ok(outcome)
}

/// Whether `new` differs from `old` only in how many children run: both progressing, same
/// generation, same children.
fn only_progress_changed(old: Option<&ForkStatus>, new: &ForkStatus) -> bool {
    old.is_some_and(|old| {
        old.phase == ForkPhase::Progressing
            && new.phase == ForkPhase::Progressing
            && old.observed_generation == new.observed_generation
            && old.children == new.children
    })
}

struct Problem {
    phase: ForkPhase,
    reason: &'static str,
    message: String,
    retry: Duration,
}

/// The spec every child gets: the snapshot's captured spec, the overrides, the snapshot as source.
fn template(ctl: &ForkContext<'_>, fork: &Fork) -> Result<SandboxSpec, Problem> {
    let snapshot_name = &fork.spec.snapshot;
    let snapshot = ctl
        .store
        .get(Kind::Snapshot, &fork.metadata.sibling(snapshot_name))
        .and_then(|e| e.resource.as_snapshot().cloned())
        .filter(|s| s.metadata.deletion_timestamp.is_none());
    let Some(snapshot) = snapshot else {
        return Err(Problem {
            phase: ForkPhase::Failed,
            reason: "SnapshotNotFound",
            message: format!("snapshot {snapshot_name:?} does not exist"),
            retry: MISSING_RETRY,
        });
    };
    let status = snapshot.status.clone().unwrap_or_default();
    match status.phase {
        SnapshotPhase::Pending => Err(Problem {
            phase: ForkPhase::Pending,
            reason: "WaitingForSnapshot",
            message: format!("snapshot {snapshot_name:?} is not ready yet"),
            retry: WAIT,
        }),
        SnapshotPhase::Failed => Err(Problem {
            phase: ForkPhase::Failed,
            reason: "SnapshotFailed",
            message: format!("snapshot {snapshot_name:?} failed: {}", status.message),
            retry: MISSING_RETRY,
        }),
        SnapshotPhase::Ready => {
            let mut spec = status.sandbox_spec.unwrap_or_else(|| SandboxSpec {
                image: status.image.clone(),
                ..SandboxSpec::default()
            });
            let overrides = &fork.spec.overrides;
            spec.ttl_seconds = overrides.ttl_seconds.or(spec.ttl_seconds);
            spec.network = overrides.network.or(spec.network);
            spec.cpus = overrides.cpus.or(spec.cpus);
            spec.memory_mb = overrides.memory_mb.or(spec.memory_mb);
            spec.source = Some(SandboxSource {
                snapshot: snapshot_name.clone(),
            });
            spec.rollback = None;
            spec.shutdown_time = None;
            Ok(spec)
        }
    }
}

/// `<fork>-<index>`.
pub fn child_name(fork: &str, index: u32) -> String {
    format!("{fork}-{index}")
}

fn index_of(fork: &str, child: &str) -> Option<u32> {
    let digits = child.strip_prefix(fork)?.strip_prefix('-')?;
    // `<fork>-01` is not a name this controller makes.
    if digits.len() > 1 && digits.starts_with('0') {
        return None;
    }
    digits.parse().ok()
}

fn owner_reference(fork: &Fork) -> OwnerReference {
    OwnerReference {
        api_version: API_VERSION.to_string(),
        kind: Kind::Fork.as_str().to_string(),
        name: fork.metadata.name.clone(),
        uid: fork.metadata.uid.clone().unwrap_or_default(),
    }
}

fn is_owned_by(sandbox: &Sandbox, fork: &Fork) -> bool {
    let wanted = owner_reference(fork);
    sandbox
        .metadata
        .owner_references
        .iter()
        .any(|r| r.kind == wanted.kind && r.name == wanted.name && r.uid == wanted.uid)
}

/// This fork's children, by owner reference, in index order.
fn children_of(ctl: &ForkContext<'_>, fork: &Fork) -> Vec<Sandbox> {
    let mut children: Vec<Sandbox> = ctl
        .store
        .list(Kind::Sandbox)
        .into_iter()
        .filter_map(|e| e.resource.as_sandbox().cloned())
        .filter(|s| is_owned_by(s, fork))
        .collect();
    children.sort_by_key(|c| {
        (
            index_of(&fork.metadata.key(), &c.metadata.key()),
            c.metadata.key(),
        )
    });
    children
}

/// Creates the children `names` together, off the async workers: one round of fsyncs for all of
/// them instead of one each, which would compete with the Docker calls of the first ones claimed.
async fn create_children(
    ctl: &ForkContext<'_>,
    fork: &Fork,
    names: Vec<String>,
    spec: &SandboxSpec,
) -> Result<(), ReconcileError> {
    if names.is_empty() {
        return Ok(());
    }
    let children = names
        .into_iter()
        .map(|name| {
            let (namespace, name) = crate::resource::split_key(&name);
            let mut child = Sandbox::new(name, spec.clone());
            child.metadata.namespace = namespace.to_string();
            child.metadata.labels = fork.metadata.labels.clone();
            AnyResource::Sandbox(child)
        })
        .collect();
    let owner = owner_reference(fork);
    let created = ctl
        .store
        .write(move |store| Ok(store.create_all_owned(children, vec![owner])))
        .await?;
    for result in created {
        match result {
            Ok(_) | Err(StoreError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

async fn update_child(
    ctl: &ForkContext<'_>,
    name: &str,
    spec: &SandboxSpec,
) -> Result<(), ReconcileError> {
    let (name, spec) = (name.to_string(), spec.clone());
    let result = ctl
        .store
        .write(move |store| {
            store.update(Kind::Sandbox, &name, |resource| {
                if let AnyResource::Sandbox(sandbox) = resource {
                    // A child's source is immutable: after a change of the fork's snapshot,
                    // existing children keep the workspace they were built from.
                    let source = sandbox.spec.source.take();
                    sandbox.spec = SandboxSpec {
                        source,
                        ..spec.clone()
                    };
                }
                Ok(())
            })
        })
        .await;
    match result {
        Ok(_) | Err(StoreError::NotFound { .. }) | Err(StoreError::Terminating { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn delete_child(ctl: &ForkContext<'_>, name: &str) -> Result<(), ReconcileError> {
    let name = name.to_string();
    let deleted = ctl
        .store
        .write(move |store| store.delete(Kind::Sandbox, &name, WriteOptions::default()))
        .await;
    match deleted {
        Ok(_) | Err(StoreError::NotFound { .. }) | Err(StoreError::Terminating { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes every child, waits until they are gone, then drops the Fork.
async fn delete(
    ctl: &ForkContext<'_>,
    fork: &Fork,
    children: &[Sandbox],
) -> Result<Outcome, ReconcileError> {
    ctl.fork_progress.forget(&fork.metadata.key());
    if children.is_empty() {
        let name = fork.metadata.key();
        ctl.store
            .write(move |store| store.finalize(Kind::Fork, &name))
            .await?;
        return Ok(Outcome::done());
    }
    for child in children {
        if child.metadata.deletion_timestamp.is_none() {
            delete_child(ctl, &child.metadata.key()).await?;
        }
    }
    // Each child's removal requeues this fork too; the timer is a safety net.
    Ok(Outcome::after(WAIT))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progressing(generation: u64, children: &[&str], ready: u32) -> ForkStatus {
        ForkStatus {
            phase: ForkPhase::Progressing,
            observed_generation: Some(generation),
            children: children.iter().map(|c| c.to_string()).collect(),
            ready_replicas: ready,
            message: format!("{ready} of {} children running", children.len()),
            ..ForkStatus::default()
        }
    }

    #[test]
    fn only_a_new_count_of_progressing_children_may_wait() {
        let old = progressing(1, &["f-0", "f-1"], 0);
        assert!(only_progress_changed(
            Some(&old),
            &progressing(1, &["f-0", "f-1"], 1)
        ));
        assert!(!only_progress_changed(None, &old));
        assert!(!only_progress_changed(
            Some(&old),
            &progressing(2, &["f-0", "f-1"], 1)
        ));
        assert!(!only_progress_changed(
            Some(&old),
            &progressing(1, &["f-0"], 0)
        ));
        let ready = ForkStatus {
            phase: ForkPhase::Ready,
            ..progressing(1, &["f-0", "f-1"], 2)
        };
        assert!(!only_progress_changed(Some(&old), &ready));
        assert!(!only_progress_changed(Some(&ready), &old));
    }

    #[test]
    fn child_indices() {
        assert_eq!(child_name("f", 3), "f-3");
        assert_eq!(index_of("f", "f-3"), Some(3));
        assert_eq!(index_of("f", "f-0"), Some(0));
        assert_eq!(index_of("f", "f-03"), None);
        assert_eq!(index_of("f", "g-3"), None);
        assert_eq!(index_of("f", "f-x"), None);
        assert_eq!(index_of("f-1", "f-1-2"), Some(2));
    }
}
