//! Importing a snapshot archive, read as hostile input while it streams in. Order is what makes
//! it safe: the name is checked first; the body is counted against its cap as it arrives; the
//! manifest (bounded) is checked before any content is read; the workspace tar passes the rules
//! of a restore (`archive::validate` with the restore policy) while its bytes go, unchanged, to a
//! temp file of the store and through SHA-256; the archive must then end cleanly. Only when its
//! size and digest match the manifest, and the base image may be used here, does the store make
//! the data file and a Ready snapshot appear in one step. Every early return drops the temp
//! file.
//!
//! A Full snapshot's archive (format version 2) carries the root filesystem layer after the
//! workspace: it passes the same tar rules (names, links, no devices or set-id bits, bounded
//! sizes), goes to a scratch file of the store and through SHA-256, and must match the
//! manifest's digest before Docker sees it. Docker then makes the snapshot's image from the base
//! image (pulled first by the pull policy, or the import is refused naming it) and that layer,
//! labeled with the new snapshot's uid like a committed one; if the snapshot cannot be stored
//! after all, the image is removed again.

use std::cell::Cell;
use std::fmt::Display;
use std::io::{self, Read, Seek, Write};
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use chrono::Utc;
use futures::{Stream, StreamExt};
use serde_json::json;

use super::manifest::{Manifest, MANIFEST_NAME, MAX_MANIFEST_BYTES, ROOTFS_NAME, WORKSPACE_NAME};
use super::{Result, SnapshotArchiveError};
use crate::archive::{self, ArchiveError, ChannelReader, HashedWriter, Limits, Policy};
use crate::config::Settings;
use crate::docker::{Engine, EngineError, LABEL_SERVER, LABEL_SNAPSHOT, SNAPSHOT_REPOSITORY};
use crate::resource::yaml::value_to_resource;
use crate::resource::{
    is_valid_name, AnyResource, Condition, ConditionStatus, ImagePullPolicy, Kind, SnapshotPhase,
    SnapshotScope, SnapshotStatus, API_VERSION,
};
use crate::store::{Store, StoreError};

/// Room for the tar headers, padding and end marker around the manifest and the workspace.
const FRAMING_BYTES: u64 = 64 * 1024;
/// Zero bytes accepted after the end-of-archive marker (tar writers pad to whole records).
const MAX_TRAILING_BYTES: u64 = 64 * 1024;

/// What an import is asked to do.
pub struct ImportRequest<'a> {
    /// The new snapshot's name.
    pub name: &'a str,
    /// The body's declared length, if any: over the cap it is refused before reading.
    pub content_length: Option<u64>,
}

/// What the archive held, checked.
struct Received {
    manifest: Manifest,
    /// The root filesystem layer of a Full snapshot, in the scratch file, rewound.
    rootfs: Option<std::fs::File>,
}

fn refused(message: impl Into<String>) -> SnapshotArchiveError {
    SnapshotArchiveError::Refused(message.into())
}

/// Imports the snapshot archive `body` as snapshot `request.name`; answers the new snapshot,
/// Ready. See the module documentation for the order of checks.
pub async fn import<S, E>(
    store: &Arc<Store>,
    settings: &Settings,
    engine: &dyn Engine,
    request: ImportRequest<'_>,
    mut body: S,
) -> Result<AnyResource>
where
    S: Stream<Item = std::result::Result<Bytes, E>> + Unpin,
    E: Display,
{
    let name = request.name;
    if !is_valid_name(name) {
        return Err(SnapshotArchiveError::InvalidName(format!(
            "name: {name:?} is not a valid snapshot name (lowercase letters, digits, '-' and \
             '_', at most 63 characters, starting and ending with a letter or digit)"
        )));
    }
    if store.get(Kind::Snapshot, name).is_some() {
        return Err(SnapshotArchiveError::Exists(format!(
            "snapshot {name:?} already exists"
        )));
    }
    let max_workspace = settings.max_snapshot_bytes;
    // A Full snapshot's root filesystem layer has the same cap as its workspace.
    let cap = max_workspace
        .saturating_mul(2)
        .saturating_add(MAX_MANIFEST_BYTES)
        .saturating_add(FRAMING_BYTES);
    let too_large = || {
        SnapshotArchiveError::TooLarge(format!(
            "the archive is larger than {cap} bytes: the workspace, and the root filesystem \
             changes of a Full snapshot, may each be at most {max_workspace} bytes \
             (AGENT_SANDBOX_MAX_SNAPSHOT_BYTES), plus {MAX_MANIFEST_BYTES} bytes of manifest \
             and {FRAMING_BYTES} of framing"
        ))
    };
    if request.content_length.is_some_and(|length| length > cap) {
        return Err(too_large());
    }
    let owner = settings
        .sandbox_uid_gid()
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?;
    let policy = Policy::restore(owner, Limits::with_max_bytes(max_workspace));

    let data = store.begin_snapshot(name);
    let file = data
        .create()
        .await
        .map_err(|e| SnapshotArchiveError::Internal(format!("creating a temp file: {e}")))?;
    // Dropped (and its file removed) when the import ends, whatever the outcome.
    let scratch = store.begin_snapshot(&format!("{name}.rootfs-{}", rand::random::<u32>()));
    let scratch_file = scratch
        .create()
        .await
        .map_err(|e| SnapshotArchiveError::Internal(format!("creating a temp file: {e}")))?;
    let (tx, reader) = ChannelReader::new(16);
    let reading = tokio::task::spawn_blocking(move || {
        read_archive(reader, file, scratch_file, max_workspace, &policy)
    });
    let mut received = 0u64;
    let mut failure = None;
    while let Some(chunk) = body.next().await {
        let item = match chunk {
            Ok(bytes) => {
                received += bytes.len() as u64;
                if received > cap {
                    failure = Some(too_large());
                    Err("the archive is over its size cap".to_string())
                } else {
                    Ok(bytes)
                }
            }
            Err(error) => {
                failure = Some(SnapshotArchiveError::Body(error.to_string()));
                Err(error.to_string())
            }
        };
        let failed = item.is_err();
        // The reader stops taking when it refuses the archive.
        if tx.send(item).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    let read = reading
        .await
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()));
    // A body cut short or over its cap is the reason, whatever the reader made of it.
    if let Some(failure) = failure {
        data.discard().await;
        return Err(failure);
    }
    let (received, file) = match read.and_then(|r| r) {
        Ok(read) => read,
        Err(error) => {
            data.discard().await;
            return Err(error);
        }
    };
    if let Err(e) = data.sync(file).await {
        data.discard().await;
        return Err(SnapshotArchiveError::Internal(format!(
            "storing the snapshot failed: {e}"
        )));
    }
    let manifest = received.manifest;
    let note = match check_image(settings, engine, &manifest).await {
        Ok(note) => note,
        Err(error) => {
            data.discard().await;
            return Err(error);
        }
    };
    let uid = Store::new_uid();
    let image = match (received.rootfs, manifest.rootfs()) {
        (Some(layer), Some(entry)) => {
            let loaded = load_rootfs(store, settings, engine, &manifest, &uid, layer, entry).await;
            drop(scratch);
            match loaded {
                Ok(reference) => Some(reference),
                Err(error) => {
                    data.discard().await;
                    return Err(error);
                }
            }
        }
        _ => None,
    };
    // The base image was pulled already when the root filesystem needed it.
    let note = if image.is_some() { String::new() } else { note };
    let made = new_snapshot(name, &manifest, &note, image.as_deref());
    let created = match made {
        Ok((resource, status)) => store
            .write(move |store| store.create_imported_snapshot(resource, status, Some(uid), data))
            .await
            .map_err(|error| match error {
                StoreError::AlreadyExists { .. } => SnapshotArchiveError::Exists(error.to_string()),
                other => SnapshotArchiveError::Store(other),
            }),
        Err(error) => {
            data.discard().await;
            Err(error)
        }
    };
    if let (Err(_), Some(reference)) = (&created, &image) {
        if let Err(error) = engine.remove_image(reference).await {
            tracing::warn!(image = reference.as_str(), %error, "removing the image of a failed import failed");
        }
    }
    created
}

/// Makes the image of imported Full snapshot `uid` from the base image (pulled first unless the
/// pull policy is `Never`) and the validated `layer`; answers its reference.
async fn load_rootfs(
    store: &Arc<Store>,
    settings: &Settings,
    engine: &dyn Engine,
    manifest: &Manifest,
    uid: &str,
    layer: std::fs::File,
    entry: &super::ManifestEntry,
) -> Result<String> {
    let base = &manifest.base_image;
    if !engine.image_exists(base).await.unwrap_or(false) {
        // check_image refused the import already when the policy is Never.
        let pulled = engine
            .pull_image(
                base,
                settings.registry_auth_file.as_deref(),
                Box::new(|_, _| {}),
            )
            .await;
        if let Err(error) = pulled {
            let why = match error {
                EngineError::PullFailed { message, .. } => message,
                other => other.to_string(),
            };
            return Err(refused(format!(
                "the snapshot's base image {base} is not on this Docker host and pulling it \
                 failed: {why}; the root filesystem changes of a Full snapshot need it: load or \
                 pull the image first"
            )));
        }
    }
    let server = store
        .server_id()
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?;
    let labels = std::collections::BTreeMap::from([
        (LABEL_SERVER.to_string(), server),
        (LABEL_SNAPSHOT.to_string(), uid.to_string()),
    ]);
    let reference = format!("{SNAPSHOT_REPOSITORY}:{}", uid.to_ascii_lowercase());
    match engine
        .load_rootfs(
            base,
            layer,
            entry.size_bytes,
            &entry.digest,
            &reference,
            &labels,
        )
        .await
    {
        Ok(_) => Ok(reference),
        Err(error) => {
            // A load that failed part way may still have tagged the image.
            let _ = engine.remove_image(&reference).await;
            Err(refused(format!(
                "Docker could not make the image of the root filesystem changes on base image \
                 {base}: {error}"
            )))
        }
    }
}

/// Whether the base image may be used here: allowed by the settings, and on this host or pulled
/// by the pull policy when a sandbox starts from the snapshot. Answers a note for the status.
async fn check_image(
    settings: &Settings,
    engine: &dyn Engine,
    manifest: &Manifest,
) -> Result<String> {
    let image = &manifest.base_image;
    if !settings.image_allowed(image) {
        return Err(refused(format!(
            "the snapshot's base image {image} is not allowed on this server \
             (AGENT_SANDBOX_ALLOWED_IMAGES)"
        )));
    }
    let policy = manifest
        .snapshot
        .status
        .sandbox_spec
        .as_ref()
        .and_then(|spec| spec.image_pull_policy)
        .unwrap_or(settings.image_pull_policy);
    match engine.image_exists(image).await {
        Ok(true) => Ok(String::new()),
        Ok(false) if policy == ImagePullPolicy::Never => Err(refused(format!(
            "the snapshot's base image {image} is not on this Docker host and the pull policy \
             is Never: load or pull the image first"
        ))),
        Ok(false) => Ok(format!(
            "its base image {image} is not on this host yet; it is pulled ({policy:?}) when a \
             sandbox starts from the snapshot"
        )),
        Err(error) => {
            tracing::warn!(%error, image = image.as_str(), "could not ask Docker for the image");
            Ok(String::new())
        }
    }
}

/// The snapshot resource the manifest describes, under `name`, and its Ready status.
fn new_snapshot(
    name: &str,
    manifest: &Manifest,
    note: &str,
    rootfs_image: Option<&str>,
) -> Result<(AnyResource, serde_json::Value)> {
    let source = &manifest.snapshot;
    let document = json!({
        "apiVersion": API_VERSION,
        "kind": "Snapshot",
        "metadata": {
            "name": name,
            "labels": source.labels,
            "annotations": source.annotations,
        },
        "spec": source.spec,
    });
    let resource = value_to_resource(document, Some(Kind::Snapshot), None)
        .map_err(|e| refused(format!("manifest.json: snapshot: {e}")))?;
    let workspace = manifest.workspace();
    let mut message = format!(
        "imported from snapshot {:?}, exported {}",
        source.name,
        manifest.exported_at.to_rfc3339()
    );
    if !note.is_empty() {
        message.push_str("; ");
        message.push_str(note);
    }
    let now = Utc::now();
    let status = SnapshotStatus {
        phase: SnapshotPhase::Ready,
        observed_generation: Some(1),
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: ConditionStatus::True,
            reason: "Imported".into(),
            message: message.clone(),
            last_transition_time: now,
            observed_generation: Some(1),
        }],
        size_bytes: Some(workspace.size_bytes),
        digest: Some(workspace.digest.clone()),
        scope: Some(if rootfs_image.is_some() {
            SnapshotScope::Full
        } else {
            SnapshotScope::Workspace
        }),
        workspace_bytes: Some(workspace.size_bytes),
        rootfs_bytes: rootfs_image.and(source.status.rootfs_bytes),
        rootfs_digest: rootfs_image.and(manifest.rootfs().map(|r| r.digest.clone())),
        rootfs_image: rootfs_image.map(str::to_string),
        image: Some(manifest.base_image.clone()),
        sandbox_spec: source.status.sandbox_spec.clone(),
        ready_at: Some(now),
        message,
    };
    let status =
        serde_json::to_value(status).map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?;
    Ok((resource, status))
}

/// Reads the archive from `input`: the manifest, then the workspace tar into `file` (validated
/// as a restore would, hashed, its size and digest compared with the manifest's), then the end.
/// Blocking.
fn read_archive<R: Read>(
    input: R,
    file: std::fs::File,
    scratch: std::fs::File,
    max_workspace: u64,
    policy: &Policy,
) -> Result<(Received, std::fs::File)> {
    let consumed = Rc::new(Cell::new(0u64));
    let mut archive = tar::Archive::new(Counting {
        inner: input,
        count: Rc::clone(&consumed),
    });
    let mut entries = archive.entries().map_err(|e| malformed(&e))?;

    let mut first = entries
        .next()
        .ok_or_else(|| refused("the archive is empty: it must begin with manifest.json"))?
        .map_err(|e| malformed(&e))?;
    expect_file(&first, MANIFEST_NAME, "the first entry")?;
    let size = first.size();
    if size > MAX_MANIFEST_BYTES {
        return Err(SnapshotArchiveError::TooLarge(format!(
            "manifest.json is {size} bytes; the limit is {MAX_MANIFEST_BYTES}"
        )));
    }
    let mut text = Vec::with_capacity(size as usize);
    (&mut first)
        .take(size)
        .read_to_end(&mut text)
        .map_err(|e| malformed(&e))?;
    if (text.len() as u64) < size {
        return Err(refused("the archive is truncated inside manifest.json"));
    }
    let manifest = Manifest::parse(&text, max_workspace)?;
    drop(first);

    let expected = manifest.workspace().clone();
    let mut second = entries
        .next()
        .ok_or_else(|| {
            refused(format!(
                "the archive ends after manifest.json: {WORKSPACE_NAME} is missing"
            ))
        })?
        .map_err(|e| malformed(&e))?;
    expect_file(&second, WORKSPACE_NAME, "the second entry")?;
    if second.size() != expected.size_bytes {
        return Err(refused(format!(
            "{WORKSPACE_NAME} is {} bytes but the manifest says {}",
            second.size(),
            expected.size_bytes
        )));
    }
    let mut last_end = second.raw_file_position() + padded(expected.size_bytes);
    let file = copy_checked(&mut second, file, &expected, policy)?;
    drop(second);

    let mut rootfs = None;
    let mut last = WORKSPACE_NAME;
    if let Some(expected) = manifest.rootfs().cloned() {
        let mut third = entries
            .next()
            .ok_or_else(|| {
                refused(format!(
                    "the archive ends after {WORKSPACE_NAME}: {ROOTFS_NAME} is missing"
                ))
            })?
            .map_err(|e| malformed(&e))?;
        expect_file(&third, ROOTFS_NAME, "the third entry")?;
        if third.size() != expected.size_bytes {
            return Err(refused(format!(
                "{ROOTFS_NAME} is {} bytes but the manifest says {}",
                third.size(),
                expected.size_bytes
            )));
        }
        last_end = third.raw_file_position() + padded(expected.size_bytes);
        let mut layer = copy_checked(&mut third, scratch, &expected, policy)?;
        layer
            .rewind()
            .map_err(|e| SnapshotArchiveError::Internal(format!("reading the temp file: {e}")))?;
        rootfs = Some(layer);
        last = ROOTFS_NAME;
    }

    if let Some(next) = entries.next() {
        let next = next.map_err(|e| malformed(&e))?;
        let shown = String::from_utf8_lossy(&next.path_bytes()).into_owned();
        return Err(refused(format!("unexpected entry {shown:?} after {last}")));
    }
    if consumed.get() < last_end + 512 {
        return Err(refused(
            "the archive is truncated: its end-of-archive marker is missing",
        ));
    }
    let mut rest = archive.into_inner().take(MAX_TRAILING_BYTES + 1);
    let mut trailing = [0u8; 8192];
    let mut seen = 0u64;
    loop {
        let n = rest.read(&mut trailing).map_err(|e| malformed(&e))?;
        if n == 0 {
            break;
        }
        seen += n as u64;
        if seen > MAX_TRAILING_BYTES || trailing[..n].iter().any(|&b| b != 0) {
            return Err(refused(
                "the archive has data after its end-of-archive marker",
            ));
        }
    }
    Ok((Received { manifest, rootfs }, file))
}

/// Copies entry `input` (announced as `expected`) to `file` while it passes the tar rules of
/// `policy` and is hashed; refuses it unless it is complete and matches its digest. Answers the
/// file, written through.
fn copy_checked<R: Read>(
    input: &mut R,
    file: std::fs::File,
    expected: &super::ManifestEntry,
    policy: &Policy,
) -> Result<std::fs::File> {
    let which = expected.name.as_str();
    let out = HashedWriter::new(file, expected.size_bytes)
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?;
    let mut tee = Tee {
        inner: input.take(expected.size_bytes),
        out,
        read: 0,
    };
    let checked = archive::validate(&mut tee, policy);
    // A body that ended inside the entry is named as such, whatever the tar reader made of it.
    if checked.is_err() && tee.ended() && tee.read < expected.size_bytes {
        return Err(refused(format!(
            "the archive is truncated inside {which}: {} of {} bytes",
            tee.read, expected.size_bytes
        )));
    }
    checked.map_err(|error| match error {
        ArchiveError::TooLarge { limit } => SnapshotArchiveError::TooLarge(format!(
            "the files of {which} hold more than {limit} bytes \
             (AGENT_SANDBOX_MAX_SNAPSHOT_BYTES)"
        )),
        ArchiveError::Read(message) => refused(format!("reading the archive failed: {message}")),
        other => refused(format!("{which} is refused: {other}")),
    })?;
    // What follows the inner end-of-archive marker belongs to the entry too (and to its digest).
    io::copy(&mut tee, &mut io::sink()).map_err(|e| malformed(&e))?;
    if tee.read != expected.size_bytes {
        return Err(refused(format!(
            "the archive is truncated inside {which}: {} of {} bytes",
            tee.read, expected.size_bytes
        )));
    }
    let (digest, file) = tee
        .out
        .finish()
        .map_err(|e| SnapshotArchiveError::Internal(format!("writing the temp file: {e}")))?;
    if digest != expected.digest {
        return Err(refused(format!(
            "{which} does not match its digest: the manifest says {}, its content is {digest}",
            expected.digest
        )));
    }
    Ok(file)
}

fn expect_file<R: Read>(entry: &tar::Entry<'_, R>, name: &str, which: &str) -> Result<()> {
    let path = entry.path_bytes();
    if path.as_ref() != name.as_bytes() || entry.header().entry_type() != tar::EntryType::Regular {
        return Err(refused(format!(
            "{which} of the archive must be the file {name}; it is {:?}",
            String::from_utf8_lossy(&path)
        )));
    }
    Ok(())
}

fn malformed(error: &io::Error) -> SnapshotArchiveError {
    // A reader error carried through the tar crate keeps its own words.
    refused(format!("not a valid snapshot archive: {error}"))
}

fn padded(size: u64) -> u64 {
    size.div_ceil(512) * 512
}

/// Writes what it reads to `out`, counting it.
struct Tee<R, W> {
    inner: R,
    out: W,
    read: u64,
}

impl<R: Read, W: Write> Tee<R, W> {
    /// Whether the input has nothing more to give.
    fn ended(&mut self) -> bool {
        matches!(self.inner.read(&mut [0u8; 1]), Ok(0))
    }
}

impl<R: Read, W: Write> Read for Tee<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.out.write_all(&buf[..n])?;
        self.read += n as u64;
        Ok(n)
    }
}

/// Counts the bytes the tar reader consumed, to tell a clean end from a cut-off one.
struct Counting<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.set(self.count.get() + n as u64);
        Ok(n)
    }
}
