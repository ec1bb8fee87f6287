//! Exporting a paused sandbox's `/workspace` into a snapshot's data file (the store's
//! [`SnapshotWrite`]), through the export
//! policy of [`crate::archive`]: from this host's copy of the volume when it is verifiably the
//! container's (read with [`HostTar`]), else through Docker's archive API; hashed as it is
//! written, its disk writes started as it goes ([`Writeback`]). See the module documentation of
//! `snapshot/mod.rs` for why both ways give the same tar. This module decides nothing about the
//! snapshot's status and publishes nothing.

use std::io::Write;
use std::sync::Arc;

use futures::StreamExt;

use super::super::workspace::{open_host_root, WORKSPACE};
use crate::archive::{self, ArchiveError, ChannelReader, HashedWriter, HostTar, Limits, Policy};
use crate::docker::{Engine, EngineError};
use crate::store::SnapshotWrite;

/// The first name of the entries of the exported directory's archive.
const ROOT_NAME: &str = "workspace";

/// Unpauses the container if the snapshot is abandoned before it could do so itself (the
/// reconcile future was dropped).
pub(super) struct PauseGuard {
    pub(super) engine: Arc<dyn Engine>,
    pub(super) container: Option<String>,
}

impl Drop for PauseGuard {
    fn drop(&mut self) {
        if let Some(container) = self.container.take() {
            let engine = Arc::clone(&self.engine);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = engine.unpause(&container).await;
                });
            }
        }
    }
}

pub(super) struct Exported {
    pub(super) size: u64,
    pub(super) digest: String,
    pub(super) summary: archive::Summary,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum ExportError {
    #[error("{0}")]
    Engine(EngineError),
    #[error("{0}")]
    Archive(ArchiveError),
    #[error("{0}")]
    Io(std::io::Error),
    /// The host's copy of the workspace cannot be used (the archive API is used instead).
    #[error("the workspace cannot be read on this host: {0}")]
    HostUnavailable(String),
}

/// Writes the workspace's tar through the export policy into `temp` (flushed, not yet synced):
/// from the host's copy of the volume when `host` (the paused container) has one this process
/// can read and that is verifiably the container's `/workspace`, else (or if reading it fails)
/// through Docker's archive API. See the module documentation for why both give the same tar.
pub(super) async fn export(
    engine: &dyn Engine,
    limit: u64,
    container: &str,
    host: Option<&crate::docker::ContainerDetails>,
    data: &SnapshotWrite,
    owner: (u32, u32),
) -> Result<(Exported, std::fs::File), ExportError> {
    let policy = Policy::export(ROOT_NAME, owner, Limits::with_max_bytes(limit));
    if let Some(details) = host {
        let file = data.create().await.map_err(ExportError::Io)?;
        let policy = policy.clone();
        let details = details.clone();
        let result = tokio::task::spawn_blocking(move || {
            let root =
                open_host_root(&details).map_err(|e| ExportError::HostUnavailable(e.reason))?;
            write_tar(HostTar::new(root, ROOT_NAME), file, limit, &policy)
        })
        .await
        .map_err(|e| ExportError::Io(std::io::Error::other(e.to_string())))?;
        match result {
            Err(ExportError::HostUnavailable(reason))
            | Err(ExportError::Archive(
                ArchiveError::Read(reason)
                | ArchiveError::Truncated(reason)
                | ArchiveError::Malformed(reason),
            )) => {
                // What was written goes: the Docker path creates the file anew.
                tracing::debug!(container, %reason, "reading the workspace through Docker instead");
            }
            other => return other,
        }
    }
    export_docker(engine, container, data, limit, policy).await
}

/// Streams Docker's tar of `/workspace` into the snapshot's data, through a blocking writer
/// thread.
async fn export_docker(
    engine: &dyn Engine,
    container: &str,
    data: &SnapshotWrite,
    limit: u64,
    policy: Policy,
) -> Result<(Exported, std::fs::File), ExportError> {
    let mut stream = engine
        .archive_get(container, WORKSPACE)
        .await
        .map_err(ExportError::Engine)?;
    let file = data.create().await.map_err(ExportError::Io)?;
    let (tx, reader) = ChannelReader::new(64);
    let writer = tokio::task::spawn_blocking(move || write_tar(reader, file, limit, &policy));
    let mut engine_error = None;
    while let Some(chunk) = stream.next().await {
        let item = chunk.map_err(|e| {
            let message = e.to_string();
            engine_error = Some(e);
            message
        });
        let failed = item.is_err();
        // The writer stops reading when it refuses the archive (too large, say).
        if tx.send(item).await.is_err() || failed {
            break;
        }
    }
    drop(tx);
    let result = writer
        .await
        .map_err(|e| ExportError::Io(std::io::Error::other(e.to_string())))?;
    match (result, engine_error) {
        (Err(_), Some(engine)) => Err(ExportError::Engine(engine)),
        (result, _) => result,
    }
}

/// Runs the export policy over `input` into `file` (new and empty), hashing what is written.
/// Blocking.
fn write_tar<R: std::io::Read>(
    input: R,
    file: std::fs::File,
    limit: u64,
    policy: &Policy,
) -> Result<(Exported, std::fs::File), ExportError> {
    let out = HashedWriter::new(Writeback::new(file), limit).map_err(ExportError::Io)?;
    let (summary, out) = archive::transform(input, out, policy).map_err(ExportError::Archive)?;
    let size = out.written();
    let (digest, file) = out.finish().map_err(ExportError::Io)?;
    let file = file.file;
    Ok((
        Exported {
            size,
            digest,
            summary,
        },
        file,
    ))
}

/// A file writer that starts the disk writes of what it was given every [`WRITEBACK_STEP`]
/// bytes, so the final fsync of a large snapshot waits for the last step, not for all of it.
struct Writeback {
    file: std::fs::File,
    written: u64,
    started: u64,
}

const WRITEBACK_STEP: u64 = 32 * 1024 * 1024;

impl Writeback {
    fn new(file: std::fs::File) -> Writeback {
        Writeback {
            file,
            written: 0,
            started: 0,
        }
    }
}

impl Write for Writeback {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        if self.written - self.started >= WRITEBACK_STEP {
            start_writeback(&self.file, self.started, self.written - self.started);
            self.started = self.written;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// Asks the kernel to start writing a range of the file to disk, without waiting. Only a hint:
/// durability comes from the fsync after it, so a failure is ignored.
fn start_writeback(file: &std::fs::File, offset: u64, len: u64) {
    use std::os::unix::io::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor is owned by `file` and open for the whole call; the call reads no
    // memory of ours.
    unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
    }
}
