//! Snapshot trees stacked as layers: a snapshot of a copy-on-write workspace gets a *delta* tree
//! that holds only what the workspace changed over the trees it was a view of, and is restored
//! as an overlay of the delta on top of those trees.
//!
//! The delta is made from the snapshot's own tar (the one its `sizeBytes` and `digest` describe,
//! checked by the restore rules as every tree is), not from the view's upper directory: the tar
//! has been through the export policy and is what a copy restore would give, so the overlay of
//! the layers shows exactly the tar. An entry of the tar is left out of the delta only when the
//! workspace never wrote it (no name at or above it in the view's upper directory, read while
//! the sandbox was frozen for the snapshot, see [`ViewChanges`]) and the layers below hold it
//! with the same type, size, mode, owner, mtime (and target), as a single link; directories are
//! always written (they carry the tar's mode and mtime); whatever the layers below show that the
//! tar does not hold gets a whiteout (a `0:0` character device, overlay's own mark).
//!
//! A delta's layers below it are recorded in `<trees>/<key>.layers` (one key a line, top first),
//! written before the tree is renamed into place: a tree without one is a full tree. A chain
//! never holds more than [`MAX_LAYERS`] trees: a snapshot that would make it longer gets a full
//! tree (the chain is flattened), so neither a restore's overlay nor a lookup grows with
//! history. Garbage collection keeps every layer a kept tree stands on.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::CString;
use std::fs::File;
use std::io::BufReader;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use crate::archive::{self, ArchiveError, Policy};

/// The most trees one view stacks (its delta and those below it, the last a full tree).
pub const MAX_LAYERS: usize = 4;

/// The most names a view's upper directory may hold for a snapshot of it to become a delta; past
/// it the snapshot gets a full tree (the set is held in memory until the tree is made).
const MAX_CHANGED_NAMES: usize = 1_000_000;

/// Suffix of the file naming a delta tree's layers below it.
pub(super) const LAYERS_SUFFIX: &str = ".layers";

const DIR_FLAGS: libc::c_int =
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;

/// What a copy-on-write workspace had written over its layers when a snapshot of it was taken:
/// the names its upper directory held, read while the sandbox was frozen.
#[derive(Clone, Debug, Default)]
pub struct ViewChanges {
    /// The trees below the view, top first, by key.
    pub(super) layers: Vec<String>,
    /// In-tree names present in the upper directory.
    written: HashSet<Vec<u8>>,
    /// Names below which the layers show nothing (whiteouts, non-directories, and opaque or
    /// redirected directories of the upper directory).
    hiding: HashSet<Vec<u8>>,
}

impl ViewChanges {
    /// Whether the workspace may have changed `name` (it was written, or something above it
    /// hides the layers).
    fn touched(&self, name: &[u8]) -> bool {
        if self.written.contains(name) {
            return true;
        }
        name.iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .any(|(at, _)| self.hiding.contains(&name[..at]))
    }
}

/// Reads the upper directory `upper` of a view over `layers` (never following a symlink: the
/// sandbox wrote it). `None` when it holds too much to remember, or cannot be read.
pub(super) fn read_changes(upper: &Path, layers: Vec<String>) -> Option<ViewChanges> {
    let mut changes = ViewChanges {
        layers,
        ..ViewChanges::default()
    };
    let root = open_dir_at(None, upper.as_os_str().as_bytes()).ok()?;
    walk_upper(&root, &[], &mut changes).ok()?;
    Some(changes)
}

fn walk_upper(dir: &File, prefix: &[u8], changes: &mut ViewChanges) -> std::io::Result<()> {
    for entry in std::fs::read_dir(fd_path(dir))? {
        let entry = entry?;
        let leaf = entry.file_name();
        let mut name = prefix.to_vec();
        if !name.is_empty() {
            name.push(b'/');
        }
        name.extend_from_slice(leaf.as_bytes());
        if changes.written.len() >= MAX_CHANGED_NAMES {
            return Err(std::io::Error::other("too many changes"));
        }
        changes.written.insert(name.clone());
        if !entry.file_type()?.is_dir() {
            changes.hiding.insert(name);
            continue;
        }
        match open_dir_at(Some(dir), leaf.as_bytes()) {
            Ok(child) => {
                if has_xattr(&child, "trusted.overlay.opaque")
                    || has_xattr(&child, "trusted.overlay.redirect")
                {
                    changes.hiding.insert(name.clone());
                }
                walk_upper(&child, &name, changes)?;
            }
            // Swapped for something else meanwhile: nothing below it is the layers'.
            Err(_) => {
                changes.hiding.insert(name);
            }
        }
    }
    Ok(())
}

/// Why a delta could not be made (the caller makes a full tree instead).
#[derive(Debug, thiserror::Error)]
pub(super) enum DeltaError {
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Unpacks the tar at `tar` into `temp` (which must not exist) as a delta over the trees
/// `below` (top first): what [`ViewChanges`] and the trees say the workspace kept is left out,
/// what they show and the tar does not gets a whiteout.
pub(super) fn unpack_delta(
    tar: &Path,
    temp: &Path,
    policy: &Policy,
    below: &[PathBuf],
    changes: &ViewChanges,
) -> Result<(), DeltaError> {
    let layers: Vec<File> = below
        .iter()
        .map(|p| open_dir_at(None, p.as_os_str().as_bytes()))
        .collect::<Result<_, _>>()?;
    std::fs::DirBuilder::new().mode(0o700).create(temp)?;
    let root = archive::open_root(temp)?;
    let mut names: HashSet<Vec<u8>> = HashSet::new();
    let mut dir_mtimes: HashMap<Vec<u8>, u64> = HashMap::new();
    let file = File::open(tar)?;
    let mut keep = |header: &tar::Header, name: &[u8], target: Option<&[u8]>| {
        let name = name.strip_suffix(b"/").unwrap_or(name);
        names.insert(name.to_vec());
        match header.entry_type() {
            tar::EntryType::Directory => {
                dir_mtimes.insert(name.to_vec(), header.mtime().unwrap_or_default());
                true
            }
            tar::EntryType::Regular | tar::EntryType::Symlink => {
                changes.touched(name) || !same_below(&layers, name, header, target)
            }
            _ => true,
        }
    };
    archive::unpack_filtered(
        BufReader::with_capacity(64 * 1024, file),
        root,
        policy,
        &mut keep,
    )?;
    let mut removed = Vec::new();
    let visible: Vec<File> = layers
        .iter()
        .map(File::try_clone)
        .collect::<Result<_, _>>()?;
    removed_below(&visible, &[], &names, &dir_mtimes, &mut removed)?;
    let top = archive::open_root(temp)?;
    // One directory open at a time, each with all its whiteouts, then its mtime set back to the
    // tar's (the whiteouts moved it).
    let mut by_parent: BTreeMap<Vec<u8>, Vec<Vec<u8>>> = BTreeMap::new();
    for (parent, leaf) in removed {
        by_parent.entry(parent).or_default().push(leaf);
    }
    for (parent, leaves) in by_parent {
        let dir = walk_dirs(&top, &parent)?;
        for leaf in leaves {
            let leaf = c_name(&leaf)?;
            // SAFETY: plain system call on a descriptor owned here.
            let made = unsafe { libc::mknodat(dir.as_raw_fd(), leaf.as_ptr(), libc::S_IFCHR, 0) };
            if made != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        if let Some(mtime) = dir_mtimes.get(&parent) {
            let at = libc::timespec {
                tv_sec: libc::time_t::try_from(*mtime).unwrap_or(libc::time_t::MAX),
                tv_nsec: 0,
            };
            // SAFETY: plain system call on a descriptor owned here.
            if unsafe { libc::futimens(dir.as_raw_fd(), [at, at].as_ptr()) } != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
    }
    Ok(())
}

/// Whether the trees `layers` (top first) hold `name` as the tar's `header` describes it: the
/// same type, size, mode, owner and mtime, a single link, and for a symlink the same target.
fn same_below(layers: &[File], name: &[u8], header: &tar::Header, target: Option<&[u8]>) -> bool {
    let Some((dir, stat)) = lookup(layers, name) else {
        return false;
    };
    let (Ok(mode), Ok(uid), Ok(gid), Ok(mtime)) =
        (header.mode(), header.uid(), header.gid(), header.mtime())
    else {
        return false;
    };
    let common = stat.st_mode & 0o7777 == mode & 0o7777
        && u64::from(stat.st_uid) == uid
        && u64::from(stat.st_gid) == gid
        && stat.st_mtime == mtime as i64
        && stat.st_mtime_nsec == 0;
    if !common {
        return false;
    }
    let kind = stat.st_mode & libc::S_IFMT;
    match header.entry_type() {
        tar::EntryType::Regular => {
            kind == libc::S_IFREG
                && stat.st_nlink == 1
                && header.size().is_ok_and(|size| stat.st_size as u64 == size)
        }
        tar::EntryType::Symlink => {
            kind == libc::S_IFLNK && read_link(&dir, leaf_of(name)).as_deref() == target
        }
        _ => false,
    }
}

/// What the overlay of `layers` (top first) shows at `name`: the directory holding it and its
/// status, never through a symlink. `None` when nothing is there (a whiteout, a non-directory
/// above it, or absent in every layer) or it cannot be read.
fn lookup(layers: &[File], name: &[u8]) -> Option<(File, libc::stat)> {
    let (parent, leaf) = split(name);
    let leaf = c_name(leaf).ok()?;
    'layers: for layer in layers {
        let mut dir = layer.try_clone().ok()?;
        for part in parent.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
            match open_dir_at(Some(&dir), part) {
                Ok(next) => dir = next,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue 'layers,
                // A whiteout, file or symlink above it hides the layers below.
                Err(_) => return None,
            }
        }
        // SAFETY: `stat` is written by the call; plain system call on an owned descriptor.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        let flags = libc::AT_SYMLINK_NOFOLLOW;
        if unsafe { libc::fstatat(dir.as_raw_fd(), leaf.as_ptr(), &mut stat, flags) } != 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT) {
                continue;
            }
            return None;
        }
        if is_whiteout(&stat) {
            return None;
        }
        return Some((dir, stat));
    }
    None
}

/// Collects, below directory `prefix` (shown by the layers `visible`, top first, where it is a
/// directory), every name the layers show that the tar's `names` lack, as `(parent, leaf)`; it
/// goes down the directories both hold.
fn removed_below(
    visible: &[File],
    prefix: &[u8],
    names: &HashSet<Vec<u8>>,
    tar_dirs: &HashMap<Vec<u8>, u64>,
    removed: &mut Vec<(Vec<u8>, Vec<u8>)>,
) -> std::io::Result<()> {
    // Each name once, as its top layer shows it: `Some(true)` a directory, `None` a whiteout.
    let mut shown: BTreeMap<Vec<u8>, Option<bool>> = BTreeMap::new();
    for layer in visible {
        for entry in std::fs::read_dir(fd_path(layer))? {
            let entry = entry?;
            let leaf = entry.file_name().as_bytes().to_vec();
            if shown.contains_key(&leaf) {
                continue;
            }
            let kind = entry.file_type()?;
            let whiteout = kind.is_char_device()
                && entry
                    .metadata()
                    .is_ok_and(|m| std::os::unix::fs::MetadataExt::rdev(&m) == 0);
            shown.insert(leaf, (!whiteout).then_some(kind.is_dir()));
        }
    }
    for (leaf, kind) in shown {
        let Some(is_dir) = kind else { continue };
        let mut name = prefix.to_vec();
        if !name.is_empty() {
            name.push(b'/');
        }
        name.extend_from_slice(&leaf);
        if !names.contains(&name) {
            removed.push((prefix.to_vec(), leaf));
            continue;
        }
        if !is_dir || !tar_dirs.contains_key(&name) {
            continue;
        }
        // The layers where the child is a directory, down to the first that hides the rest.
        let mut below = Vec::new();
        for layer in visible {
            match open_dir_at(Some(layer), &leaf) {
                Ok(dir) => below.push(dir),
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(_) => break,
            }
        }
        removed_below(&below, &name, names, tar_dirs, removed)?;
    }
    Ok(())
}

fn is_whiteout(stat: &libc::stat) -> bool {
    stat.st_mode & libc::S_IFMT == libc::S_IFCHR && stat.st_rdev == 0
}

fn read_link(dir: &File, leaf: &[u8]) -> Option<Vec<u8>> {
    let leaf = c_name(leaf).ok()?;
    let mut buffer = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: the buffer is as long as said; plain system call on an owned descriptor.
    let length = unsafe {
        libc::readlinkat(
            dir.as_raw_fd(),
            leaf.as_ptr(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
        )
    };
    let length = usize::try_from(length).ok()?;
    buffer.truncate(length);
    Some(buffer)
}

/// Opens directory `name` (one component, or an absolute path when `at` is `None`) without
/// following a symlink at its last component.
fn open_dir_at(at: Option<&File>, name: &[u8]) -> std::io::Result<File> {
    let name = c_name(name)?;
    let at = at.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    // SAFETY: plain system call; the descriptor it returns is owned by the File.
    let fd = unsafe { libc::openat(at, name.as_ptr(), DIR_FLAGS) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// Opens the in-tree directory `name` below `root`, one component at a time.
fn walk_dirs(root: &File, name: &[u8]) -> std::io::Result<File> {
    let mut dir = root.try_clone()?;
    for part in name.split(|&b| b == b'/').filter(|p| !p.is_empty()) {
        dir = open_dir_at(Some(&dir), part)?;
    }
    Ok(dir)
}

fn has_xattr(dir: &File, key: &str) -> bool {
    let Ok(key) = CString::new(key) else {
        return false;
    };
    // SAFETY: a size query (no buffer) on an owned descriptor.
    unsafe { libc::fgetxattr(dir.as_raw_fd(), key.as_ptr(), std::ptr::null_mut(), 0) >= 0 }
}

fn split(name: &[u8]) -> (&[u8], &[u8]) {
    match name.iter().rposition(|&b| b == b'/') {
        Some(slash) => (&name[..slash], &name[slash + 1..]),
        None => (&[], name),
    }
}

fn leaf_of(name: &[u8]) -> &[u8] {
    split(name).1
}

fn c_name(name: &[u8]) -> std::io::Result<CString> {
    CString::new(name)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "NUL in a name"))
}

fn fd_path(dir: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()))
}

/// The layers file's text for the trees `below` (top first).
pub(super) fn layers_text(below: &[String]) -> String {
    below.iter().map(|k| format!("{k}\n")).collect()
}

/// The keys a layers file names, top first; `None` when one is not a plain key.
pub(super) fn parse_layers(text: &str, plain: impl Fn(&str) -> bool) -> Option<Vec<String>> {
    let keys: Vec<String> = text.lines().map(str::to_string).collect();
    (!keys.is_empty() && keys.len() < MAX_LAYERS && keys.iter().all(|k| plain(k))).then_some(keys)
}

#[cfg(test)]
#[path = "layers_tests.rs"]
mod tests;
