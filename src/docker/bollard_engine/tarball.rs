//! Small tar archives this engine sends to Docker itself (workspace ownership, helper binary,
//! the empty image used to fill the helper volume) and reading one file back out of a tar.
//! Everything here is a few kilobytes plus the helper binary; user data never passes through.

use std::io::{self, Read};
use std::time::{SystemTime, UNIX_EPOCH};

use tar::{Builder, EntryType, Header};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// A tar whose only entry is a directory named `/`, owned by `uid:gid` with `mode`.
///
/// Extracted by Docker's archive API into a path, it re-owns that path itself: Docker skips an
/// entry named `.` or `./` when the target directory exists, but an entry named `/` resolves to
/// the target directory and gets its owner, mode and mtime applied. The tar crate refuses to
/// write absolute names, hence the raw name field.
pub fn root_dir(uid: u32, gid: u32, mode: u32) -> io::Result<Vec<u8>> {
    let mut header = Header::new_ustar();
    header.set_entry_type(EntryType::Directory);
    header.set_uid(u64::from(uid));
    header.set_gid(u64::from(gid));
    header.set_mode(mode);
    header.set_size(0);
    header.set_mtime(now());
    let ustar = header
        .as_ustar_mut()
        .ok_or_else(|| io::Error::other("ustar header expected"))?;
    ustar.name = [0; 100];
    ustar.name[0] = b'/';
    header.set_cksum();
    let mut builder = Builder::new(Vec::new());
    builder.append(&header, io::empty())?;
    builder.into_inner()
}

/// A tar of regular files at the top level, each `(name, mode, content)`, owned by root.
pub fn root_files(files: &[(&str, u32, &[u8])]) -> io::Result<Vec<u8>> {
    let mut builder = Builder::new(Vec::new());
    let mtime = now();
    for (name, mode, content) in files {
        let mut header = Header::new_gnu();
        header.set_entry_type(EntryType::Regular);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mode(*mode);
        header.set_size(content.len() as u64);
        header.set_mtime(mtime);
        builder.append_data(&mut header, name, *content)?;
    }
    builder.into_inner()
}

/// A root filesystem holding one empty directory: enough for `docker import` to make an image
/// from which containers can be created (never started) to reach a volume.
pub fn empty_rootfs() -> io::Result<Vec<u8>> {
    let mut header = Header::new_gnu();
    header.set_entry_type(EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    header.set_mtime(now());
    let mut builder = Builder::new(Vec::new());
    builder.append_data(&mut header, "opt/", io::empty())?;
    builder.into_inner()
}

/// Content of the first regular file in `tar` whose name ends with `name`, up to `limit` bytes.
pub fn read_file(tar: &[u8], name: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries()? {
        let entry = entry?;
        let matches = entry.header().entry_type() == EntryType::Regular
            && entry.path()?.file_name().and_then(|f| f.to_str()) == Some(name);
        if matches {
            let mut content = Vec::new();
            entry.take(limit).read_to_end(&mut content)?;
            return Ok(Some(content));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_dir_entry_is_named_slash() {
        let tar = root_dir(1000, 1000, 0o755).unwrap();
        assert_eq!(tar[0], b'/');
        assert_eq!(tar[1], 0);
        let header = Header::from_byte_slice(&tar[..512]);
        assert_eq!(header.uid().unwrap(), 1000);
        assert_eq!(header.gid().unwrap(), 1000);
        assert_eq!(header.mode().unwrap(), 0o755);
        assert_eq!(header.entry_type(), EntryType::Directory);
        // The checksum must match, or Docker's reader rejects the archive.
        let stored = header.cksum().unwrap();
        let mut copy = header.clone();
        copy.set_cksum();
        assert_eq!(copy.cksum().unwrap(), stored);
    }

    #[test]
    fn files_round_trip() {
        let tar = root_files(&[("a", 0o555, b"hello"), ("b", 0o444, b"x")]).unwrap();
        assert_eq!(
            read_file(&tar, "a", 100).unwrap().as_deref(),
            Some(&b"hello"[..])
        );
        assert_eq!(
            read_file(&tar, "b", 100).unwrap().as_deref(),
            Some(&b"x"[..])
        );
        assert_eq!(read_file(&tar, "c", 100).unwrap(), None);
        assert_eq!(
            read_file(&tar, "a", 2).unwrap().as_deref(),
            Some(&b"he"[..])
        );
    }

    #[test]
    fn empty_rootfs_is_a_valid_tar() {
        let tar = empty_rootfs().unwrap();
        let mut archive = tar::Archive::new(&tar[..]);
        assert_eq!(archive.entries().unwrap().count(), 1);
    }
}
