//! The `Sandbox` kind: what a user declares (spec) and what the controller observes (status), and
//! the split of spec fields into those applied in place and those that need a new container.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Condition;

/// Desired state of one sandbox. Every limit is optional; the server's defaults fill the gaps and
/// its maximums bound them (see `config::Settings`).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSpec {
    /// Container image; must match the server's allowlist. Default: the server's default image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// CPU limit in cores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1024.0))]
    pub cpus: Option<f64>,
    /// Memory limit in MiB; swap is off, so this is memory plus swap too.
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub memory_mb: Option<u64>,
    /// Maximum number of processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8, max = 1048576))]
    pub pids_limit: Option<u64>,
    /// Join the dedicated bridge network (inter-container traffic disabled) instead of loopback only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// Keep the root filesystem read-only (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_rootfs: Option<bool>,
    /// Environment for the sandbox's processes; exec requests add to it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Lifetime in seconds, counted from creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ttl_seconds: Option<u64>,
    /// Absolute deadline; the earlier of this and `ttlSeconds` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<DateTime<Utc>>,
    /// Start from a snapshot's workspace. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SandboxSource>,
    /// A new `requestId` asks the controller for exactly one rollback to `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackRequest>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxSource {
    #[schemars(length(min = 1, max = 63))]
    pub snapshot: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackRequest {
    #[schemars(length(min = 1, max = 63))]
    pub snapshot: String,
    #[schemars(length(min = 1, max = 128))]
    pub request_id: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SandboxPhase {
    #[default]
    Pending,
    Creating,
    Running,
    Paused,
    Failed,
    Expired,
    Terminating,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxStatus {
    #[serde(default)]
    pub phase: SandboxPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// When the current lifetime began: creation, or the document change that revived an
    /// expired folder-owned sandbox. `ttlSeconds` counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_since: Option<DateTime<Utc>>,
    /// The generation that expired, for folder-owned sandboxes kept as `Expired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expired_generation: Option<u64>,
    /// The snapshot whose content the current workspace was built from (source or last rollback).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_snapshot: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_rollback: Option<RollbackRecord>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackRecord {
    pub request_id: String,
    pub snapshot: String,
    pub completed_at: DateTime<Utc>,
}
