//! A snapshot's data files in `<data>/snapshots/`: the temp file an export writes, its
//! publication under the snapshot's name, its removal, and the collection of files that belong
//! to no snapshot.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::super::error::ReconcileError;
use super::super::tracker::Tracker;
use crate::resource::Kind;
use crate::store::Store;

const TEMP_MARKER: &str = ".tar.tmp-";

/// Renames the finished temp file into place and makes the rename durable.
pub(super) fn publish(temp: &Path, target: &Path, dir: &Path) -> std::io::Result<()> {
    std::fs::rename(temp, target)?;
    std::fs::File::open(dir)?.sync_all()
}

pub(super) fn temp_path(dir: &Path, name: &str) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(
        ".{name}{TEMP_MARKER}{}-{unique}",
        std::process::id()
    ))
}

pub(super) fn remove_data(path: &Path) -> Result<(), ReconcileError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            if let Some(dir) = path.parent() {
                let _ = std::fs::File::open(dir).and_then(|d| d.sync_all());
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(ReconcileError::DataNotRemoved {
            path: path.display().to_string(),
            error,
        }),
    }
}

/// Removes `<data>/snapshots/*.tar` files no Snapshot resource claims and temp files no snapshot
/// is writing. Waits for a complete load of desired state: a partial view deletes nothing.
pub(in crate::controller) fn collect_data(store: &Store, snapshots: &Tracker) -> usize {
    if !store.is_fully_loaded() {
        return 0;
    }
    let probe = store.snapshot_path("probe");
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
                Some((snapshot, _)) => !snapshots.is_writing(snapshot),
                None => false,
            }
        } else if let Some(snapshot) = file_name.strip_suffix(".tar") {
            store.get(Kind::Snapshot, snapshot).is_none()
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
