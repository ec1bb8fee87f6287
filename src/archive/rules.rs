//! The rules every tar entry passes, in strict or lenient mode (the list is in the module doc of
//! `archive`): names normalized and confined, types, parents, hard links, set-id bits, counts and
//! sizes. [`State`] sees each entry once, in order, and hands what it lets through to a
//! [`Sink`] with a fresh header; it never writes anything itself and never touches the
//! filesystem.

use std::collections::HashSet;
use std::io::{self, Read};

use tar::{EntryType, Header};

use super::policy::{lift, ArchiveError, Limits, Policy, Sink, Summary};

const SETID: u32 = 0o6000;
/// Permission bits kept from a header: rwx for all, plus the sticky bit.
const KEPT_MODE: u32 = 0o1777;

/// What the pass has seen so far.
#[derive(Default)]
pub(super) struct State {
    pub(super) summary: Summary,
    seen: HashSet<Vec<u8>>,
    dirs: HashSet<Vec<u8>>,
    files: HashSet<Vec<u8>>,
}

impl State {
    pub(super) fn entry<R: Read, S: Sink>(
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
pub(super) fn normalize(raw: &[u8], policy: &Policy) -> Result<Option<Vec<u8>>, ArchiveError> {
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

pub(super) fn show(bytes: &[u8]) -> String {
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
