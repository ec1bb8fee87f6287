//! The server-owned half of a resource: `<data>/state/<plural>/<name>.json` holds its metadata
//! (uid, generation, resourceVersion, timestamps, owner references), where it was declared, a copy
//! of the declaration that generation was last decided on, and its status. JSON only; the
//! declaration copy is validated like any document when read back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::{atomic, Origin};
use crate::resource::yaml::value_to_resource;
use crate::resource::{is_valid_key, AnyResource, Kind, OwnerReference};

/// A resource as the index holds it.
#[derive(Clone, Debug)]
pub(super) struct Record {
    /// Declaration plus server metadata and status.
    pub resource: AnyResource,
    pub origin: Origin,
    pub file: Option<PathBuf>,
}

impl Record {
    pub fn resource_version(&self) -> u64 {
        parse_rv(self.resource.metadata().resource_version.as_deref())
    }

    pub fn is_deleting(&self) -> bool {
        self.resource.metadata().deletion_timestamp.is_some()
    }
}

pub(super) fn parse_rv(rv: Option<&str>) -> u64 {
    rv.and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StateFile {
    kind: Kind,
    name: String,
    uid: String,
    generation: u64,
    resource_version: String,
    creation_timestamp: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deletion_timestamp: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    owner_references: Vec<OwnerReference>,
    /// The read-only folder that declares it; absent for the data directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    folder: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    file: Option<PathBuf>,
    declaration: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    status: Option<serde_json::Value>,
}

pub(super) fn state_path(data_dir: &Path, kind: Kind, name: &str) -> PathBuf {
    data_dir
        .join("state")
        .join(kind.plural())
        .join(format!("{name}.json"))
}

pub(super) fn save(data_dir: &Path, record: &Record) -> std::io::Result<()> {
    let (path, bytes) = encode(data_dir, record)?;
    atomic::write_atomic(&path, &bytes)
}

/// The state file of `record`: where it goes and what it holds.
pub(super) fn encode(data_dir: &Path, record: &Record) -> std::io::Result<(PathBuf, Vec<u8>)> {
    let r = &record.resource;
    let meta = r.metadata();
    let state = StateFile {
        kind: r.kind(),
        // The key ([`crate::resource::object_key`]): the name, namespace-qualified outside
        // `default`, as the file is named.
        name: meta.key(),
        uid: meta.uid.clone().unwrap_or_default(),
        generation: meta.generation.unwrap_or(1),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        creation_timestamp: meta.creation_timestamp.unwrap_or_else(Utc::now),
        deletion_timestamp: meta.deletion_timestamp,
        owner_references: meta.owner_references.clone(),
        folder: match &record.origin {
            Origin::DataDir => None,
            Origin::Folder(dir) => Some(dir.clone()),
        },
        file: record.file.clone(),
        declaration: r.declaration().to_json(),
        status: r.status_json(),
    };
    let bytes = serde_json::to_vec_pretty(&state).map_err(std::io::Error::other)?;
    Ok((state_path(data_dir, r.kind(), &meta.key()), bytes))
}

pub(super) fn remove(data_dir: &Path, kind: Kind, name: &str) -> std::io::Result<()> {
    match std::fs::remove_file(state_path(data_dir, kind, name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Reads every state file. Unreadable or invalid ones are logged and skipped: the declaration, if
/// any, then makes a fresh resource of it.
pub(super) fn load_all(data_dir: &Path) -> BTreeMap<(Kind, String), Record> {
    let mut out = BTreeMap::new();
    for kind in Kind::ALL {
        let dir = data_dir.join("state").join(kind.plural());
        atomic::remove_temp_files(&dir);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if hidden || path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            match load_one(&path, kind) {
                Ok(record) => {
                    out.insert((kind, record.resource.key()), record);
                }
                Err(message) => {
                    tracing::warn!(file = %path.display(), "ignoring state file: {message}");
                }
            }
        }
    }
    out
}

fn load_one(path: &Path, kind: Kind) -> Result<Record, String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let state: StateFile = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    let expected_name = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
    if state.kind != kind || state.name != expected_name || !is_valid_key(&state.name) {
        return Err(format!(
            "holds {} {:?}, which does not match its path",
            state.kind, state.name
        ));
    }
    let mut resource =
        value_to_resource(state.declaration, Some(kind), None).map_err(|e| e.to_string())?;
    if resource.key() != state.name {
        return Err("its declaration names another resource".into());
    }
    if let Err(e) = resource.set_status_json(state.status) {
        // The status is the controller's to rebuild; losing it is harmless.
        tracing::warn!(file = %path.display(), "dropping unreadable status: {e}");
    }
    let meta = resource.metadata_mut();
    meta.uid = Some(state.uid);
    meta.generation = Some(state.generation);
    meta.resource_version = Some(state.resource_version);
    meta.creation_timestamp = Some(state.creation_timestamp);
    meta.deletion_timestamp = state.deletion_timestamp;
    meta.owner_references = state.owner_references;
    Ok(Record {
        resource,
        origin: state.folder.map_or(Origin::DataDir, Origin::Folder),
        file: state.file,
    })
}
