//! The `/v1` wire contract of agent-sandbox 0.2.1, on top of the store (lifecycle) and the data
//! plane (exec and files). Clients of that server (its SDK, its MCP server, curl scripts) must
//! not be able to tell the difference, so this module reproduces its check order, messages,
//! coercions and byte formats (see `wire` and `lax`).
//!
//! It never touches Docker: lifecycle calls write desired state through the store and wait for
//! the status the controller observes (`wait`); exec and file calls go through the data plane.
//! Routing quirks shared by every route (405, 404, trailing slashes, auth) belong to the router.

pub(crate) mod common;
mod exec;
mod files;
pub mod lax;
mod request;
pub(crate) mod rules;
pub(crate) mod sandboxes;
pub mod schemas;
pub(crate) mod snapshots;
pub mod wait;
pub mod wire;

use std::time::Duration;

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, Path};
use axum::Extension;
use serde_json::json;

use crate::api::error::ApiError;
use crate::api::openapi::Describe;
use crate::api::AppState;
use crate::config::Settings;
use crate::dataplane::{paths, DataPlaneError, SandboxTarget};
use crate::resource::{Sandbox, SandboxPhase};

/// Tunables of the `/v1` routes.
#[derive(Clone, Debug)]
pub struct V1Options {
    /// How long a lifecycle call waits for the controller before answering 503.
    pub wait_timeout: Duration,
}

impl Default for V1Options {
    fn default() -> V1Options {
        V1Options {
            wait_timeout: wait::DEFAULT_WAIT,
        }
    }
}

/// The `/v1` routes with default options, described with the limits of `settings`.
pub fn routes(settings: &Settings) -> ApiRouter<AppState> {
    routes_with(settings, V1Options::default())
}

/// Every `/v1` operation carries this tag.
fn v1<'t>(op: TransformOperation<'t>, id: &str, summary: &str) -> TransformOperation<'t> {
    op.id(id).summary(summary).tag("v1")
}

/// The `/v1` routes with explicit options (tests shorten the wait for the controller), each
/// with its description; limits in the schemas are those of `settings`.
pub fn routes_with(settings: &Settings, options: V1Options) -> ApiRouter<AppState> {
    let exec_request = schemas::exec_request(settings);
    ApiRouter::new()
        .api_route(
            "/v1/sandboxes",
            post_with(sandboxes::create, |op| {
                v1(op, "v1CreateSandbox", "Create a sandbox")
                    .description(
                        "Writes a Sandbox resource with every value resolved from the request \
                         and the server's defaults, and answers once the controller reports it \
                         running.",
                    )
                    .json_body_schema("V1SandboxCreate", schemas::sandbox_create(settings))
                    .json::<wire::SandboxInfo>(201, "The new sandbox, running")
                    .links_to_sandbox()
                    .errors(&[400, 403, 413, 422, 429, 502, 503])
            })
            .get_with(sandboxes::list, |op| {
                v1(op, "v1ListSandboxes", "List sandboxes")
                    .json::<wire::SandboxList>(200, "Every sandbox, sorted by created_at")
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}",
            get_with(sandboxes::get, |op| {
                v1(op, "v1GetSandbox", "Get a sandbox")
                    .path_param("id", SANDBOX_ID)
                    .json::<wire::SandboxInfo>(200, "The sandbox")
                    .errors(&[400, 404])
            })
            .delete_with(sandboxes::delete, |op| {
                v1(op, "v1DeleteSandbox", "Delete a sandbox")
                    .description("Its snapshots remain.")
                    .path_param("id", SANDBOX_ID)
                    .empty(
                        204,
                        "Deleted: gone from the API and its processes killed; its container and \
                         workspace are removed in the background",
                    )
                    .errors(&[400, 403, 404, 503])
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}/timeout",
            post_with(sandboxes::set_timeout, |op| {
                v1(op, "v1SetTimeout", "Set a sandbox's lifetime")
                    .description("The sandbox now expires `timeout_seconds` from now.")
                    .path_param("id", SANDBOX_ID)
                    .json_body_schema("V1TimeoutRequest", schemas::timeout_request(settings))
                    .json::<wire::SandboxInfo>(200, "The sandbox, with its new expires_at")
                    .errors(&[400, 403, 404, 413, 422])
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}/exec",
            post_with(exec::exec, |op| {
                v1(op, "v1Exec", "Run a command")
                    .path_param("id", SANDBOX_ID)
                    .json_body_schema("V1ExecRequest", exec_request.clone())
                    .json::<wire::ExecResponse>(200, "The command's output and exit code")
                    .errors(&[400, 404, 409, 413, 422, 502])
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}/exec/stream",
            post_with(exec::exec_stream, |op| {
                v1(op, "v1ExecStream", "Run a command, streaming its output")
                    .description(
                        "One JSON object per line as output arrives; the last line is the \
                         `exit` event.",
                    )
                    .path_param("id", SANDBOX_ID)
                    .json_body_schema("V1ExecRequest", exec_request)
                    .ndjson::<wire::ExecEvent>(200, "Output events, then exactly one exit event")
                    .errors(&[400, 404, 409, 413, 422, 502])
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}/files",
            get_with(files::read, |op| {
                v1(op, "v1ReadFile", "Read a file")
                    .path_param("id", SANDBOX_ID)
                    .query_with_schema(
                        "path",
                        true,
                        "File path; relative paths are under /workspace",
                        schemas::path("File path; relative paths are under /workspace"),
                    )
                    .binary(200, "The file's bytes")
                    .errors(&[400, 404, 409, 413, 422, 502])
            })
            .put_with(files::write, |op| {
                v1(op, "v1WriteFile", "Write a file under /workspace")
                    .description("Parent directories are created. The body is the file's content.")
                    .path_param("id", SANDBOX_ID)
                    .query_with_schema(
                        "path",
                        true,
                        "File path, strictly under /workspace",
                        schemas::path_in_workspace(),
                    )
                    .query_with_schema(
                        "mode",
                        false,
                        "Octal permission bits (default 644)",
                        json!({"type": "string", "pattern": "^0?[0-7]{3}$", "default": "644"}),
                    )
                    .binary_body()
                    .json::<wire::FileInfo>(200, "The written file")
                    .errors(&[400, 404, 409, 413, 422, 502])
            })
            // The write caps its body itself at `max_file_bytes`, while it streams in.
            .layer(DefaultBodyLimit::disable()),
        )
        .api_route(
            "/v1/sandboxes/{id}/files/list",
            get_with(files::list, |op| {
                v1(op, "v1ListFiles", "List a directory")
                    .path_param("id", SANDBOX_ID)
                    .query_with_schema(
                        "path",
                        false,
                        "Directory (default /workspace)",
                        schemas::path("Directory; relative paths are under /workspace"),
                    )
                    .json::<wire::FileList>(200, "The directory's entries, sorted by name")
                    .errors(&[400, 404, 409, 502])
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}/snapshots",
            post_with(snapshots::create, |op| {
                v1(op, "v1CreateSnapshot", "Snapshot a sandbox's workspace")
                    .path_param("id", SANDBOX_ID)
                    .optional_json_body_schema("V1SnapshotCreate", schemas::snapshot_create())
                    .json::<wire::SnapshotInfo>(201, "The snapshot, ready")
                    .link(201, "v1GetSnapshot", "id", "$response.body#/id")
                    .link(201, "v1Fork", "id", "$response.body#/id")
                    .link(201, "v1DeleteSnapshot", "id", "$response.body#/id")
                    .errors(&[400, 403, 404, 413, 422, 502, 503])
            }),
        )
        .api_route(
            "/v1/sandboxes/{id}/rollback",
            post_with(snapshots::rollback, |op| {
                v1(op, "v1Rollback", "Roll a sandbox back to a snapshot")
                    .description(
                        "Keeps the sandbox's ID, spec and expiry; replaces its container and \
                         workspace with the snapshot's content. Running processes stop and /tmp \
                         is cleared.",
                    )
                    .path_param("id", SANDBOX_ID)
                    .json_body_schema("V1RollbackRequest", schemas::rollback_request())
                    .json::<wire::SandboxInfo>(200, "The sandbox, with source_snapshot_id set")
                    .errors(&[400, 403, 404, 409, 413, 422, 502, 503])
            }),
        )
        .api_route(
            "/v1/snapshots",
            get_with(snapshots::list, |op| {
                v1(op, "v1ListSnapshots", "List snapshots")
                    .query("sandbox_id", false, "Only the snapshots of this sandbox")
                    .json::<wire::SnapshotList>(200, "Snapshots, sorted by created_at")
            }),
        )
        .api_route(
            "/v1/snapshots/{id}",
            get_with(snapshots::get, |op| {
                v1(op, "v1GetSnapshot", "Get a snapshot")
                    .path_param("id", SNAPSHOT_ID)
                    .json::<wire::SnapshotInfo>(200, "The snapshot")
                    .errors(&[400, 404])
            })
            .delete_with(snapshots::delete, |op| {
                v1(op, "v1DeleteSnapshot", "Delete a snapshot")
                    .path_param("id", SNAPSHOT_ID)
                    .empty(204, "Deleted, with its data")
                    .errors(&[400, 403, 404, 503])
            }),
        )
        .api_route(
            "/v1/snapshots/{id}/fork",
            post_with(snapshots::fork, |op| {
                v1(op, "v1Fork", "Start a new sandbox from a snapshot")
                    .description(
                        "The new sandbox gets the snapshot's captured spec plus the overrides, \
                         its own lifetime, and the snapshot's workspace.",
                    )
                    .path_param("id", SNAPSHOT_ID)
                    .optional_json_body_schema("V1ForkRequest", schemas::fork_request(settings))
                    .json::<wire::SandboxInfo>(201, "The new sandbox, running")
                    .links_to_sandbox()
                    .errors(&[400, 403, 404, 413, 422, 429, 502, 503])
            }),
        )
        .layer(Extension(options))
}

/// The `{id}` of a route; only undecodable bytes make it fail.
fn path_id(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(id)| id)
        .map_err(|rejection| ApiError::InvalidRequest(rejection.body_text()))
}

/// A request path checked and normalized the way the reference does.
fn valid_path(path: &str) -> Result<String, ApiError> {
    if path.is_empty() || path.contains('\0') {
        return Err(ApiError::InvalidRequest(
            "path must be a non-empty string".into(),
        ));
    }
    paths::normalize(path).map_err(dataplane_error)
}

/// Where exec and file calls go: the container the controller last observed.
fn target(sandbox: &Sandbox, require_running: bool) -> Result<SandboxTarget, ApiError> {
    let name = &sandbox.metadata.key();
    let not_running = || ApiError::InvalidRequest(format!("sandbox {name} is not running"));
    let status = sandbox.status.as_ref().ok_or_else(not_running)?;
    let container_id = status.container_id.clone().ok_or_else(not_running)?;
    if require_running && status.phase != SandboxPhase::Running {
        return Err(not_running());
    }
    Ok(SandboxTarget {
        name: name.clone(),
        container_id,
        env: sandbox.resolved_spec().env.clone(),
        started_at: status.started_at,
    })
}

/// [`target`] of a sandbox woken first: the call counts as activity, and a paused or stopped
/// sandbox is resumed (or the call refused) as its `spec.autoResume` says.
async fn awake_target(
    state: &AppState,
    sandbox: Sandbox,
    require_running: bool,
) -> Result<SandboxTarget, ApiError> {
    let sandbox = crate::api::power::awake(state, sandbox).await?;
    let mut target = target(&sandbox, require_running)?;
    target.env = with_egress_env(state, &sandbox.metadata.key(), target.env);
    Ok(target)
}

/// `env` over the egress proxy variables of a policed sandbox.
pub(crate) fn with_egress_env(
    state: &AppState,
    name: &str,
    env: std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    let Some(gateway) = &state.egress else {
        return env;
    };
    let mut merged: std::collections::BTreeMap<String, String> =
        gateway.sandbox_env(name).into_iter().collect();
    merged.extend(env);
    merged
}

/// Data-plane refusals with the reference's statuses; it answers 400 for a stopped sandbox.
fn dataplane_error(err: DataPlaneError) -> ApiError {
    match err {
        DataPlaneError::InvalidRequest(m) => ApiError::InvalidRequest(m),
        DataPlaneError::NotFound(m) => ApiError::NotFound(m),
        DataPlaneError::TooLarge { what, limit } => {
            ApiError::PayloadTooLarge(format!("{what} is larger than {limit} bytes"))
        }
        DataPlaneError::NotRunning(name) => {
            ApiError::InvalidRequest(format!("sandbox {name} is not running"))
        }
        DataPlaneError::Backend(m) => ApiError::Backend(m),
    }
}

/// The operations that take a sandbox's `{id}`, for the links from the creating ones.
const TAKES_SANDBOX_ID: [&str; 10] = [
    "v1GetSandbox",
    "v1DeleteSandbox",
    "v1SetTimeout",
    "v1Exec",
    "v1ExecStream",
    "v1ReadFile",
    "v1WriteFile",
    "v1ListFiles",
    "v1CreateSnapshot",
    "v1Rollback",
];

trait SandboxLinks {
    /// Links from the 201 answer (a `SandboxInfo`) to every operation taking its `id`.
    fn links_to_sandbox(self) -> Self;
}

impl SandboxLinks for TransformOperation<'_> {
    fn links_to_sandbox(self) -> Self {
        TAKES_SANDBOX_ID.iter().fold(self, |op, target| {
            op.link(201, target, "id", "$response.body#/id")
        })
    }
}

const SANDBOX_ID: &str = "Sandbox ID (`sb_` + 16 hex digits for API-created sandboxes)";
const SNAPSHOT_ID: &str = "Snapshot ID (`snap_` + 16 hex digits)";
