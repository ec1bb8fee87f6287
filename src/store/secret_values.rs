//! The values of `Secret`s given through the API: `<data>/secrets/<name>`, in a directory and
//! files only the server's user can read (0700, 0600), outside `manifests/` so that nothing that
//! reads or copies manifests sees them. Replaced crash-safely (a private temp file, fsync,
//! rename, fsync the directory). This module never logs a value, and nothing here decides what a
//! value is for.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::PathBuf;

use super::{Store, StoreError, StoreResult};

impl Store {
    fn secret_values_dir(&self) -> PathBuf {
        self.data_dir.join("secrets")
    }

    /// Keeps `value` as the value of Secret `name`, replacing any earlier one.
    pub fn set_secret_value(&self, name: &str, value: &[u8]) -> StoreResult<()> {
        let dir = self.secret_values_dir();
        let io = |path: PathBuf| move |source| StoreError::Io { path, source };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(io(dir.clone()))?;
        // A directory made by an older run or by hand is made private too.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io(dir.clone()))?;
        let path = dir.join(name);
        let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_file(&temp);
        let written = (|| {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)?;
            file.write_all(value)?;
            file.sync_all()?;
            std::fs::rename(&temp, &path)?;
            std::fs::File::open(&dir)?.sync_all()
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        written.map_err(io(path))
    }

    /// The value given through the API for Secret `name`, if any.
    pub fn secret_value(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.secret_values_dir().join(name)).ok()
    }

    /// Forgets the value of Secret `name` (nothing to forget is fine).
    pub fn remove_secret_value(&self, name: &str) -> StoreResult<()> {
        let path = self.secret_values_dir().join(name);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(StoreError::Io { path, source: e })
            }
            _ => Ok(()),
        }
    }
}
