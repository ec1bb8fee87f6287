//! A tar of a directory on this host, produced lazily as a [`Read`], in the form Docker's
//! `GET /containers/{id}/archive?path=/<root>` would give it: entries named `<root>/...` (the root
//! directory first), depth first with the names of each directory in byte order, directories
//! before their contents, hard links (a non-directory seen again by inode) as link entries to
//! the first name, sockets left out, FIFOs and devices present (so that [`super::transform`]
//! drops and reports them exactly as it does for Docker's archive). Owners are written as 0 (the
//! export policy replaces them); modes keep their permission, setuid/setgid and sticky bits;
//! mtimes are whole seconds.
//!
//! It never follows a symlink: the root is opened with `O_NOFOLLOW`, every other name is looked
//! up as one component relative to its already opened parent directory (through that
//! directory's descriptor), with `lstat` semantics, and every file or directory opened is
//! checked to be the very inode that was listed. Symlinks are stored as links (their target is
//! read, never resolved). Whoever uses this must make sure nothing changes the tree while it is
//! read (the snapshot pauses the sandbox); a file that shrinks underneath is an error, not a
//! silently short entry.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use tar::{EntryType, Header};

const BLOCK: usize = 512;

/// Opens `path` as the root of a tree to export: a directory, not a symlink.
pub fn open_root(path: &Path) -> io::Result<File> {
    let dir = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    if !dir.metadata()?.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory",
            path.display()
        )));
    }
    Ok(dir)
}

/// One directory being listed: its descriptor and the names still to visit.
struct Level {
    dir: File,
    /// Path of the directory relative to the root, without a trailing slash ("" for the root).
    prefix: Vec<u8>,
    /// Remaining names, in reverse byte order (popped from the end).
    names: Vec<OsString>,
}

/// The lazily produced tar stream of one directory tree.
pub struct HostTar {
    root_name: Vec<u8>,
    stack: Vec<Level>,
    /// Header bytes (and long-name records) of the current entry, not yet read.
    pending: Vec<u8>,
    pending_at: usize,
    /// The current regular file, its bytes still to yield and its name (for errors).
    data: Option<(File, u64, Vec<u8>)>,
    padding: usize,
    /// First name of each multiply linked inode, by (device, inode).
    links: HashMap<(u64, u64), Vec<u8>>,
    root: Option<File>,
    finished: bool,
}

impl HostTar {
    /// A tar of the directory `root` (opened by [`open_root`]), its entries named `root_name/...`.
    pub fn new(root: File, root_name: &str) -> HostTar {
        HostTar {
            root_name: root_name.as_bytes().to_vec(),
            stack: Vec::new(),
            pending: Vec::new(),
            pending_at: 0,
            data: None,
            padding: 0,
            links: HashMap::new(),
            root: Some(root),
            finished: false,
        }
    }

    fn full_name(&self, rel: &[u8]) -> Vec<u8> {
        let mut name = self.root_name.clone();
        name.push(b'/');
        name.extend_from_slice(rel);
        name
    }

    /// Lists a directory through its descriptor (never through a path that could be a link).
    fn level(dir: File, prefix: Vec<u8>) -> io::Result<Level> {
        let listing = std::fs::read_dir(fd_path(&dir))?;
        let mut names = Vec::new();
        for entry in listing {
            names.push(entry?.file_name());
        }
        names.sort_by(|a, b| b.as_bytes().cmp(a.as_bytes()));
        Ok(Level { dir, prefix, names })
    }

    /// Queues the next entry's header (and opens its data); `false` at the end of the tree.
    fn advance(&mut self) -> io::Result<bool> {
        if let Some(root) = self.root.take() {
            let meta = root.metadata()?;
            let name = self.full_name(b"");
            self.queue(EntryType::Directory, &name, None, &meta, 0)?;
            let level = HostTar::level(root, Vec::new())?;
            self.stack.push(level);
            return Ok(true);
        }
        loop {
            let Some(level) = self.stack.last_mut() else {
                return Ok(false);
            };
            let Some(name) = level.names.pop() else {
                self.stack.pop();
                continue;
            };
            let mut rel = level.prefix.clone();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
            let child = fd_path(&level.dir).join(&name);
            // lstat: the name itself, never what a symlink points to.
            let meta = match std::fs::symlink_metadata(&child) {
                Ok(meta) => meta,
                // Gone since the listing (only possible if something else changes the tree).
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(context(e, &rel)),
            };
            let kind = meta.file_type();
            let full = self.full_name(&rel);
            if kind.is_socket() {
                continue;
            }
            if !kind.is_dir() && meta.nlink() > 1 {
                let key = (meta.dev(), meta.ino());
                if let Some(first) = self.links.get(&key) {
                    let first = first.clone();
                    self.queue(EntryType::Link, &full, Some(&first), &meta, 0)?;
                    return Ok(true);
                }
                self.links.insert(key, full.clone());
            }
            if kind.is_dir() {
                let dir = open_checked(&child, &meta, true).map_err(|e| context(e, &rel))?;
                let mut dir_name = full;
                dir_name.push(b'/');
                self.queue(EntryType::Directory, &dir_name, None, &meta, 0)?;
                let level = HostTar::level(dir, rel.clone()).map_err(|e| context(e, &rel))?;
                self.stack.push(level);
            } else if kind.is_symlink() {
                let target = std::fs::read_link(&child).map_err(|e| context(e, &rel))?;
                let target = target.as_os_str().as_bytes().to_vec();
                self.queue(EntryType::Symlink, &full, Some(&target), &meta, 0)?;
            } else if kind.is_file() {
                let file = open_checked(&child, &meta, false).map_err(|e| context(e, &rel))?;
                self.queue(EntryType::Regular, &full, None, &meta, meta.len())?;
                self.data = Some((file, meta.len(), rel));
                self.padding = padding(meta.len());
            } else {
                let kind = if kind.is_fifo() {
                    EntryType::Fifo
                } else if kind.is_char_device() {
                    EntryType::Char
                } else {
                    EntryType::Block
                };
                self.queue(kind, &full, None, &meta, 0)?;
            }
            return Ok(true);
        }
    }

    fn queue(
        &mut self,
        kind: EntryType,
        name: &[u8],
        link: Option<&[u8]>,
        meta: &Metadata,
        size: u64,
    ) -> io::Result<()> {
        self.pending.clear();
        self.pending_at = 0;
        if name.len() > 100 {
            long_record(&mut self.pending, EntryType::GNULongName, name);
        }
        if let Some(link) = link.filter(|l| l.len() > 100) {
            long_record(&mut self.pending, EntryType::GNULongLink, link);
        }
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(meta.mode() & 0o7777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(u64::try_from(meta.mtime()).unwrap_or(0));
        header.set_size(size);
        let fields = header
            .as_gnu_mut()
            .ok_or_else(|| io::Error::other("GNU header expected"))?;
        let n = name.len().min(fields.name.len());
        fields.name[..n].copy_from_slice(&name[..n]);
        if let Some(link) = link {
            let n = link.len().min(fields.linkname.len());
            fields.linkname[..n].copy_from_slice(&link[..n]);
        }
        header.set_cksum();
        self.pending.extend_from_slice(header.as_bytes());
        Ok(())
    }
}

impl Read for HostTar {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.pending_at < self.pending.len() {
                let n = buf.len().min(self.pending.len() - self.pending_at);
                buf[..n].copy_from_slice(&self.pending[self.pending_at..self.pending_at + n]);
                self.pending_at += n;
                return Ok(n);
            }
            if let Some((file, remaining, name)) = &mut self.data {
                if *remaining > 0 {
                    let want = buf
                        .len()
                        .min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                    let read = file.read(&mut buf[..want])?;
                    if read == 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("{} shrank while it was read", String::from_utf8_lossy(name)),
                        ));
                    }
                    *remaining -= read as u64;
                    return Ok(read);
                }
                self.data = None;
            }
            if self.padding > 0 {
                let n = buf.len().min(self.padding);
                buf[..n].fill(0);
                self.padding -= n;
                return Ok(n);
            }
            if self.finished {
                return Ok(0);
            }
            if !self.advance()? {
                // The end-of-archive marker: two zero blocks.
                self.finished = true;
                self.padding = 2 * BLOCK;
            }
        }
    }
}

/// The path through which the kernel resolves names relative to an open directory: lookups of one
/// component below it never pass through a symlink of the tree.
pub(super) fn fd_path(dir: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// Opens `path` (one component below an open directory) without following a symlink and checks
/// that it is still the inode `listed` described.
pub(super) fn open_checked(path: &Path, listed: &Metadata, dir: bool) -> io::Result<File> {
    let mut flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // Never block on something that turned into a FIFO.
    flags |= if dir {
        libc::O_DIRECTORY
    } else {
        libc::O_NONBLOCK
    };
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)?;
    let opened = file.metadata()?;
    let same = opened.dev() == listed.dev()
        && opened.ino() == listed.ino()
        && opened.file_type() == listed.file_type();
    if !same {
        return Err(io::Error::other("changed while it was read"));
    }
    Ok(file)
}

fn context(error: io::Error, rel: &[u8]) -> io::Error {
    io::Error::new(
        error.kind(),
        format!("{}: {error}", String::from_utf8_lossy(rel)),
    )
}

fn padding(size: u64) -> usize {
    let rest = (size % BLOCK as u64) as usize;
    if rest == 0 {
        0
    } else {
        BLOCK - rest
    }
}

/// A GNU long-name or long-link record for `value` (NUL-terminated, as GNU tar writes it).
fn long_record(out: &mut Vec<u8>, kind: EntryType, value: &[u8]) {
    out.extend_from_slice(super::rewrite::long_header(kind, value).as_bytes());
    out.extend_from_slice(value);
    out.push(0);
    let used = value.len() + 1;
    out.resize(out.len() + padding(used as u64), 0);
}
