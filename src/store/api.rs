//! Writes through the API and the controller: create, replace, delete, status, finalize. Each one
//! checks ownership and concurrency, writes the manifest (data directory only) and then the state
//! file, and only then changes the index and broadcasts the result, so that nobody acts on a
//! change a crash could take back. Two writes of one resource never interleave. Creates and
//! status writes, the controller's steady traffic (a Fork's children, every reconcile's status),
//! do their fsyncs outside the store's lock so that those of different resources overlap; the
//! other writes hold the lock throughout. Folder contents are never written here.

use std::path::{Path, PathBuf};

use super::folders::Declared;
use super::index::{self, Inner, Key};
use super::state::{self, Record};
use super::{atomic, EventType, Origin, Store, StoreError, StoreResult, WriteOptions};
use crate::resource::yaml::to_yaml;
use crate::resource::{is_valid_key, AnyResource, Kind, OwnerReference};

/// The data directory is always the first source.
const DATA_DIR: usize = 0;

pub(super) fn manifest_path(store: &Store, kind: Kind, name: &str) -> PathBuf {
    store
        .data_dir
        .join("manifests")
        .join(kind.plural())
        .join(format!("{name}.yaml"))
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn not_found(key: &Key) -> StoreError {
    StoreError::NotFound {
        kind: key.0,
        name: key.1.clone(),
    }
}

fn found(inner: &Inner, key: &Key) -> StoreResult<Record> {
    inner
        .records
        .get(key)
        .cloned()
        .ok_or_else(|| not_found(key))
}

fn check_writable(record: &Record, key: &Key) -> StoreResult<()> {
    match &record.origin {
        Origin::DataDir => Ok(()),
        Origin::Folder(folder) => Err(StoreError::ReadOnly {
            kind: key.0,
            name: key.1.clone(),
            folder: folder.clone(),
        }),
    }
}

/// The manifest file the API may rewrite or remove for `record`: its own file, unless a person
/// put it in a file together with other documents, which we cannot edit without losing theirs.
fn writable_file(store: &Store, inner: &Inner, record: &Record, key: &Key) -> StoreResult<PathBuf> {
    let canonical = manifest_path(store, key.0, &key.1);
    let Some(file) = record.file.as_ref().filter(|f| **f != canonical) else {
        return Ok(canonical);
    };
    let docs = &inner.sources[DATA_DIR].docs;
    let Some(declared) = docs.files.get(file) else {
        return Ok(canonical);
    };
    let sole = declared.len() == 1 && declared[0].key() == *key;
    let has_errors = docs.errors.iter().any(|e| e.file.as_ref() == Some(file));
    if sole && !has_errors {
        Ok(file.clone())
    } else {
        Err(StoreError::Invalid(format!(
            "{} {:?} is declared in {} together with other documents; edit that file",
            key.0,
            key.1,
            file.display()
        )))
    }
}

/// A declaration as the manifest file the data directory keeps.
fn manifest_text(declaration: &AnyResource) -> StoreResult<String> {
    to_yaml(declaration).map_err(|e| StoreError::Invalid(e.to_string()))
}

/// Tells the data-directory source about a declaration just written, so that a rescan racing
/// with the write is redone rather than undoing it.
fn note_manifest(inner: &mut Inner, path: &Path, declaration: &AnyResource) {
    let source = &mut inner.sources[DATA_DIR];
    source.docs.files.insert(
        path.to_path_buf(),
        vec![Declared {
            resource: declaration.clone(),
            file: path.to_path_buf(),
            line: 1,
        }],
    );
    source.seq += 1;
}

/// Writes an edited declaration and its state file in one round of flushes (as a create does):
/// every pause, resume and stop is such an edit, and syncing the two files one after the other
/// doubled its wait. A crash in between may leave either file new: a new manifest alone is the
/// edit, declared again on restart; a new state file alone is an edit nobody was told of, which
/// the old manifest undoes.
fn write_manifest_and_state(
    store: &Store,
    path: &Path,
    declaration: &AnyResource,
    record: &Record,
) -> StoreResult<()> {
    let yaml = manifest_text(declaration)?;
    let (state_path, state) = state::encode(&store.data_dir, record).map_err(io_error(path))?;
    atomic::write_all_atomic(&[(path, yaml.as_bytes()), (&state_path, &state)])
        .map_err(io_error(path))
}

pub(super) fn create(
    store: &Store,
    resource: AnyResource,
    owner_references: Vec<OwnerReference>,
    opts: WriteOptions,
) -> StoreResult<AnyResource> {
    let mut results = create_all(store, vec![resource], owner_references, opts);
    results.pop().unwrap_or_else(|| {
        Err(StoreError::Invalid(
            "a create wrote nothing and said nothing".into(),
        ))
    })
}

/// A create that passed its checks and holds its reservation, not yet written.
struct NewRecord {
    key: Key,
    path: PathBuf,
    declaration: AnyResource,
    record: Record,
}

/// Creates `resources` (each with `owner_references`) in one round of disk flushes: every
/// manifest and state file is synced together, so a Fork's children cost one wait, not one each.
/// Each resource fails or succeeds on its own checks (one that exists fails, the others are
/// created); a failed write fails them all. The results follow the input's order.
pub(super) fn create_all(
    store: &Store,
    resources: Vec<AnyResource>,
    owner_references: Vec<OwnerReference>,
    opts: WriteOptions,
) -> Vec<StoreResult<AnyResource>> {
    let keys: Vec<Key> = resources.iter().map(|r| (r.kind(), r.key())).collect();
    let mut results: Vec<StoreResult<AnyResource>> = Vec::with_capacity(keys.len());
    let mut pending: Vec<(usize, NewRecord)> = Vec::new();
    let mut inner = store.lock_to_reserve_all(&keys);
    let last_rv = inner.last_rv;
    for (index, (resource, key)) in resources.iter().zip(&keys).enumerate() {
        let repeated = pending.iter().any(|(_, new)| new.key == *key);
        let checked = if repeated {
            Err(StoreError::AlreadyExists {
                kind: key.0,
                name: key.1.clone(),
            })
        } else {
            check_new(store, &inner, key)
        };
        match checked {
            Err(e) => results.push(Err(e)),
            Ok(path) => {
                let declaration = resource.declaration();
                let mut created = index::fresh(&mut inner, &declaration);
                created.metadata_mut().owner_references = owner_references.clone();
                results.push(Ok(created.clone()));
                let record = Record {
                    resource: created,
                    origin: Origin::DataDir,
                    file: Some(path.clone()),
                };
                let new = NewRecord {
                    key: key.clone(),
                    path,
                    declaration,
                    record,
                };
                pending.push((index, new));
            }
        }
    }
    if opts.dry_run || pending.is_empty() {
        inner.last_rv = last_rv;
        return results;
    }
    for (_, new) in &pending {
        inner.writing.insert(new.key.clone());
    }
    drop(inner);
    // The manifest and the state file of each are synced with all the others. A crash in
    // between may leave either without the other, of a create nobody was told of: a manifest
    // alone is declared again on restart, a state file alone is a resource no longer declared,
    // deleted.
    let write = || {
        let mut files = Vec::with_capacity(2 * pending.len());
        for (_, new) in &pending {
            let yaml = manifest_text(&new.declaration)?;
            let (state_path, state) =
                state::encode(&store.data_dir, &new.record).map_err(io_error(&new.path))?;
            files.push((new.path.clone(), yaml.into_bytes()));
            files.push((state_path, state));
        }
        let borrowed: Vec<(&Path, &[u8])> = files
            .iter()
            .map(|(path, bytes)| (path.as_path(), bytes.as_slice()))
            .collect();
        atomic::write_all_atomic(&borrowed).map_err(io_error(&pending[0].1.path))
    };
    let reserved = pending.iter().map(|(_, new)| new.key.clone()).collect();
    let written = write_unlocked(store, reserved, write, |inner| {
        for (_, new) in &pending {
            note_manifest(inner, &new.path, &new.declaration);
            inner.records.insert(new.key.clone(), new.record.clone());
            store.emit(EventType::Added, new.record.resource.clone());
        }
    });
    if let Err(error) = written {
        for (index, _) in &pending {
            results[*index] = Err(copy_of(&error));
        }
    }
    results
}

/// Creates `resource` with `status` already set, in one write: the controller never sees it
/// without that status. `place_data` runs first, after the checks and with the name reserved, to
/// put the resource's data in place (an imported snapshot's file); if it or the write fails,
/// `remove_data` takes the data away again and nothing is created.
pub(super) fn create_with_status(
    store: &Store,
    resource: AnyResource,
    status: serde_json::Value,
    uid: Option<String>,
    place_data: impl FnOnce() -> StoreResult<()>,
    remove_data: impl FnOnce(),
) -> StoreResult<AnyResource> {
    let key: Key = (resource.kind(), resource.key());
    let mut inner = store.lock_to_reserve(&key);
    let path = check_new(store, &inner, &key)?;
    let declaration = resource.declaration();
    let last_rv = inner.last_rv;
    let mut created = index::fresh(&mut inner, &declaration);
    if uid.is_some() {
        created.metadata_mut().uid = uid;
    }
    if let Err(e) = created.set_status_json(Some(status)) {
        inner.last_rv = last_rv;
        return Err(StoreError::Invalid(format!("status: {e}")));
    }
    let record = Record {
        resource: created.clone(),
        origin: Origin::DataDir,
        file: Some(path.clone()),
    };
    inner.writing.insert(key.clone());
    drop(inner);
    let write = || {
        place_data()?;
        let written = write_manifest_and_state(store, &path, &declaration, &record);
        if written.is_err() {
            remove_data();
        }
        written
    };
    write_unlocked(store, vec![key.clone()], write, |inner| {
        note_manifest(inner, &path, &declaration);
        inner.records.insert(key, record.clone());
        store.emit(EventType::Added, created.clone());
    })?;
    Ok(created)
}

/// The same failure again, for each resource of a write that failed as a whole.
fn copy_of(error: &StoreError) -> StoreError {
    match error {
        StoreError::Io { path, source } => StoreError::Io {
            path: path.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        other => StoreError::Invalid(other.to_string()),
    }
}

/// Whether `key` may be created: valid, not known, and no file of another kind in its way.
/// Returns its manifest path.
fn check_new(store: &Store, inner: &Inner, key: &Key) -> StoreResult<PathBuf> {
    if !is_valid_key(&key.1) {
        return Err(StoreError::Invalid(if key.1.is_empty() {
            "metadata.name is required".into()
        } else {
            format!("metadata.name: {:?} is not a valid name", key.1)
        }));
    }
    if inner.records.contains_key(key) || inner.is_declared(key) {
        return Err(StoreError::AlreadyExists {
            kind: key.0,
            name: key.1.clone(),
        });
    }
    let path = manifest_path(store, key.0, &key.1);
    if std::fs::symlink_metadata(&path).is_ok() {
        return Err(StoreError::Invalid(format!(
            "the manifest file {} exists but does not declare a valid {} {:?}; fix or remove it",
            path.display(),
            key.0,
            key.1
        )));
    }
    Ok(path)
}

pub(super) fn replace(
    store: &Store,
    resource: AnyResource,
    opts: WriteOptions,
) -> StoreResult<AnyResource> {
    let key: Key = (resource.kind(), resource.key());
    let mut inner = store.lock_key(&key);
    let mut record = found(&inner, &key)?;
    check_writable(&record, &key)?;
    if record.is_deleting() {
        return Err(StoreError::Terminating {
            kind: key.0,
            name: key.1,
        });
    }
    let current = record.resource_version().to_string();
    if let Some(given) = resource.metadata().resource_version.as_deref() {
        if !given.is_empty() && given != current {
            return Err(StoreError::Conflict {
                kind: key.0,
                name: key.1,
                given: given.to_string(),
                current,
            });
        }
    }
    let path = writable_file(store, &inner, &record, &key)?;
    let declaration = resource.declaration();
    if record.resource.same_declaration(&declaration) {
        return Ok(record.resource);
    }
    let fields = record.resource.immutable_changes(&declaration);
    if !fields.is_empty() {
        return Err(StoreError::Immutable {
            kind: key.0,
            name: key.1,
            fields,
        });
    }
    let last_rv = inner.last_rv;
    let updated = index::redeclared(&mut inner, &record.resource, &declaration);
    if opts.dry_run {
        inner.last_rv = last_rv;
        return Ok(updated);
    }
    record.resource = updated.clone();
    record.file = Some(path.clone());
    if let Err(e) = write_manifest_and_state(store, &path, &declaration, &record) {
        inner.last_rv = last_rv;
        return Err(e);
    }
    note_manifest(&mut inner, &path, &declaration);
    inner.records.insert(key, record);
    store.emit(EventType::Modified, updated.clone());
    Ok(updated)
}

pub(super) fn delete(
    store: &Store,
    kind: Kind,
    name: &str,
    opts: WriteOptions,
) -> StoreResult<AnyResource> {
    let key: Key = (kind, name.to_string());
    let mut inner = store.lock_key(&key);
    let mut record = found(&inner, &key)?;
    check_writable(&record, &key)?;
    if record.is_deleting() {
        return Ok(record.resource);
    }
    // Refuse now what finalize could not do later: remove a document from a shared file.
    writable_file(store, &inner, &record, &key)?;
    let last_rv = inner.last_rv;
    let rv = inner.next_rv();
    let meta = record.resource.metadata_mut();
    meta.deletion_timestamp = Some(chrono::Utc::now());
    meta.resource_version = Some(rv);
    if opts.dry_run {
        inner.last_rv = last_rv;
        return Ok(record.resource);
    }
    if let Err(e) = state::save(&store.data_dir, &record) {
        inner.last_rv = last_rv;
        let path = state::state_path(&store.data_dir, kind, name);
        return Err(io_error(&path)(e));
    }
    let deleted = record.resource.clone();
    inner.records.insert(key, record);
    store.emit(EventType::Modified, deleted.clone());
    Ok(deleted)
}

pub(super) fn update_status(
    store: &Store,
    kind: Kind,
    name: &str,
    status: serde_json::Value,
) -> StoreResult<AnyResource> {
    let key: Key = (kind, name.to_string());
    let record = {
        let mut inner = store.lock_to_reserve(&key);
        let mut record = found(&inner, &key)?;
        let before = record.resource.status_json();
        record
            .resource
            .set_status_json(Some(status))
            .map_err(|e| StoreError::Invalid(format!("status: {e}")))?;
        // Rewriting the same status would wake every watcher (the controller among them) for
        // nothing.
        if record.resource.status_json() == before {
            return Ok(record.resource);
        }
        let rv = inner.next_rv();
        record.resource.metadata_mut().resource_version = Some(rv);
        inner.writing.insert(key.clone());
        record
    };
    let updated = record.resource.clone();
    let write = || {
        state::save(&store.data_dir, &record).map_err(|e| {
            let path = state::state_path(&store.data_dir, kind, name);
            io_error(&path)(e)
        })
    };
    write_unlocked(store, vec![key.clone()], write, |inner| {
        inner.records.insert(key, record.clone());
        store.emit(EventType::Modified, updated.clone());
    })?;
    Ok(updated)
}

/// The second half of a write that does its fsyncs without the store's lock, so that writes of
/// different resources overlap (and share the file system's journal commits). The caller has
/// reserved `key` in `Inner::writing` under the lock, after checking everything, so nothing else
/// changes that resource meanwhile (see `Store::lock_key`). `write` runs unlocked; only when it
/// succeeded does `commit` change the index and broadcast, under the lock: nobody acts on a change
/// a crash could still take back. A failed write changes nothing but leaves a gap in
/// resourceVersions, which is harmless: they only ever grow.
fn write_unlocked(
    store: &Store,
    keys: Vec<Key>,
    write: impl FnOnce() -> StoreResult<()>,
    commit: impl FnOnce(&mut Inner),
) -> StoreResult<()> {
    let mut in_flight = InFlight { store, keys };
    write()?;
    let mut inner = store.lock();
    for key in std::mem::take(&mut in_flight.keys) {
        inner.writing.remove(&key);
    }
    commit(&mut inner);
    store.settled.notify_all();
    Ok(())
}

/// Resources reserved between their unlocked write and its commit. Dropped before the commit (an
/// error or a panic), it lets their other writers in and changes nothing else.
struct InFlight<'a> {
    store: &'a Store,
    keys: Vec<Key>,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut inner = self.store.lock();
        for key in self.keys.drain(..) {
            inner.writing.remove(&key);
        }
        drop(inner);
        self.store.settled.notify_all();
    }
}

pub(super) fn finalize(store: &Store, kind: Kind, name: &str) -> StoreResult<()> {
    let key: Key = (kind, name.to_string());
    let mut inner = store.lock_quiet();
    let Some(record) = inner.records.get(&key).cloned() else {
        return Ok(());
    };
    if !record.is_deleting() {
        return Err(StoreError::Invalid(format!(
            "{kind} {name:?} is not marked for deletion"
        )));
    }
    if record.origin == Origin::DataDir {
        let canonical = manifest_path(store, kind, name);
        let source = &mut inner.sources[DATA_DIR];
        for file in record.file.iter().chain([&canonical]) {
            let sole = source
                .docs
                .files
                .get(file)
                .is_some_and(|d| d.len() == 1 && d[0].key() == key);
            if !sole {
                continue;
            }
            match std::fs::remove_file(file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(io_error(file)(e));
                }
                _ => {}
            }
            source.docs.files.remove(file);
            source.seq += 1;
        }
    }
    let path = state::state_path(&store.data_dir, kind, name);
    state::remove(&store.data_dir, kind, name).map_err(io_error(&path))?;
    inner.records.remove(&key);
    store.emit(EventType::Deleted, record.resource);
    // A declaration that waited for the name (or a folder that still declares it) applies now.
    store.resolve(&mut inner);
    Ok(())
}
