//! The `SandboxPool` kind: a number of hardened, running, unassigned containers with ready
//! workspaces, which new sandboxes with matching immutable properties claim instead of waiting for
//! a container to be created and started.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Condition;

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxPoolSpec {
    /// Image of the pooled containers; only sandboxes of this image claim them.
    #[schemars(length(min = 1, max = 512))]
    pub image: String,
    /// How many unassigned containers to keep ready.
    #[schemars(range(max = 200))]
    pub size: u32,
    /// Root filesystem mode of the pooled containers (default true); part of the match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_rootfs: Option<bool>,
    /// Whether pooled containers sit on the sandbox bridge (default false); part of the match,
    /// because Docker cannot attach a running network-less container to a network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// Docker runtime of the pooled containers (default: the server's); part of the match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub runtime: Option<String>,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxPoolStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Unassigned containers running and ready to be claimed.
    #[serde(default)]
    pub ready_replicas: u32,
    /// Sandboxes currently running on a container claimed from this pool.
    #[serde(default)]
    pub claimed: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
