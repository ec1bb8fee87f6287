//! Reconciling one `Snapshot`: taking it once (the sandbox's `/workspace` exported by Docker,
//! normalized by [`crate::archive`] into `<data>/snapshots/<name>.tar`), keeping its data honest
//! (a Ready snapshot without data becomes Failed), deleting the data with the resource, and
//! collecting data files that belong to no resource.
//!
//! A snapshot pauses its sandbox's container while exporting, so the tar is one instant of the
//! workspace, and always unpauses it. [`Tracker`] is the in-memory record of that: which sandboxes
//! a snapshot is holding (the sandbox reconcile leaves those paused and unpauses any other paused
//! container, e.g. one left by a crash) and which temp files are being written. This module never
//! restores anything; see `restore.rs`.
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

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;

use super::workspace::{open_host_root, WORKSPACE};
use super::{Controller, Outcome, ReconcileError};
use crate::archive::{self, ArchiveError, ChannelReader, HashedWriter, HostTar, Limits, Policy};
use crate::docker::{Engine, EngineError};
use crate::resource::{
    set_condition, Condition, ConditionStatus, Kind, SandboxPhase, SandboxSpec, Snapshot,
    SnapshotPhase, SnapshotStatus,
};

/// How long a snapshot waits for a sandbox that is still being created.
const SANDBOX_START_GRACE: Duration = Duration::from_secs(60);
const TEMP_MARKER: &str = ".tar.tmp-";
/// The first name of the entries of the exported directory's archive.
const ROOT_NAME: &str = "workspace";

/// In-memory coordination between snapshots and the sandbox reconcile.
#[derive(Default)]
pub(super) struct Tracker {
    /// One lock per sandbox: snapshots and rollbacks of one sandbox take turns.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Sandboxes whose container a snapshot paused and will unpause.
    paused: Mutex<HashSet<String>>,
    /// Snapshots whose temp file is being written.
    writing: Mutex<HashSet<String>>,
}

impl Tracker {
    /// Waits for, then holds, the sandbox's lock.
    pub(super) async fn lock(self: &Arc<Self>, sandbox: &str) -> SandboxLock {
        let mutex = {
            let mut locks = lock(&self.locks);
            Arc::clone(locks.entry(sandbox.to_string()).or_default())
        };
        let guard = Arc::clone(&mutex).lock_owned().await;
        SandboxLock {
            tracker: Arc::clone(self),
            sandbox: sandbox.to_string(),
            mutex,
            guard: Some(guard),
        }
    }

    /// Whether a snapshot paused this sandbox's container on purpose.
    pub(super) fn holds_paused(&self, sandbox: &str) -> bool {
        lock(&self.paused).contains(sandbox)
    }

    fn is_writing(&self, snapshot: &str) -> bool {
        lock(&self.writing).contains(snapshot)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) struct SandboxLock {
    tracker: Arc<Tracker>,
    sandbox: String,
    mutex: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for SandboxLock {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = lock(&self.tracker.locks);
        // Only the map and this handle left: nobody waits, forget the sandbox.
        if Arc::strong_count(&self.mutex) == 2 {
            locks.remove(&self.sandbox);
        }
    }
}

/// Removes a name from one of the tracker's sets when dropped.
struct Mark<'a> {
    set: &'a Mutex<HashSet<String>>,
    name: String,
}

impl<'a> Mark<'a> {
    fn new(set: &'a Mutex<HashSet<String>>, name: &str) -> Mark<'a> {
        lock(set).insert(name.to_string());
        Mark {
            set,
            name: name.to_string(),
        }
    }
}

impl Drop for Mark<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.name);
    }
}

/// Unpauses the container if the snapshot is abandoned before it could do so itself (the
/// reconcile future was dropped).
struct PauseGuard {
    engine: Arc<dyn Engine>,
    container: Option<String>,
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        if let Some(container) = self.container.take() {
            let engine = Arc::clone(&self.engine);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = engine.unpause(&container).await;
                });
            }
        }
    }
}

pub(super) async fn reconcile(ctl: &Controller, name: &str) -> Result<Outcome, ReconcileError> {
    let Some(entry) = ctl.store.get(Kind::Snapshot, name) else {
        // Its data, if any, goes with the next data collection.
        return Ok(Outcome::done());
    };
    let Some(snapshot) = entry.resource.as_snapshot().cloned() else {
        return Ok(Outcome::done());
    };
    if snapshot.metadata.deletion_timestamp.is_some() {
        remove_data(&ctl.store.snapshot_path(name))?;
        ctl.store.finalize(Kind::Snapshot, name)?;
        return Ok(Outcome::done());
    }
    let mut status = snapshot.status.clone().unwrap_or_default();
    match status.phase {
        SnapshotPhase::Pending => take(ctl, &snapshot, status).await,
        SnapshotPhase::Ready => {
            let path = ctl.store.snapshot_path(name);
            if !path.exists() {
                let message = format!("the snapshot's data file {} is missing", path.display());
                fail(&mut status, &snapshot, "DataMissing", &message);
            }
            note_spec_change(&mut status, &snapshot);
            write_status(ctl, &snapshot, status).await?;
            Ok(Outcome::done())
        }
        SnapshotPhase::Failed => {
            note_spec_change(&mut status, &snapshot);
            write_status(ctl, &snapshot, status).await?;
            Ok(Outcome::done())
        }
    }
}

async fn take(
    ctl: &Controller,
    snapshot: &Snapshot,
    mut status: SnapshotStatus,
) -> Result<Outcome, ReconcileError> {
    let name = snapshot.metadata.name.as_str();
    let sandbox_name = snapshot.spec.sandbox.as_str();
    let generation = snapshot.metadata.generation.unwrap_or(1);
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
        let running =
            sandbox_status.phase == SandboxPhase::Running && sandbox_status.container_id.is_some();
        if sandbox.metadata.deletion_timestamp.is_none() && !running && starting {
            let age = snapshot
                .metadata
                .creation_timestamp
                .map(|at| (Utc::now() - at).to_std().unwrap_or_default())
                .unwrap_or_default();
            if age < SANDBOX_START_GRACE {
                ready(
                    status,
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
        write_status(ctl, snapshot, status).await?;
        return Ok(outcome);
    }
    let _sandbox_lock = ctl.snapshots.lock(sandbox_name).await;
    let sandbox = match check(&mut status)? {
        Ok(sandbox) => sandbox,
        Err(outcome) => {
            write_status(ctl, snapshot, status).await?;
            return Ok(outcome);
        }
    };
    let container = sandbox
        .status
        .as_ref()
        .and_then(|s| s.container_id.clone())
        .unwrap_or_default();
    let details = ctl.engine.inspect_container(&container).await?;
    let Some(details) = details.filter(|d| d.running || d.paused) else {
        let message = format!("sandbox {sandbox_name:?} has no running container");
        fail(&mut status, snapshot, "SandboxNotRunning", &message);
        write_status(ctl, snapshot, status).await?;
        return Ok(Outcome::done());
    };

    let owner = ctl
        .settings
        .sandbox_uid_gid()
        .map_err(|e| ReconcileError::Other(e.to_string()))?;
    let final_path = ctl.store.snapshot_path(name);
    let dir = final_path
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."));
    let temp = temp_path(&dir, name);
    let _writing = Mark::new(&ctl.snapshots.writing, name);

    let exported = {
        let _paused_mark = Mark::new(&ctl.snapshots.paused, sandbox_name);
        // Armed before pausing: a dropped future must not leave the container frozen.
        // An engine that cannot freeze a container gets its workspace read while it runs.
        let freeze = ctl.engine.capabilities().pause;
        let mut unpause = PauseGuard {
            engine: Arc::clone(&ctl.engine),
            container: freeze.then(|| details.id.clone()),
        };
        if freeze && !details.paused {
            ctl.engine.pause(&details.id).await?;
        }
        let host = (ctl.settings.host_workspace_access
            && ctl.engine.capabilities().host_workspace_access)
            .then_some(&details);
        let exported = export(ctl, &details.id, host, &temp, owner).await;
        unpause.container = None;
        // Everything is read: the sandbox may run again while the data reaches the disk.
        let synced = async {
            match exported {
                Ok((exported, file)) => {
                    let synced = tokio::task::spawn_blocking(move || file.sync_all())
                        .await
                        .map_err(|e| std::io::Error::other(e.to_string()))
                        .and_then(|r| r);
                    synced.map(|()| exported).map_err(ExportError::Io)
                }
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
        exported
    };

    let exported = match exported {
        Ok(exported) => exported,
        Err(error) => {
            let _ = std::fs::remove_file(&temp);
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
                    ready(
                        &mut status,
                        ConditionStatus::False,
                        "ExportFailed",
                        &error.to_string(),
                        generation,
                    );
                    status.message = error.to_string();
                    write_status(ctl, snapshot, status).await?;
                    return Err(error.into());
                }
                other => ("ExportFailed", other.to_string()),
            };
            fail(&mut status, snapshot, reason, &message);
            write_status(ctl, snapshot, status).await?;
            return Ok(Outcome::done());
        }
    };
    if let Err(error) = publish(&temp, &final_path, &dir) {
        let _ = std::fs::remove_file(&temp);
        let message = format!("storing the snapshot failed: {error}");
        fail(&mut status, snapshot, "ExportFailed", &message);
        write_status(ctl, snapshot, status).await?;
        return Ok(Outcome::done());
    }

    let effective = sandbox.spec.effective(&ctl.defaults());
    status.phase = SnapshotPhase::Ready;
    status.size_bytes = Some(exported.size);
    status.digest = Some(exported.digest);
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
    ready(
        &mut status,
        ConditionStatus::True,
        "Ready",
        &message,
        generation,
    );
    write_status(ctl, snapshot, status).await?;
    Ok(Outcome::done())
}

struct Exported {
    size: u64,
    digest: String,
    summary: archive::Summary,
}

#[derive(Debug, thiserror::Error)]
enum ExportError {
    #[error("{0}")]
    Engine(EngineError),
    #[error("{0}")]
    Archive(ArchiveError),
    #[error("{0}")]
    Io(std::io::Error),
    /// The host's copy of the workspace cannot be used (the archive API is used instead).
    #[error("the workspace cannot be read on this host: {0}")]
    HostUnavailable(String),
}

/// Writes the workspace's tar through the export policy into `temp` (flushed, not yet synced):
/// from the host's copy of the volume when `host` (the paused container) has one this process
/// can read and that is verifiably the container's `/workspace`, else (or if reading it fails)
/// through Docker's archive API. See the module documentation for why both give the same tar.
async fn export(
    ctl: &Controller,
    container: &str,
    host: Option<&crate::docker::ContainerDetails>,
    temp: &Path,
    owner: (u32, u32),
) -> Result<(Exported, std::fs::File), ExportError> {
    let limit = ctl.settings.max_snapshot_bytes;
    let policy = Policy::export(ROOT_NAME, owner, Limits::with_max_bytes(limit));
    if let Some(details) = host {
        let host_temp = temp.to_path_buf();
        let policy = policy.clone();
        let details = details.clone();
        let result = tokio::task::spawn_blocking(move || {
            let root =
                open_host_root(&details).map_err(|e| ExportError::HostUnavailable(e.reason))?;
            write_tar(HostTar::new(root, ROOT_NAME), &host_temp, limit, &policy)
        })
        .await
        .map_err(|e| ExportError::Io(std::io::Error::other(e.to_string())))?;
        match result {
            Err(ExportError::HostUnavailable(reason))
            | Err(ExportError::Archive(
                ArchiveError::Read(reason)
                | ArchiveError::Truncated(reason)
                | ArchiveError::Malformed(reason),
            )) => {
                tracing::debug!(container, %reason, "reading the workspace through Docker instead");
                let _ = std::fs::remove_file(temp);
            }
            other => return other,
        }
    }
    export_docker(ctl, container, temp, limit, policy).await
}

/// Streams Docker's tar of `/workspace` into `temp`, through a blocking writer thread.
async fn export_docker(
    ctl: &Controller,
    container: &str,
    temp: &Path,
    limit: u64,
    policy: Policy,
) -> Result<(Exported, std::fs::File), ExportError> {
    let mut stream = ctl
        .engine
        .archive_get(container, WORKSPACE)
        .await
        .map_err(ExportError::Engine)?;
    let (tx, reader) = ChannelReader::new(64);
    let temp = temp.to_path_buf();
    let writer = tokio::task::spawn_blocking(move || write_tar(reader, &temp, limit, &policy));
    let mut engine_error = None;
    while let Some(chunk) = stream.next().await {
        let item = chunk.map_err(|e| {
            let message = e.to_string();
            engine_error = Some(e);
            message
        });
        let failed = item.is_err();
        // The writer stops reading when it refuses the archive (too large, say).
        if tx.send(item).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    let result = writer
        .await
        .map_err(|e| ExportError::Io(std::io::Error::other(e.to_string())))?;
    match (result, engine_error) {
        (Err(_), Some(engine)) => Err(ExportError::Engine(engine)),
        (result, _) => result,
    }
}

/// Runs the export policy over `input` into a new file at `temp`, hashing what is written.
/// Blocking.
fn write_tar<R: std::io::Read>(
    input: R,
    temp: &Path,
    limit: u64,
    policy: &Policy,
) -> Result<(Exported, std::fs::File), ExportError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(temp)
        .map_err(ExportError::Io)?;
    let out = HashedWriter::new(Writeback::new(file), limit).map_err(ExportError::Io)?;
    let (summary, out) = archive::transform(input, out, policy).map_err(ExportError::Archive)?;
    let size = out.written();
    let (digest, file) = out.finish().map_err(ExportError::Io)?;
    let file = file.file;
    Ok((
        Exported {
            size,
            digest,
            summary,
        },
        file,
    ))
}

/// A file writer that starts the disk writes of what it was given every [`WRITEBACK_STEP`]
/// bytes, so the final fsync of a large snapshot waits for the last step, not for all of it.
struct Writeback {
    file: std::fs::File,
    written: u64,
    started: u64,
}

const WRITEBACK_STEP: u64 = 32 * 1024 * 1024;

impl Writeback {
    fn new(file: std::fs::File) -> Writeback {
        Writeback {
            file,
            written: 0,
            started: 0,
        }
    }
}

impl Write for Writeback {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITEBACK_STEP {
            start_writeback(&self.file, self.started, self.written - self.started);
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Asks the kernel to start writing a range of the file to disk, without waiting. Only a hint:
/// durability comes from the fsync after it, so a failure is ignored.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is owned by `file` and open for the whole call; the call reads no
    // memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}

/// Renames the finished temp file into place and makes the rename durable.
fn publish(temp: &Path, target: &Path, dir: &Path) -> std::io::Result<()> {
    std::fs::rename(temp, target)?;
    std::fs::File::open(dir)?.sync_all()
}

fn temp_path(dir: &Path, name: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        ".{name}{TEMP_MARKER}{}-{unique}",
        std::process::id()
    ))
}

fn remove_data(path: &Path) -> Result<(), ReconcileError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(ReconcileError::Other(format!(
            "removing {}: {e}",
            path.display()
        ))),
    }
}

/// Removes `<data>/snapshots/*.tar` files no Snapshot resource claims and temp files no snapshot
/// is writing. Waits for a complete load of desired state: a partial view deletes nothing.
pub(super) fn collect_data(ctl: &Controller) -> usize {
    if !ctl.store.is_fully_loaded() {
        return 0;
    }
    let probe = ctl.store.snapshot_path("probe");
    let Some(dir) = probe.parent() else {
        return 0;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(file_name) = file_name.to_str() else {
            continue;
        };
        let orphan = if let Some(rest) = file_name.strip_prefix('.') {
            match rest.split_once(TEMP_MARKER) {
                Some((snapshot, _)) => !ctl.snapshots.is_writing(snapshot),
                None => false,
            }
        } else if let Some(snapshot) = file_name.strip_suffix(".tar") {
            ctl.store.get(Kind::Snapshot, snapshot).is_none()
        } else {
            false
        };
        if orphan && entry.file_type().is_ok_and(|t| t.is_file()) {
            tracing::info!(
                file = file_name,
                "removing snapshot data that belongs to no snapshot"
            );
            if std::fs::remove_file(entry.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
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
    let generation = snapshot.metadata.generation.unwrap_or(1);
    let taken = status.observed_generation.unwrap_or(generation);
    if generation == taken {
        status.conditions.retain(|c| c.type_ != "SpecApplied");
        return;
    }
    set_condition(
        &mut status.conditions,
        Condition {
            type_: "SpecApplied".into(),
            status: ConditionStatus::False,
            reason: "Immutable".into(),
            message: format!(
                "a snapshot is taken once: this one reflects generation {taken}; the spec \
                 change of generation {generation} is ignored"
            ),
            last_transition_time: Utc::now(),
            observed_generation: Some(generation),
        },
    );
}

fn fail(status: &mut SnapshotStatus, snapshot: &Snapshot, reason: &str, message: &str) {
    let generation = snapshot.metadata.generation.unwrap_or(1);
    status.phase = SnapshotPhase::Failed;
    status.message = message.to_string();
    ready(status, ConditionStatus::False, reason, message, generation);
}

fn ready(
    status: &mut SnapshotStatus,
    verdict: ConditionStatus,
    reason: &str,
    message: &str,
    generation: u64,
) {
    set_condition(
        &mut status.conditions,
        Condition {
            type_: "Ready".into(),
            status: verdict,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: Utc::now(),
            observed_generation: Some(generation),
        },
    );
}

async fn write_status(
    ctl: &Controller,
    snapshot: &Snapshot,
    status: SnapshotStatus,
) -> Result<(), ReconcileError> {
    let name = &snapshot.metadata.name;
    super::write_status_if_changed(
        &ctl.store,
        Kind::Snapshot,
        name,
        snapshot.status.as_ref(),
        &status,
    )
    .await
}
