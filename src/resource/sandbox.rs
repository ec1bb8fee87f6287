//! The `Sandbox` kind: what a user declares (spec) and what the controller observes (status), and
//! the split of spec fields into those applied in place and those that need a new container.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::egress::{AllowEntryError, EgressSpec};
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
    /// Size limit of `/workspace` in MiB: writes beyond it fail inside the sandbox with "no
    /// space" (ENOSPC). 0 is no limit. Default: the server's `AGENT_SANDBOX_DEFAULT_DISK_MB`.
    /// Raising it applies to the running sandbox; lowering it applies to the next new workspace
    /// (a rollback).
    #[serde(default, rename = "diskMB", skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 16777216))]
    pub disk_mb: Option<u64>,
    /// Maximum number of processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 8, max = 1048576))]
    pub pids_limit: Option<u64>,
    /// Join the dedicated bridge network (inter-container traffic disabled) instead of loopback only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<bool>,
    /// What the network may reach: with it set, nothing but the destinations `allow` lists
    /// (through the server's egress gateway). Needs `network: true`. Edits of the list apply to
    /// the next connection, in the same container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<EgressSpec>,
    /// Keep the root filesystem read-only (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only_rootfs: Option<bool>,
    /// Environment for the sandbox's commands; exec requests add to it. A change applies to the
    /// next command, in the same container.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Lifetime in seconds, counted from creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub ttl_seconds: Option<u64>,
    /// Absolute deadline; the earlier of this and `ttlSeconds` wins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_time: Option<DateTime<Utc>>,
    /// What the end of the lifetime (`ttlSeconds`, `shutdownTime`) does: `Delete` (the default)
    /// deletes the sandbox; `Pause` or `Stop` sets `spec.state` instead and keeps the sandbox.
    /// With `Pause` or `Stop` the lifetime runs only while the sandbox runs: it starts again at
    /// each resume (`ttlSeconds` from then; a `shutdownTime` from before the resume no longer
    /// counts). A lifetime that `shutdownTime` alone set becomes `ttlSeconds` of its length when
    /// it ends, so the next one is as long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expiry_action: Option<ExpiryAction>,
    /// Start from a snapshot's workspace. Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SandboxSource>,
    /// A `SandboxTemplate` whose values fill every field this spec leaves unset, as the template
    /// was when the sandbox was made (see `status.template`). Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub template: Option<String>,
    /// A new `requestId` asks the controller for exactly one rollback to `snapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback: Option<RollbackRequest>,
    /// `Running` (the default), `Paused` (every process frozen, memory kept) or `Stopped` (the
    /// container stopped; `/workspace`, and the root filesystem when it is writable, kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<SandboxState>,
    /// Pause or stop the sandbox after this long without activity (API calls on it, running
    /// commands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle: Option<IdlePolicy>,
    /// Whether an exec or file call on a paused or stopped sandbox resumes it first (default
    /// true); when false such calls answer 409 `sandbox_paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_resume: Option<bool>,
    /// When the image is pulled: `IfNotPresent` (when missing), `Always` (before every new
    /// container) or `Never`. Default: the server's `AGENT_SANDBOX_IMAGE_PULL_POLICY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<ImagePullPolicy>,
    /// Long-running commands kept up while the container runs (see `docs/ports.md`). A change
    /// restarts only the services it changes, in the same container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<super::ServiceSpec>,
    /// Secrets the sandbox's requests may carry without the sandbox ever holding them: `env`
    /// holds a placeholder, and the egress gateway writes the Secret's value into requests to
    /// the Secret's hosts. Needs `network: true` and an egress list. Changes apply in place.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub secrets: Vec<SecretEnv>,
}

/// One entry of `spec.secrets`: which variable holds the placeholder of which Secret.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretEnv {
    /// The environment variable that holds the placeholder (e.g. `OPENAI_API_KEY`).
    #[schemars(length(min = 1, max = 128))]
    pub env: String,
    /// The name of a `Secret` on this server.
    #[schemars(length(min = 1, max = 63))]
    pub secret: String,
}

/// When a sandbox's image is pulled from its registry.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImagePullPolicy {
    #[default]
    IfNotPresent,
    Always,
    Never,
}

impl std::str::FromStr for ImagePullPolicy {
    type Err = String;

    fn from_str(text: &str) -> Result<ImagePullPolicy, String> {
        match text {
            "IfNotPresent" => Ok(ImagePullPolicy::IfNotPresent),
            "Always" => Ok(ImagePullPolicy::Always),
            "Never" => Ok(ImagePullPolicy::Never),
            other => Err(format!(
                "{other:?} is not an image pull policy (IfNotPresent, Always or Never)"
            )),
        }
    }
}

/// How far the pull of a sandbox's image has come, in bytes of its layers.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ImagePullProgress {
    pub bytes_done: u64,
    pub bytes_total: u64,
}

/// What a sandbox's container should be doing.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SandboxState {
    #[default]
    Running,
    Paused,
    Stopped,
}

/// `spec.idle`: what to do with a sandbox nobody has used for a while.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IdlePolicy {
    /// Seconds without activity after which `action` is taken.
    #[schemars(range(min = 1))]
    pub after_seconds: u64,
    /// `Pause` (the default) or `Stop`.
    #[serde(default)]
    pub action: IdleAction,
}

/// `spec.expiryAction`: what the end of a sandbox's lifetime does to it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ExpiryAction {
    #[default]
    Delete,
    Pause,
    Stop,
}

impl ExpiryAction {
    /// The state the end of the lifetime puts the sandbox in; `None` when it deletes it.
    pub fn state(self) -> Option<SandboxState> {
        match self {
            ExpiryAction::Delete => None,
            ExpiryAction::Pause => Some(SandboxState::Paused),
            ExpiryAction::Stop => Some(SandboxState::Stopped),
        }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdleAction {
    #[default]
    Pause,
    Stop,
}

impl SandboxState {
    /// The phase of a sandbox held in this state.
    pub fn phase(self) -> SandboxPhase {
        match self {
            SandboxState::Running => SandboxPhase::Running,
            SandboxState::Paused => SandboxPhase::Paused,
            SandboxState::Stopped => SandboxPhase::Stopped,
        }
    }
}

impl IdleAction {
    /// The state this action puts a sandbox in.
    pub fn state(self) -> SandboxState {
        match self {
            IdleAction::Pause => SandboxState::Paused,
            IdleAction::Stop => SandboxState::Stopped,
        }
    }
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
    Stopped,
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
    /// When the current workspace came from a `Full` snapshot: the root filesystem its
    /// containers start from instead of the plain image (also after a container replacement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<RootfsRecord>,
    /// The Docker volume currently mounted at `/workspace` (a rollback builds a new one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace_volume: Option<String>,
    /// The template the sandbox was made from, at which generation, with the values it took.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<super::TemplateRecord>,
    /// The warm pool the current container was claimed from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_from: Option<String>,
    /// Container-shape hash of the spec a claimed pool container now serves (its labels still
    /// carry the pool's, since Docker cannot relabel a container).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_hash: Option<String>,
    /// The CPU, memory and pids limits last applied to the container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_limits: Option<AppliedLimits>,
    /// When the sandbox was last resumed from `Paused` or `Stopped`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resumed_at: Option<DateTime<Utc>>,
    /// How many times it was resumed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub resumes: u64,
    /// The pull of the image, while one runs (and its totals once it is done).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull: Option<ImagePullProgress>,
    /// Set when the idle policy paused or stopped the sandbox: the last activity before that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<DateTime<Utc>>,
    /// The declared services, as last seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<super::ServiceStatus>,
    /// TCP ports something listens on inside the sandbox, ascending (refreshed every few seconds
    /// while someone reads the sandbox).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listening_ports: Vec<u16>,
    /// Why the container, or a process in it, last died, as Docker reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_termination: Option<Termination>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Why something in a sandbox died.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq, Eq)]
pub enum TerminationReason {
    /// The kernel killed a process (the container's or a command's) for want of memory.
    #[serde(rename = "OOMKilled")]
    OomKilled,
    /// Someone asked Docker to stop or kill the container.
    Killed,
    /// The in-sandbox helper (the container's main process) ended without being asked.
    HelperLost,
    /// The container's main process ended on its own.
    Exited,
}

impl TerminationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            TerminationReason::OomKilled => "OOMKilled",
            TerminationReason::Killed => "Killed",
            TerminationReason::HelperLost => "HelperLost",
            TerminationReason::Exited => "Exited",
        }
    }
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Termination {
    pub reason: TerminationReason,
    /// The container's exit code, when the container itself stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// The signal that ended it, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i64>,
    /// The container the death happened in.
    #[serde(
        default,
        rename = "containerID",
        skip_serializing_if = "Option::is_none"
    )]
    pub container_id: Option<String>,
    pub at: DateTime<Utc>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppliedLimits {
    pub cpus: f64,
    #[serde(rename = "memoryMB")]
    pub memory_mb: u64,
    pub pids_limit: u64,
}

#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RollbackRecord {
    pub request_id: String,
    pub snapshot: String,
    pub completed_at: DateTime<Utc>,
}

/// The root filesystem of a `Full` snapshot a sandbox runs on.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RootfsRecord {
    /// The snapshot it was taken by.
    pub snapshot: String,
    /// The image holding the image's content plus the snapshot's changes.
    pub image: String,
    /// The image the changes were made on top of.
    pub base_image: String,
}

impl RootfsRecord {
    /// Whether a sandbox whose `spec.image` is `spec_image` runs on it: when the spec names no
    /// image, or names the one the changes were made on.
    pub fn applies_to(&self, spec_image: Option<&str>) -> bool {
        spec_image.is_none_or(|image| image == self.base_image)
    }
}

/// A spec the schema lets through but that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    #[error("spec.egress needs spec.network: true")]
    EgressWithoutNetwork,
    #[error(transparent)]
    Allow(AllowEntryError),
    #[error(
        "spec.secrets needs spec.network: true and spec.egress (the gateway puts the values in)"
    )]
    SecretsWithoutEgress,
    #[error("spec.secrets[{index}].{field}: {reason}")]
    Secret {
        index: usize,
        field: &'static str,
        reason: String,
    },
}

impl SpecError {
    /// JSON pointer of the offending value.
    pub fn pointer(&self) -> String {
        match self {
            SpecError::EgressWithoutNetwork => "/spec/egress".into(),
            SpecError::Allow(e) => format!("/spec/egress/allow/{}", e.index),
            SpecError::SecretsWithoutEgress => "/spec/secrets".into(),
            SpecError::Secret { index, field, .. } => format!("/spec/secrets/{index}/{field}"),
        }
    }
}

/// Server defaults and bounds that turn a [`SandboxSpec`] into concrete values.
#[derive(Clone, Debug)]
pub struct SandboxDefaults {
    pub image: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_limit: u64,
    /// `spec.diskMB` when a sandbox sets none (0: no limit).
    pub disk_mb: u64,
    /// Sandboxes with a network that set no `egress` get the server's default allow list.
    pub egress_by_default: bool,
}

/// A sandbox spec with every default filled in: what the container is actually built from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct EffectiveSandbox {
    pub image: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_limit: u64,
    /// The workspace's size limit in MiB (0: none).
    pub disk_mb: u64,
    pub network: bool,
    /// The network goes through the egress gateway (an allow list applies), rather than open.
    pub egress: bool,
    pub read_only_rootfs: bool,
    pub env: BTreeMap<String, String>,
}

impl SandboxSpec {
    /// The rollback this spec asks for that `status` does not record as done yet.
    pub fn pending_rollback(&self, status: Option<&SandboxStatus>) -> Option<&RollbackRequest> {
        let request = self.rollback.as_ref()?;
        let done = status
            .and_then(|s| s.last_rollback.as_ref())
            .is_some_and(|r| r.request_id == request.request_id);
        (!done).then_some(request)
    }

    pub fn effective(&self, defaults: &SandboxDefaults) -> EffectiveSandbox {
        let network = self.network.unwrap_or(false);
        EffectiveSandbox {
            egress: network && (self.egress.is_some() || defaults.egress_by_default),
            image: self.image.clone().unwrap_or_else(|| defaults.image.clone()),
            cpus: self.cpus.unwrap_or(defaults.cpus),
            memory_mb: self.memory_mb.unwrap_or(defaults.memory_mb),
            pids_limit: self.pids_limit.unwrap_or(defaults.pids_limit),
            disk_mb: self.disk_mb.unwrap_or(defaults.disk_mb),
            network,
            read_only_rootfs: self.read_only_rootfs.unwrap_or(true),
            env: self.env.clone(),
        }
    }

    /// What a schema cannot say: every `egress.allow` entry is one, and `egress` comes with
    /// `network: true`.
    pub fn check(&self) -> Result<(), SpecError> {
        self.check_secrets()?;
        let Some(egress) = &self.egress else {
            return Ok(());
        };
        if self.network != Some(true) {
            return Err(SpecError::EgressWithoutNetwork);
        }
        egress.rules().map(|_| ()).map_err(SpecError::Allow)
    }

    /// `secrets` entries: a variable name each, used once and not in `env`, a Secret name, and
    /// a network through the gateway (without it nothing would put the values in).
    fn check_secrets(&self) -> Result<(), SpecError> {
        if self.secrets.is_empty() {
            return Ok(());
        }
        if self.network != Some(true) || self.egress.is_none() {
            return Err(SpecError::SecretsWithoutEgress);
        }
        let mut seen = std::collections::HashSet::new();
        for (index, entry) in self.secrets.iter().enumerate() {
            let bad = |field, reason: String| SpecError::Secret {
                index,
                field,
                reason,
            };
            let env = entry.env.as_str();
            let is_name = env
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && env.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !is_name {
                return Err(bad(
                    "env",
                    format!("{env:?} is not a variable name (letters, digits, '_')"),
                ));
            }
            if !seen.insert(env) || self.env.contains_key(env) {
                return Err(bad(
                    "env",
                    format!("{env:?} is set twice (here and in spec.env or another entry)"),
                ));
            }
            if !super::is_valid_name(&entry.secret) {
                return Err(bad(
                    "secret",
                    format!("{:?} is not a Secret name", entry.secret),
                ));
            }
        }
        Ok(())
    }

    /// The state the spec asks for.
    pub fn desired_state(&self) -> SandboxState {
        self.state.unwrap_or_default()
    }

    /// The state the end of the lifetime puts the sandbox in; `None` when it deletes it.
    pub fn expiry_state(&self) -> Option<SandboxState> {
        self.expiry_action.unwrap_or_default().state()
    }

    /// Whether calls on a paused or stopped sandbox resume it.
    pub fn auto_resumes(&self) -> bool {
        self.auto_resume.unwrap_or(true)
    }

    /// When this sandbox's lifetime ends, counted from `anchor` (creation, or a revival).
    pub fn expires_at(&self, anchor: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let by_ttl = self
            .ttl_seconds
            .and_then(|ttl| i64::try_from(ttl).ok())
            .and_then(chrono::TimeDelta::try_seconds)
            .and_then(|d| anchor.checked_add_signed(d));
        // A sandbox its lifetime's end keeps starts a new lifetime at each resume: a deadline
        // from before that start belongs to an earlier one.
        let shutdown = self
            .shutdown_time
            .filter(|at| self.expiry_state().is_none() || *at > anchor);
        match (by_ttl, shutdown) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl SandboxSpec {
    /// The immutable fields `new` changes, as paths: `spec.source` (a workspace is built from
    /// a snapshot once; a rollback replaces it) and `spec.template`. Updates through the API and folder edits are
    /// refused when this is not empty.
    pub fn immutable_changes(&self, new: &SandboxSpec) -> Vec<&'static str> {
        let mut changed = Vec::new();
        if self.source != new.source {
            changed.push("spec.source");
        }
        // A sandbox is made from a template once; its values are kept in `status.template`.
        if self.template != new.template {
            changed.push("spec.template");
        }
        changed
    }
}

impl EffectiveSandbox {
    /// The part that shapes the container and cannot change in place: a different hash means a new
    /// container (the workspace volume is kept). Limits are left out: they are updated live. So
    /// is the env: every command gets it from the spec as it is when the command starts (no
    /// container carries it), so a change reaches the next command without a new container.
    pub fn container_hash(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut shape = serde_json::json!({
            "image": self.image,
            "network": self.network,
            "readOnlyRootfs": self.read_only_rootfs,
        });
        // Only when set, so that the containers of sandboxes without egress keep their hash.
        // The list itself is left out: the gateway reads it at each connection.
        if self.egress {
            shape["egress"] = serde_json::Value::Bool(true);
            // Policed containers mount the gateway's CA bundle; those made before it existed
            // are replaced once, since their commands are told to trust a file they lack.
            shape["egressCa"] = serde_json::Value::Bool(true);
        }
        let digest = Sha256::digest(shape.to_string().as_bytes());
        hex::encode(&digest[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> SandboxDefaults {
        SandboxDefaults {
            image: "img".into(),
            cpus: 1.0,
            memory_mb: 512,
            pids_limit: 256,
            disk_mb: 0,
            egress_by_default: false,
        }
    }

    #[test]
    fn a_kept_sandbox_counts_its_lifetime_from_each_resume() {
        let t0 = Utc::now();
        let resumed = t0 + chrono::TimeDelta::seconds(100);
        let mut spec = SandboxSpec {
            ttl_seconds: Some(10),
            shutdown_time: Some(t0 + chrono::TimeDelta::seconds(5)),
            ..SandboxSpec::default()
        };
        // Deleted at the end: the earlier deadline wins, wherever the lifetime starts.
        assert_eq!(spec.expiry_state(), None);
        assert_eq!(spec.expires_at(t0), spec.shutdown_time);
        assert_eq!(spec.expires_at(resumed), spec.shutdown_time);
        // Kept at the end: a deadline from before the current lifetime no longer counts.
        spec.expiry_action = Some(ExpiryAction::Pause);
        assert_eq!(spec.expiry_state(), Some(SandboxState::Paused));
        assert_eq!(spec.expires_at(t0), spec.shutdown_time);
        assert_eq!(
            spec.expires_at(resumed),
            Some(resumed + chrono::TimeDelta::seconds(10))
        );
        spec.expiry_action = Some(ExpiryAction::Stop);
        assert_eq!(spec.expiry_state(), Some(SandboxState::Stopped));
    }

    #[test]
    fn egress_needs_a_network_and_valid_entries() {
        let mut spec = SandboxSpec {
            egress: Some(EgressSpec {
                allow: vec!["pypi.org".into()],
            }),
            ..SandboxSpec::default()
        };
        assert_eq!(spec.check(), Err(SpecError::EgressWithoutNetwork));
        spec.network = Some(true);
        spec.check().unwrap();
        spec.egress = Some(EgressSpec {
            allow: vec!["pypi.org".into(), "*.org:99999".into()],
        });
        let error = spec.check().unwrap_err();
        assert_eq!(error.pointer(), "/spec/egress/allow/1");
        assert!(
            error.to_string().contains("allow[1] \"*.org:99999\""),
            "{error}"
        );
    }

    #[test]
    fn the_allow_list_changes_in_place_but_policing_does_not() {
        let open = SandboxSpec {
            network: Some(true),
            ..SandboxSpec::default()
        };
        let mut policed = open.clone();
        policed.egress = Some(EgressSpec {
            allow: vec!["a.example".into()],
        });
        let mut edited = policed.clone();
        edited.egress = Some(EgressSpec {
            allow: vec!["b.example".into()],
        });
        let hash = |s: &SandboxSpec| s.effective(&defaults()).container_hash();
        assert_eq!(hash(&policed), hash(&edited));
        assert_ne!(hash(&open), hash(&policed));
        let mut by_default = defaults();
        by_default.egress_by_default = true;
        assert!(open.effective(&by_default).egress);
        assert!(!SandboxSpec::default().effective(&by_default).egress);
    }

    #[test]
    fn limits_and_env_do_not_change_the_container_hash_but_shape_does() {
        let base = SandboxSpec::default().effective(&defaults());
        let mut limits = base.clone();
        limits.cpus = 2.0;
        limits.memory_mb = 1024;
        assert_eq!(base.container_hash(), limits.container_hash());
        let mut image = base.clone();
        image.image = "other".into();
        assert_ne!(base.container_hash(), image.container_hash());
        let mut env = base.clone();
        env.env.insert("A".into(), "b".into());
        assert_eq!(base.container_hash(), env.container_hash());
        let mut writable = base.clone();
        writable.read_only_rootfs = !base.read_only_rootfs;
        assert_ne!(base.container_hash(), writable.container_hash());
        assert_eq!(
            base.container_hash(),
            SandboxSpec::default()
                .effective(&defaults())
                .container_hash()
        );
    }

    #[test]
    fn only_the_source_is_immutable() {
        let old = SandboxSpec {
            source: Some(SandboxSource {
                snapshot: "s1".into(),
            }),
            ..SandboxSpec::default()
        };
        let mut new = old.clone();
        new.cpus = Some(2.0);
        new.image = Some("other".into());
        assert!(old.immutable_changes(&new).is_empty());
        new.source = None;
        assert_eq!(old.immutable_changes(&new), ["spec.source"]);
        assert_eq!(new.immutable_changes(&old), ["spec.source"]);
    }

    #[test]
    fn the_earlier_deadline_wins() {
        let anchor = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let mut spec = SandboxSpec {
            ttl_seconds: Some(60),
            ..SandboxSpec::default()
        };
        assert_eq!(
            spec.expires_at(anchor).unwrap().to_rfc3339(),
            "2026-01-01T00:01:00+00:00"
        );
        spec.shutdown_time = Some(anchor + chrono::TimeDelta::seconds(30));
        assert_eq!(spec.expires_at(anchor), spec.shutdown_time);
        spec.ttl_seconds = None;
        assert_eq!(spec.expires_at(anchor), spec.shutdown_time);
        assert_eq!(SandboxSpec::default().expires_at(anchor), None);
    }
}
