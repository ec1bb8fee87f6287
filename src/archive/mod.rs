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
//!
//! Where things are: the one pass ([`validate`], [`transform`], [`unpack`]) and its policy,
//! here; the per-entry rules, `rules.rs`; the rebuilt tar, `rewrite.rs`; extraction into a host
//! directory, `unpack.rs`; reading a host directory, `host.rs`; hard-link copies, `link.rs`;
//! digests and capped writers, `digest.rs`; the blocking/async bridge, `pipe.rs`.

mod digest;
mod host;
mod link;
mod pipe;
mod rewrite;
mod rules;
#[cfg(test)]
mod test_tree;
#[cfg(test)]
mod tests;
mod unpack;

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Read, Write};
use std::rc::Rc;

use tar::Header;

pub use digest::{digest, Capped, HashedWriter};
pub use host::{open_root, HostTar};
pub use link::link_tree;
pub use pipe::{ChannelReader, ChannelWriter};
use rewrite::TarSink;
use rules::State;

const BLOCK: u64 = 512;

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
