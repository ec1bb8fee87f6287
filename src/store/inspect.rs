//! Read-only looks at the data directory for `agent-sandbox doctor`: who owns it, its mode,
//! whether this process can write it, and the same for a file in it (the generated key file).
//! Nothing here creates, changes or removes anything.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// One file system object as the checks see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub owner_uid: u32,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
    pub is_dir: bool,
    /// Whether this process may write it (for a directory: create files in it).
    pub writable: bool,
}

/// What is at `path`: `Ok(None)` when nothing is.
pub fn inspect(path: &Path) -> std::io::Result<Option<Entry>> {
    let metadata = match std::fs::metadata(path) {
        Ok(metadata) => metadata,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(Entry {
        owner_uid: metadata.uid(),
        mode: metadata.mode() & 0o7777,
        is_dir: metadata.is_dir(),
        writable: writable(path),
    }))
}

/// The nearest existing ancestor of `path` (itself included) and what is there, for a data
/// directory that does not exist yet: the server will create it there.
pub fn nearest_existing(path: &Path) -> Option<(std::path::PathBuf, Entry)> {
    let absolute = std::path::absolute(path).ok()?;
    absolute
        .ancestors()
        .find_map(|dir| inspect(dir).ok().flatten().map(|e| (dir.to_path_buf(), e)))
}

/// The effective user of this process.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c_path` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c_path.as_ptr(), libc::W_OK) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_mode_owner_and_absence() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
        let entry = inspect(&file).unwrap().unwrap();
        assert_eq!(entry.mode, 0o640);
        assert!(!entry.is_dir);
        assert_eq!(entry.owner_uid, effective_uid());
        assert!(inspect(&dir.path().join("missing")).unwrap().is_none());
        let (found, entry) = nearest_existing(&dir.path().join("a/b/c")).unwrap();
        assert_eq!(found, dir.path());
        assert!(entry.is_dir && entry.writable);
    }
}
