//! Reading one file through Docker's archive API (as root): only the first entry of the tar is
//! parsed, and the stream is dropped as soon as it is known (a directory is refused after its
//! first header, not after tarring it all). Links are reported, not followed: the caller follows
//! them, bounded.

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use std::io::Read;

use crate::docker::{Engine, EngineError};

/// Room for tar headers (including PAX or GNU long-name records) in front of the data.
const HEADER_ROOM: usize = 1 << 20;

pub enum Entry {
    File(Bytes),
    Directory,
    Link(String),
    Other,
    TooLarge,
}

pub enum ReadError {
    NotFound,
    Engine(EngineError),
    Bad(String),
}

enum Parsed {
    Need,
    Done(Entry),
}

fn parse(buf: &[u8], limit: u64) -> Result<Parsed, String> {
    let mut archive = tar::Archive::new(buf);
    let mut entries = match archive.entries() {
        Ok(e) => e,
        Err(_) => return Ok(Parsed::Need),
    };
    let mut entry = match entries.next() {
        None | Some(Err(_)) => return Ok(Parsed::Need),
        Some(Ok(entry)) => entry,
    };
    let kind = entry.header().entry_type();
    if kind.is_dir() {
        return Ok(Parsed::Done(Entry::Directory));
    }
    if kind.is_symlink() {
        let link = entry
            .link_name()
            .map_err(|e| e.to_string())?
            .map(|l| l.to_string_lossy().into_owned())
            .unwrap_or_default();
        return Ok(Parsed::Done(Entry::Link(link)));
    }
    if !(kind.is_file() || kind.is_contiguous()) {
        return Ok(Parsed::Done(Entry::Other));
    }
    let size = entry.size();
    if size > limit {
        return Ok(Parsed::Done(Entry::TooLarge));
    }
    let start = entry.raw_file_position();
    if (buf.len() as u64) < start.saturating_add(size) {
        return Ok(Parsed::Need);
    }
    let mut data = Vec::with_capacity(size as usize);
    entry.read_to_end(&mut data).map_err(|e| e.to_string())?;
    Ok(Parsed::Done(Entry::File(Bytes::from(data))))
}

pub async fn first_entry(
    engine: &dyn Engine,
    container: &str,
    path: &str,
    limit: u64,
) -> Result<Entry, ReadError> {
    let mut stream = engine
        .archive_get(container, path)
        .await
        .map_err(|e| match e {
            e if e.is_not_found() => ReadError::NotFound,
            e => ReadError::Engine(e),
        })?;
    let max = usize::try_from(limit)
        .unwrap_or(usize::MAX)
        .saturating_add(HEADER_ROOM);
    let mut buf = BytesMut::new();
    loop {
        match stream.next().await {
            Some(Ok(chunk)) => {
                let room = max.saturating_sub(buf.len());
                buf.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Some(Err(e)) => return Err(ReadError::Engine(e)),
            None => {
                return match parse(&buf, limit).map_err(ReadError::Bad)? {
                    Parsed::Done(entry) => Ok(entry),
                    Parsed::Need => Err(ReadError::Bad(format!(
                        "docker sent an incomplete archive of {path}"
                    ))),
                }
            }
        }
        if let Parsed::Done(entry) = parse(&buf, limit).map_err(ReadError::Bad)? {
            return Ok(entry);
        }
        if buf.len() >= max {
            return Err(ReadError::Bad(format!(
                "the archive of {path} is malformed"
            )));
        }
    }
}
