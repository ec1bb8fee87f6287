//! The stored form of a checked archive: a freshly built tar written to any [`Write`], each
//! entry with a new header (forced owner, no extension records) and its name and link target
//! verbatim. It writes only what [`super::run`] let through, to the writer it is given.

use std::io::{self, Read, Write};

use tar::{EntryType, Header};

use super::policy::{lift, ArchiveError, Sink};

/// Bytes of a tar block.
pub(super) const BLOCK: u64 = 512;

/// The rebuilt tar: each entry with `name` (and link `target`) stored verbatim, using GNU
/// long-name records when they do not fit the header. Done by hand because the tar crate's own
/// path handling re-normalizes link targets, and a restored symlink must point exactly where it
/// did.
pub(super) struct TarSink<W: Write>(pub(super) tar::Builder<W>);

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
pub(super) fn long_header(kind: EntryType, value: &[u8]) -> Header {
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
