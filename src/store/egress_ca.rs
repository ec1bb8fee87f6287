//! The egress gateway's certificate authority on disk: `<data>/egress-ca/` (0700) holds the key
//! (`ca.key`, 0600) and certificate (`ca.pem`); `<data>/egress-ca-public/` (0755) holds what
//! sandboxes may read, mounted read-only into policed ones: the certificate alone (`ca.pem`) and
//! a bundle of the host's roots plus it (`bundle.pem`). Files are replaced crash-safely; this
//! module never logs a key and does not decide what is in the files.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::atomic::write_atomic;
use super::{Store, StoreError, StoreResult};

impl Store {
    fn egress_ca_dir(&self) -> PathBuf {
        self.data_dir.join("egress-ca")
    }

    /// The directory policed sandboxes get read-only: `ca.pem` and `bundle.pem`.
    pub fn egress_ca_public_dir(&self) -> PathBuf {
        self.data_dir.join("egress-ca-public")
    }

    /// The authority's certificate and key (PEM), when both were kept.
    pub fn egress_ca(&self) -> Option<(String, String)> {
        let dir = self.egress_ca_dir();
        let cert = std::fs::read_to_string(dir.join("ca.pem")).ok()?;
        let key = std::fs::read_to_string(dir.join("ca.key")).ok()?;
        Some((cert, key))
    }

    /// Keeps a new authority: the key first (owner-only), then the certificate, so that a crash
    /// between the two leaves no certificate without its key (the pair is made anew then).
    pub fn set_egress_ca(&self, cert: &str, key: &str) -> StoreResult<()> {
        let dir = self.egress_ca_dir();
        make_dir(&dir, 0o700)?;
        let _ = std::fs::remove_file(dir.join("ca.pem"));
        write_private(&dir.join("ca.key"), key.as_bytes())?;
        write_file(&dir.join("ca.pem"), cert.as_bytes(), 0o600)
    }

    /// Writes what sandboxes read: the certificate and the bundle; answers their directory.
    pub fn set_egress_ca_public(&self, cert: &str, bundle: &str) -> StoreResult<PathBuf> {
        let dir = self.egress_ca_public_dir();
        make_dir(&dir, 0o755)?;
        write_file(&dir.join("ca.pem"), cert.as_bytes(), 0o644)?;
        write_file(&dir.join("bundle.pem"), bundle.as_bytes(), 0o644)?;
        Ok(dir)
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn make_dir(dir: &Path, mode: u32) -> StoreResult<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).map_err(io(dir))
}

/// Written inside a 0700 directory, so the temp file is private before its mode is set.
fn write_private(path: &Path, contents: &[u8]) -> StoreResult<()> {
    write_file(path, contents, 0o600)
}

fn write_file(path: &Path, contents: &[u8], mode: u32) -> StoreResult<()> {
    write_atomic(path, contents).map_err(io(path))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io(path))
}
