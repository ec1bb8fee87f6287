//! Extracting a checked archive below a directory of this host ([`super::unpack`]): how a restore
//! fills a workspace volume whose directory is verifiably the sandbox's, without Docker's archive
//! API.
//!
//! It only ever receives what [`super::run`] let through (in-tree names whose parent directory
//! came first; regular files, directories, symlinks, hard links to an earlier file; the owner
//! forced), and still trusts nothing about the tree it writes into, which a running sandbox could
//! be changing underneath: every name is made or opened as one component relative to its parent's
//! descriptor, with `O_NOFOLLOW` (a symlink, whoever put it there, is never followed), and only
//! with calls that never replace an existing name (`O_CREAT | O_EXCL`, `mkdirat`, `symlinkat`,
//! `linkat`): a name that exists already is an error, not overwritten. Owners, modes and mtimes
//! are set through the descriptor of what was made (or, for a symlink, without following it).
//! Directories are made `0700` and get their own mode and mtime only after everything below them
//! is in: a read-only directory must still receive its entries, and every entry made in a
//! directory moves its mtime.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};

use tar::{EntryType, Header};

use super::policy::{ArchiveError, Sink};

/// How every directory is opened: never through a symlink.
const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
/// How every file is made: a new name, never through a symlink.
const FILE_FLAGS: libc::c_int =
    libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC;
/// Size of the copy buffer for file contents.
const PIECE: usize = 256 * 1024;

pub(super) struct HostSink {
    root: File,
    /// The directory the last entry went into, by its in-tree name (`""` is the root).
    parent: Option<(Vec<u8>, File)>,
    /// Directories made, in order, with the mode and mtime they get once their contents are in.
    dirs: Vec<(Vec<u8>, u32, u64)>,
    buffer: Vec<u8>,
}

impl HostSink {
    pub(super) fn new(root: File) -> HostSink {
        HostSink {
            root,
            parent: None,
            dirs: Vec::new(),
            buffer: Vec::new(),
        }
    }

    /// Gives every directory made its mode and mtime, deepest first (so that no later change
    /// below one moves its mtime again).
    pub(super) fn finish(mut self) -> Result<(), ArchiveError> {
        self.parent = None;
        for (name, mode, mtime) in std::mem::take(&mut self.dirs).iter().rev() {
            let dir = self.open_dir(name).map_err(|e| failed(name, e))?;
            let fd = dir.as_raw_fd();
            check(unsafe { libc::fchmod(fd, *mode as libc::mode_t) })
                .map_err(|e| failed(name, e))?;
            let times = times(*mtime);
            check(unsafe { libc::futimens(fd, times.as_ptr()) }).map_err(|e| failed(name, e))?;
        }
        Ok(())
    }

    /// Opens the directory `name` (in-tree, `""` for the root) one component at a time from the
    /// root, never through a symlink.
    fn open_dir(&self, name: &[u8]) -> io::Result<File> {
        let mut current = self.root.try_clone()?;
        for part in name.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
            current = open_at(&current, part, DIR_FLAGS, 0)?;
        }
        Ok(current)
    }

    /// The descriptor of directory `name`, kept for the entries that follow (which mostly share
    /// it).
    fn enter(&mut self, name: &[u8]) -> io::Result<libc::c_int> {
        let cached = self.parent.as_ref().is_some_and(|(n, _)| n == name);
        if !cached {
            let dir = self.open_dir(name)?;
            self.parent = Some((name.to_vec(), dir));
        }
        match &self.parent {
            Some((_, dir)) => Ok(dir.as_raw_fd()),
            None => Err(io::Error::other("no parent directory")),
        }
    }

    fn entry(
        &mut self,
        header: &Header,
        name: &[u8],
        target: Option<&[u8]>,
        data: &mut dyn Read,
    ) -> io::Result<()> {
        let (parent, leaf) = split(name);
        let leaf = c_name(leaf)?;
        let owner = (owner_id(header.uid()?)?, owner_id(header.gid()?)?);
        let mode = header.mode()?;
        let mtime = header.mtime()?;
        match header.entry_type() {
            EntryType::Directory => {
                let at = self.enter(parent)?;
                check(unsafe { libc::mkdirat(at, leaf.as_ptr(), 0o700) })?;
                let dir = open_raw(at, &leaf, DIR_FLAGS, 0)?;
                chown(&dir, owner)?;
                self.dirs.push((name.to_vec(), mode, mtime));
                // What follows a directory is mostly its contents.
                self.parent = Some((name.to_vec(), dir));
            }
            EntryType::Regular => {
                let at = self.enter(parent)?;
                let mut file = open_raw(at, &leaf, FILE_FLAGS, 0o600)?;
                if self.buffer.is_empty() {
                    self.buffer = vec![0u8; PIECE];
                }
                loop {
                    let n = match data.read(&mut self.buffer) {
                        Ok(0) => break,
                        Ok(n) => n,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => return Err(e),
                    };
                    file.write_all(&self.buffer[..n])?;
                }
                chown(&file, owner)?;
                let fd = file.as_raw_fd();
                check(unsafe { libc::fchmod(fd, mode as libc::mode_t) })?;
                let times = times(mtime);
                check(unsafe { libc::futimens(fd, times.as_ptr()) })?;
            }
            EntryType::Symlink => {
                let target = c_name(target.unwrap_or_default())?;
                let at = self.enter(parent)?;
                check(unsafe { libc::symlinkat(target.as_ptr(), at, leaf.as_ptr()) })?;
                let nofollow = libc::AT_SYMLINK_NOFOLLOW;
                check(unsafe { libc::fchownat(at, leaf.as_ptr(), owner.0, owner.1, nofollow) })?;
                let times = times(mtime);
                check(unsafe { libc::utimensat(at, leaf.as_ptr(), times.as_ptr(), nofollow) })?;
            }
            EntryType::Link => {
                let (from_parent, from_leaf) = split(target.unwrap_or_default());
                let from_leaf = c_name(from_leaf)?;
                let from = self.open_dir(from_parent)?;
                let at = self.enter(parent)?;
                // Flags 0: a name that turned into a symlink is linked as the symlink itself,
                // never followed.
                check(unsafe {
                    libc::linkat(from.as_raw_fd(), from_leaf.as_ptr(), at, leaf.as_ptr(), 0)
                })?;
            }
            other => {
                return Err(io::Error::other(format!(
                    "unexpected entry type {:?}",
                    char::from(other.as_byte())
                )))
            }
        }
        Ok(())
    }
}

impl Sink for HostSink {
    fn append<D: Read>(
        &mut self,
        header: Header,
        name: &[u8],
        target: Option<&[u8]>,
        mut data: D,
    ) -> Result<(), ArchiveError> {
        self.entry(&header, name, target, &mut data).map_err(|e| {
            // A read error of the archive itself keeps its own kind (truncated, say).
            if e.get_ref().is_some_and(|inner| inner.is::<ArchiveError>()) {
                super::policy::lift(e, ArchiveError::Write)
            } else {
                failed(name, e)
            }
        })
    }
}

/// `(parent, leaf)` of an in-tree name; the parent of a top-level name is `""`.
fn split(name: &[u8]) -> (&[u8], &[u8]) {
    match name.iter().rposition(|&b| b == b'/') {
        Some(slash) => (&name[..slash], &name[slash + 1..]),
        None => (&[], name),
    }
}

fn c_name(name: &[u8]) -> io::Result<CString> {
    CString::new(name).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in a name"))
}

fn owner_id(id: u64) -> io::Result<libc::uid_t> {
    libc::uid_t::try_from(id).map_err(|_| io::Error::other(format!("owner {id} is out of range")))
}

fn open_at(dir: &File, name: &[u8], flags: libc::c_int, mode: libc::mode_t) -> io::Result<File> {
    open_raw(dir.as_raw_fd(), &c_name(name)?, flags, mode)
}

fn open_raw(
    at: libc::c_int,
    name: &CString,
    flags: libc::c_int,
    mode: libc::mode_t,
) -> io::Result<File> {
    let fd = unsafe { libc::openat(at, name.as_ptr(), flags, libc::c_uint::from(mode)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn chown(file: &File, (uid, gid): (libc::uid_t, libc::gid_t)) -> io::Result<()> {
    check(unsafe { libc::fchown(file.as_raw_fd(), uid, gid) })
}

/// Access and modification time both `mtime` (whole seconds), as tar extraction sets them.
fn times(mtime: u64) -> [libc::timespec; 2] {
    let at = libc::timespec {
        tv_sec: libc::time_t::try_from(mtime).unwrap_or(libc::time_t::MAX),
        tv_nsec: 0,
    };
    [at, at]
}

fn check(result: libc::c_int) -> io::Result<()> {
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn failed(name: &[u8], error: io::Error) -> ArchiveError {
    ArchiveError::Write(format!("{}: {error}", String::from_utf8_lossy(name)))
}

#[cfg(test)]
#[path = "unpack_tests.rs"]
mod tests;
