//! `GET …/sandboxes/{name}/stats`: what one sandbox uses now, read from its container's cgroup
//! and network namespace on this host and its workspace on disk (see `crate::metrics`). Asking
//! never wakes a paused or stopped sandbox: a stopped one has nothing to report (409).
//! `GET …/sandboxes/{name}/stats/history`: the last hour of its CPU and memory, as the server
//! sampled it (see `crate::metrics::history`).

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use axum::extract::{Path, State};
use axum::Json;
use chrono::{DateTime, Utc};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ApiError;
use super::openapi::Describe;
use super::resources::PREFIX;
use super::AppState;
use crate::metrics::UsageError;
use crate::resource::Kind;

/// What a running sandbox uses now.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SandboxStats {
    /// CPU time its container has used since it started (user and system).
    pub cpu_seconds: f64,
    /// Memory in use, less the page cache the kernel can drop at once.
    pub memory_bytes: u64,
    /// Its memory limit (`null` when it has none).
    pub memory_limit_bytes: Option<u64>,
    /// Tasks (processes and threads) in its container; under gVisor, those of the gVisor
    /// sandbox on the host.
    pub pids: u64,
    /// Bytes its workspace takes on disk (`null` when the volume is not readable here).
    pub workspace_bytes: Option<u64>,
    /// Bytes received over its network interfaces, loopback left out (`null`: not readable).
    pub net_rx_bytes: Option<u64>,
    /// Bytes sent over its network interfaces, loopback left out (`null`: not readable).
    pub net_tx_bytes: Option<u64>,
    /// When this was read.
    pub sampled_at: DateTime<Utc>,
}

/// One past sample of a sandbox's usage.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatsPoint {
    pub at: DateTime<Utc>,
    /// CPU seconds its container had used by then (a new container counts again from 0).
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub memory_limit_bytes: Option<u64>,
}

/// The last hour of a sandbox's CPU and memory, as the server sampled it.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatsHistory {
    /// Seconds between samples.
    pub interval_seconds: u64,
    /// Oldest first; empty until the sandbox was first sampled running.
    pub items: Vec<StatsPoint>,
}

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new()
        .api_route(
            &format!("{PREFIX}/sandboxes/{{name}}/stats/history"),
            get_with(history, |op| {
                op.id("sandboxStatsHistory")
                    .summary("What a sandbox used over the last hour")
                    .description(
                        "CPU seconds, memory and memory limit of the sandbox's container, \
                         sampled by the server every intervalSeconds while it runs or is paused, \
                         for up to an hour, oldest first. Kept in the server's memory: a restarted \
                         server starts again with none.",
                    )
                    .tag("sandboxes")
                    .path_param("name", "The sandbox's name")
                    .json::<StatsHistory>(200, "The kept samples")
                    .errors(&[404])
            }),
        )
        .api_route(
            &format!("{PREFIX}/sandboxes/{{name}}/stats"),
            get_with(stats, |op| {
                op.id("sandboxStats")
                    .summary("What a sandbox uses now")
                    .description(
                        "CPU seconds, memory, memory limit and tasks from the container's cgroup, \
                     network bytes from its network namespace, and its workspace's bytes on \
                     disk, read on the server's host when asked. A paused sandbox is reported \
                     without being woken; a stopped one answers 409. 503 when the container's \
                     cgroup is not on this host (a Docker daemon elsewhere).",
                    )
                    .tag("sandboxes")
                    .path_param("name", "The sandbox's name")
                    .json::<SandboxStats>(200, "The sandbox's usage now")
                    .errors(&[404, 409, 502, 503])
            }),
        )
}

async fn history(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<StatsHistory>, ApiError> {
    if state.store.get(Kind::Sandbox, &name).is_none() {
        return Err(ApiError::NotFound(format!("sandbox {name:?} not found")));
    }
    let items = state
        .metrics
        .history(&name)
        .into_iter()
        .map(|p| StatsPoint {
            at: p.at,
            cpu_seconds: p.cpu_seconds,
            memory_bytes: p.memory_bytes,
            memory_limit_bytes: p.memory_limit_bytes,
        })
        .collect();
    Ok(Json(StatsHistory {
        interval_seconds: crate::metrics::history::INTERVAL.as_secs(),
        items,
    }))
}

async fn stats(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<SandboxStats>, ApiError> {
    let sandbox = state
        .store
        .get(Kind::Sandbox, &name)
        .and_then(|e| e.resource.as_sandbox().cloned())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| ApiError::NotFound(format!("sandbox {name:?} not found")))?;
    let usage = state.metrics.usage(&sandbox).await.map_err(|e| match e {
        UsageError::NotRunning(_) => ApiError::Conflict(e.to_string()),
        UsageError::Unavailable(_) => ApiError::Unavailable(e.to_string()),
        UsageError::Docker(_) => ApiError::Backend(e.to_string()),
    })?;
    // The limit Docker was given, where the cgroup does not say (it always does under runc).
    let applied = sandbox
        .status
        .as_ref()
        .and_then(|s| s.applied_limits)
        .map(|l| l.memory_mb * 1024 * 1024);
    let (rx, tx) = usage.network.unzip();
    Ok(Json(SandboxStats {
        cpu_seconds: usage.cgroup.cpu_seconds,
        memory_bytes: usage.cgroup.memory_bytes,
        memory_limit_bytes: usage.cgroup.memory_limit_bytes.or(applied),
        pids: usage.cgroup.pids,
        workspace_bytes: usage.workspace_bytes,
        net_rx_bytes: rx,
        net_tx_bytes: tx,
        sampled_at: usage.sampled_at,
    }))
}
