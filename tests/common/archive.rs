//! Snapshot archives in tests: reading their entries, writing well-behaved ones from parts, and
//! importing them, so that each suite says only what it changes in an archive.

use std::io::Read;

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{http_bytes, Server, API};

pub fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The entries of a tar, as (name, bytes).
pub fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut tar = tar::Archive::new(archive);
    tar.entries()
        .unwrap()
        .map(|entry| {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

/// A snapshot archive of `manifest` then `parts` (name, bytes), as a well-behaved writer makes it.
pub fn archive_with(manifest: &Value, parts: &[(&str, &[u8])]) -> Vec<u8> {
    let manifest = serde_json::to_vec(manifest).unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in
        std::iter::once(("manifest.json", manifest.as_slice())).chain(parts.iter().copied())
    {
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, name, data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// `POST …/snapshots/import?name=NAME` with `archive`: the status and the answer (JSON, or its
/// text as a string).
pub fn import(server: &Server, name: &str, archive: &[u8]) -> (u16, Value) {
    let (status, body) = http_bytes(
        server,
        "POST",
        &format!("{API}/snapshots/import?name={name}"),
        archive,
    );
    let value = serde_json::from_slice(&body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&body).into_owned()));
    (status, value)
}
