//! Desired state on disk, and the in-memory index of it that everything else reads.
//!
//! Layout of the data directory:
//!
//! ```text
//! <data>/manifests/<plural>/<name>.yaml   declarations (apiVersion, kind, name, labels, annotations,
//!                                         spec) written by the API; people may edit them; watched
//! <data>/state/<plural>/<name>.json       server-owned metadata (uid, generation, resourceVersion,
//!                                         timestamps, owner references) and observed status
//! <data>/snapshots/<name>.tar             snapshot contents
//! --watch DIR                             read-only folders of manifests; watched, never written
//! ```
//!
//! Every write is crash-safe (temp file, fsync, rename, fsync the directory). The store assigns
//! server metadata, enforces optimistic concurrency and folder ownership, merges the folders
//! (a bad document keeps its last good version; a name declared twice is an error for the later
//! declaration), and broadcasts every change. It never talks to Docker.

mod atomic;
mod folders;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::broadcast;

use crate::resource::yaml::DocumentError;
use crate::resource::{AnyResource, Kind};

pub use atomic::write_atomic;

/// Which source declares a resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `<data>/manifests`: written by the API, editable by people. The API may change it.
    DataDir,
    /// A read-only `--watch` folder; the API refuses to change or delete what it declares.
    Folder(PathBuf),
}

impl Origin {
    pub fn is_writable(&self) -> bool {
        matches!(self, Origin::DataDir)
    }
}

/// A resource as the store holds it.
#[derive(Clone, Debug)]
pub struct Entry {
    /// With server metadata and status filled in.
    pub resource: AnyResource,
    pub origin: Origin,
    /// The file that declares it, when known.
    pub file: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

/// One change, as `?watch=true` streams it.
#[derive(Clone, Debug)]
pub struct WatchEvent {
    pub event_type: EventType,
    pub resource: AnyResource,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{kind} {name:?} not found")]
    NotFound { kind: Kind, name: String },
    #[error("{kind} {name:?} already exists")]
    AlreadyExists { kind: Kind, name: String },
    #[error(
        "{kind} {name:?} has been modified: resourceVersion {given} is stale (current {current})"
    )]
    Conflict {
        kind: Kind,
        name: String,
        given: String,
        current: String,
    },
    #[error("{kind} {name:?} is declared in the read-only folder {folder}; change it there")]
    ReadOnly {
        kind: Kind,
        name: String,
        folder: PathBuf,
    },
    #[error("{kind} {name:?} is being deleted")]
    Terminating { kind: Kind, name: String },
    #[error("{0}")]
    Invalid(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Options of a write through the API.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    /// Validate and compute the result, write nothing, broadcast nothing.
    pub dry_run: bool,
}

pub struct Store {
    data_dir: PathBuf,
    watch_dirs: Vec<PathBuf>,
    events: broadcast::Sender<WatchEvent>,
}

impl Store {
    /// Opens (creating the layout if needed) and loads everything: data-dir manifests and state,
    /// then each watched folder. Bad documents are recorded, not fatal.
    pub fn open(data_dir: &Path, watch_dirs: &[PathBuf]) -> StoreResult<Arc<Store>> {
        let _ = (data_dir, watch_dirs);
        todo!("store::open")
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn watch_dirs(&self) -> &[PathBuf] {
        &self.watch_dirs
    }

    /// Where a snapshot's tar lives.
    pub fn snapshot_path(&self, name: &str) -> PathBuf {
        self.data_dir.join("snapshots").join(format!("{name}.tar"))
    }

    /// True once every source has been read completely at least once. Garbage collection waits
    /// for it: a partial view is never a reason to delete.
    pub fn is_fully_loaded(&self) -> bool {
        todo!()
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<Entry> {
        let _ = (kind, name);
        todo!()
    }

    /// All resources of a kind, sorted by creation time then name.
    pub fn list(&self, kind: Kind) -> Vec<Entry> {
        let _ = kind;
        todo!()
    }

    /// Creates a resource declared through the API. Server metadata in the input is ignored, except
    /// that `owner_references` are kept when `internal` callers (controllers) pass them.
    pub fn create(&self, resource: AnyResource, opts: WriteOptions) -> StoreResult<AnyResource> {
        let _ = (resource, opts);
        todo!()
    }

    /// Replaces labels, annotations and spec. A `resourceVersion` in the input must be current
    /// (else [`StoreError::Conflict`]); without one the write is unconditional.
    pub fn replace(&self, resource: AnyResource, opts: WriteOptions) -> StoreResult<AnyResource> {
        let _ = (resource, opts);
        todo!()
    }

    /// Read-modify-write of a writable resource's declaration, retried on conflicts.
    pub fn update<F>(&self, kind: Kind, name: &str, mutate: F) -> StoreResult<AnyResource>
    where
        F: FnMut(&mut AnyResource) -> Result<(), StoreError>,
    {
        let _ = (kind, name, mutate);
        todo!()
    }

    /// Marks a resource for deletion (`deletionTimestamp`); the controller removes what it owns and
    /// then calls [`Store::finalize`].
    pub fn delete(&self, kind: Kind, name: &str, opts: WriteOptions) -> StoreResult<AnyResource> {
        let _ = (kind, name, opts);
        todo!()
    }

    /// Writes observed status (controller only). Bumps `resourceVersion`, not `generation`.
    pub fn update_status(
        &self,
        kind: Kind,
        name: &str,
        status: serde_json::Value,
    ) -> StoreResult<AnyResource> {
        let _ = (kind, name, status);
        todo!()
    }

    /// Drops a deleted resource's files and forgets it (controller only, after cleanup).
    pub fn finalize(&self, kind: Kind, name: &str) -> StoreResult<()> {
        let _ = (kind, name);
        todo!()
    }

    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<WatchEvent> {
        self.events.subscribe()
    }

    /// Documents that failed to parse or validate, or lost a name clash, as of the last scan.
    pub fn document_errors(&self) -> Vec<DocumentError> {
        todo!()
    }

    /// Watches `<data>/manifests` and every `--watch` folder until the returned task is dropped
    /// or aborted, rescanning a folder (debounced) whenever something in it changes.
    pub fn spawn_watchers(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        todo!()
    }
}
