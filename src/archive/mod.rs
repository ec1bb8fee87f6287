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
//! Where things are: the one pass ([`validate`], [`transform`], [`unpack`]), here; its policy,
//! limits, summary and errors, `policy.rs`; the per-entry rules, `rules.rs`; the rebuilt tar, `rewrite.rs`; extraction into a host
//! directory, `unpack.rs`; reading a host directory, `host.rs`; hard-link copies, `link.rs`;
//! digests and capped writers, `digest.rs`; the blocking/async bridge, `pipe.rs`.

mod digest;
mod host;
mod link;
mod pipe;
mod policy;
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

pub use digest::{digest, Capped, HashedWriter};
pub use host::{open_root, HostTar};
pub use link::link_tree;
pub use pipe::{ChannelReader, ChannelWriter};
use policy::{lift, Sink};
pub use policy::{ArchiveError, Limits, Policy, Summary};
use rewrite::TarSink;
use rules::State;

use rewrite::BLOCK;

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

/// Decides, from an entry's checked header, in-tree name and link target, whether it is written.
pub type Keep<'a> = dyn FnMut(&tar::Header, &[u8], Option<&[u8]>) -> bool + 'a;

/// [`unpack`], writing only the entries `keep` accepts (it sees each entry as the policy let it
/// through: its checked header, in-tree name and link target). A skipped entry's data is read
/// past; the rules still apply to it, so a refused archive is refused whatever `keep` says. How
/// a snapshot's tree is made as a delta over an earlier one: only what differs is written.
pub fn unpack_filtered<R: Read>(
    input: R,
    root: File,
    policy: &Policy,
    keep: &mut Keep<'_>,
) -> Result<Summary, ArchiveError> {
    let mut sink = unpack::HostSink::new(root);
    let summary = run(
        input,
        &mut Filtered {
            sink: &mut sink,
            keep,
        },
        policy,
    )?;
    sink.finish()?;
    Ok(summary)
}

/// A sink that passes on only what its filter keeps.
struct Filtered<'a, S> {
    sink: &'a mut S,
    keep: &'a mut Keep<'a>,
}

impl<S: Sink> Sink for Filtered<'_, S> {
    fn append<D: Read>(
        &mut self,
        header: tar::Header,
        name: &[u8],
        target: Option<&[u8]>,
        mut data: D,
    ) -> Result<(), ArchiveError> {
        if (self.keep)(&header, name, target) {
            return self.sink.append(header, name, target, data);
        }
        // Read to its end all the same: a cut-off archive is refused, kept or not.
        io::copy(&mut data, &mut io::sink()).map_err(|e| lift(e, ArchiveError::Read))?;
        Ok(())
    }
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
