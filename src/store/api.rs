//! Writes through the API and the controller: create, replace, delete, status, finalize. Each one
//! checks ownership and concurrency, writes the manifest (data directory only) and then the state
//! file while holding the store's lock, so that two writes of one resource never interleave, and
//! broadcasts the result. Folder contents are never written here.

use std::path::{Path, PathBuf};

use super::folders::Declared;
use super::index::{self, Inner, Key};
use super::state::{self, Record};
use super::{atomic, EventType, Origin, Store, StoreError, StoreResult, WriteOptions};
use crate::resource::yaml::to_yaml;
use crate::resource::{is_valid_name, AnyResource, Kind, OwnerReference};

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

/// Writes a declaration into the data directory and tells the data-directory source about it, so
/// that a rescan racing with this write is redone rather than undoing it.
fn write_manifest(inner: &mut Inner, path: &Path, declaration: &AnyResource) -> StoreResult<()> {
    let yaml = to_yaml(declaration).map_err(|e| StoreError::Invalid(e.to_string()))?;
    atomic::write_atomic(path, yaml.as_bytes()).map_err(io_error(path))?;
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
    Ok(())
}

/// Writes the state file after the manifest. If that fails the manifest already says what is
/// wanted and the index follows it; the next write (or a restart) writes the state again.
fn save_state(store: &Store, record: &Record) {
    if let Err(e) = state::save(&store.data_dir, record) {
        tracing::error!(
            "cannot write the state of {} {:?}: {e}",
            record.resource.kind(),
            record.resource.name()
        );
    }
}

pub(super) fn create(
    store: &Store,
    resource: AnyResource,
    owner_references: Vec<OwnerReference>,
    opts: WriteOptions,
) -> StoreResult<AnyResource> {
    let key: Key = (resource.kind(), resource.name().to_string());
    if !is_valid_name(&key.1) {
        return Err(StoreError::Invalid(if key.1.is_empty() {
            "metadata.name is required".into()
        } else {
            format!("metadata.name: {:?} is not a valid name", key.1)
        }));
    }
    let mut inner = store.lock();
    if inner.records.contains_key(&key) || inner.is_declared(&key) {
        return Err(StoreError::AlreadyExists {
            kind: key.0,
            name: key.1,
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
    let declaration = resource.declaration();
    let last_rv = inner.last_rv;
    let mut created = index::fresh(&mut inner, &declaration);
    created.metadata_mut().owner_references = owner_references;
    if opts.dry_run {
        inner.last_rv = last_rv;
        return Ok(created);
    }
    write_manifest(&mut inner, &path, &declaration)?;
    let record = Record {
        resource: created.clone(),
        origin: Origin::DataDir,
        file: Some(path),
    };
    save_state(store, &record);
    inner.records.insert(key, record);
    store.emit(EventType::Added, created.clone());
    Ok(created)
}

pub(super) fn replace(
    store: &Store,
    resource: AnyResource,
    opts: WriteOptions,
) -> StoreResult<AnyResource> {
    let key: Key = (resource.kind(), resource.name().to_string());
    let mut inner = store.lock();
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
    let last_rv = inner.last_rv;
    let updated = index::redeclared(&mut inner, &record.resource, &declaration);
    if opts.dry_run {
        inner.last_rv = last_rv;
        return Ok(updated);
    }
    if let Err(e) = write_manifest(&mut inner, &path, &declaration) {
        inner.last_rv = last_rv;
        return Err(e);
    }
    record.resource = updated.clone();
    record.file = Some(path);
    save_state(store, &record);
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
    let mut inner = store.lock();
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
    let mut inner = store.lock();
    let mut record = found(&inner, &key)?;
    let before = record.resource.status_json();
    record
        .resource
        .set_status_json(Some(status))
        .map_err(|e| StoreError::Invalid(format!("status: {e}")))?;
    // Rewriting the same status would wake every watcher (the controller among them) for nothing.
    if record.resource.status_json() == before {
        return Ok(record.resource);
    }
    let last_rv = inner.last_rv;
    let rv = inner.next_rv();
    record.resource.metadata_mut().resource_version = Some(rv);
    if let Err(e) = state::save(&store.data_dir, &record) {
        inner.last_rv = last_rv;
        let path = state::state_path(&store.data_dir, kind, name);
        return Err(io_error(&path)(e));
    }
    let updated = record.resource.clone();
    inner.records.insert(key, record);
    store.emit(EventType::Modified, updated.clone());
    Ok(updated)
}

pub(super) fn finalize(store: &Store, kind: Kind, name: &str) -> StoreResult<()> {
    let key: Key = (kind, name.to_string());
    let mut inner = store.lock();
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
