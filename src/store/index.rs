//! The in-memory index and how folder declarations become resources: which source owns a name,
//! what a changed declaration does to generation and resourceVersion, when a resource is pruned.
//! Everything here runs with the store's lock held and no unlocked write in flight; it writes
//! state files (never manifests) and broadcasts the changes it makes.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;

use chrono::Utc;

use super::folders::{self, Declared, SourceDocs};
use super::state::{self, Record};
use super::{EventType, Origin, Store};
use crate::resource::yaml::DocumentError;
use crate::resource::{AnyResource, Kind, ObjectReference};

pub(super) type Key = (Kind, String);

/// One place declarations come from: `<data>/manifests` first, then each `--watch` folder.
pub(super) struct Source {
    pub root: PathBuf,
    pub origin: Origin,
    pub docs: SourceDocs,
    /// Read successfully at least once; until then it owns what the state files say it owns.
    pub loaded: bool,
    /// Bumped whenever the API changes `docs` directly, so that a scan that raced with it is
    /// thrown away instead of undoing it.
    pub seq: u64,
    /// Why the last scan failed, if it did.
    pub failure: Option<DocumentError>,
    /// The namespace a `--watch NS=DIR` folder is bound to.
    pub namespace: Option<String>,
}

pub(super) struct Inner {
    pub records: BTreeMap<Key, Record>,
    pub last_rv: u64,
    pub sources: Vec<Source>,
    /// Declarations that lost a name to another one.
    pub clashes: Vec<DocumentError>,
    /// Errors already logged; an error is logged again only after it went away and came back.
    pub logged: HashSet<String>,
    /// Resources a create or status write is writing to disk right now, outside the lock. Nothing
    /// else may change them until the write is committed (see `Store::lock_key`).
    pub writing: HashSet<Key>,
    /// Writers waiting for `writing` to drain; new unlocked writes hold back until they are done.
    pub quiet_waiters: usize,
}

impl Inner {
    pub fn next_rv(&mut self) -> String {
        self.last_rv += 1;
        self.last_rv.to_string()
    }

    pub fn source_of(&self, origin: &Origin) -> Option<usize> {
        self.sources.iter().position(|s| &s.origin == origin)
    }

    pub fn errors(&self) -> Vec<DocumentError> {
        let mut out = Vec::new();
        for source in &self.sources {
            out.extend(source.failure.iter().cloned());
            out.extend(source.docs.errors.iter().cloned());
        }
        out.extend(self.clashes.iter().cloned());
        out
    }

    /// Whether any source declares `key`, owning it or not.
    pub fn is_declared(&self, key: &Key) -> bool {
        self.sources
            .iter()
            .flat_map(|s| s.docs.files.values().flatten())
            .any(|d| &d.key() == key)
    }
}

pub(super) fn new_uid() -> String {
    let mut bits: u128 = rand::random();
    // Shaped like a random (version 4) UUID, which is what Kubernetes tools expect a uid to be.
    bits = (bits & !(0xf << 76)) | (0x4 << 76);
    bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// A declaration made into a new resource: fresh uid, generation 1, the next resourceVersion.
pub(super) fn fresh(inner: &mut Inner, declaration: &AnyResource) -> AnyResource {
    let mut resource = declaration.declaration();
    let meta = resource.metadata_mut();
    meta.uid = Some(new_uid());
    meta.generation = Some(1);
    meta.resource_version = Some(inner.next_rv());
    meta.creation_timestamp = Some(Utc::now());
    resource
}

/// `current` with its declaration replaced by `declaration`: generation bumped only when the spec
/// changed; server metadata and status kept.
pub(super) fn redeclared(
    inner: &mut Inner,
    current: &AnyResource,
    declaration: &AnyResource,
) -> AnyResource {
    let mut resource = declaration.declaration();
    if let Err(e) = resource.set_status_json(current.status_json()) {
        tracing::warn!("status of {} {} lost: {e}", current.kind(), current.name());
    }
    let old = current.metadata();
    let spec_changed = current.spec_json() != resource.spec_json();
    let meta = resource.metadata_mut();
    meta.uid = old.uid.clone();
    meta.creation_timestamp = old.creation_timestamp;
    meta.deletion_timestamp = old.deletion_timestamp;
    meta.owner_references = old.owner_references.clone();
    let generation = old.generation.unwrap_or(1);
    meta.generation = Some(if spec_changed {
        generation + 1
    } else {
        generation
    });
    meta.resource_version = Some(inner.next_rv());
    resource
}

fn clash(loser: &Declared, owner_file: Option<&PathBuf>, deleting: bool) -> DocumentError {
    let (kind, name) = loser.key();
    let place = owner_file.map_or_else(String::new, |f| format!(" in {}", f.display()));
    let mut message = format!("{kind} {name:?} is already declared{place}");
    if deleting {
        message.push_str(" and is being deleted; this declaration applies once it is gone");
    }
    DocumentError {
        file: Some(loser.file.clone()),
        line: Some(loser.line),
        field: Some("metadata.name".into()),
        message,
        identity: Some((kind, name)),
    }
}

/// A folder document that changes immutable fields of the resource it declares.
fn immutable(declared: &Declared, fields: Vec<&'static str>) -> DocumentError {
    let (kind, name) = declared.key();
    DocumentError {
        file: Some(declared.file.clone()),
        line: Some(declared.line),
        // `Display` puts the field before the message: `…: spec.sandbox: field is immutable`.
        field: (fields.len() == 1).then(|| fields[0].to_string()),
        message: format!(
            "{}; the change is not applied (delete and recreate the {kind} to change it)",
            match fields.as_slice() {
                [_] => "field is immutable".to_string(),
                _ => super::immutable_message(&fields),
            }
        ),
        identity: Some((kind, name)),
    }
}

impl Store {
    /// Brings the index in line with what the sources declare: creates, updates and prunes
    /// resources, recomputes name clashes, and logs errors not logged before.
    pub(super) fn resolve(&self, inner: &mut Inner) {
        let mut candidates: BTreeMap<Key, Vec<(usize, Declared)>> = BTreeMap::new();
        for (index, source) in inner.sources.iter().enumerate() {
            for declared in source.docs.files.values().flatten() {
                candidates
                    .entry(declared.key())
                    .or_default()
                    .push((index, declared.clone()));
            }
        }
        let keys: BTreeSet<Key> = candidates
            .keys()
            .chain(inner.records.keys())
            .cloned()
            .collect();
        let mut clashes = Vec::new();
        for key in keys {
            let found = candidates.remove(&key).unwrap_or_default();
            self.resolve_one(inner, &key, found, &mut clashes);
        }
        inner.clashes = clashes;
        self.log_new_errors(inner);
    }

    fn resolve_one(
        &self,
        inner: &mut Inner,
        key: &Key,
        candidates: Vec<(usize, Declared)>,
        clashes: &mut Vec<DocumentError>,
    ) {
        let Some(record) = inner.records.get(key).cloned() else {
            let mut rest = candidates.into_iter();
            if let Some((source, declared)) = rest.next() {
                let resource = fresh(inner, &declared.resource);
                let record = Record {
                    resource,
                    origin: inner.sources[source].origin.clone(),
                    file: Some(declared.file.clone()),
                };
                for (_, loser) in rest {
                    clashes.push(clash(&loser, Some(&declared.file), false));
                }
                self.commit(inner, key, record, EventType::Added);
            }
            return;
        };
        let owner_source = inner.source_of(&record.origin);
        let owner = owner_source.and_then(|s| {
            candidates
                .iter()
                .position(|(i, d)| *i == s && Some(&d.file) == record.file.as_ref())
                .or_else(|| candidates.iter().position(|(i, _)| *i == s))
        });
        let deleting = record.is_deleting();
        for (i, (_, loser)) in candidates.iter().enumerate() {
            if Some(i) != owner {
                clashes.push(clash(loser, record.file.as_ref(), deleting));
            }
        }
        match owner {
            Some(i) => {
                let declared = &candidates[i].1;
                let moved = record.file.as_ref() != Some(&declared.file);
                let fields = record.resource.immutable_changes(&declared.resource);
                if !deleting && !fields.is_empty() {
                    // The last good version stays; the document says why it is not applied.
                    clashes.push(immutable(declared, fields));
                } else if !deleting && !record.resource.same_declaration(&declared.resource) {
                    let resource = redeclared(inner, &record.resource, &declared.resource);
                    let mut updated = record;
                    updated.resource = resource;
                    updated.file = Some(declared.file.clone());
                    self.commit(inner, key, updated, EventType::Modified);
                } else if moved {
                    // Not a change of the resource: no new resourceVersion, no event.
                    let mut updated = record.clone();
                    updated.file = Some(declared.file.clone());
                    self.persist_quietly(&updated);
                    inner.records.insert(key.clone(), updated);
                }
            }
            None => {
                let source_unread = owner_source.is_some_and(|s| !inner.sources[s].loaded);
                if !deleting && !source_unread {
                    tracing::info!("{} {:?} is no longer declared; deleting it", key.0, key.1);
                    let mut updated = record.clone();
                    let rv = inner.next_rv();
                    let meta = updated.resource.metadata_mut();
                    meta.deletion_timestamp = Some(Utc::now());
                    meta.resource_version = Some(rv);
                    self.commit(inner, key, updated, EventType::Modified);
                }
            }
        }
    }

    /// Stores a record changed by a folder, writes its state and broadcasts it. A failed state
    /// write is logged: the declaration still rules, and the next change writes again.
    fn commit(&self, inner: &mut Inner, key: &Key, record: Record, event: EventType) {
        self.persist_quietly(&record);
        let resource = record.resource.clone();
        inner.records.insert(key.clone(), record);
        self.emit(event, resource);
    }

    fn persist_quietly(&self, record: &Record) {
        if let Err(e) = state::save(&self.data_dir, record) {
            tracing::error!(
                "cannot write the state of {} {:?}: {e}",
                record.resource.kind(),
                record.resource.name()
            );
        }
    }

    fn log_new_errors(&self, inner: &mut Inner) {
        let current: HashSet<String> = inner.errors().iter().map(|e| e.to_string()).collect();
        for error in inner.errors() {
            let text = error.to_string();
            if !inner.logged.contains(&text) {
                let file = error
                    .file
                    .as_ref()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default();
                let line = error.line.unwrap_or(0);
                tracing::warn!(file = %file, line, "manifest error: {text}");
                self.record_manifest_error(inner, &error, text);
            }
        }
        inner.logged = current;
    }

    /// A manifest error as a Warning event, about the resource it declares when that is known,
    /// else about its file.
    fn record_manifest_error(&self, inner: &Inner, error: &DocumentError, text: String) {
        let object = match &error.identity {
            Some((kind, key)) => ObjectReference {
                kind: kind.to_string(),
                name: crate::resource::split_key(key).1.to_string(),
                namespace: crate::resource::split_key(key).0.to_string(),
                uid: inner
                    .records
                    .get(&(*kind, key.clone()))
                    .and_then(|r| r.resource.metadata().uid.clone())
                    .unwrap_or_default(),
            },
            None => ObjectReference {
                kind: "Manifest".to_string(),
                namespace: crate::resource::DEFAULT_NAMESPACE.to_string(),
                name: error
                    .file
                    .as_ref()
                    .map(|f| f.display().to_string())
                    .unwrap_or_default(),
                uid: String::new(),
            },
        };
        self.event_log
            .recorder()
            .warning(object, "ManifestInvalid", text);
    }

    /// Rescans one source and applies it. A scan that raced with a write through the API is
    /// redone, so that it cannot undo that write.
    pub(super) fn rescan(&self, index: usize) -> bool {
        for _ in 0..5 {
            let (root, seq) = {
                let inner = self.lock();
                let Some(source) = inner.sources.get(index) else {
                    return false;
                };
                (source.root.clone(), source.seq)
            };
            let scan = folders::scan_folder(&root);
            let mut inner = self.lock_quiet();
            if inner.sources[index].seq != seq {
                continue;
            }
            let ok = scan.is_ok();
            let source = &mut inner.sources[index];
            match scan {
                Ok(scan) => {
                    let mut merged =
                        folders::merge_scan(&source.docs, scan, source.namespace.as_deref());
                    if merged.kept_because_empty {
                        // Visible in the API too, so that whoever emptied the files learns why
                        // nothing was deleted.
                        merged.docs.errors.push(folders::error_at(
                            &root,
                            format!(
                                "every manifest file here is empty; keeping the {} resources it \
                                 declared before (remove the files to delete them)",
                                merged.docs.count()
                            ),
                        ));
                    }
                    source.docs = merged.docs;
                    source.loaded = true;
                    source.failure = None;
                }
                Err(e) => {
                    // Keep what it declared before: a folder that vanished prunes nothing.
                    source.failure = Some(folders::error_at(
                        &root,
                        format!("cannot read folder ({e}); keeping what it declared before"),
                    ));
                }
            }
            self.resolve(&mut inner);
            return ok;
        }
        tracing::warn!(folder = %self.lock().sources[index].root.display(), "folder keeps changing under the API's writes; rescanning later");
        true
    }
}
