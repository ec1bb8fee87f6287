//! Carrying a workspace into another volume without copying a byte: [`link_tree`] rebuilds the
//! directories of a tree below an empty directory of this host and hard-links everything else
//! (files, symlinks, FIFOs: the very inodes, so contents, owners, modes, times and link counts
//! within the tree stay as they were). The source is left whole, so whoever calls this can drop
//! the copy at any point and still has the original; it must make sure nothing changes the
//! source meanwhile (the controller pauses its container).
//!
//! Like [`super::HostTar`] it never follows a symlink: every name is looked up as one component
//! relative to its already opened parent, every directory is opened with `O_NOFOLLOW` and checked
//! to be the inode that was listed, and `linkat` is called without `AT_SYMLINK_FOLLOW`. Nothing
//! in the target is replaced (`mkdirat` and `linkat` fail on an existing name), and the target
//! must start empty. The walk keeps one level per directory of depth on its own stack (never the
//! thread's), two descriptors each.

use std::ffi::{CString, OsString};
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::{AsRawFd, FromRawFd};

use super::host::{fd_path, open_checked};

/// One directory being carried over: the source and target descriptors, the names still to
/// visit and the source's own metadata (applied to the target once its contents are in).
struct Level {
    from: File,
    to: File,
    names: Vec<OsString>,
    meta: Metadata,
}

impl Level {
    fn new(from: File, to: File, meta: Metadata) -> io::Result<Level> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(fd_path(&from))? {
            names.push(entry?.file_name());
        }
        Ok(Level {
            from,
            to,
            names,
            meta,
        })
    }
}

/// Rebuilds the tree below the directory `from` inside the empty directory `to` (both opened
/// with [`super::open_root`]), hard-linking every non-directory, and gives `to` the owner, mode
/// and times of `from`. Returns the number of entries carried over. On error `to` holds part of
/// the tree and should be discarded; `from` is never changed.
pub fn link_tree(from: File, to: File) -> io::Result<u64> {
    if std::fs::read_dir(fd_path(&to))?.next().is_some() {
        return Err(io::Error::other("the target directory is not empty"));
    }
    let meta = from.metadata()?;
    let mut stack = vec![Level::new(from, to, meta)?];
    let mut carried = 0u64;
    while let Some(level) = stack.last_mut() {
        let Some(name) = level.names.pop() else {
            if let Some(done) = stack.pop() {
                copy_attributes(&done.to, &done.meta)?;
            }
            continue;
        };
        let shown = || String::from_utf8_lossy(name.as_bytes()).into_owned();
        let context = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", shown()));
        let c_name =
            CString::new(name.as_bytes()).map_err(|_| io::Error::other("NUL in a name"))?;
        // lstat: the name itself, never what a symlink points to.
        let meta = std::fs::symlink_metadata(fd_path(&level.from).join(&name)).map_err(context)?;
        carried += 1;
        if meta.is_dir() {
            let to = level.to.as_raw_fd();
            // SAFETY: a valid descriptor and a NUL-terminated name.
            check(unsafe { libc::mkdirat(to, c_name.as_ptr(), 0o700) }).map_err(context)?;
            let from_child =
                open_checked(&fd_path(&level.from).join(&name), &meta, true).map_err(context)?;
            let to_child = open_dir_at(to, &c_name).map_err(context)?;
            let next = Level::new(from_child, to_child, meta).map_err(context)?;
            stack.push(next);
        } else {
            // Flags 0: a symlink is linked as itself, never followed.
            // SAFETY: valid descriptors and NUL-terminated names.
            check(unsafe {
                libc::linkat(
                    level.from.as_raw_fd(),
                    c_name.as_ptr(),
                    level.to.as_raw_fd(),
                    c_name.as_ptr(),
                    0,
                )
            })
            .map_err(context)?;
        }
    }
    Ok(carried)
}

fn open_dir_at(at: libc::c_int, name: &CString) -> io::Result<File> {
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid descriptor and a NUL-terminated name.
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Gives the directory `dir` the owner, permission bits and times of `meta`.
fn copy_attributes(dir: &File, meta: &Metadata) -> io::Result<()> {
    let fd = dir.as_raw_fd();
    let times = [
        libc::timespec {
            tv_sec: meta.atime(),
            tv_nsec: meta.atime_nsec(),
        },
        libc::timespec {
            tv_sec: meta.mtime(),
            tv_nsec: meta.mtime_nsec(),
        },
    ];
    // SAFETY: plain system calls on a descriptor this function borrows.
    unsafe {
        check(libc::fchown(fd, meta.uid(), meta.gid()))?;
        check(libc::fchmod(fd, (meta.mode() & 0o7777) as libc::mode_t))?;
        check(libc::futimens(fd, times.as_ptr()))
    }
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[path = "link_tests.rs"]
mod tests;
