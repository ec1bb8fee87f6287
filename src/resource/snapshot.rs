//! The `Snapshot` kind: a tar of one sandbox's `/workspace` and, with `scope: Full`, its root
//! filesystem changes, taken once. Its spec is immutable.

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Condition;
use super::sandbox::SandboxSpec;

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotSpec {
    /// The sandbox whose workspace is captured.
    #[schemars(length(min = 1, max = 63))]
    pub sandbox: String,
    /// A human label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub display_name: Option<String>,
    /// What is captured: `Workspace` (the default) is `/workspace` only; `Full` adds every
    /// change to the root filesystem (files added, changed and deleted, with modes, owners and
    /// symlinks) of a sandbox with `readOnlyRootfs: false`. Memory and processes are never
    /// captured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SnapshotScope>,
}

/// What a snapshot captures: `Workspace` is `/workspace` only, `Full` is `/workspace` and the
/// root filesystem's changes against the image.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SnapshotScope {
    #[default]
    Workspace,
    Full,
}

impl SnapshotSpec {
    /// `spec.scope` with its default.
    pub fn scope(&self) -> SnapshotScope {
        self.scope.unwrap_or_default()
    }

    /// The fields `new` changes, as paths: every field of a snapshot's spec is immutable (it is
    /// taken once). Updates through the API and folder edits are refused when this is not empty.
    pub fn immutable_changes(&self, new: &SnapshotSpec) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.sandbox != new.sandbox {
            changed.push("spec.sandbox");
        }
        if self.display_name != new.display_name {
            changed.push("spec.displayName");
        }
        if self.scope() != new.scope() {
            changed.push("spec.scope");
        }
        changed
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SnapshotPhase {
    #[default]
    Pending,
    Ready,
    Failed,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotStatus {
    #[serde(default)]
    pub phase: SnapshotPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Size of the stored workspace tar (the same as `workspaceBytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// `sha256:<hex>` of the stored workspace tar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// What the snapshot captured (`spec.scope` when it was taken).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<SnapshotScope>,
    /// Size of the stored workspace tar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_bytes: Option<u64>,
    /// `Full` only: how many bytes the root filesystem changes add to the image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_bytes: Option<u64>,
    /// `Full` only: `sha256:<hex>` of the uncompressed tar of the root filesystem changes
    /// (the layer's digest, deletions as whiteout entries).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_digest: Option<String>,
    /// `Full` only: the image holding the root filesystem changes on top of `image`, from which
    /// restores of the snapshot start their containers. Made by the server, removed with the
    /// snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs_image: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The sandbox spec at the time of the snapshot, with the server defaults filled in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox_spec: Option<SandboxSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_field_is_immutable() {
        let old = SnapshotSpec {
            sandbox: "a".into(),
            display_name: None,
            scope: None,
        };
        assert!(old.immutable_changes(&old.clone()).is_empty());
        let mut new = old.clone();
        new.sandbox = "b".into();
        assert_eq!(old.immutable_changes(&new), ["spec.sandbox"]);
        new.display_name = Some("x".into());
        assert_eq!(
            old.immutable_changes(&new),
            ["spec.sandbox", "spec.displayName"]
        );
        // The default spelled out is no change.
        let mut explicit = old.clone();
        explicit.scope = Some(SnapshotScope::Workspace);
        assert!(old.immutable_changes(&explicit).is_empty());
        new.scope = Some(SnapshotScope::Full);
        assert_eq!(
            old.immutable_changes(&new),
            ["spec.sandbox", "spec.displayName", "spec.scope"]
        );
    }
}
