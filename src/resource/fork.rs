//! The `Fork` kind: keeps `replicas` child Sandboxes started from one snapshot.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::meta::Condition;

fn one() -> u32 {
    1
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkSpec {
    #[schemars(length(min = 1, max = 63))]
    pub snapshot: String,
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 100))]
    pub replicas: u32,
    #[serde(default, skip_serializing_if = "ForkOverrides::is_empty")]
    pub overrides: ForkOverrides,
}

/// The parts of the snapshot's captured spec a fork may change.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ttl_seconds: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.01, max = 1024.0))]
    pub cpus: Option<f64>,
    #[serde(default, rename = "memoryMB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 16, max = 1048576))]
    pub memory_mb: Option<u64>,
}

impl ForkOverrides {
    pub fn is_empty(&self) -> bool {
        self == &ForkOverrides::default()
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ForkPhase {
    #[default]
    Pending,
    Progressing,
    Ready,
    Failed,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkStatus {
    #[serde(default)]
    pub phase: ForkPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Names of the child Sandboxes, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<String>,
    #[serde(default)]
    pub ready_replicas: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
