//! Snapshot data files, `<data>/snapshots/<name>.tar`, and their whole lifecycle: a snapshot's
//! data is written into a temp file of its own ([`SnapshotWrite`]), synced, and renamed into place
//! durably; it is removed with its resource; and files that belong to no snapshot (a crash
//! between the rename and the status write, a resource deleted while the server was down) are
//! collected once desired state is fully loaded. Every call that touches the disk runs off the
//! async workers. What goes into a file is the controller's business; where it lives is the
//! store's.

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{api, Store, StoreError, StoreResult};
use crate::resource::{AnyResource, Kind};

/// What a temp file's name holds between the snapshot's name and the writer's identity.
const TEMP_MARKER: &str = ".tar.tmp-";

/// The snapshots whose data is being written, whose temp files collection leaves alone.
#[derive(Default)]
pub(super) struct Writing(Mutex<HashSet<String>>);

impl Writing {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store {
    fn snapshots_dir(&self) -> PathBuf {
        self.data_dir().join("snapshots")
    }

    /// Whether snapshot `name` has its data file (of any kind: a directory there is not taken
    /// for missing data).
    pub async fn has_snapshot_data(&self, name: &str) -> bool {
        let path = self.snapshot_path(name);
        self.offload(move || path.exists()).await.unwrap_or(false)
    }

    /// What snapshot `name`'s data file is now, if it has one.
    pub async fn snapshot_stamp(&self, name: &str) -> Option<DataStamp> {
        let path = self.snapshot_path(name);
        self.offload(move || DataStamp::of(&path)).await.ok()?
    }

    /// A fresh uid, for a snapshot whose uid must be known before it is created (an imported
    /// Full snapshot's image is labeled with it); see [`Store::create_imported_snapshot`].
    pub fn new_uid() -> String {
        super::index::new_uid()
    }

    /// Starts writing snapshot `name`'s data. Nothing is on disk until [`SnapshotWrite::create`];
    /// until the write is published or dropped, collection leaves its temp file alone.
    pub fn begin_snapshot(self: &Arc<Self>, name: &str) -> SnapshotWrite {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let unique = COUNTER.fetch_add(1, Ordering::Relaxed);
        let temp = self.snapshots_dir().join(format!(
            ".{name}{TEMP_MARKER}{}-{unique}",
            std::process::id()
        ));
        self.snapshot_writes.lock().insert(name.to_string());
        SnapshotWrite {
            store: Arc::clone(self),
            name: name.to_string(),
            temp,
            published: false,
        }
    }

    /// Removes snapshot `name`'s data, durably; data that is not there is no error.
    pub async fn remove_snapshot_data(&self, name: &str) -> StoreResult<()> {
        let path = self.snapshot_path(name);
        self.offload(move || match std::fs::remove_file(&path) {
            Ok(()) => {
                if let Some(dir) = path.parent() {
                    let _ = File::open(dir).and_then(|d| d.sync_all());
                }
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StoreError::Io { path, source }),
        })
        .await?
    }

    /// Creates the Snapshot `resource` with `status` (Ready) and makes what `data` wrote (complete
    /// and synced) its data file, as one step: the data is renamed into place once the name is
    /// reserved and free, and removed again if the resource cannot be written, so a failure
    /// leaves neither. For imported snapshots, which have no sandbox to be taken from: the
    /// controller never sees them Pending. `uid`, when given, is the new snapshot's uid (from
    /// [`Store::new_uid`]); otherwise a fresh one. Blocking.
    pub fn create_imported_snapshot(
        &self,
        resource: AnyResource,
        status: serde_json::Value,
        uid: Option<String>,
        mut data: SnapshotWrite,
    ) -> StoreResult<AnyResource> {
        if resource.kind() != Kind::Snapshot || resource.name() != data.name {
            return Err(StoreError::Invalid(format!(
                "the data of snapshot {:?} cannot become that of {} {:?}",
                data.name,
                resource.kind(),
                resource.name()
            )));
        }
        let target = self.snapshot_path(&data.name);
        let place = || {
            publish(&data.temp, &target).map_err(|source| StoreError::Io {
                path: target.clone(),
                source,
            })
        };
        let remove = || {
            let _ = std::fs::remove_file(&target);
        };
        let created = api::create_with_status(self, resource, status, uid, place, remove)?;
        data.published = true;
        Ok(created)
    }

    /// Removes `<data>/snapshots/*.tar` files no Snapshot resource claims and temp files no
    /// snapshot is writing; returns how many. Waits for a complete load of desired state: a
    /// partial view deletes nothing.
    pub async fn collect_snapshot_data(self: &Arc<Self>) -> usize {
        let store = Arc::clone(self);
        self.offload(move || store.collect_snapshot_data_now())
            .await
            .unwrap_or(0)
    }

    fn collect_snapshot_data_now(&self) -> usize {
        if !self.is_fully_loaded() {
            return 0;
        }
        let Ok(entries) = std::fs::read_dir(self.snapshots_dir()) else {
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
                    Some((snapshot, _)) => !self.snapshot_writes.lock().contains(snapshot),
                    None => false,
                }
            } else if let Some(snapshot) = file_name.strip_suffix(".tar") {
                // Asked in this order: an import publishes its file before its resource exists,
                // and stops writing only once the resource does.
                !self.snapshot_writes.lock().contains(snapshot)
                    && self.get(Kind::Snapshot, snapshot).is_none()
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
}

/// The data of one snapshot being written: a temp file in the snapshots directory, published
/// under the snapshot's name once complete and synced. Dropped unpublished, it removes its temp
/// file.
pub struct SnapshotWrite {
    store: Arc<Store>,
    name: String,
    temp: PathBuf,
    published: bool,
}

impl SnapshotWrite {
    /// Creates the temp file anew (whatever an earlier attempt of this write left there goes)
    /// and opens it for writing (and reading back: an import hands a scratch file to Docker).
    pub async fn create(&self) -> std::io::Result<File> {
        let temp = self.temp.clone();
        self.store
            .offload(move || {
                match std::fs::remove_file(&temp) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&temp)
            })
            .await
            .map_err(std::io::Error::other)?
    }

    /// Waits until what was written through `file` (opened by [`create`](Self::create)) is on
    /// disk.
    pub async fn sync(&self, file: File) -> std::io::Result<()> {
        self.store
            .offload(move || file.sync_all())
            .await
            .map_err(std::io::Error::other)?
    }

    /// Gives the write up: its temp file is removed now.
    pub async fn discard(mut self) {
        let temp = std::mem::take(&mut self.temp);
        self.published = true;
        let _ = self.store.offload(move || std::fs::remove_file(temp)).await;
    }

    /// Renames the synced temp file into place as the snapshot's data and makes the rename
    /// durable.
    pub async fn publish(mut self) -> std::io::Result<()> {
        let temp = self.temp.clone();
        let target = self.store.snapshot_path(&self.name);
        let published = self
            .store
            .offload(move || publish(&temp, &target))
            .await
            .map_err(std::io::Error::other)?;
        self.published = published.is_ok();
        published
    }
}

/// Renames `temp` to `target` and syncs their directory.
fn publish(temp: &Path, target: &Path) -> std::io::Result<()> {
    std::fs::rename(temp, target)?;
    let dir = target.parent().unwrap_or(Path::new("."));
    File::open(dir)?.sync_all()
}

impl Drop for SnapshotWrite {
    fn drop(&mut self) {
        if !self.published {
            let temp = std::mem::take(&mut self.temp);
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => {
                    runtime.spawn_blocking(move || {
                        let _ = std::fs::remove_file(temp);
                    });
                }
                Err(_) => {
                    let _ = std::fs::remove_file(temp);
                }
            }
        }
        self.store.snapshot_writes.lock().remove(&self.name);
    }
}

/// What identifies a data file's content without reading it: any write, truncation or
/// replacement changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl DataStamp {
    /// The stamp of the regular file at `path`; `None` for anything else or nothing.
    pub fn of(path: &Path) -> Option<DataStamp> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::symlink_metadata(path).ok()?;
        meta.is_file().then(|| DataStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}
