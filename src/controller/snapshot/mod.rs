//! Reconciling one `Snapshot`: taking it once (the sandbox's `/workspace` exported by Docker,
//! normalized by [`crate::archive`] into `<data>/snapshots/<name>.tar`), keeping its data honest
//! (a Ready snapshot without data becomes Failed), and deleting the data with the resource.
//!
//! A snapshot pauses its sandbox's container while exporting, so the tar is one instant of the
//! workspace, and always unpauses it. A sandbox that is paused or stopped (`spec.state`) is read
//! as it is and left so: a snapshot never wakes one. The tracker (`tracker.rs`) is the in-memory
//! record of that: which sandboxes a snapshot is holding (the sandbox reconcile leaves those
//! paused and unpauses any other paused container, e.g. one left by a crash) and which temp files
//! are being written. This module never
//! restores anything; see `restore.rs`. `export.rs` writes the tar; the store keeps the data
//! files (`store/snapshots.rs`).
//!
//! Where the tar comes from: Docker's archive API is the reference, and always works (remote
//! daemons, gVisor, a server that is not root), but it streams the whole workspace through the
//! daemon and its HTTP connection, which bounds large snapshots and adds a round trip to small
//! ones. So when this host's copy of the volume is verifiably the container's `/workspace` (see
//! `workspace.rs`), the snapshot reads that directory itself with [`archive::HostTar`]: never
//! following a symlink (every name is looked up relative to its opened parent, opened with
//! `O_NOFOLLOW` and checked to be the listed inode), while the container is paused so the
//! sandbox cannot change the tree underneath. `HostTar` produces the archive in the form Docker
//! does (same names, order, types, hard links, modes, mtimes) and it goes through the same export
//! policy, so the stored tar is the same either way. Any failure to read it falls back to the
//! archive API before anything is stored. Hashing and the writes to the temp file run on their
//! own threads ([`archive::HashedWriter`]), and the fsync runs after the container is unpaused
//! (the data is complete by then; only durability is still pending, and the snapshot is not
//! published before it).

mod export;
pub(super) mod rootfs;

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;

use super::context::SnapshotContext;
use super::error::ReconcileError;
use super::policy::{Failure, Outcome};
use super::quota;
use super::status::{clear_condition, generation, note_immutable, set_ready, write_status};
use crate::archive::{self, ArchiveError};
use crate::docker::EngineError;
use crate::resource::{
    ConditionStatus, Kind, SandboxPhase, SandboxSpec, Snapshot, SnapshotPhase, SnapshotScope,
    SnapshotStatus,
};
use export::{export, ExportError, PauseGuard};

/// How long a snapshot waits for a sandbox that is still being created.
const SANDBOX_START_GRACE: Duration = Duration::from_secs(60);

/// Reconciles snapshot `name`. An export Docker failed leaves with the status observed so far;
/// the error policy reports it.
pub(super) async fn reconcile(
    ctl: &SnapshotContext<'_>,
    name: &str,
) -> Result<Outcome, Failure<Snapshot>> {
    let Some(entry) = ctl.store.get(Kind::Snapshot, name) else {
        // Its data, if any, goes with the next data collection.
        return Ok(Outcome::done());
    };
    let Some(snapshot) = entry.resource.as_snapshot().cloned() else {
        return Ok(Outcome::done());
    };
    if snapshot.metadata.deletion_timestamp.is_some() {
        ctl.store.remove_snapshot_data(name).await?;
        // Its image too, unless containers still run on it (their sandboxes were restored from
        // it): garbage collection removes it once they are gone.
        let reference = snapshot
            .status
            .as_ref()
            .and_then(|s| s.rootfs_image.clone());
        if let Some(reference) = reference.or_else(|| rootfs::reference(&snapshot)) {
            rootfs::remove(ctl.engine.as_ref(), &reference).await;
        }
        let name = name.to_string();
        ctl.store
            .write(move |store| store.finalize(Kind::Snapshot, &name))
            .await?;
        return Ok(Outcome::done());
    }
    let mut status = snapshot.status.clone().unwrap_or_default();
    match status.phase {
        SnapshotPhase::Pending => take(ctl, &snapshot, status).await,
        SnapshotPhase::Ready => {
            if !ctl.store.has_snapshot_data(name).await {
                let path = ctl.store.snapshot_path(name);
                let message = format!("the snapshot's data file {} is missing", path.display());
                fail(&mut status, &snapshot, "DataMissing", &message);
            }
            note_spec_change(&mut status, &snapshot);
            write_status(ctl.store, ctl.events, &snapshot, &status).await?;
            Ok(Outcome::done())
        }
        SnapshotPhase::Failed => {
            note_spec_change(&mut status, &snapshot);
            write_status(ctl.store, ctl.events, &snapshot, &status).await?;
            Ok(Outcome::done())
        }
    }
}

async fn take(
    ctl: &SnapshotContext<'_>,
    snapshot: &Snapshot,
    mut status: SnapshotStatus,
) -> Result<Outcome, Failure<Snapshot>> {
    let name = &snapshot.metadata.key();
    let sandbox_name = &snapshot.metadata.sibling(&snapshot.spec.sandbox);
    let generation = generation(&snapshot.metadata);
    status.observed_generation = Some(generation);

    // Checked before and after waiting for the lock: a rollback may have replaced the container.
    let check = |status: &mut SnapshotStatus| -> Result<Result<_, Outcome>, ReconcileError> {
        let Some(entry) = ctl.store.get(Kind::Sandbox, sandbox_name) else {
            let message = format!("sandbox {sandbox_name:?} does not exist");
            fail(status, snapshot, "SandboxNotFound", &message);
            return Ok(Err(Outcome::done()));
        };
        let Some(sandbox) = entry.resource.as_sandbox().cloned() else {
            return Ok(Err(Outcome::done()));
        };
        let sandbox_status = sandbox.status.clone().unwrap_or_default();
        let starting = matches!(
            sandbox_status.phase,
            SandboxPhase::Pending | SandboxPhase::Creating
        );
        // A paused or stopped sandbox is read as it is, without waking it: its workspace is one
        // instant already, and its declared state is not the snapshot's to change.
        let running = matches!(
            sandbox_status.phase,
            SandboxPhase::Running | SandboxPhase::Paused | SandboxPhase::Stopped
        ) && sandbox_status.container_id.is_some();
        if sandbox.metadata.deletion_timestamp.is_none() && !running && starting {
            let age = snapshot
                .metadata
                .creation_timestamp
                .map(|at| (Utc::now() - at).to_std().unwrap_or_default())
                .unwrap_or_default();
            if age < SANDBOX_START_GRACE {
                set_ready(
                    &mut status.conditions,
                    ConditionStatus::False,
                    "WaitingForSandbox",
                    "",
                    generation,
                );
                return Ok(Err(Outcome::after(Duration::from_secs(1))));
            }
        }
        if sandbox.metadata.deletion_timestamp.is_some() || !running {
            let phase = if sandbox.metadata.deletion_timestamp.is_some() {
                "being deleted".to_string()
            } else {
                format!("{:?}", sandbox_status.phase)
            };
            let message = format!("sandbox {sandbox_name:?} is not running ({phase})");
            fail(status, snapshot, "SandboxNotRunning", &message);
            return Ok(Err(Outcome::done()));
        }
        Ok(Ok(sandbox))
    };
    if let Err(outcome) = check(&mut status)? {
        write_status(ctl.store, ctl.events, snapshot, &status).await?;
        return Ok(outcome);
    }
    let _sandbox_lock = ctl.snapshots.lock(sandbox_name).await;
    let sandbox = match check(&mut status)? {
        Ok(sandbox) => sandbox,
        Err(outcome) => {
            write_status(ctl.store, ctl.events, snapshot, &status).await?;
            return Ok(outcome);
        }
    };
    let container = sandbox
        .status
        .as_ref()
        .and_then(|s| s.container_id.clone())
        .unwrap_or_default();
    let stopped = sandbox.status.as_ref().map(|s| s.phase) == Some(SandboxPhase::Stopped);
    let details = ctl.engine.inspect_container(&container).await?;
    let Some(details) = details.filter(|d| d.running || d.paused || stopped) else {
        let message = format!("sandbox {sandbox_name:?} has no running container");
        fail(&mut status, snapshot, "SandboxNotRunning", &message);
        write_status(ctl.store, ctl.events, snapshot, &status).await?;
        return Ok(Outcome::done());
    };

    // As the sandbox runs: with what its template gave it.
    let effective = sandbox
        .resolved_spec()
        .effective(&ctl.containers.defaults());
    let full = snapshot.spec.scope() == SnapshotScope::Full;
    if full && effective.read_only_rootfs {
        let message = format!(
            "a Full snapshot captures the root filesystem's changes, and sandbox \
             {sandbox_name:?} has a read-only root filesystem (readOnlyRootfs is not false), so \
             it has none: take a Workspace snapshot"
        );
        fail(&mut status, snapshot, "ReadOnlyRootfs", &message);
        write_status(ctl.store, ctl.events, snapshot, &status).await?;
        return Ok(Outcome::done());
    }
    let rootfs_reference = rootfs::reference(snapshot);
    if let Some(reference) = &rootfs_reference {
        // An attempt interrupted after its commit left an image under this name; a new commit
        // would only untag it.
        rootfs::remove(ctl.engine.as_ref(), reference).await;
    }

    // A stopped sandbox's workspace is read from its volume's directory: a pool member's view
    // there is mounted again first if the host lost it (see `member_views.rs`).
    if !details.running && !details.paused {
        if let Some(volume) = sandbox
            .status
            .as_ref()
            .and_then(|s| s.workspace_volume.as_ref())
        {
            super::member_views::keep(ctl.store, ctl.engine.as_ref(), volume).await?;
        }
    }
    let owner = ctl.settings.sandbox_uid_gid()?;
    let data = ctl.store.begin_snapshot(name);

    let exported = {
        let _paused_mark = ctl.snapshots.hold_paused(sandbox_name);
        // Armed before pausing: a dropped future must not leave the container frozen.
        // An engine that cannot freeze a container gets its workspace read while it runs. One
        // already paused (the sandbox's own state) or stopped is read as it is and left so; the
        // mark keeps a resume meanwhile from thawing it under the export.
        let capabilities = ctl.engine.capabilities();
        let freeze = capabilities.pause && details.running && !details.paused;
        let mut unpause = PauseGuard {
            engine: Arc::clone(ctl.engine),
            container: freeze.then(|| details.id.clone()),
        };
        if freeze {
            ctl.engine.pause(&details.id).await?;
        }
        let host = (ctl.settings.host_workspace_access && capabilities.host_workspace_access)
            .then_some(&details);
        let exported = export(
            ctl.engine.as_ref(),
            ctl.settings.max_snapshot_bytes,
            &details.id,
            host,
            &data,
            owner,
        )
        .await;
        // The root filesystem, in the same frozen instant (Docker freezes it itself where this
        // engine could not).
        let committed = match (&exported, &rootfs_reference) {
            (Ok(_), Some(reference)) => {
                let docker_pauses = !freeze && details.running && !details.paused;
                let labels = rootfs::labels(&ctl.containers.server_id, snapshot);
                Some(
                    ctl.engine
                        .commit_rootfs(&details.id, reference, &labels, docker_pauses)
                        .await,
                )
            }
            _ => None,
        };
        // What a copy-on-write workspace changed over its trees, in the same frozen instant:
        // the snapshot's own tree is then a delta. Not read from a container that runs on.
        let changes = match &exported {
            Ok(_) if freeze || !details.running || details.paused => {
                let volume = sandbox.status.as_ref();
                let volume = volume.and_then(|s| s.workspace_volume.as_deref());
                let engine = ctl.engine.as_ref();
                super::views::changes_of(ctl.store, ctl.settings, engine, &details, volume).await
            }
            _ => None,
        };
        unpause.container = None;
        // Everything is read: the sandbox may run again while the data reaches the disk.
        let synced = async {
            match exported {
                Ok((exported, file)) => data
                    .sync(file)
                    .await
                    .map(|()| exported)
                    .map_err(ExportError::Io),
                Err(error) => Err(error),
            }
        };
        let thaw = async {
            match freeze {
                true => ctl.engine.unpause(&details.id).await,
                false => Ok(()),
            }
        };
        let (unpaused, exported) = tokio::join!(thaw, synced);
        if let Err(error) = unpaused {
            // The sandbox reconcile unpauses any container no snapshot holds.
            tracing::warn!(sandbox = sandbox_name, %error, "unpause after snapshot failed");
            ctl.queue.add((Kind::Sandbox, sandbox_name.to_string()));
        }
        (exported, committed, changes)
    };
    let (exported, committed, changes) = exported;
    if details.paused {
        // A resume asked for while the export held the sandbox frozen is carried out now.
        ctl.queue.add((Kind::Sandbox, sandbox_name.to_string()));
    }

    let committed = match committed.transpose() {
        Ok(committed) => committed,
        Err(error) => {
            data.discard().await;
            if let Some(reference) = &rootfs_reference {
                rootfs::remove(ctl.engine.as_ref(), reference).await;
            }
            if matches!(error, EngineError::Unreachable(_)) {
                // Docker may come back: stay Pending and retry.
                let error = ReconcileError::Export(error);
                return Err(Failure::reported(error, snapshot, status));
            }
            let message = format!(
                "committing the root filesystem of {sandbox_name:?} failed; nothing was \
                 stored: {error}"
            );
            fail(&mut status, snapshot, "ExportFailed", &message);
            write_status(ctl.store, ctl.events, snapshot, &status).await?;
            return Ok(Outcome::done());
        }
    };
    let exported = match exported {
        Ok(exported) => exported,
        Err(error) => {
            data.discard().await;
            if let Some(reference) = &rootfs_reference {
                rootfs::remove(ctl.engine.as_ref(), reference).await;
            }
            let (reason, message) = match error {
                ExportError::Archive(ArchiveError::TooLarge { limit }) => (
                    "TooLarge",
                    format!(
                        "the workspace of {sandbox_name:?} is larger than the snapshot limit of \
                         {limit} bytes; nothing was stored"
                    ),
                ),
                ExportError::Engine(error) => {
                    // Docker may come back: stay Pending and retry.
                    let error = ReconcileError::Export(error);
                    return Err(Failure::reported(error, snapshot, status));
                }
                other => ("ExportFailed", other.to_string()),
            };
            fail(&mut status, snapshot, reason, &message);
            write_status(ctl.store, ctl.events, snapshot, &status).await?;
            return Ok(Outcome::done());
        }
    };
    let defaults = ctl.settings.sandbox_defaults();
    if let Some(exceeded) = quota::snapshot_over(ctl.store, &defaults, snapshot, exported.size) {
        data.discard().await;
        if let Some(reference) = &rootfs_reference {
            rootfs::remove(ctl.engine.as_ref(), reference).await;
        }
        let message = format!("{exceeded}; nothing was stored");
        fail(&mut status, snapshot, quota::QUOTA_EXCEEDED, &message);
        write_status(ctl.store, ctl.events, snapshot, &status).await?;
        return Ok(Outcome::done());
    }
    if let Err(error) = data.publish().await {
        if let Some(reference) = &rootfs_reference {
            rootfs::remove(ctl.engine.as_ref(), reference).await;
        }
        let message = format!("storing the snapshot failed: {error}");
        fail(&mut status, snapshot, "ExportFailed", &message);
        write_status(ctl.store, ctl.events, snapshot, &status).await?;
        return Ok(Outcome::done());
    }

    status.phase = SnapshotPhase::Ready;
    status.size_bytes = Some(exported.size);
    status.digest = Some(exported.digest);
    status.scope = Some(snapshot.spec.scope());
    status.workspace_bytes = Some(exported.size);
    if let (Some(committed), Some(reference)) = (committed, rootfs_reference) {
        status.rootfs_bytes = Some(committed.layer_bytes);
        status.rootfs_digest = Some(committed.layer_digest);
        status.rootfs_image = Some(reference);
    }
    status.image = Some(effective.image.clone());
    status.sandbox_spec = Some(SandboxSpec {
        image: Some(effective.image),
        cpus: Some(effective.cpus),
        memory_mb: Some(effective.memory_mb),
        pids_limit: Some(effective.pids_limit),
        network: Some(effective.network),
        read_only_rootfs: Some(effective.read_only_rootfs),
        env: effective.env,
        ..SandboxSpec::default()
    });
    status.ready_at = Some(Utc::now());
    status.message = adjustments(&exported.summary);
    let message = status.message.clone();
    set_ready(
        &mut status.conditions,
        ConditionStatus::True,
        "Ready",
        &message,
        generation,
    );
    // Restores of it will be copy-on-write views of its tree: only what changed, when the
    // sandbox's workspace is itself a view. Said before it is Ready: a restore may come first.
    let views = super::views::enabled(ctl.settings, ctl.engine.as_ref());
    let uid = snapshot.metadata.uid.clone().filter(|_| views);
    if let (Some(uid), Some(changes)) = (&uid, changes) {
        super::views::expect_delta(ctl.store, ctl.settings, uid, changes);
    }
    write_status(ctl.store, ctl.events, snapshot, &status).await?;
    // The tree is unpacked now, in the background, so the first restore does not wait for it.
    if let Some(uid) = uid {
        let store = Arc::clone(ctl.store);
        let settings = Arc::clone(ctl.settings);
        let path = store.snapshot_path(name);
        tokio::spawn(async move {
            super::views::prepare_tree(&store, &settings, &uid, &path).await;
        });
    }
    Ok(Outcome::done())
}

fn adjustments(summary: &archive::Summary) -> String {
    if summary.adjusted_count == 0 {
        return String::new();
    }
    let more = summary.adjusted_count - summary.adjusted.len() as u64;
    let mut message = format!(
        "{} entries could not be kept as they were: {}",
        summary.adjusted_count,
        summary.adjusted.join("; ")
    );
    if more > 0 {
        message.push_str(&format!("; and {more} more"));
    }
    message
}

/// Spec changes after the snapshot was taken are ignored, and said so.
fn note_spec_change(status: &mut SnapshotStatus, snapshot: &Snapshot) {
    let generation = generation(&snapshot.metadata);
    let taken = status.observed_generation.unwrap_or(generation);
    if generation == taken {
        clear_condition(&mut status.conditions, "SpecApplied");
        return;
    }
    note_immutable(
        &mut status.conditions,
        "SpecApplied",
        format!(
            "a snapshot is taken once: this one reflects generation {taken}; the spec change of \
             generation {generation} is ignored"
        ),
        Some(generation),
    );
}

fn fail(status: &mut SnapshotStatus, snapshot: &Snapshot, reason: &str, message: &str) {
    let generation = generation(&snapshot.metadata);
    status.phase = SnapshotPhase::Failed;
    status.message = message.to_string();
    set_ready(
        &mut status.conditions,
        ConditionStatus::False,
        reason,
        message,
        generation,
    );
}
