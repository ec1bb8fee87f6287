//! Streaming a snapshot archive from a Ready snapshot's data file: the manifest and the tar
//! headers are made up front, the data file is read in pieces as the client takes them, and the
//! length is known before the first byte (so a client can show progress). The file is opened
//! once: a delete meanwhile does not cut the stream short, and a file that is not as long as the
//! snapshot's status says is refused before anything is sent.
//!
//! A Full snapshot's root filesystem changes come from Docker (the top layer of its image): they
//! are copied to a scratch file of the store first, checked against the snapshot's
//! `rootfsDigest`, and streamed from there after the workspace, so the length is still exact.
//! The scratch file goes when the stream ends or is dropped.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use tokio::io::AsyncReadExt;
use tokio_util::io::ReaderStream;

use super::manifest::{Manifest, MANIFEST_NAME, ROOTFS_NAME, WORKSPACE_NAME};
use super::{Result, SnapshotArchiveError};
use crate::docker::Engine;
use crate::resource::{Kind, SnapshotPhase, SnapshotStatus};
use crate::store::{SnapshotWrite, Store};

/// Tar's block size.
const BLOCK: u64 = 512;
/// Bytes read from the data file at a time.
const PIECE: usize = 256 * 1024;

/// An archive ready to stream.
pub struct Export {
    /// Its exact length in bytes.
    pub length: u64,
    /// A file name for it (`<snapshot>.snapshot.tar`).
    pub file_name: String,
    pub body: BoxStream<'static, io::Result<Bytes>>,
}

/// The archive of Ready snapshot `name`.
pub async fn export(store: &Arc<Store>, engine: &dyn Engine, name: &str) -> Result<Export> {
    let snapshot = store
        .get(Kind::Snapshot, name)
        .and_then(|entry| entry.resource.as_snapshot().cloned())
        .ok_or_else(|| SnapshotArchiveError::NotFound(format!("snapshot {name:?} not found")))?;
    if snapshot.metadata.deletion_timestamp.is_some() {
        return Err(SnapshotArchiveError::NotReady(format!(
            "snapshot {name:?} is being deleted"
        )));
    }
    let status = snapshot.status.clone().unwrap_or_default();
    if status.phase != SnapshotPhase::Ready {
        let why = if status.message.is_empty() {
            String::new()
        } else {
            format!(" ({})", status.message)
        };
        return Err(SnapshotArchiveError::NotReady(format!(
            "snapshot {name:?} is {:?}{why}; only a Ready snapshot can be exported",
            status.phase
        )));
    }
    let path = store.snapshot_path(name);
    let file = tokio::fs::File::open(&path).await.map_err(|e| {
        SnapshotArchiveError::NotReady(format!("the data of snapshot {name:?} cannot be read: {e}"))
    })?;
    let size = file
        .metadata()
        .await
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?
        .len();
    if status.size_bytes != Some(size) {
        return Err(SnapshotArchiveError::NotReady(format!(
            "the data file of snapshot {name:?} is {size} bytes but its status says {}: it was \
             changed or damaged",
            status.size_bytes.unwrap_or(0)
        )));
    }
    let rootfs = match status.rootfs_image.as_deref() {
        Some(image) => Some(rootfs_layer(store, engine, name, image, &status).await?),
        None => None,
    };
    let manifest = Manifest::of(&snapshot, size, rootfs.as_ref().map(|r| r.1))?;
    let manifest = serde_json::to_vec_pretty(&manifest)
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?;

    let mut head = Vec::with_capacity(3 * BLOCK as usize + manifest.len());
    head.extend_from_slice(&header(MANIFEST_NAME, manifest.len() as u64)?);
    head.extend_from_slice(&manifest);
    head.resize(head.len() + padding(manifest.len() as u64), 0);
    head.extend_from_slice(&header(WORKSPACE_NAME, size)?);
    let mut length = head.len() as u64;
    let mut body = stream::once(async move { Ok(Bytes::from(head)) }).boxed();
    body = body
        .chain(exactly(
            file,
            size,
            format!("the data file of snapshot {name:?}"),
        ))
        .boxed();
    length += size;
    // The entry's padding (and the next entry's header).
    let mut between = vec![0u8; padding(size)];
    if let Some((layer, layer_size, scratch)) = rootfs {
        between.extend_from_slice(&header(ROOTFS_NAME, layer_size)?);
        length += between.len() as u64 + layer_size;
        let what = format!("the root filesystem layer of snapshot {name:?}");
        body = body
            .chain(stream::once(async move { Ok(Bytes::from(between)) }))
            .chain(exactly(layer, layer_size, what))
            // The scratch file lives as long as the stream reads it.
            .chain(stream::once(async move {
                drop(scratch);
                Ok(Bytes::new())
            }))
            .boxed();
        between = vec![0u8; padding(layer_size)];
    }
    // The last entry's padding, then the end-of-archive marker (two zero blocks).
    between.resize(between.len() + 2 * BLOCK as usize, 0);
    length += between.len() as u64;
    let body = body
        .chain(stream::once(async move { Ok(Bytes::from(between)) }))
        .boxed();
    Ok(Export {
        length,
        file_name: format!("{name}.snapshot.tar"),
        body,
    })
}

/// The first `size` bytes of `file` as a stream that fails unless all of them were there.
fn exactly(
    file: tokio::fs::File,
    size: u64,
    what: String,
) -> BoxStream<'static, io::Result<Bytes>> {
    let sent = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&sent);
    let content = ReaderStream::with_capacity(file.take(size), PIECE).inspect(move |piece| {
        if let Ok(piece) = piece {
            counted.fetch_add(piece.len() as u64, Ordering::Relaxed);
        }
    });
    let end = stream::once(async move {
        let sent = sent.load(Ordering::Relaxed);
        if sent == size {
            Ok(Bytes::new())
        } else {
            Err(io::Error::other(format!(
                "{what} ended after {sent} of {size} bytes"
            )))
        }
    });
    content.chain(end).boxed()
}

/// The top layer of Full snapshot `name`'s image `image`, copied by Docker into a scratch file
/// of the store and checked against `status.rootfsDigest`: the open file, its size, and the
/// scratch write that removes the file when dropped.
async fn rootfs_layer(
    store: &Arc<Store>,
    engine: &dyn Engine,
    name: &str,
    image: &str,
    status: &SnapshotStatus,
) -> Result<(tokio::fs::File, u64, SnapshotWrite)> {
    let digest = status.rootfs_digest.clone().ok_or_else(|| {
        SnapshotArchiveError::NotReady(format!(
            "snapshot {name:?} has no status.rootfsDigest; only a Ready snapshot taken by this \
             server can be exported"
        ))
    })?;
    let scratch = store.begin_snapshot(&format!("{name}.rootfs-{}", rand::random::<u32>()));
    let file = scratch
        .create()
        .await
        .map_err(|e| SnapshotArchiveError::Internal(format!("creating a temp file: {e}")))?;
    let (size, file) = engine
        .export_top_layer(image, &digest, file)
        .await
        .map_err(|e| {
            SnapshotArchiveError::NotReady(format!(
                "the root filesystem of snapshot {name:?} (image {image}) cannot be read from \
                 Docker: {e}"
            ))
        })?;
    Ok((tokio::fs::File::from_std(file), size, scratch))
}

/// A ustar header of a regular file `name` of `size` bytes, mode 0644, owned by 0:0, dated now.
fn header(name: &str, size: u64) -> Result<[u8; BLOCK as usize]> {
    let mut header = tar::Header::new_ustar();
    header
        .set_path(name)
        .map_err(|e| SnapshotArchiveError::Internal(e.to_string()))?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(chrono::Utc::now().timestamp().max(0) as u64);
    header.set_cksum();
    let mut block = [0u8; BLOCK as usize];
    block.copy_from_slice(header.as_bytes());
    Ok(block)
}

/// Zero bytes that round `size` up to whole blocks.
fn padding(size: u64) -> usize {
    (size.div_ceil(BLOCK) * BLOCK - size) as usize
}
