//! Desired state on disk, and the in-memory index of it that everything else reads.
//!
//! Layout of the data directory:
//!
//! ```text
//! <data>/manifests/<plural>/<name>.yaml   declarations (apiVersion, kind, name, labels, annotations,
//!                                         spec) written by the API; people may edit them; watched
//! <data>/state/<plural>/<name>.json       server-owned metadata (uid, generation, resourceVersion,
//!                                         timestamps, owner references) and observed status
//! <data>/snapshots/<name>.tar             snapshot contents (see `snapshots.rs`)
//! <data>/trees/<key>/                     a snapshot's content unpacked once, read-only
//! <data>/views/<volume>/{upper,work}      what a copy-on-write workspace wrote (`trees.rs`)
//! <data>/events.json                       recorded events, bounded (see `event_log.rs`)
//! <data>/outbox.jsonl                      event occurrences webhooks have yet to get (same)
//! <data>/secrets/<name>                    Secret values given through the API, owner-only
//!                                         (`secret_values.rs`)
//! <data>/audit/audit.jsonl[.N]              the audit trail, rotated by size (`audit_log.rs`)
//! <data>/create-keys.json                  idempotency keys of creates, kept past their objects
//!                                         (`create_keys.rs`)
//! <data>/server-id                        this server's identity (see `identity.rs`)
//! <data>/api-key                          the generated API key, mode 0600 (`identity.rs`)
//! --watch DIR                             read-only folders of manifests; watched, never written
//! ```
//!
//! Every write is crash-safe (temp file, fsync, rename, fsync the directory). The store assigns
//! server metadata, enforces optimistic concurrency and folder ownership, merges the folders
//! (a bad document keeps its last good version; a name declared twice is an error for the later
//! declaration), and broadcasts every change. It never talks to Docker. Its writes block on
//! their fsyncs; async callers use [`Store::write`] (`offload.rs`), which runs them off the async
//! workers.

mod api;
mod atomic;
mod audit_log;
mod create_keys;
mod egress_ca;
mod egress_log;
mod event_log;
mod folders;
mod identity;
mod index;
pub mod inspect;
mod layers;
mod offload;
mod secret_values;
mod snapshots;
mod state;
#[cfg(test)]
mod tests;
mod trees;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use tokio::sync::broadcast;

use crate::resource::yaml::DocumentError;
use crate::resource::{shown_key, AnyResource, Kind};
use index::{Inner, Source};

pub use atomic::write_atomic;
pub use audit_log::{AuditLog, KEPT_GENERATIONS as AUDIT_GENERATIONS};
pub use create_keys::CreateKey;
pub use egress_log::{EgressLog, EGRESS_LOG_BYTES};
pub use event_log::{EventChange, EventLimits, EventLog, Recorder};
pub use identity::{read_or_create_private, replace_private, PrivateFile};
pub use layers::{ViewChanges, MAX_LAYERS};
pub use snapshots::{DataStamp, SnapshotWrite};
pub use trees::{TreeError, ViewDirs};

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
    #[error("{kind} {} not found", shown_key(name))]
    NotFound { kind: Kind, name: String },
    #[error("{kind} {} already exists", shown_key(name))]
    AlreadyExists { kind: Kind, name: String },
    #[error(
        "{kind} {} has been modified: resourceVersion {given} is stale (current {current})",
        shown_key(name)
    )]
    Conflict {
        kind: Kind,
        name: String,
        given: String,
        current: String,
    },
    #[error(
        "{kind} {} is declared in the read-only folder {folder}; change it there",
        shown_key(name)
    )]
    ReadOnly {
        kind: Kind,
        name: String,
        folder: PathBuf,
    },
    #[error("{kind} {} is being deleted", shown_key(name))]
    Terminating { kind: Kind, name: String },
    #[error("{0}")]
    Invalid(String),
    /// An update changes fields that are fixed once the resource exists (Kubernetes' wording).
    #[error("{kind} {} is invalid: {}", shown_key(name), immutable_message(fields))]
    Immutable {
        kind: Kind,
        name: String,
        fields: Vec<&'static str>,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A store operation run off the async workers did not finish (it panicked, or the runtime
    /// is shutting down).
    #[error("a store operation did not finish: {0}")]
    Interrupted(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// `spec.sandbox: field is immutable`, one clause per field.
pub fn immutable_message(fields: &[&str]) -> String {
    fields
        .iter()
        .map(|f| format!("{f}: field is immutable"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// A folder of manifests to watch, and the namespace it is bound to (`--watch team-a=DIR`): its
/// documents that name no namespace are in that one, and one naming another is an error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchDir {
    pub path: PathBuf,
    pub namespace: Option<String>,
}

impl From<PathBuf> for WatchDir {
    fn from(path: PathBuf) -> WatchDir {
        WatchDir {
            path,
            namespace: None,
        }
    }
}

impl std::str::FromStr for WatchDir {
    type Err = String;

    /// `DIR`, or `NS=DIR` where `NS` is a namespace name (a folder whose own name holds `=`
    /// is written `./x=y`).
    fn from_str(text: &str) -> Result<WatchDir, String> {
        match text.split_once('=') {
            Some((namespace, path)) if !namespace.contains('/') && !namespace.starts_with('.') => {
                if !crate::resource::is_valid_namespace(namespace) {
                    return Err(format!(
                        "{namespace:?} is not a namespace name (a-z, 0-9 and -, at most 63)"
                    ));
                }
                if path.is_empty() {
                    return Err(format!("{text:?} names no folder after {namespace:?}="));
                }
                Ok(WatchDir {
                    path: PathBuf::from(path),
                    namespace: Some(namespace.to_string()),
                })
            }
            _ => Ok(WatchDir::from(PathBuf::from(text))),
        }
    }
}

/// Options of a write through the API.
#[derive(Clone, Copy, Debug, Default)]
pub struct WriteOptions {
    /// Validate and compute the result, write nothing, broadcast nothing.
    pub dry_run: bool,
}

/// How many events a slow subscriber may fall behind before it sees `Lagged`.
const EVENT_CAPACITY: usize = 1024;

pub struct Store {
    data_dir: PathBuf,
    watch_dirs: Vec<PathBuf>,
    events: broadcast::Sender<WatchEvent>,
    inner: Mutex<Inner>,
    /// Signalled whenever an unlocked write leaves `Inner::writing` or a quiet waiter is done.
    settled: Condvar,
    /// Snapshots whose data is being written (see `snapshots.rs`).
    snapshot_writes: snapshots::Writing,
    /// Trees and views made or used lately (see `trees.rs`).
    cow_touched: trees::Touched,
    /// What happened to resources (see `event_log.rs`).
    event_log: EventLog,
    /// The egress gateway's decisions, per sandbox (see `egress_log.rs`).
    egress_log: EgressLog,
    /// Who did what through the API (see `audit_log.rs`).
    audit_log: AuditLog,
}

/// Size at which the audit log starts a new file.
pub const AUDIT_LOG_BYTES: u64 = 16 * 1024 * 1024;

impl Store {
    /// Opens (creating the layout if needed) and loads everything: data-dir manifests and state,
    /// then each watched folder. Bad documents are recorded, not fatal; a watched folder that
    /// cannot be read yet is retried by the watchers (and [`Store::is_fully_loaded`] stays false).
    pub fn open(data_dir: &Path, watch_dirs: &[PathBuf]) -> StoreResult<Arc<Store>> {
        let unbound: Vec<WatchDir> = watch_dirs.iter().cloned().map(WatchDir::from).collect();
        Store::open_watching(data_dir, &unbound)
    }

    /// [`Store::open`], with folders that may be bound to a namespace.
    pub fn open_watching(data_dir: &Path, watch_dirs: &[WatchDir]) -> StoreResult<Arc<Store>> {
        let io = |path: PathBuf| move |source| StoreError::Io { path, source };
        for sub in ["manifests", "state"] {
            for kind in Kind::ALL {
                let dir = data_dir.join(sub).join(kind.plural());
                std::fs::create_dir_all(&dir).map_err(io(dir.clone()))?;
                atomic::remove_temp_files(&dir);
            }
        }
        let snapshots = data_dir.join("snapshots");
        std::fs::create_dir_all(&snapshots).map_err(io(snapshots.clone()))?;
        atomic::remove_temp_files(&snapshots);

        let records = state::load_all(data_dir);
        let last_rv = records
            .values()
            .map(state::Record::resource_version)
            .max()
            .unwrap_or(0);
        let roots = std::iter::once((data_dir.join("manifests"), Origin::DataDir, None)).chain(
            watch_dirs.iter().map(|dir| {
                let origin = Origin::Folder(dir.path.clone());
                (dir.path.clone(), origin, dir.namespace.clone())
            }),
        );
        let sources = roots
            .map(|(root, origin, namespace)| Source {
                root,
                origin,
                docs: Default::default(),
                loaded: false,
                seq: 0,
                failure: None,
                namespace,
            })
            .collect::<Vec<_>>();
        let source_count = sources.len();
        let store = Arc::new(Store {
            data_dir: data_dir.to_path_buf(),
            watch_dirs: watch_dirs.iter().map(|d| d.path.clone()).collect(),
            events: broadcast::channel(EVENT_CAPACITY).0,
            inner: Mutex::new(Inner {
                records,
                last_rv,
                sources,
                clashes: Vec::new(),
                logged: Default::default(),
                writing: Default::default(),
                quiet_waiters: 0,
            }),
            settled: Condvar::new(),
            snapshot_writes: Default::default(),
            cow_touched: Default::default(),
            event_log: EventLog::open(&data_dir.join("events.json"), EventLimits::default()),
            egress_log: EgressLog::open(&data_dir.join("egress")),
            audit_log: AuditLog::open(&data_dir.join("audit"), AUDIT_LOG_BYTES),
        });
        for index in 0..source_count {
            store.rescan(index);
        }
        Ok(store)
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The directory of the workspaces' disks (see [`crate::disk`], which owns what is in it).
    pub fn disks_dir(&self) -> PathBuf {
        self.data_dir.join("disks")
    }

    pub fn watch_dirs(&self) -> &[PathBuf] {
        &self.watch_dirs
    }

    /// The audit trail.
    pub fn audit(&self) -> &AuditLog {
        &self.audit_log
    }

    /// The events recorded about resources.
    pub fn events(&self) -> &EventLog {
        &self.event_log
    }

    /// The egress gateway's decision logs.
    pub fn egress_log(&self) -> &EgressLog {
        &self.egress_log
    }

    /// The handle through which events are recorded.
    pub fn recorder(&self) -> Recorder {
        self.event_log.recorder()
    }

    /// Where a snapshot's tar lives.
    pub fn snapshot_path(&self, name: &str) -> PathBuf {
        self.data_dir.join("snapshots").join(format!("{name}.tar"))
    }

    /// True once every source has been read completely at least once. Garbage collection waits
    /// for it: a partial view is never a reason to delete.
    pub fn is_fully_loaded(&self) -> bool {
        self.lock().sources.iter().all(|s| s.loaded)
    }

    pub fn get(&self, kind: Kind, name: &str) -> Option<Entry> {
        let inner = self.lock();
        inner.records.get(&(kind, name.to_string())).map(|r| Entry {
            resource: r.resource.clone(),
            origin: r.origin.clone(),
            file: r.file.clone(),
        })
    }

    /// All resources of a kind, sorted by creation time then name.
    pub fn list(&self, kind: Kind) -> Vec<Entry> {
        let mut out: Vec<Entry> = {
            let inner = self.lock();
            inner
                .records
                .range((kind, String::new())..)
                .take_while(|((k, _), _)| *k == kind)
                .map(|(_, r)| Entry {
                    resource: r.resource.clone(),
                    origin: r.origin.clone(),
                    file: r.file.clone(),
                })
                .collect()
        };
        out.sort_by(|a, b| {
            let key = |e: &Entry| (e.resource.metadata().creation_timestamp, e.resource.key());
            key(a).cmp(&key(b))
        });
        out
    }

    /// Creates a resource declared through the API. Server metadata in the input is ignored. The
    /// name must be given and valid (the API generates one for a nameless Sandbox first).
    pub fn create(&self, resource: AnyResource, opts: WriteOptions) -> StoreResult<AnyResource> {
        self.create_owned(resource, Vec::new(), opts)
    }

    /// [`Store::create`] for controllers: the new resource carries `owner_references` (a Fork's
    /// children point at their Fork).
    pub fn create_owned(
        &self,
        resource: AnyResource,
        owner_references: Vec<crate::resource::OwnerReference>,
        opts: WriteOptions,
    ) -> StoreResult<AnyResource> {
        api::create(self, resource, owner_references, opts)
    }

    /// Creates every one of `resources` for a controller, each owned through `owner_references`,
    /// with one round of disk flushes for all; see [`Store::create_owned`]. One result per
    /// resource, in order: each fails or succeeds on its own checks, a failed write fails all.
    pub fn create_all_owned(
        &self,
        resources: Vec<AnyResource>,
        owner_references: Vec<crate::resource::OwnerReference>,
    ) -> Vec<StoreResult<AnyResource>> {
        api::create_all(self, resources, owner_references, WriteOptions::default())
    }

    /// Replaces labels, annotations and spec. A `resourceVersion` in the input must be current
    /// (else [`StoreError::Conflict`]); without one the write is unconditional. Replacing with an
    /// identical declaration changes nothing (no new resourceVersion, no event).
    pub fn replace(&self, resource: AnyResource, opts: WriteOptions) -> StoreResult<AnyResource> {
        api::replace(self, resource, opts)
    }

    /// Read-modify-write of a writable resource's declaration, retried on conflicts.
    pub fn update<F>(&self, kind: Kind, name: &str, mut mutate: F) -> StoreResult<AnyResource>
    where
        F: FnMut(&mut AnyResource) -> Result<(), StoreError>,
    {
        let mut attempts = 0;
        loop {
            let entry = self.get(kind, name).ok_or_else(|| StoreError::NotFound {
                kind,
                name: name.to_string(),
            })?;
            let read_version = entry.resource.metadata().resource_version.clone();
            let mut resource = entry.resource;
            mutate(&mut resource)?;
            // The mutation may not rename the resource or drop the version we read.
            resource.metadata_mut().name = name.to_string();
            resource.metadata_mut().resource_version = read_version;
            match self.replace(resource, WriteOptions::default()) {
                Err(StoreError::Conflict { .. }) if attempts < 16 => attempts += 1,
                other => return other,
            }
        }
    }

    /// Marks a resource for deletion (`deletionTimestamp`); the controller removes what it owns and
    /// then calls [`Store::finalize`]. Deleting a resource already being deleted changes nothing.
    pub fn delete(&self, kind: Kind, name: &str, opts: WriteOptions) -> StoreResult<AnyResource> {
        api::delete(self, kind, name, opts)
    }

    /// Writes observed status (controller only). Bumps `resourceVersion`, not `generation`. Works
    /// for resources of read-only folders too: status is the server's.
    pub fn update_status(
        &self,
        kind: Kind,
        name: &str,
        status: serde_json::Value,
    ) -> StoreResult<AnyResource> {
        api::update_status(self, kind, name, status)
    }

    /// Drops a deleted resource's files and forgets it (controller only, after cleanup). Only a
    /// resource marked for deletion can be finalized; finalizing one already gone is a no-op.
    pub fn finalize(&self, kind: Kind, name: &str) -> StoreResult<()> {
        api::finalize(self, kind, name)
    }

    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<WatchEvent> {
        self.events.subscribe()
    }

    /// Documents that failed to parse or validate, or lost a name clash, and folders that could
    /// not be read, as of the last scan.
    pub fn document_errors(&self) -> Vec<DocumentError> {
        self.lock().errors()
    }

    /// The errors of documents that declare `kind`/`name`.
    pub fn errors_for(&self, kind: Kind, name: &str) -> Vec<DocumentError> {
        let mut errors = self.document_errors();
        errors.retain(|e| {
            e.identity
                .as_ref()
                .is_some_and(|(k, n)| *k == kind && n == name)
        });
        errors
    }

    /// Watches `<data>/manifests` and every `--watch` folder until the returned task is dropped
    /// or aborted, rescanning a folder (debounced) whenever something in it changes, and every
    /// folder periodically in case a change notification was lost.
    pub fn spawn_watchers(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        watch::spawn(Arc::clone(self))
    }

    /// The lock, for reading the index or changing what no unlocked write can touch.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the index as consistent as any single step
        // leaves it; refusing all further work would be worse.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(
        &self,
        guard: MutexGuard<'a, Inner>,
        busy: impl FnMut(&mut Inner) -> bool,
    ) -> MutexGuard<'a, Inner> {
        self.settled
            .wait_while(guard, busy)
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, once no unlocked write of `key` is in flight: for a change of that one resource.
    fn lock_key(&self, key: &index::Key) -> MutexGuard<'_, Inner> {
        self.wait(self.lock(), |inner| inner.writing.contains(key))
    }

    /// The lock, once no unlocked write is in flight at all: for changes that may touch any
    /// resource (a folder rescan, a finalize that lets a waiting declaration in). New unlocked
    /// writes hold back meanwhile, so a steady stream of them cannot starve this.
    fn lock_quiet(&self) -> MutexGuard<'_, Inner> {
        let mut guard = self.lock();
        guard.quiet_waiters += 1;
        let mut guard = self.wait(guard, |inner| !inner.writing.is_empty());
        guard.quiet_waiters -= 1;
        // Writers parked behind us re-check once this guard is dropped.
        self.settled.notify_all();
        guard
    }

    /// The lock, once `key` may be reserved for an unlocked write (a create or a status write).
    fn lock_to_reserve(&self, key: &index::Key) -> MutexGuard<'_, Inner> {
        self.lock_to_reserve_all(std::slice::from_ref(key))
    }

    /// [`Store::lock_to_reserve`] for several keys at once.
    fn lock_to_reserve_all(&self, keys: &[index::Key]) -> MutexGuard<'_, Inner> {
        self.wait(self.lock(), |inner| {
            inner.quiet_waiters > 0 || keys.iter().any(|key| inner.writing.contains(key))
        })
    }

    fn emit(&self, event_type: EventType, resource: AnyResource) {
        // An error only means nobody is subscribed.
        let _ = self.events.send(WatchEvent {
            event_type,
            resource,
        });
    }
}
