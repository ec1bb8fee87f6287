//! `GET …/sandboxes/{name}/stats`: what one sandbox uses now, read from its container's cgroup
//! and network namespace on this host and its workspace on disk (see `crate::metrics`). Asking
//! never wakes a paused or stopped sandbox: a stopped one has nothing to report (409).

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

pub fn routes() -> ApiRouter<AppState> {
    ApiRouter::new().api_route(
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
