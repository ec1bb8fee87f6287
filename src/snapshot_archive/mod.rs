//! Snapshot archives: one Ready snapshot as a single file that moves between servers
//! (`GET .../snapshots/{name}/export`, `POST .../snapshots/import?name=`). The format is
//! documented in `docs/snapshot-archive.md`: an outer tar holding `manifest.json` first (format
//! version, the snapshot's spec and status, entry sizes and digests, the base image), then the
//! stored workspace tar, byte for byte, so its digest travels unchanged, and for a Full snapshot
//! (format version 2) the top layer of its image, byte for byte, so its `rootfsDigest` does too.
//!
//! An export streams the archive straight from the data file ([`export`]), never holding it. An
//! import treats the archive as hostile ([`import`]): it is read as it streams in, within the size
//! caps of the settings; the manifest is bounded and checked; the workspace tar passes every
//! rule a restore enforces and its size and digest must match the manifest's, all while it is
//! written to a temp file; only then does the store make the file and a Ready snapshot appear
//! together. Any failure leaves nothing: no resource, no data file, no temp file.
//!
//! This module reaches Docker only through the engine (whether the base image is there, pulling
//! it, reading a Full snapshot's layer out and loading one in), never writes a workspace, and
//! leaves where files live to the store. Where things are: the manifest
//! and its checks, `manifest.rs`; the export stream, `export.rs`; the import, `import.rs`.

mod export;
mod import;
mod manifest;

pub use export::{export, Export};
pub use import::{import, ImportRequest};
pub use manifest::{
    Manifest, ManifestEntry, ManifestSnapshot, FORMAT_VERSION, FORMAT_VERSION_FULL, MANIFEST_NAME,
    MAX_MANIFEST_BYTES, ROOTFS_NAME, WORKSPACE_NAME,
};

/// Why an export or import was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotArchiveError {
    #[error("{0}")]
    NotFound(String),
    /// The snapshot cannot be exported as it is (not Ready, being deleted, data missing).
    #[error("{0}")]
    NotReady(String),
    /// The name is taken.
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    InvalidName(String),
    /// Over a size cap; the message names the setting or limit.
    #[error("{0}")]
    TooLarge(String),
    /// The archive is refused: what is wrong with it.
    #[error("{0}")]
    Refused(String),
    /// The request body could not be read to its end.
    #[error("reading the request body failed: {0}")]
    Body(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, SnapshotArchiveError>;
