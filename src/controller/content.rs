//! Validated snapshot content: a Ready snapshot's data file, validated whole by
//! [`crate::archive`] before anything is restored from it ([`validated`]), the rules a restore
//! unpacks it under ([`restore_policy`]), and the memory of files validated lately
//! ([`ValidatedFiles`]). This module reads snapshot files and never writes a workspace; see
//! `workspace.rs` for that.

use std::collections::HashMap;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::error::ReconcileError;
use crate::archive::{self, ArchiveError, Limits, Policy};
use crate::config::Settings;
use crate::resource::{Kind, SnapshotPhase};
use crate::store::{DataStamp, Store};

/// A snapshot whose data passed validation.
pub struct Validated {
    pub(super) name: String,
    pub(super) path: PathBuf,
    /// The snapshot's `metadata.uid`: with the owner a restore forces, it names the snapshot's
    /// tree (see `views.rs`).
    pub(super) uid: Option<String>,
    /// A `Full` snapshot's root filesystem: the image a restore starts its container from.
    pub(super) rootfs: Option<RootfsImage>,
    /// The size of the snapshot's tar (`status.sizeBytes`; 0 when unknown).
    pub(super) size_bytes: u64,
}

/// The image holding a `Full` snapshot's root filesystem changes, and the image they were made
/// on top of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct RootfsImage {
    pub(super) image: String,
    pub(super) base: String,
}

/// Finds a Ready snapshot's data and validates all of it (once per unchanged file, as `files`
/// remembers).
pub(super) async fn validated(
    store: &Store,
    settings: &Settings,
    files: &ValidatedFiles,
    name: &str,
) -> Result<Validated, ReconcileError> {
    let entry = store
        .get(Kind::Snapshot, name)
        .ok_or_else(|| ReconcileError::SnapshotNotFound(name.to_string()))?;
    let snapshot = entry
        .resource
        .as_snapshot()
        .ok_or_else(|| ReconcileError::SnapshotNotFound(name.to_string()))?;
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Err(ReconcileError::SnapshotNotFound(name.to_string()));
    }
    let uid = snapshot.metadata.uid.clone();
    let status = snapshot.status.clone().unwrap_or_default();
    let size_bytes = status.size_bytes.unwrap_or_default();
    let rootfs = status.rootfs_image.clone().map(|image| RootfsImage {
        image,
        base: status.image.clone().unwrap_or_default(),
    });
    match status.phase {
        SnapshotPhase::Pending => return Err(ReconcileError::SnapshotNotReady(name.to_string())),
        SnapshotPhase::Failed => {
            return Err(ReconcileError::SnapshotFailed {
                name: name.to_string(),
                message: status.message,
            })
        }
        SnapshotPhase::Ready => {}
    }
    let path = store.snapshot_path(name);
    let Some(before) = store.snapshot_stamp(name).await else {
        return Err(ReconcileError::DataMissing {
            name: name.to_string(),
            path: path.display().to_string(),
        });
    };
    if files.holds(&path, before) {
        return Ok(Validated {
            name: name.to_string(),
            path,
            uid,
            rootfs,
            size_bytes,
        });
    }
    let policy = restore_policy(settings)?;
    let file_path = path.clone();
    let checked = tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&file_path)
            .map_err(|e| ArchiveError::Read(format!("{}: {e}", file_path.display())))?;
        archive::validate(BufReader::new(file), &policy)
    })
    .await?;
    checked.map_err(|error| ReconcileError::Refused {
        name: name.to_string(),
        error,
    })?;
    // Only a file that did not change while it was read counts as validated.
    if store.snapshot_stamp(name).await == Some(before) {
        files.remember(&path, before);
    }
    Ok(Validated {
        name: name.to_string(),
        path,
        uid,
        rootfs,
        size_bytes,
    })
}

/// The rules a stored tar is restored under: every breach refuses it, the owner is the sandbox
/// user's.
pub(super) fn restore_policy(settings: &Settings) -> Result<Policy, ReconcileError> {
    let owner = settings.sandbox_uid_gid()?;
    Ok(Policy::restore(
        owner,
        Limits::with_max_bytes(settings.max_snapshot_bytes),
    ))
}

/// Snapshot files validated whole lately, by what the file was then. Restoring an unchanged file
/// again (an agent rolling back to the same checkpoint, the children of a Fork) skips the
/// validation, about 13 ms per 10 MiB; any write, truncation or replacement changes the stamp
/// (ctime, mtime, size, inode), so such a file is validated again. The unpack enforces the same
/// rules a second time whatever this says, and it always fills a new workspace, so even a
/// change this missed could only make a restore fail, never let through what the rules refuse.
#[derive(Default)]
pub(super) struct ValidatedFiles(std::sync::Mutex<HashMap<PathBuf, DataStamp>>);

/// How many validated files are remembered; past it the memory starts over.
const VALIDATED_FILES: usize = 256;

impl ValidatedFiles {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, DataStamp>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn holds(&self, path: &Path, stamp: DataStamp) -> bool {
        self.lock().get(path) == Some(&stamp)
    }

    pub(super) fn remember(&self, path: &Path, stamp: DataStamp) {
        let mut files = self.lock();
        if files.len() >= VALIDATED_FILES {
            files.clear();
        }
        files.insert(path.to_path_buf(), stamp);
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
        let stamp = DataStamp::of(&path).unwrap();
        assert!(!files.holds(&path, stamp));
        files.remember(&path, stamp);
        assert!(files.holds(&path, DataStamp::of(&path).unwrap()));

        // Same size, new content: ctime and mtime move (past the clock's coarse tick).
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&path, b"two").unwrap();
        assert!(!files.holds(&path, DataStamp::of(&path).unwrap()));

        // Replaced by another file renamed over it: another inode.
        files.remember(&path, DataStamp::of(&path).unwrap());
        let other = dir.path().join("other");
        std::fs::write(&other, b"two").unwrap();
        std::fs::rename(&other, &path).unwrap();
        assert!(!files.holds(&path, DataStamp::of(&path).unwrap()));
        assert_eq!(
            DataStamp::of(dir.path()),
            None,
            "directories are not snapshot files"
        );
    }
}
