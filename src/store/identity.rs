//! The data directory's own files besides desired state: `<data>/server-id`, the identity this
//! directory's server labels its Docker objects with, and private files a server generates once
//! (the API key file). Both are created atomically and never replaced once there; what a file
//! means (is this key acceptable?) is its caller's business.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{atomic, Store, StoreError, StoreResult};

/// Name of the identity file in the data directory.
const SERVER_ID_FILE: &str = "server-id";

impl Store {
    /// The identity of this data directory's server, created once and kept in
    /// `<data>/server-id`.
    pub fn server_id(&self) -> StoreResult<String> {
        load_or_create_server_id(self.data_dir())
    }
}

fn load_or_create_server_id(data_dir: &Path) -> StoreResult<String> {
    let path = data_dir.join(SERVER_ID_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        let id = text.trim();
        if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Ok(id.to_string());
        }
    }
    let id = format!("{:016x}", rand::random::<u64>());
    atomic::write_atomic(&path, format!("{id}\n").as_bytes())
        .map_err(|source| StoreError::Io { path, source })?;
    Ok(id)
}

/// A private file of the data directory as it was found or made.
pub struct PrivateFile {
    pub path: PathBuf,
    pub contents: Vec<u8>,
    /// Whether it was created just now.
    pub created: bool,
    /// Whether users other than its owner may read or write it.
    pub shared: bool,
}

/// Reads `<data_dir>/<name>`, or creates it holding what `generate` makes: mode 0600, atomically,
/// never replacing a file that appeared meanwhile (then that one is read).
pub fn read_or_create_private(
    data_dir: &Path,
    name: &str,
    generate: impl FnOnce() -> String,
) -> StoreResult<PrivateFile> {
    let path = data_dir.join(name);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| StoreError::Io { path, source }
    };
    match std::fs::read(&path) {
        Ok(contents) => return Ok(found(path, contents)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&path)(e)),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let contents = generate();
    let tmp = dir.join(format!(
        ".{name}.{}.tmp",
        hex::encode(rand::random::<[u8; 8]>())
    ));
    let written = write_private(&tmp, contents.as_bytes());
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, &path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            if let Ok(d) = std::fs::File::open(dir) {
                let _ = d.sync_all();
            }
            Ok(PrivateFile {
                path,
                contents: contents.into_bytes(),
                created: true,
                shared: false,
            })
        }
        // Someone else created it first: theirs it is.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let contents = std::fs::read(&path).map_err(io(&path))?;
            Ok(found(path, contents))
        }
        Err(e) => Err(io(&path)(e)),
    }
}

/// Replaces `<data_dir>/<name>` with `contents` atomically, readable by its owner only.
pub fn replace_private(data_dir: &Path, name: &str, contents: &[u8]) -> StoreResult<()> {
    let path = data_dir.join(name);
    let tmp = data_dir.join(format!(
        ".{name}.{}.tmp",
        hex::encode(rand::random::<[u8; 8]>())
    ));
    let done = write_private(&tmp, contents).and_then(|()| std::fs::rename(&tmp, &path));
    if done.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    done.map_err(|source| StoreError::Io {
        path: path.clone(),
        source,
    })?;
    if let Ok(d) = std::fs::File::open(data_dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

fn found(path: PathBuf, contents: Vec<u8>) -> PrivateFile {
    use std::os::unix::fs::PermissionsExt;
    let shared = std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o077 != 0);
    PrivateFile {
        path,
        contents,
        created: false,
        shared,
    }
}

/// Creates `path` (which must not exist) readable and writable by its owner only.
fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(contents)?;
    file.sync_all()
}
