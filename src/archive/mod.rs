//! Tar handling for snapshots: exporting a workspace into the stored form, and checking and
//! rewriting a stored tar before it is restored into a sandbox.
//!
//! Docker's archive API extracts as root, honours the owner and mode in each header and follows
//! symlinks inside the container, so a tar handed to it must be harmless by construction. One
//! streaming pass reads a tar entry by entry and applies the rules below; what it lets through
//! goes either into a freshly built tar (new headers, forced owner, no extension records) written
//! to any [`Write`] ([`transform`]), or straight into a directory of this host ([`unpack`], which
//! never follows a symlink nor replaces an existing name):
//!
//! - only regular files, directories, symlinks and hard links to an earlier regular file of the
//!   same archive; no devices, FIFOs, sparse or unknown entries;
//! - names are relative, in-tree, without `..`, NUL, duplicates or over-long parts, and each
//!   entry's parent directory appears earlier in the archive (so no entry can reach through a
//!   symlink, and Docker never creates a root-owned directory on its own);
//! - no setuid or setgid bits; bounded entry count, size and name length;
//! - the archive must be complete: every entry's data and the end-of-archive marker are present.
//!
//! In strict mode (restores) any breach refuses the whole archive; callers validate fully before
//! anything is restored. In lenient mode (taking a snapshot of a live workspace, which may hold a
//! FIFO or a setuid bit the sandbox user set) the offending entries are dropped or stripped and
//! listed in the [`Summary`]. This module never talks to Docker; apart from [`HostTar`] (which
//! reads a directory of this host, without following symlinks, into the same tar form Docker's
//! archive API gives), [`unpack`] and [`link_tree`] (which carries a tree into another directory
//! by hard links) it never touches the filesystem beyond the reader and writer it is given.

mod digest;
mod host;
mod link;
mod pipe;
#[cfg(test)]
mod test_tree;
#[cfg(test)]
mod tests;
mod unpack;

use std::cell::Cell;
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read, Write};
use std::rc::Rc;

use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

pub use digest::HashedWriter;
pub use host::{open_root, HostTar};
pub use link::link_tree;
pub use pipe::{ChannelReader, ChannelWriter};

const BLOCK: u64 = 512;
const SETID: u32 = 0o6000;
/// Permission bits kept from a header: rwx for all, plus the sticky bit.
const KEPT_MODE: u32 = 0o1777;

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("not a valid tar archive: {0}")]
    Malformed(String),
    #[error("the archive is truncated: {0}")]
    Truncated(String),
    #[error("entry {0:?} has an absolute path")]
    AbsolutePath(String),
    #[error("entry {0:?} has a `..` path component")]
    ParentComponent(String),
    #[error("entry {0:?} has a NUL byte in its name or link target")]
    Nul(String),
    #[error("entry {0:?} is not under the exported directory")]
    OutsideRoot(String),
    #[error(
        "entry {path:?} is a {kind}; only regular files, directories and symlinks are allowed"
    )]
    UnsupportedType { path: String, kind: String },
    #[error("entry {0:?} has the setuid or setgid bit")]
    SetId(String),
    #[error("hard link {path:?} points to {target:?}, which is not an earlier regular file of the archive")]
    HardLinkOutside { path: String, target: String },
    #[error("symlink {0:?} has an empty or over-long target")]
    BadSymlink(String),
    #[error("the parent directory of entry {0:?} does not appear earlier in the archive")]
    MissingParent(String),
    #[error("entry {0:?} appears twice")]
    Duplicate(String),
    #[error("entry {0:?} has an over-long name")]
    NameTooLong(String),
    #[error("the archive has more than {0} entries")]
    TooManyEntries(u64),
    #[error("the archive is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("reading the archive failed: {0}")]
    Read(String),
    #[error("writing the archive failed: {0}")]
    Write(String),
}

impl ArchiveError {
    /// Wraps the error so that it survives a trip through an `io::Error` (from a reader or a
    /// writer the tar crate drives) and is recovered by [`lift`].
    pub fn into_io(self) -> io::Error {
        io::Error::other(self)
    }
}

/// Recovers an [`ArchiveError`] carried in an `io::Error`, or classifies a plain one.
fn lift(error: io::Error, plain: fn(String) -> ArchiveError) -> ArchiveError {
    if error
        .get_ref()
        .is_some_and(|inner| inner.is::<ArchiveError>())
    {
        if let Some(inner) = error.into_inner() {
            if let Ok(archive) = inner.downcast::<ArchiveError>() {
                return *archive;
            }
            // Unreachable: `is` said it was one.
            return ArchiveError::Read("unexpected error".into());
        }
        return ArchiveError::Read("unexpected error".into());
    }
    plain(error.to_string())
}

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_entries: u64,
    /// Sum of all file contents.
    pub max_content_bytes: u64,
    pub max_path_bytes: usize,
    pub max_component_bytes: usize,
    pub max_link_bytes: usize,
}

impl Limits {
    pub fn with_max_bytes(max_content_bytes: u64) -> Limits {
        Limits {
            max_entries: 1_000_000,
            max_content_bytes,
            max_path_bytes: 4096,
            max_component_bytes: 255,
            max_link_bytes: 4096,
        }
    }
}

/// How [`transform`] treats its input.
#[derive(Clone, Debug)]
pub struct Policy {
    /// A first path component every entry must carry and that is removed (Docker names the
    /// entries of `GET /archive?path=/workspace` `workspace/...`). The entry that is the root
    /// itself is dropped: an extraction never changes its target directory.
    pub strip_root: Option<Vec<u8>>,
    /// Owner written into every header.
    pub owner: (u32, u32),
    /// Drop unsupported entries and strip setuid/setgid bits (reported in the summary) instead of
    /// refusing the archive.
    pub lenient: bool,
    pub limits: Limits,
}

impl Policy {
    /// For a stored snapshot about to be restored: every rule refuses.
    pub fn restore(owner: (u32, u32), limits: Limits) -> Policy {
        Policy {
            strip_root: None,
            owner,
            lenient: false,
            limits,
        }
    }

    /// For Docker's export of the directory named `root` of a live sandbox.
    pub fn export(root: &str, owner: (u32, u32), limits: Limits) -> Policy {
        Policy {
            strip_root: Some(root.as_bytes().to_vec()),
            owner,
            lenient: true,
            limits,
        }
    }
}

/// What a pass saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Entries written (the root entry excluded).
    pub entries: u64,
    pub content_bytes: u64,
    /// Lenient mode only: what was dropped or changed, one line each (the first few).
    pub adjusted: Vec<String>,
    /// Total number of adjustments, including those not listed.
    pub adjusted_count: u64,
}

const ADJUSTED_LISTED: usize = 10;

impl Summary {
    fn adjust(&mut self, note: String) {
        self.adjusted_count += 1;
        if self.adjusted.len() < ADJUSTED_LISTED {
            self.adjusted.push(note);
        }
    }
}

/// Checks `input` against `policy` without producing anything.
pub fn validate<R: Read>(input: R, policy: &Policy) -> Result<Summary, ArchiveError> {
    transform(input, io::sink(), policy).map(|(summary, _)| summary)
}

/// Reads the tar `input`, applies `policy`, and writes the rebuilt tar to `output`. On error the
/// output holds a prefix of the result and must be discarded.
pub fn transform<R: Read, W: Write>(
    input: R,
    output: W,
    policy: &Policy,
) -> Result<(Summary, W), ArchiveError> {
    // The builder writes an end-of-archive marker when dropped; after a failure that marker
    // would make a prefix look like a whole archive, so the gate closes first.
    let open = Rc::new(Cell::new(true));
    let mut sink = TarSink(tar::Builder::new(Gate {
        inner: output,
        open: Rc::clone(&open),
    }));
    let result = run(input, &mut sink, policy).and_then(|summary| {
        sink.0.finish().map_err(|e| lift(e, ArchiveError::Write))?;
        Ok(summary)
    });
    let summary = match result {
        Ok(summary) => summary,
        Err(error) => {
            open.set(false);
            return Err(error);
        }
    };
    let gate = sink
        .0
        .into_inner()
        .map_err(|e| lift(e, ArchiveError::Write))?;
    Ok((summary, gate.inner))
}

/// Reads the tar `input`, applies `policy`, and extracts what it lets through below the directory
/// `root` of this host (see [`unpack`](self::unpack) for how nothing is followed or overwritten).
/// On error the tree holds part of the archive and must be discarded.
pub fn unpack<R: Read>(input: R, root: File, policy: &Policy) -> Result<Summary, ArchiveError> {
    let mut sink = unpack::HostSink::new(root);
    let summary = run(input, &mut sink, policy)?;
    sink.finish()?;
    Ok(summary)
}

/// Where [`run`] delivers each entry it lets through, rebuilt: `header` is fresh (forced owner,
/// kept mode bits, mtime, size), `name` the normalized in-tree name, `target` a symlink's target
/// or a hard link's (normalized) earlier file, and `data` exactly a regular file's contents.
trait Sink {
    fn append<D: Read>(
        &mut self,
        header: Header,
        name: &[u8],
        target: Option<&[u8]>,
        data: D,
    ) -> Result<(), ArchiveError>;
}

/// The one pass over `input` both outputs share: every rule of the module applies here.
fn run<R: Read, S: Sink>(input: R, sink: &mut S, policy: &Policy) -> Result<Summary, ArchiveError> {
    let consumed = Rc::new(Cell::new(0));
    let mut archive = tar::Archive::new(Counting {
        inner: input,
        count: Rc::clone(&consumed),
    });
    let mut state = State::default();
    let mut last_end = 0u64;
    let entries = archive
        .entries()
        .map_err(|e| lift(e, ArchiveError::Malformed))?;
    for entry in entries {
        let entry = entry.map_err(|e| lift(e, ArchiveError::Malformed))?;
        last_end = entry.raw_file_position() + padded(entry.size());
        state.entry(entry, sink, policy)?;
    }
    // A clean end has a zero block after the last entry; EOF at an entry boundary means the
    // archive was cut off there.
    if consumed.get() < last_end + BLOCK {
        return Err(ArchiveError::Truncated(
            "the end-of-archive marker is missing".into(),
        ));
    }
    Ok(state.summary)
}

/// Passes writes through until closed, then refuses them.
struct Gate<W> {
    inner: W,
    open: Rc<Cell<bool>>,
}

impl<W: Write> Write for Gate<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.open.get() {
            return Err(io::Error::other("archive abandoned"));
        }
        self.inner.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn padded(size: u64) -> u64 {
    size.div_ceil(BLOCK) * BLOCK
}

#[derive(Default)]
struct State {
    summary: Summary,
    seen: HashSet<Vec<u8>>,
    dirs: HashSet<Vec<u8>>,
    files: HashSet<Vec<u8>>,
}

impl State {
    fn entry<R: Read, S: Sink>(
        &mut self,
        mut entry: tar::Entry<'_, R>,
        sink: &mut S,
        policy: &Policy,
    ) -> Result<(), ArchiveError> {
        let raw_name = entry.path_bytes().into_owned();
        let shown = show(&raw_name);
        let Some(name) = normalize(&raw_name, policy)? else {
            // The root of the tree: an extraction never applies it.
            return match entry.header().entry_type() {
                EntryType::Directory => Ok(()),
                _ => Err(ArchiveError::OutsideRoot(shown)),
            };
        };
        check_lengths(&name, &shown, &policy.limits)?;
        let kind = entry.header().entry_type();
        let supported = matches!(
            kind,
            EntryType::Regular | EntryType::Directory | EntryType::Symlink | EntryType::Link
        );
        if !supported {
            let kind = type_name(kind);
            if policy.lenient {
                self.summary.adjust(format!("dropped {shown} ({kind})"));
                return Ok(());
            }
            return Err(ArchiveError::UnsupportedType { path: shown, kind });
        }
        if !self.seen.insert(name.clone()) {
            return Err(ArchiveError::Duplicate(shown));
        }
        if let Some(parent) = parent(&name) {
            if !self.dirs.contains(parent) {
                if policy.lenient {
                    self.summary
                        .adjust(format!("dropped {shown} (its directory was dropped)"));
                    return Ok(());
                }
                return Err(ArchiveError::MissingParent(shown));
            }
        }
        self.summary.entries += 1;
        if self.summary.entries > policy.limits.max_entries {
            return Err(ArchiveError::TooManyEntries(policy.limits.max_entries));
        }

        let mut mode = entry
            .header()
            .mode()
            .map_err(|e| ArchiveError::Malformed(format!("entry {shown:?}: {e}")))?;
        if mode & SETID != 0 {
            if !policy.lenient {
                return Err(ArchiveError::SetId(shown));
            }
            self.summary
                .adjust(format!("cleared setuid/setgid bits of {shown}"));
            mode &= !SETID;
        }
        let mtime = entry.header().mtime().unwrap_or(0);
        let mut header = Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode & KEPT_MODE);
        header.set_uid(u64::from(policy.owner.0));
        header.set_gid(u64::from(policy.owner.1));
        header.set_mtime(mtime);
        header.set_size(0);

        match kind {
            EntryType::Directory => {
                self.dirs.insert(name.clone());
                sink.append(header, &name, None, io::empty())
            }
            EntryType::Symlink => {
                let target = entry.link_name_bytes().map(|t| t.into_owned());
                let target = target
                    .filter(|t| !t.is_empty() && t.len() <= policy.limits.max_link_bytes)
                    .ok_or_else(|| ArchiveError::BadSymlink(shown.clone()))?;
                if target.contains(&0) {
                    return Err(ArchiveError::Nul(shown));
                }
                sink.append(header, &name, Some(&target), io::empty())
            }
            EntryType::Link => {
                let raw_target = entry
                    .link_name_bytes()
                    .map(|t| t.into_owned())
                    .unwrap_or_default();
                let outside = || ArchiveError::HardLinkOutside {
                    path: shown.clone(),
                    target: show(&raw_target),
                };
                let target = match normalize(&raw_target, policy) {
                    Ok(Some(target)) => target,
                    Ok(None) | Err(_) => return Err(outside()),
                };
                if !self.files.contains(&target) {
                    if policy.lenient {
                        self.summary.entries -= 1;
                        self.summary.adjust(format!(
                            "dropped hard link {shown} (its target was dropped)"
                        ));
                        return Ok(());
                    }
                    return Err(outside());
                }
                sink.append(header, &name, Some(&target), io::empty())
            }
            _ => {
                let size = entry.size();
                let total = self.summary.content_bytes.saturating_add(size);
                if total > policy.limits.max_content_bytes {
                    return Err(ArchiveError::TooLarge {
                        limit: policy.limits.max_content_bytes,
                    });
                }
                self.summary.content_bytes = total;
                header.set_size(size);
                self.files.insert(name.clone());
                let data = Exact {
                    inner: &mut entry,
                    remaining: size,
                    name: shown,
                };
                sink.append(header, &name, None, data)
            }
        }
    }
}

/// The in-tree name of `raw` (components joined by `/`), `None` for the root itself.
fn normalize(raw: &[u8], policy: &Policy) -> Result<Option<Vec<u8>>, ArchiveError> {
    let shown = || show(raw);
    if raw.contains(&0) {
        return Err(ArchiveError::Nul(shown()));
    }
    if raw.first() == Some(&b'/') {
        return Err(ArchiveError::AbsolutePath(shown()));
    }
    let mut parts: Vec<&[u8]> = Vec::new();
    for part in raw.split(|&b| b == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err(ArchiveError::ParentComponent(shown())),
            _ => parts.push(part),
        }
    }
    if let Some(root) = &policy.strip_root {
        if parts.first() != Some(&root.as_slice()) {
            return Err(ArchiveError::OutsideRoot(shown()));
        }
        parts.remove(0);
    }
    if parts.is_empty() {
        return Ok(None);
    }
    Ok(Some(parts.join(&b'/')))
}

fn check_lengths(name: &[u8], shown: &str, limits: &Limits) -> Result<(), ArchiveError> {
    let too_long = name.len() > limits.max_path_bytes
        || name
            .split(|&b| b == b'/')
            .any(|part| part.len() > limits.max_component_bytes);
    if too_long {
        return Err(ArchiveError::NameTooLong(shown.to_string()));
    }
    Ok(())
}

fn parent(name: &[u8]) -> Option<&[u8]> {
    name.iter()
        .rposition(|&b| b == b'/')
        .map(|slash| &name[..slash])
}

fn show(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn type_name(kind: EntryType) -> String {
    match kind {
        EntryType::Char => "character device".into(),
        EntryType::Block => "block device".into(),
        EntryType::Fifo => "FIFO".into(),
        EntryType::Continuous => "contiguous file".into(),
        EntryType::GNUSparse => "sparse file".into(),
        EntryType::XGlobalHeader => "global extended header".into(),
        other => format!("entry of type {:?}", char::from(other.as_byte())),
    }
}

/// The rebuilt tar: each entry with `name` (and link `target`) stored verbatim, using GNU
/// long-name records when they do not fit the header. Done by hand because the tar crate's own
/// path handling re-normalizes link targets, and a restored symlink must point exactly where it
/// did.
struct TarSink<W: Write>(tar::Builder<W>);

impl<W: Write> Sink for TarSink<W> {
    fn append<D: Read>(
        &mut self,
        mut header: Header,
        name: &[u8],
        target: Option<&[u8]>,
        data: D,
    ) -> Result<(), ArchiveError> {
        let builder = &mut self.0;
        let write = |e| lift(e, ArchiveError::Write);
        let is_dir = header.entry_type() == EntryType::Directory;
        let mut stored_name = name.to_vec();
        if is_dir {
            stored_name.push(b'/');
        }
        let fields = header
            .as_gnu_mut()
            .ok_or_else(|| ArchiveError::Write("GNU header expected".into()))?;
        if stored_name.len() > fields.name.len() {
            long_record(builder, EntryType::GNULongName, &stored_name).map_err(write)?;
        }
        let n = stored_name.len().min(fields.name.len());
        fields.name[..n].copy_from_slice(&stored_name[..n]);
        if let Some(target) = target {
            if target.len() > fields.linkname.len() {
                long_record(builder, EntryType::GNULongLink, target).map_err(write)?;
            }
            let n = target.len().min(fields.linkname.len());
            fields.linkname[..n].copy_from_slice(&target[..n]);
        }
        header.set_cksum();
        if header.entry_type() != EntryType::Regular {
            return builder.append(&header, data).map_err(write);
        }
        // File data is copied in large pieces: `Builder::append` goes through an 8 KiB buffer,
        // and every piece is hashed and written separately further down.
        copy_entry(builder.get_mut(), &header, data).map_err(write)
    }
}

/// Writes `header`, all of `data` and the padding to a whole block, as `Builder::append` does.
fn copy_entry<W: Write, D: Read>(out: &mut W, header: &Header, mut data: D) -> io::Result<()> {
    const PIECE: usize = 256 * 1024;
    out.write_all(header.as_bytes())?;
    let size = header.size().unwrap_or(0).clamp(1, PIECE as u64);
    let mut buffer = vec![0u8; usize::try_from(size).unwrap_or(PIECE)];
    let mut copied = 0u64;
    loop {
        let n = match data.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        out.write_all(&buffer[..n])?;
        copied += n as u64;
    }
    let rest = (copied % BLOCK) as usize;
    if rest != 0 {
        out.write_all(&[0u8; BLOCK as usize][..BLOCK as usize - rest])?;
    }
    Ok(())
}

fn long_record<W: Write>(
    builder: &mut tar::Builder<W>,
    kind: EntryType,
    value: &[u8],
) -> io::Result<()> {
    builder.append(&long_header(kind, value), value.chain(&[0u8][..]))
}

/// The header of a GNU long-name or long-link record for `value`, whose data is `value` and a
/// NUL (as GNU tar writes it).
fn long_header(kind: EntryType, value: &[u8]) -> Header {
    let mut header = Header::new_gnu();
    let marker = b"././@LongLink";
    if let Some(gnu) = header.as_gnu_mut() {
        gnu.name[..marker.len()].copy_from_slice(marker);
    }
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(value.len() as u64 + 1);
    header.set_cksum();
    header
}

/// Counts the bytes the tar reader consumed, to tell a clean end from a cut-off one.
struct Counting<R> {
    inner: R,
    count: Rc<Cell<u64>>,
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self
            .inner
            .read(buf)
            .map_err(|e| lift(e, ArchiveError::Read).into_io())?;
        self.count.set(self.count.get() + read as u64);
        Ok(read)
    }
}

/// Yields exactly `remaining` bytes of an entry, or fails with [`ArchiveError::Truncated`].
struct Exact<'a, R: Read> {
    inner: &'a mut R,
    remaining: u64,
    name: String,
}

impl<R: Read> Read for Exact<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let read = self
            .inner
            .read(&mut buf[..want])
            .map_err(|e| lift(e, ArchiveError::Read).into_io())?;
        if read == 0 {
            return Err(ArchiveError::Truncated(format!(
                "the data of entry {:?} ends {} bytes early",
                self.name, self.remaining
            ))
            .into_io());
        }
        self.remaining -= read as u64;
        Ok(read)
    }
}

/// A writer that hashes and counts what passes through and refuses to go past a byte limit.
pub struct Capped<W> {
    inner: W,
    written: u64,
    limit: u64,
    hasher: Sha256,
}

impl<W: Write> Capped<W> {
    pub fn new(inner: W, limit: u64) -> Capped<W> {
        Capped {
            inner,
            written: 0,
            limit,
            hasher: Sha256::new(),
        }
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// `sha256:<hex>` of everything written, and the inner writer.
    pub fn finish(self) -> (String, W) {
        (
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.inner,
        )
    }
}

impl<W: Write> Write for Capped<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.written.saturating_add(buf.len() as u64) > self.limit {
            return Err(ArchiveError::TooLarge { limit: self.limit }.into_io());
        }
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `sha256:<hex>` of everything `reader` yields.
pub fn digest<R: Read>(mut reader: R) -> io::Result<String> {
    let mut hasher = Sha256::new();
    io::copy(&mut reader, &mut hasher)?;
    Ok(format!("sha256:{}", hex::encode(hasher.finalize())))
}
