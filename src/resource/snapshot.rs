//! The `Snapshot` kind: a tar of one sandbox's `/workspace`, taken once. Its spec is immutable.

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
}

impl SnapshotSpec {
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// `sha256:<hex>` of the stored tar.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
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
    }
}
