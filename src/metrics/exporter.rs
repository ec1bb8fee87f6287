//! Reads what is, for a scrape and for one sandbox's usage: resources from the store, each
//! running sandbox's cgroup on this host (no Docker call), and its workspace's size on disk. It
//! also samples those cgroups into the last hour of history charts draw from (`history.rs`).
//!
//! Sizing a workspace walks its files, which no scrape should wait for: each scrape reports the
//! size last measured and, when that is older than [`WORKSPACE_REFRESH`], has it measured again
//! in the background, one workspace at a time (the directory comes from one inspect of the
//! container, remembered while the container lives). A workspace is only measured when its
//! container's cgroup is on this host, so a remote daemon's path is never walked here.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::history::{self, UsageHistory, UsagePoint};
use super::usage::{network_bytes, CgroupUsage, Cgroups};
use super::{Metrics, PoolSample, SandboxSample, SnapshotSample, State};
use crate::docker::Engine;
use crate::resource::{Kind, Sandbox, SandboxPhase, SnapshotPhase};
use crate::store::Store;

/// How old a workspace's measured size may get before a scrape has it measured again.
pub const WORKSPACE_REFRESH: Duration = Duration::from_secs(60);
/// How old a measured size may be to answer a sandbox's stats.
pub const WORKSPACE_FRESH: Duration = Duration::from_secs(5);

const SANDBOX_PHASES: [SandboxPhase; 8] = [
    SandboxPhase::Pending,
    SandboxPhase::Creating,
    SandboxPhase::Running,
    SandboxPhase::Paused,
    SandboxPhase::Stopped,
    SandboxPhase::Failed,
    SandboxPhase::Expired,
    SandboxPhase::Terminating,
];

fn sandbox_phase(phase: SandboxPhase) -> &'static str {
    match phase {
        SandboxPhase::Pending => "Pending",
        SandboxPhase::Creating => "Creating",
        SandboxPhase::Running => "Running",
        SandboxPhase::Paused => "Paused",
        SandboxPhase::Stopped => "Stopped",
        SandboxPhase::Failed => "Failed",
        SandboxPhase::Expired => "Expired",
        SandboxPhase::Terminating => "Terminating",
    }
}

fn snapshot_phase(phase: SnapshotPhase) -> &'static str {
    match phase {
        SnapshotPhase::Pending => "Pending",
        SnapshotPhase::Ready => "Ready",
        SnapshotPhase::Failed => "Failed",
    }
}

/// One sandbox's usage now.
#[derive(Clone, Debug, PartialEq)]
pub struct SandboxUsage {
    pub cgroup: CgroupUsage,
    /// Bytes of its workspace on disk, measured for this answer (`None`: not readable here).
    pub workspace_bytes: Option<u64>,
    /// Bytes received and sent over its network interfaces (loopback left out).
    pub network: Option<(u64, u64)>,
    pub sampled_at: DateTime<Utc>,
}

/// Why a sandbox's usage cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("sandbox {0} has no running container")]
    NotRunning(String),
    #[error(
        "the usage of sandbox {0} cannot be read on this host (its container's cgroup is not \
         here: the Docker daemon runs elsewhere, or cgroups are not mounted)"
    )]
    Unavailable(String),
    #[error("{0}")]
    Docker(#[from] crate::docker::EngineError),
}

/// What is known of one container's workspace.
#[derive(Default)]
struct Workspace {
    /// The volume's directory on this host, once the container was inspected.
    source: Option<PathBuf>,
    bytes: Option<u64>,
    measured_at: Option<Instant>,
    measuring: bool,
}

/// Reads what is, for `/metrics` and a sandbox's stats.
pub struct Exporter {
    metrics: Metrics,
    store: Arc<Store>,
    engine: Arc<dyn Engine>,
    cgroups: Cgroups,
    queue_depth: Box<dyn Fn() -> usize + Send + Sync>,
    /// By container ID.
    workspaces: Mutex<HashMap<String, Workspace>>,
    /// One workspace measured at a time.
    measuring: tokio::sync::Semaphore,
    /// The last hour of each running sandbox's CPU and memory (see `history.rs`).
    history: UsageHistory,
}

impl Exporter {
    /// `queue_depth` tells how many resources wait in the controller's work queue.
    pub fn new(
        metrics: Metrics,
        store: Arc<Store>,
        engine: Arc<dyn Engine>,
        queue_depth: Box<dyn Fn() -> usize + Send + Sync>,
    ) -> Exporter {
        Exporter {
            metrics,
            store,
            engine,
            cgroups: Cgroups::discover(),
            queue_depth,
            workspaces: Mutex::default(),
            measuring: tokio::sync::Semaphore::new(1),
            history: UsageHistory::default(),
        }
    }

    /// The kept points of `sandbox`'s usage, oldest first.
    pub fn history(&self, sandbox: &str) -> Vec<UsagePoint> {
        self.history.of(sandbox)
    }

    /// Samples every running or paused sandbox's cgroup into the history every
    /// [`history::INTERVAL`], for as long as the task runs (the server aborts it on its way out).
    pub async fn keep_history(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(history::INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            ticks.tick().await;
            self.sample_history();
        }
    }

    fn sample_history(&self) {
        let mut live = HashSet::new();
        for entry in self.store.list(Kind::Sandbox) {
            let Some(sandbox) = entry.resource.as_sandbox() else {
                continue;
            };
            let Some(status) = sandbox.status.as_ref() else {
                continue;
            };
            let name = &sandbox.metadata.key();
            live.insert(name.clone());
            if !matches!(status.phase, SandboxPhase::Running | SandboxPhase::Paused) {
                continue;
            }
            let Some(usage) = status
                .container_id
                .as_deref()
                .and_then(|id| self.cgroups.read(id))
            else {
                continue;
            };
            self.history.record(
                name,
                UsagePoint {
                    at: Utc::now(),
                    cpu_seconds: usage.cpu_seconds,
                    memory_bytes: usage.memory_bytes,
                    memory_limit_bytes: usage.memory_limit_bytes,
                },
            );
        }
        self.history.retain(&live);
    }

    /// Where what happens is recorded.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The whole exposition of `GET /metrics`.
    pub fn render(self: &Arc<Self>) -> String {
        let state = self.state();
        self.metrics.render(&state)
    }

    /// What is, now.
    fn state(self: &Arc<Self>) -> State {
        let mut sandboxes = Vec::new();
        let mut live = Vec::new();
        for entry in self.store.list(Kind::Sandbox) {
            let Some(sandbox) = entry.resource.as_sandbox() else {
                continue;
            };
            let status = sandbox.status.as_ref();
            let phase = status.map(|s| s.phase).unwrap_or_default();
            let container = status
                .and_then(|s| s.container_id.as_deref())
                .filter(|_| matches!(phase, SandboxPhase::Running | SandboxPhase::Paused));
            let usage = container.and_then(|id| self.cgroups.read(id));
            let workspace_bytes = match (container, &usage) {
                (Some(id), Some(_)) => {
                    live.push(id.to_string());
                    self.workspace_bytes(id)
                }
                _ => None,
            };
            sandboxes.push(SandboxSample {
                namespace: sandbox.metadata.namespace.clone(),
                name: sandbox.metadata.name.clone(),
                phase: sandbox_phase(phase),
                usage,
                workspace_bytes,
            });
        }
        self.forget_all_but(&live);
        let pools = self
            .store
            .list(Kind::SandboxPool)
            .iter()
            .filter_map(|entry| {
                let pool = entry.resource.as_pool()?;
                let status = pool.status.clone().unwrap_or_default();
                Some(PoolSample {
                    namespace: pool.metadata.namespace.clone(),
                    name: pool.metadata.name.clone(),
                    ready: status.ready_replicas,
                    claimed: status.claimed,
                })
            })
            .collect();
        let snapshots = self
            .store
            .list(Kind::Snapshot)
            .iter()
            .filter_map(|entry| {
                let snapshot = entry.resource.as_snapshot()?;
                let status = snapshot.status.clone().unwrap_or_default();
                Some(SnapshotSample {
                    namespace: snapshot.metadata.namespace.clone(),
                    phase: snapshot_phase(status.phase),
                    size_bytes: status.size_bytes,
                })
            })
            .collect();
        State {
            phases: SANDBOX_PHASES.iter().map(|p| sandbox_phase(*p)).collect(),
            sandboxes,
            pools,
            snapshots,
            queue_depth: (self.queue_depth)(),
        }
    }

    /// The last measured size of the container's workspace; starts a new measurement when it
    /// is missing or old.
    fn workspace_bytes(self: &Arc<Self>, container: &str) -> Option<u64> {
        let mut workspaces = self.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        let workspace = workspaces.entry(container.to_string()).or_default();
        let stale = workspace
            .measured_at
            .is_none_or(|at| at.elapsed() >= WORKSPACE_REFRESH);
        if stale && !workspace.measuring {
            workspace.measuring = true;
            let this = Arc::clone(self);
            let container = container.to_string();
            tokio::spawn(async move { this.measure(container).await });
        }
        workspace.bytes
    }

    async fn measure(self: Arc<Self>, container: String) {
        let Ok(_turn) = self.measuring.acquire().await else {
            return;
        };
        let source = self.source_of(&container).await;
        let bytes = match source {
            Some(source) => tokio::task::spawn_blocking(move || super::disk_usage(&source).ok())
                .await
                .ok()
                .flatten(),
            None => None,
        };
        let mut workspaces = self.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(workspace) = workspaces.get_mut(&container) {
            workspace.measuring = false;
            workspace.measured_at = Some(Instant::now());
            if bytes.is_some() {
                workspace.bytes = bytes;
            }
        }
    }

    /// The workspace directory of the container on this host, inspected once per container.
    async fn source_of(&self, container: &str) -> Option<PathBuf> {
        let known = self
            .workspaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(container)
            .and_then(|w| w.source.clone());
        if known.is_some() {
            return known;
        }
        let source = self
            .engine
            .inspect_container(container)
            .await
            .ok()
            .flatten()?
            .workspace_source?;
        if let Some(workspace) = self
            .workspaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(container)
        {
            workspace.source = Some(source.clone());
        }
        Some(source)
    }

    fn forget_all_but(&self, live: &[String]) {
        let mut workspaces = self.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        if workspaces.len() != live.len() || live.iter().any(|id| !workspaces.contains_key(id)) {
            let live: std::collections::HashSet<&String> = live.iter().collect();
            workspaces.retain(|id, _| live.contains(id));
        }
    }

    /// The workspace's size measured less than [`WORKSPACE_FRESH`] ago, or measured now (and
    /// remembered for scrapes).
    async fn fresh_workspace_bytes(&self, container: &str, source: PathBuf) -> Option<u64> {
        let known = self
            .workspaces
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(container)
            .filter(|w| {
                w.measured_at
                    .is_some_and(|at| at.elapsed() < WORKSPACE_FRESH)
            })
            .and_then(|w| w.bytes);
        if known.is_some() {
            return known;
        }
        let bytes = tokio::task::spawn_blocking(move || super::disk_usage(&source).ok())
            .await
            .ok()
            .flatten()?;
        let mut workspaces = self.workspaces.lock().unwrap_or_else(|e| e.into_inner());
        let workspace = workspaces.entry(container.to_string()).or_default();
        workspace.bytes = Some(bytes);
        workspace.measured_at = Some(Instant::now());
        Some(bytes)
    }

    /// The usage of `sandbox` now: one inspect of its container, its cgroup, its network
    /// counters, and its workspace's size (measured for this answer unless it was measured in
    /// the last [`WORKSPACE_FRESH`], so that a refreshing `top` does not walk it every time).
    pub async fn usage(&self, sandbox: &Sandbox) -> Result<SandboxUsage, UsageError> {
        let name = &sandbox.metadata.key();
        let not_running = || UsageError::NotRunning(name.clone());
        let container = sandbox
            .status
            .as_ref()
            .and_then(|s| s.container_id.clone())
            .ok_or_else(not_running)?;
        let details = self
            .engine
            .inspect_container(&container)
            .await?
            .filter(|d| d.running)
            .ok_or_else(not_running)?;
        let cgroup = self
            .cgroups
            .read(&details.id)
            .ok_or_else(|| UsageError::Unavailable(name.clone()))?;
        let workspace_bytes = match details.workspace_source.clone() {
            Some(source) => self.fresh_workspace_bytes(&details.id, source).await,
            None => None,
        };
        Ok(SandboxUsage {
            cgroup,
            workspace_bytes,
            network: network_bytes(details.pid),
            sampled_at: Utc::now(),
        })
    }
}
