//! `manifest.json`, the first entry of a snapshot archive: what it holds, how it is made from a
//! snapshot, and the checks an import applies to it before any content is read. Version 1 (a
//! Workspace snapshot: the workspace only) and version 2 (a Full snapshot: the workspace, then
//! the root filesystem changes) share every field; both are strict: unknown fields are refused
//! (a writer that adds any bumps the version).

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{Result, SnapshotArchiveError};
use crate::resource::{Snapshot, SnapshotPhase, SnapshotScope, SnapshotSpec, SnapshotStatus};

/// The format version of a Workspace snapshot's archive (unchanged since the first).
pub const FORMAT_VERSION: u64 = 1;
/// The format version of a Full snapshot's archive: version 1 plus [`ROOTFS_NAME`].
pub const FORMAT_VERSION_FULL: u64 = 2;
/// The name of the first entry.
pub const MANIFEST_NAME: &str = "manifest.json";
/// The name of the workspace entry: the stored tar of `/workspace`, byte for byte.
pub const WORKSPACE_NAME: &str = "workspace.tar";
/// The name of the root filesystem entry of a Full snapshot (version 2): the top layer of its
/// image, Docker's uncompressed layer tar (deletions as `.wh.` whiteout entries), byte for byte.
pub const ROOTFS_NAME: &str = "rootfs.tar";
/// The largest manifest an import reads.
pub const MAX_MANIFEST_BYTES: u64 = 1024 * 1024;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Manifest {
    pub format_version: u64,
    pub exported_at: DateTime<Utc>,
    pub snapshot: ManifestSnapshot,
    /// The image the snapshot's sandbox ran, which a sandbox made from it runs too.
    pub base_image: String,
    /// The entries after the manifest, in archive order.
    pub entries: Vec<ManifestEntry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestSnapshot {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub spec: SnapshotSpec,
    pub status: SnapshotStatus,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestEntry {
    pub name: String,
    pub size_bytes: u64,
    /// `sha256:<hex>` of the entry's bytes.
    pub digest: String,
}

fn refused(message: impl Into<String>) -> SnapshotArchiveError {
    SnapshotArchiveError::Refused(format!("manifest.json: {}", message.into()))
}

impl Manifest {
    /// The manifest of Ready `snapshot`, whose data file is `size` bytes and, for a Full
    /// snapshot, whose root filesystem layer is `rootfs_size` bytes.
    pub fn of(snapshot: &Snapshot, size: u64, rootfs_size: Option<u64>) -> Result<Manifest> {
        let status = snapshot.status.clone().unwrap_or_default();
        let name = &snapshot.metadata.name;
        let missing = |field: &str| {
            SnapshotArchiveError::NotReady(format!(
                "snapshot {name:?} has no status.{field}; only a Ready snapshot taken by this \
                 server can be exported"
            ))
        };
        let digest = status.digest.clone().ok_or_else(|| missing("digest"))?;
        let base_image = status.image.clone().ok_or_else(|| missing("image"))?;
        let mut entries = vec![ManifestEntry {
            name: WORKSPACE_NAME.into(),
            size_bytes: size,
            digest,
        }];
        let full = snapshot.spec.scope() == SnapshotScope::Full || status.rootfs_image.is_some();
        if full {
            let rootfs_digest = status
                .rootfs_digest
                .clone()
                .ok_or_else(|| missing("rootfsDigest"))?;
            let size_bytes = rootfs_size.ok_or_else(|| missing("rootfsImage"))?;
            entries.push(ManifestEntry {
                name: ROOTFS_NAME.into(),
                size_bytes,
                digest: rootfs_digest,
            });
        }
        Ok(Manifest {
            format_version: if full {
                FORMAT_VERSION_FULL
            } else {
                FORMAT_VERSION
            },
            exported_at: Utc::now(),
            snapshot: ManifestSnapshot {
                name: name.clone(),
                labels: snapshot.metadata.labels.clone(),
                annotations: snapshot.metadata.annotations.clone(),
                spec: snapshot.spec.clone(),
                status,
            },
            base_image,
            entries,
        })
    }

    /// Reads and checks a manifest: the version first (so that a newer format is named as such,
    /// not as a list of unknown fields), then every field, then that its parts agree.
    /// `max_workspace` is the largest workspace entry accepted (`AGENT_SANDBOX_MAX_SNAPSHOT_BYTES`).
    pub fn parse(bytes: &[u8], max_workspace: u64) -> Result<Manifest> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| refused(format!("not valid JSON: {e}")))?;
        let Some(object) = value.as_object() else {
            return Err(refused("not a JSON object"));
        };
        match object.get("formatVersion") {
            None => return Err(refused("formatVersion is missing")),
            Some(version)
                if version.as_u64() == Some(FORMAT_VERSION)
                    || version.as_u64() == Some(FORMAT_VERSION_FULL) => {}
            Some(version) => {
                return Err(refused(format!(
                    "formatVersion {version} is not supported: this server reads versions \
                     {FORMAT_VERSION} (Workspace snapshots) and {FORMAT_VERSION_FULL} (Full \
                     snapshots)"
                )))
            }
        }
        let manifest: Manifest =
            serde_json::from_value(value).map_err(|e| refused(e.to_string()))?;
        manifest.check(max_workspace)?;
        Ok(manifest)
    }

    fn check(&self, max_workspace: u64) -> Result<()> {
        let status = &self.snapshot.status;
        if status.phase != SnapshotPhase::Ready {
            return Err(refused(format!(
                "snapshot.status.phase is {:?}; only a Ready snapshot can be imported",
                status.phase
            )));
        }
        let full = self.format_version == FORMAT_VERSION_FULL;
        let expected: &[&str] = if full {
            &[WORKSPACE_NAME, ROOTFS_NAME]
        } else {
            &[WORKSPACE_NAME]
        };
        let names: Vec<&str> = self.entries.iter().map(|e| e.name.as_str()).collect();
        if names != expected {
            if !full && names.contains(&ROOTFS_NAME) {
                return Err(refused(format!(
                    "entries name {ROOTFS_NAME} (root filesystem changes of a Full snapshot), \
                     which format version {FORMAT_VERSION} does not carry: a Full snapshot's \
                     archive is format version {FORMAT_VERSION_FULL}"
                )));
            }
            return Err(refused(format!(
                "entries must be {expected:?} for format version {}; they are {names:?}",
                self.format_version
            )));
        }
        let entry = &self.entries[0];
        if entry.name != WORKSPACE_NAME {
            return Err(refused(format!(
                "entries[0].name is {:?}; expected {WORKSPACE_NAME:?}",
                entry.name
            )));
        }
        check_entry(0, WORKSPACE_NAME, entry, max_workspace)?;
        if status.digest.as_deref() != Some(entry.digest.as_str()) {
            return Err(refused(
                "snapshot.status.digest differs from entries[0].digest",
            ));
        }
        if status.size_bytes != Some(entry.size_bytes) {
            return Err(refused(
                "snapshot.status.sizeBytes differs from entries[0].sizeBytes",
            ));
        }
        if status.image.as_deref() != Some(self.base_image.as_str()) || self.base_image.is_empty() {
            return Err(refused("snapshot.status.image differs from baseImage"));
        }
        let scope_full = self.snapshot.spec.scope() == SnapshotScope::Full;
        if scope_full != full || (!full && status.rootfs_image.is_some()) {
            return Err(refused(format!(
                "snapshot.spec.scope is {:?}, but format version {} is for {} snapshots",
                self.snapshot.spec.scope(),
                self.format_version,
                if full { "Full" } else { "Workspace" }
            )));
        }
        if let Some(rootfs) = self.rootfs() {
            check_entry(1, ROOTFS_NAME, rootfs, max_workspace)?;
            if status.rootfs_digest.as_deref() != Some(rootfs.digest.as_str()) {
                return Err(refused(
                    "snapshot.status.rootfsDigest differs from entries[1].digest",
                ));
            }
        }
        if status.sandbox_spec.is_none() {
            return Err(refused(
                "snapshot.status.sandboxSpec is missing: a sandbox made from the snapshot \
                 takes its shape from it",
            ));
        }
        Ok(())
    }

    /// The workspace entry (present once [`Manifest::parse`] accepted the manifest).
    pub fn workspace(&self) -> &ManifestEntry {
        &self.entries[0]
    }

    /// The root filesystem entry of a Full snapshot's archive.
    pub fn rootfs(&self) -> Option<&ManifestEntry> {
        self.entries.get(1)
    }
}

/// Entry `index` (named `name`) gives a well-formed digest and a size within `max` bytes.
fn check_entry(index: usize, name: &str, entry: &ManifestEntry, max: u64) -> Result<()> {
    if !is_digest(&entry.digest) {
        return Err(refused(format!(
            "entries[{index}].digest {:?} is not sha256:<64 lowercase hex digits>",
            entry.digest
        )));
    }
    if entry.size_bytes > max {
        return Err(SnapshotArchiveError::TooLarge(format!(
            "the archive's {name} is {} bytes, over the limit of {max} bytes \
             (AGENT_SANDBOX_MAX_SNAPSHOT_BYTES)",
            entry.size_bytes
        )));
    }
    Ok(())
}

fn is_digest(text: &str) -> bool {
    text.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SandboxSpec;

    fn snapshot() -> Snapshot {
        let spec = SnapshotSpec {
            sandbox: "sb".into(),
            display_name: None,
            scope: None,
        };
        let mut snapshot = Snapshot::new("s1", spec);
        snapshot.status = Some(SnapshotStatus {
            phase: SnapshotPhase::Ready,
            size_bytes: Some(2048),
            digest: Some(format!("sha256:{}", "ab".repeat(32))),
            image: Some("busybox:latest".into()),
            sandbox_spec: Some(SandboxSpec::default()),
            ..SnapshotStatus::default()
        });
        snapshot
    }

    fn text(manifest: &Manifest) -> Vec<u8> {
        serde_json::to_vec(manifest).unwrap()
    }

    #[test]
    fn a_manifest_reads_back_as_written() {
        let manifest = Manifest::of(&snapshot(), 2048, None).unwrap();
        assert_eq!(Manifest::parse(&text(&manifest), 4096).unwrap(), manifest);
    }

    #[test]
    fn other_versions_are_named() {
        let mut value =
            serde_json::to_value(Manifest::of(&snapshot(), 2048, None).unwrap()).unwrap();
        value["formatVersion"] = 3.into();
        value["somethingNew"] = true.into();
        let error = Manifest::parse(value.to_string().as_bytes(), 4096).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("formatVersion 3 is not supported"),
            "{error}"
        );
        value.as_object_mut().unwrap().remove("formatVersion");
        let error = Manifest::parse(value.to_string().as_bytes(), 4096).unwrap_err();
        assert!(error.to_string().contains("formatVersion is missing"));
    }

    #[test]
    fn disagreeing_or_oversized_manifests_are_refused() {
        let good = Manifest::of(&snapshot(), 2048, None).unwrap();
        let mut bad = good.clone();
        bad.entries[0].digest = format!("sha256:{}", "cd".repeat(32));
        let error = Manifest::parse(&text(&bad), 4096).unwrap_err();
        assert!(
            error.to_string().contains("status.digest differs"),
            "{error}"
        );
        let error = Manifest::parse(&text(&good), 1024).unwrap_err();
        assert!(matches!(error, SnapshotArchiveError::TooLarge(_)));
        assert!(error
            .to_string()
            .contains("AGENT_SANDBOX_MAX_SNAPSHOT_BYTES"));
        let mut bad = good.clone();
        bad.entries[0].digest = "sha256:XYZ".into();
        assert!(Manifest::parse(&text(&bad), 4096).is_err());
        let mut bad = good.clone();
        bad.entries.push(ManifestEntry {
            name: ROOTFS_NAME.into(),
            size_bytes: 0,
            digest: good.entries[0].digest.clone(),
        });
        let error = Manifest::parse(&text(&bad), 4096).unwrap_err();
        assert!(error.to_string().contains("rootfs.tar"), "{error}");
        let mut full = good.clone();
        full.snapshot.spec.scope = Some(SnapshotScope::Full);
        full.snapshot.status.rootfs_digest = Some(good.entries[0].digest.clone());
        full.format_version = FORMAT_VERSION_FULL;
        full.entries.push(ManifestEntry {
            name: ROOTFS_NAME.into(),
            size_bytes: 1024,
            digest: good.entries[0].digest.clone(),
        });
        assert_eq!(Manifest::parse(&text(&full), 4096).unwrap(), full);
        let error = Manifest::parse(&text(&full), 1023).unwrap_err();
        assert!(
            matches!(error, SnapshotArchiveError::TooLarge(_)),
            "{error}"
        );
        let mut bad = full.clone();
        bad.entries[1].digest = format!("sha256:{}", "ef".repeat(32));
        let error = Manifest::parse(&text(&bad), 4096).unwrap_err();
        assert!(
            error.to_string().contains("rootfsDigest differs"),
            "{error}"
        );
        let mut bad = full.clone();
        bad.entries.pop();
        let error = Manifest::parse(&text(&bad), 4096).unwrap_err();
        assert!(error.to_string().contains("entries must be"), "{error}");
        let mut bad = full;
        bad.snapshot.spec.scope = None;
        let error = Manifest::parse(&text(&bad), 4096).unwrap_err();
        assert!(
            error.to_string().contains("is for Full snapshots"),
            "{error}"
        );
        let mut bad = good;
        bad.snapshot.status.phase = SnapshotPhase::Pending;
        assert!(Manifest::parse(&text(&bad), 4096).is_err());
        assert!(Manifest::parse(b"[1]", 4096).is_err());
    }
}
