//! The `ResourceQuota` kind: limits on what the sandboxes and snapshots of one namespace may use
//! together, and (in its status) what they use now. What counts and whether a change fits is
//! decided in `quota`; this module owns the document.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Limits; a limit left out is no limit.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceQuotaSpec {
    /// Sandboxes that exist (all but those being deleted or expired).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u64>,
    /// The sum of those sandboxes' CPU limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub cpus: Option<f64>,
    /// The sum of those sandboxes' memory limits, in MiB.
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Snapshots that exist.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots: Option<u64>,
    /// The sum of those snapshots' sizes (`status.sizeBytes`), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_bytes: Option<u64>,
    /// The sum of those sandboxes' workspace size limits (`spec.diskMB`), in MiB. With it set,
    /// a sandbox without a limit is refused: it could fill any amount.
    #[serde(
        default,
        rename = "workspaceMB",
        skip_serializing_if = "Option::is_none"
    )]
    pub workspace_mb: Option<u64>,
}

/// What the namespace's sandboxes and snapshots use, in the units of the spec.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct QuotaUsage {
    #[serde(default)]
    pub sandboxes: u64,
    #[serde(default)]
    pub cpus: f64,
    #[serde(default, rename = "memoryMB")]
    pub memory_mb: u64,
    #[serde(default)]
    pub snapshots: u64,
    #[serde(default)]
    pub snapshot_bytes: u64,
    #[serde(default, rename = "workspaceMB")]
    pub workspace_mb: u64,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ResourceQuotaStatus {
    /// Recomputed from what exists at each change, so it never drifts.
    #[serde(default)]
    pub used: QuotaUsage,
}
