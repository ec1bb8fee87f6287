//! Restoring a snapshot into a sandbox: the first workspace of a sandbox started from
//! `spec.source`, and rollbacks (`spec.rollback`). Both fill a NEW workspace: a warm pool
//! member's, or a new volume mounted by a new container (see `workspace.rs` for how the content
//! gets in: on this host, or through Docker's archive API).
//!
//! Order is what makes this safe. The stored tar is validated whole by [`crate::archive`] before
//! Docker is touched (once per unchanged file: [`ValidatedFiles`]), so a refused snapshot changes
//! nothing; it is checked (and rewritten: owner forced, fresh headers) a second time while it is
//! written, and any difference aborts the restore. A rollback builds its new container under a
//! staging name while the old one keeps serving, and swaps the names only once the new workspace
//! is complete. A workspace counts as restored only once `status.workspaceVolume` names it: an
//! interrupted restore leaves an unrecorded container and volume that the retry replaces or the
//! cleanup of stray objects removes. This module decides nothing about when to restore;
//! `sandbox.rs` does.

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use chrono::Utc;

use super::pool::Claimed;
use super::sandbox::plan_for;
use super::workspace::Prepare;
use super::Controller;
use crate::archive::{self, ArchiveError, Limits, Policy};
use crate::docker::{container_name, volume_name, ContainerPlan, EngineError, LABEL_SERVER};
use crate::resource::{
    set_condition, AppliedLimits, Condition, ConditionStatus, EffectiveSandbox, Kind,
    RollbackRecord, Sandbox, SandboxStatus, SnapshotPhase,
};

#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error("snapshot {0:?} does not exist")]
    SnapshotNotFound(String),
    #[error("snapshot {0:?} is not ready yet")]
    SnapshotNotReady(String),
    #[error("snapshot {name:?} failed: {message}")]
    SnapshotFailed { name: String, message: String },
    #[error("the data of snapshot {name:?} is missing ({path})")]
    DataMissing { name: String, path: String },
    #[error("snapshot {name:?} was refused and nothing was restored: {error}")]
    Refused { name: String, error: ArchiveError },
    #[error("docker: {0}")]
    Engine(#[from] EngineError),
    /// Writing the workspace on this host failed (the next attempt goes through Docker).
    #[error("writing the workspace on this host failed: {0}")]
    HostWrite(String),
    #[error("{0}")]
    Other(String),
}

impl RestoreError {
    /// The condition reason reporting this error.
    pub fn reason(&self) -> &'static str {
        match self {
            RestoreError::SnapshotNotFound(_) => "SnapshotNotFound",
            RestoreError::SnapshotNotReady(_) => "WaitingForSnapshot",
            RestoreError::SnapshotFailed { .. } => "SnapshotFailed",
            RestoreError::DataMissing { .. } => "SnapshotDataMissing",
            RestoreError::Refused { .. } => "SnapshotRefused",
            RestoreError::Engine(EngineError::ImageMissing(_)) => "ImageMissing",
            RestoreError::Engine(_) | RestoreError::HostWrite(_) | RestoreError::Other(_) => {
                "RestoreFailed"
            }
        }
    }
}

impl From<super::ReconcileError> for RestoreError {
    fn from(error: super::ReconcileError) -> RestoreError {
        match error {
            super::ReconcileError::Engine(e) => RestoreError::Engine(e),
            other => RestoreError::Other(other.to_string()),
        }
    }
}

/// A snapshot whose data passed validation.
pub struct Validated {
    pub(super) name: String,
    pub(super) path: PathBuf,
}

/// Finds a Ready snapshot's data and validates all of it.
pub async fn validated(ctl: &Controller, name: &str) -> Result<Validated, RestoreError> {
    let entry = ctl
        .store
        .get(Kind::Snapshot, name)
        .ok_or_else(|| RestoreError::SnapshotNotFound(name.to_string()))?;
    let snapshot = entry
        .resource
        .as_snapshot()
        .ok_or_else(|| RestoreError::SnapshotNotFound(name.to_string()))?;
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Err(RestoreError::SnapshotNotFound(name.to_string()));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    match status.phase {
        SnapshotPhase::Pending => return Err(RestoreError::SnapshotNotReady(name.to_string())),
        SnapshotPhase::Failed => {
            return Err(RestoreError::SnapshotFailed {
                name: name.to_string(),
                message: status.message,
            })
        }
        SnapshotPhase::Ready => {}
    }
    let path = ctl.store.snapshot_path(name);
    if !path.is_file() {
        return Err(RestoreError::DataMissing {
            name: name.to_string(),
            path: path.display().to_string(),
        });
    }
    let before = FileStamp::of(&path);
    if before.is_some_and(|stamp| ctl.validated_files.holds(&path, stamp)) {
        return Ok(Validated {
            name: name.to_string(),
            path,
        });
    }
    let policy = restore_policy(ctl)?;
    let file_path = path.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&file_path)
            .map_err(|e| ArchiveError::Read(format!("{}: {e}", file_path.display())))?;
        archive::validate(BufReader::new(file), &policy)
    })
    .await
    .map_err(|e| RestoreError::Other(e.to_string()))?;
    checked.map_err(|error| RestoreError::Refused {
        name: name.to_string(),
        error,
    })?;
    // Only a file that did not change while it was read counts as validated.
    if let Some(stamp) = before.filter(|stamp| FileStamp::of(&path) == Some(*stamp)) {
        ctl.validated_files.remember(&path, stamp);
    }
    Ok(Validated {
        name: name.to_string(),
        path,
    })
}

/// Snapshot files validated whole lately, by what the file was then. Restoring an unchanged file
/// again (an agent rolling back to the same checkpoint, the children of a Fork) skips the
/// validation, about 13 ms per 10 MiB; any write, truncation or replacement changes the stamp
/// (ctime, mtime, size, inode), so such a file is validated again. The unpack enforces the same
/// rules a second time whatever this says, and it always fills a new workspace, so even a
/// change this missed could only make a restore fail, never let through what the rules refuse.
#[derive(Default)]
pub(super) struct ValidatedFiles(std::sync::Mutex<HashMap<PathBuf, FileStamp>>);

/// How many validated files are remembered; past it the memory starts over.
const VALIDATED_FILES: usize = 256;

impl ValidatedFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, FileStamp>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn holds(&self, path: &Path, stamp: FileStamp) -> bool {
        self.lock().get(path) == Some(&stamp)
    }

    pub(super) fn remember(&self, path: &Path, stamp: FileStamp) {
        let mut files = self.lock();
        if files.len() >= VALIDATED_FILES {
            files.clear();
        }
        files.insert(path.to_path_buf(), stamp);
    }
}

/// What identifies a file's content without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    pub(super) fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).ok()?;
        meta.is_file().then(|| FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// The rules a stored tar is restored under: every breach refuses it, the owner is the sandbox
/// user's.
pub(super) fn restore_policy(ctl: &Controller) -> Result<Policy, RestoreError> {
    let owner = ctl
        .settings
        .sandbox_uid_gid()
        .map_err(|e| RestoreError::Other(e.to_string()))?;
    Ok(Policy::restore(
        owner,
        Limits::with_max_bytes(ctl.settings.max_snapshot_bytes),
    ))
}

/// Makes `plan.workspace_volume` a new volume holding the snapshot, mounted by a newly created
/// and started container of `plan`, whose ID is returned. The container's name must be free.
/// On error both are removed again.
pub async fn populate_volume(
    ctl: &Controller,
    plan: &ContainerPlan,
    snapshot: &Validated,
) -> Result<String, RestoreError> {
    let volume = plan.workspace_volume.as_str();
    // Whatever an interrupted attempt left there is not trusted; the create makes it anew,
    // labeled for the sandbox.
    ctl.engine.remove_volume(volume).await?;
    let id = match ctl.engine.create_container(plan).await {
        Ok(id) => id,
        Err(error) => {
            let _ = ctl.engine.remove_volume(volume).await;
            return Err(error.into());
        }
    };
    let runtime = plan.runtime.clone().unwrap_or_default();
    match ctl
        .start_with_workspace(&id, &runtime, Some(snapshot))
        .await
    {
        Ok(()) => Ok(id),
        Err(error) => {
            let _ = ctl.engine.remove_container(&id).await;
            let _ = ctl.engine.remove_volume(volume).await;
            Err(error)
        }
    }
}

/// Before a sandbox's first container: builds its first workspace from `spec.source`, in a
/// running container of `effective` that `status` then names; returns whether it did so now.
/// Later changes of `spec.source` never rebuild anything; they are reported in a condition.
pub(super) async fn ensure_source(
    ctl: &Controller,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &mut SandboxStatus,
) -> Result<bool, RestoreError> {
    let name = sandbox.metadata.name.as_str();
    let Some(source) = &sandbox.spec.source else {
        status.conditions.retain(|c| c.type_ != SOURCE_CONDITION);
        return Ok(false);
    };
    if status.workspace_volume.is_some() {
        note_source_change(status, sandbox, &source.snapshot);
        return Ok(false);
    }
    let snapshot = validated(ctl, &source.snapshot).await?;
    if let Some(claimed) =
        claim_filled(ctl, sandbox, effective, &container_name(name), &snapshot).await?
    {
        claimed.record(status, effective);
        status.source_snapshot = Some(source.snapshot.clone());
        return Ok(true);
    }
    let volume = volume_name(name);
    let plan = plan_for(ctl, sandbox, effective, &volume).await?;
    ctl.engine.remove_container(&container_name(name)).await?;
    let id = populate_volume(ctl, &plan, &snapshot).await?;
    status.workspace_volume = Some(volume);
    status.container_id = Some(id);
    status.started_at = Some(Utc::now());
    status.applied_limits = Some(limits_of(&plan));
    status.source_snapshot = Some(source.snapshot.clone());
    Ok(true)
}

const SOURCE_CONDITION: &str = "SourceApplied";

/// `spec.source` is immutable: a workspace built from one snapshot (or from none) stays.
fn note_source_change(status: &mut SandboxStatus, sandbox: &Sandbox, wanted: &str) {
    if status.last_rollback.is_some() {
        // The workspace has been replaced since; the original source no longer shows.
        return;
    }
    if status.source_snapshot.as_deref() == Some(wanted) {
        status.conditions.retain(|c| c.type_ != SOURCE_CONDITION);
        return;
    }
    let built_from = match &status.source_snapshot {
        Some(snapshot) => format!("snapshot {snapshot:?}"),
        None => "no snapshot".to_string(),
    };
    set_condition(
        &mut status.conditions,
        Condition {
            type_: SOURCE_CONDITION.into(),
            status: ConditionStatus::False,
            reason: "Immutable".into(),
            message: format!(
                "spec.source is immutable: the workspace was built from {built_from}; the change \
                 to snapshot {wanted:?} is ignored (use a rollback to replace the workspace)"
            ),
            last_transition_time: Utc::now(),
            observed_generation: sandbox.metadata.generation,
        },
    );
}

/// What a completed rollback or container replacement left behind, to remove once its status is
/// written.
#[derive(Debug, Default)]
pub(super) struct Replaced {
    /// The previous container (ID or retired name), renamed out of the way but still there.
    pub container: Option<String>,
    /// The previous workspace volume.
    pub volume: Option<String>,
}

impl Replaced {
    /// Removes the previous container, then its workspace. Failures are left to garbage
    /// collection (a retired container belongs to no one) and the stray-volume cleanup.
    pub(super) async fn remove(self, ctl: &Controller) {
        if let Some(container) = &self.container {
            if let Err(error) = ctl.engine.remove_container(container).await {
                tracing::warn!(container, %error, "removing the replaced container failed");
                return;
            }
        }
        if let Some(volume) = &self.volume {
            if let Err(error) = ctl.engine.remove_volume(volume).await {
                tracing::warn!(volume, %error, "removing the replaced workspace failed");
            }
        }
    }
}

/// Carries out a new `spec.rollback` request: a fresh workspace holding the snapshot in a fresh
/// container, and only then the old one goes. Returns `None` when there was nothing to do.
/// The caller must persist `status` at once: that write is what makes the rollback complete;
/// after it, the returned leftovers are removed.
///
/// The new container is a warm pool member when a pool has one, else a new container on a new
/// volume; either way it is filled while running under a staging name, and the old container
/// keeps serving until the two names are swapped, so the sandbox is never down.
pub(super) async fn ensure_rollback(
    ctl: &Controller,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &mut SandboxStatus,
) -> Result<Option<Replaced>, RestoreError> {
    let name = sandbox.metadata.name.as_str();
    let Some(request) = sandbox.spec.pending_rollback(Some(status)) else {
        return Ok(None);
    };
    // A snapshot of this sandbox in progress finishes first.
    let _lock = ctl.snapshots.lock(name).await;
    let snapshot = validated(ctl, &request.snapshot).await?;
    let staging = staging_container_name(name);
    let old_volume = status.workspace_volume.clone();
    let replaced =
        if let Some(claimed) = claim_filled(ctl, sandbox, effective, &staging, &snapshot).await? {
            let replaced = swap_in(ctl, name, &claimed.container_id).await?;
            claimed.record(status, effective);
            replaced
        } else {
            // A new volume per attempt: one left by an interrupted attempt may still be mounted by
            // its container, and the stray-volume cleanup removes it after the rollback.
            let volume = format!("{}-{:08x}", volume_name(name), rand::random::<u32>());
            let mut plan = plan_for(ctl, sandbox, effective, &volume).await?;
            plan.name = Some(staging.clone());
            ctl.engine.remove_container(&staging).await?;
            let id = populate_volume(ctl, &plan, &snapshot).await?;
            let replaced = swap_in(ctl, name, &id).await?;
            status.workspace_volume = Some(volume);
            status.container_id = Some(id);
            status.started_at = Some(Utc::now());
            status.applied_limits = Some(limits_of(&plan));
            status.claimed_from = None;
            status.container_hash = None;
            replaced
        };
    status.source_snapshot = Some(request.snapshot.clone());
    status.last_rollback = Some(RollbackRecord {
        request_id: request.request_id.clone(),
        snapshot: request.snapshot.clone(),
        completed_at: Utc::now(),
    });
    Ok(Some(Replaced {
        container: replaced,
        volume: old_volume,
    }))
}

/// Gives the sandbox's container name to the container `new` (filled under the staging name),
/// after renaming the current container, if any, out of the way (to its retired name, by which
/// it is returned, to be removed once the status names `new`).
pub(super) async fn swap_in(
    ctl: &Controller,
    name: &str,
    new: &str,
) -> Result<Option<String>, EngineError> {
    let current = container_name(name);
    let retired = retired_container_name(name);
    let replaced = match ctl.engine.rename_container(&current, &retired).await {
        Ok(()) => Some(retired),
        Err(error) if error.is_not_found() => None,
        Err(EngineError::Conflict { .. }) => {
            // One retired before whose removal was interrupted: the status names neither it nor
            // its workspace as current any more, or it is about to be replaced again.
            ctl.engine.remove_container(&retired).await?;
            ctl.engine.rename_container(&current, &retired).await?;
            Some(retired)
        }
        Err(error) => return Err(error),
    };
    ctl.engine.rename_container(new, &current).await?;
    Ok(replaced)
}

/// Name of the container a rollback fills before it takes over the sandbox's name. It is the
/// sandbox's own (garbage collection keeps it while the sandbox lives; a retry replaces it).
pub(super) fn staging_container_name(sandbox: &str) -> String {
    format!("{}{STAGING_SUFFIX}", container_name(sandbox))
}

/// Suffix of a staging container's name (a dot never occurs in a sandbox name).
pub(super) const STAGING_SUFFIX: &str = ".restore";

/// Name a replaced container has from the swap until it is removed.
pub(super) fn retired_container_name(sandbox: &str) -> String {
    format!("{}.retired", container_name(sandbox))
}

/// Every Docker name a container of the sandbox can have: its own, while being built, and
/// while waiting to be removed after a replacement.
pub(super) fn container_names(sandbox: &str) -> [String; 3] {
    [
        container_name(sandbox),
        staging_container_name(sandbox),
        retired_container_name(sandbox),
    ]
}

/// Claims a warm pool member as `as_name` and fills its (running) workspace with the snapshot.
/// `None` when no pool has a member ready. On a failed fill the member is removed again.
async fn claim_filled(
    ctl: &Controller,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    as_name: &str,
    snapshot: &Validated,
) -> Result<Option<Claimed>, RestoreError> {
    let name = sandbox.metadata.name.as_str();
    let Some(claimed) = ctl.claim_as(name, effective, as_name).await? else {
        return Ok(None);
    };
    let runtime = ctl.settings.docker_runtime.clone();
    let filled = ctl
        .make_ready(
            &claimed.container_id,
            &runtime,
            Prepare::AlreadyDone,
            Some(snapshot),
        )
        .await;
    if let Err(error) = filled {
        let _ = ctl.engine.remove_container(&claimed.container_id).await;
        let _ = ctl.engine.remove_volume(&claimed.volume).await;
        return Err(error);
    }
    Ok(Some(claimed))
}

/// Removes what earlier rollback attempts of sandbox `name` left: the staging container and
/// every workspace volume but `current`. Only for a sandbox whose rollback is not in progress.
pub(super) async fn discard_attempts(
    ctl: &Controller,
    name: &str,
    current: &str,
) -> Result<(), RestoreError> {
    ctl.engine
        .remove_container(&staging_container_name(name))
        .await?;
    remove_stray_volumes(ctl, name, current).await
}

/// Removes this sandbox's workspace volumes other than `current` (left by a rollback that
/// completed, or one interrupted before it did).
pub(super) async fn remove_stray_volumes(
    ctl: &Controller,
    name: &str,
    current: &str,
) -> Result<(), RestoreError> {
    let prefix = volume_name(name);
    for volume in ctl.engine.list_volumes().await? {
        let ours = volume.sandbox() == Some(name)
            && volume.labels.get(LABEL_SERVER) == Some(&ctl.server_id)
            && volume.name.starts_with(&prefix)
            && volume.name != current;
        if ours {
            tracing::info!(volume = %volume.name, sandbox = name, "removing replaced workspace");
            ctl.engine.remove_volume(&volume.name).await?;
        }
    }
    Ok(())
}

fn limits_of(plan: &ContainerPlan) -> AppliedLimits {
    AppliedLimits {
        cpus: plan.cpus,
        memory_mb: plan.memory_mb,
        pids_limit: plan.pids_limit,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_validated_file_is_known_until_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.tar");
        std::fs::write(&path, b"one").unwrap();
        let files = ValidatedFiles::default();
        let stamp = FileStamp::of(&path).unwrap();
        assert!(!files.holds(&path, stamp));
        files.remember(&path, stamp);
        assert!(files.holds(&path, FileStamp::of(&path).unwrap()));

        // Same size, new content: ctime and mtime move (past the clock's coarse tick).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"two").unwrap();
        assert!(!files.holds(&path, FileStamp::of(&path).unwrap()));

        // Replaced by another file renamed over it: another inode.
        files.remember(&path, FileStamp::of(&path).unwrap());
        let other = dir.path().join("other");
        std::fs::write(&other, b"two").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!files.holds(&path, FileStamp::of(&path).unwrap()));
        assert_eq!(
            FileStamp::of(dir.path()),
            None,
            "directories are not snapshot files"
        );
    }
}
