//! A sandbox's power state: holding its container paused or stopped as `spec.state` says (the
//! same container throughout, so a resume continues it, or starts it again with its root
//! filesystem and `/workspace` as they were), counting resumes, and the idle policy
//! (`spec.idle`) that pauses or stops a sandbox nobody uses. Making the container exist and run
//! is `sandbox.rs`'s (`ensure_running`); this module only ever pauses, stops, or starts again a
//! container that is already the sandbox's.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::context::SandboxContext;
use super::error::ReconcileError;
use super::names::container_name;
use crate::docker::{ContainerDetails, EngineError, LABEL_SPEC_HASH, LABEL_UID};
use crate::resource::{AnyResource, EffectiveSandbox, Kind, Sandbox, SandboxState, SandboxStatus};
use crate::store::StoreError;

/// How long a stopping sandbox's processes get between SIGTERM and SIGKILL.
pub(super) const STOP_GRACE: Duration = Duration::from_secs(5);

/// Whether `details` is the container this sandbox's status and spec say it runs: built for this
/// resource from this spec (or recorded as claimed for it), and the one recorded, if one is.
pub(super) fn is_current(
    details: &ContainerDetails,
    status: &SandboxStatus,
    uid: &str,
    hash: &str,
) -> bool {
    let claimed_id = status
        .container_hash
        .as_deref()
        .filter(|h| *h == hash)
        .and(status.container_id.as_deref());
    let built_for_us = details.labels.get(LABEL_UID).map(String::as_str) == Some(uid)
        && details.labels.get(LABEL_SPEC_HASH).map(String::as_str) == Some(hash)
        && status
            .container_id
            .as_deref()
            .is_none_or(|id| id == details.id);
    built_for_us || claimed_id == Some(details.id.as_str())
}

/// Puts the sandbox's recorded container in `state` (`Paused` or `Stopped`) when it has one that
/// is still current, and answers whether it did. Anything else (no container yet, one built from
/// another spec) is for `ensure_running` to fix first.
pub(super) async fn hold(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &SandboxStatus,
    state: SandboxState,
) -> Result<bool, ReconcileError> {
    let name = &sandbox.metadata.key();
    let Some(recorded) = status.container_id.as_deref() else {
        return Ok(false);
    };
    let Some(details) = ctl.engine.inspect_container(&container_name(name)).await? else {
        return Ok(false);
    };
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    if details.id != recorded || !is_current(&details, status, &uid, &effective.container_hash()) {
        return Ok(false);
    }
    apply(ctl, name, &details, state).await?;
    Ok(true)
}

/// Puts the current container `details` in `state`. A snapshot in progress finishes first: it
/// thaws what it froze, which must not undo a pause.
pub(super) async fn apply(
    ctl: &SandboxContext<'_>,
    name: &str,
    details: &ContainerDetails,
    state: SandboxState,
) -> Result<(), ReconcileError> {
    let id = details.id.as_str();
    match state {
        SandboxState::Running => {}
        SandboxState::Paused if details.paused && !ctl.snapshots.holds_paused(name) => {}
        SandboxState::Paused => {
            let _snapshots_wait = ctl.snapshots.lock(name).await;
            if !details.running {
                start_existing(ctl, id).await?;
            }
            ctl.engine.pause(id).await?;
        }
        SandboxState::Stopped if !details.running => {}
        SandboxState::Stopped => {
            let _snapshots_wait = ctl.snapshots.lock(name).await;
            ctl.engine.stop_container(id, STOP_GRACE).await?;
        }
    }
    Ok(())
}

/// Starts the sandbox's existing container `id`. One whose runtime kept its task across a Docker
/// daemon restart can never start again, so it is removed and the error returned: the next
/// reconcile finds no container and makes a new one on the same workspace (processes are fresh
/// after such a restart anyway; a writable root filesystem's changes are what is lost).
pub(super) async fn start_existing(
    ctl: &SandboxContext<'_>,
    id: &str,
) -> Result<(), ReconcileError> {
    match ctl.engine.start_container(id).await {
        Err(stale @ EngineError::StaleRuntimeTask { .. }) => {
            tracing::warn!(container = id, "{stale}");
            ctl.engine.remove_container(id).await?;
            Err(stale.into())
        }
        other => Ok(other?),
    }
}

/// Records a resume when a sandbox that was paused or stopped runs again.
pub(super) fn note_resumed(ctl: &SandboxContext<'_>, name: &str, status: &mut SandboxStatus) {
    status.resumes = status.resumes.saturating_add(1);
    status.last_resumed_at = Some(Utc::now());
    status.idle_since = None;
    ctl.activity.touch(name);
}

/// What the idle policy says about a running sandbox now.
pub(super) enum Idle {
    /// No policy, or nothing due: look again at this time (if any).
    Until(Option<DateTime<Utc>>),
    /// Unused since this time, long enough: take the action.
    Since(DateTime<Utc>),
}

/// Judges a running sandbox against its idle policy and the activity the API reported.
pub(super) fn idle(ctl: &SandboxContext<'_>, sandbox: &Sandbox) -> Idle {
    let Some(policy) = &sandbox.spec.idle else {
        return Idle::Until(None);
    };
    let after =
        chrono::TimeDelta::try_seconds(i64::try_from(policy.after_seconds).unwrap_or(i64::MAX))
            .unwrap_or(chrono::TimeDelta::MAX);
    let (last, busy) = ctl.activity.observe(&sandbox.metadata.key());
    let now = Utc::now();
    if busy {
        // A command runs; its end counts as activity and starts the count again.
        return Idle::Until(now.checked_add_signed(after));
    }
    match last.checked_add_signed(after) {
        Some(due) if due > now => Idle::Until(Some(due)),
        Some(_) => Idle::Since(last),
        None => Idle::Until(None),
    }
}

/// A sandbox its API calls show idle is asked about its long-lived processes before anything is
/// done: one that still runs keeps it in use (it is looked at again a period later), and the end
/// of the last one counts as activity, as the end of an exec does. The question is asked only
/// when idleness is due, so it costs at most one request to the sandbox's supervisor a period,
/// and the answer comes from the sandbox itself: a restarted server, which remembers no
/// activity, gets it right. A sandbox that cannot answer (no supervisor) runs none.
pub(super) async fn confirm_idle(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    container_id: Option<&str>,
    last: DateTime<Utc>,
) -> Idle {
    let (Some(policy), Some(container_id)) = (&sandbox.spec.idle, container_id) else {
        return Idle::Since(last);
    };
    let target = crate::processes::Target {
        name: sandbox.metadata.key(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        container_id: container_id.to_string(),
        env: Default::default(),
    };
    let after =
        chrono::TimeDelta::try_seconds(i64::try_from(policy.after_seconds).unwrap_or(i64::MAX))
            .unwrap_or(chrono::TimeDelta::MAX);
    let now = Utc::now();
    match ctl.processes.in_use(&target).await {
        Ok((true, _)) => Idle::Until(now.checked_add_signed(after)),
        Ok((false, Some(ended))) if ended > last => match ended.checked_add_signed(after) {
            Some(due) if due > now => Idle::Until(Some(due)),
            _ => Idle::Since(ended),
        },
        Ok(_) => Idle::Since(last),
        Err(error) => {
            tracing::debug!(sandbox = %target.name, %error, "no answer about its processes");
            Idle::Since(last)
        }
    }
}

/// Writes the idle policy's action into the sandbox's `spec.state`, the way a person would. A
/// sandbox declared in a read-only folder cannot be changed: its policy only logs.
pub(super) async fn act_on_idle(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
) -> Result<bool, ReconcileError> {
    let Some(policy) = sandbox.spec.idle.clone() else {
        return Ok(false);
    };
    let name = sandbox.metadata.key();
    let target = policy.action.state();
    tracing::info!(sandbox = %name, state = ?target, after = policy.after_seconds, "sandbox idle");
    let written = ctl
        .store
        .write(move |store| {
            store.update(Kind::Sandbox, &name, |resource| match resource {
                AnyResource::Sandbox(sandbox) if sandbox.metadata.deletion_timestamp.is_none() => {
                    sandbox.spec.state = Some(target);
                    Ok(())
                }
                _ => Err(StoreError::Invalid("not a live sandbox".into())),
            })
        })
        .await;
    match written {
        Ok(_) => Ok(true),
        Err(StoreError::ReadOnly { .. }) => {
            tracing::warn!(
                sandbox = &sandbox.metadata.key(),
                "idle, but declared in a read-only folder: its state cannot be changed"
            );
            Ok(false)
        }
        Err(StoreError::Invalid(_)) | Err(StoreError::NotFound { .. }) => Ok(false),
        Err(error) => Err(error.into()),
    }
}
