//! How many bytes a workspace takes on this host's disk: the blocks of every file, directory and
//! link under its volume's directory, as `du` counts them (a file with several names once).
//!
//! The tree belongs to the sandbox, which may change it while it is read, so the walk never
//! follows a symlink: the root is opened with `O_NOFOLLOW`, and every directory below it is
//! opened as one name relative to its already opened parent (`openat` with `O_NOFOLLOW`), so a
//! directory swapped for a link to elsewhere is never entered. A name that disappears while it is
//! read is skipped. Walking is proportional to the number of files, so callers run it off the
//! async threads and not on every scrape (see `exporter.rs`).

use std::collections::HashSet;
use std::ffi::CString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::io::{AsRawFd, FromRawFd};
use std::path::Path;

/// Bytes allocated on disk to everything under `root` (the root directory itself included).
pub fn disk_usage(root: &Path) -> io::Result<u64> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(root)?;
    let mut total = dir.metadata()?.blocks() * 512;
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    let mut pending = vec![dir];
    while let Some(dir) = pending.pop() {
        let listing = match std::fs::read_dir(format!("/proc/self/fd/{}", dir.as_raw_fd())) {
            Ok(listing) => listing,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in listing {
            let Ok(entry) = entry else { continue };
            // `DirEntry::metadata` does not follow a symlink.
            let Ok(meta) = entry.metadata() else { continue };
            if meta.nlink() > 1 && !meta.is_dir() && !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            total = total.saturating_add(meta.blocks() * 512);
            if meta.is_dir() {
                if let Some(child) = open_below(&dir, entry.file_name().as_bytes(), &meta) {
                    pending.push(child);
                }
            }
        }
    }
    Ok(total)
}

/// Opens directory `name` of `parent` without following a symlink, if it is still the directory
/// that was listed.
fn open_below(parent: &File, name: &[u8], listed: &std::fs::Metadata) -> Option<File> {
    let name = CString::new(name).ok()?;
    // SAFETY: `parent` is an open directory and `name` a NUL-terminated string; the descriptor
    // returned is owned by the `File` made from it right after.
    let fd = unsafe {
        libc::openat(
            parent.as_raw_fd(),
            name.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` was just opened and nothing else owns it.
    let dir = unsafe { File::from_raw_fd(fd) };
    let opened = dir.metadata().ok()?;
    (opened.dev() == listed.dev() && opened.ino() == listed.ino()).then_some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_files_once_and_never_follows_links() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("big"), vec![1u8; 1 << 20]).unwrap();
        let root = tempfile::tempdir().unwrap();
        let empty = disk_usage(root.path()).unwrap();
        std::fs::create_dir(root.path().join("sub")).unwrap();
        std::fs::write(root.path().join("sub/file"), vec![1u8; 100_000]).unwrap();
        std::fs::hard_link(root.path().join("sub/file"), root.path().join("again")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        let used = disk_usage(root.path()).unwrap() - empty;
        // The file's blocks once, the directory's and the link's; never the 1 MiB outside.
        assert!((100_000..200_000).contains(&used), "{used}");
        assert!(disk_usage(&root.path().join("link")).is_err());
    }
}
