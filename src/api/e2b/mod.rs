//! The E2B routes: its control API under `/e2b` (behind the API key, which the SDK sends as
//! `X-API-Key`) and envd under `/e2b/envd` (behind each sandbox's envd access token, which the
//! SDK sends as `X-Access-Token` with `E2b-Sandbox-Id`), and the root `/files` for signed file
//! URLs (behind their signature). Handlers parse, call the store, the data
//! plane or the process supervisor, and map errors in one place per wire: [`E2bError`] for the
//! control API and `/files`, [`crate::e2b::connect::RpcError`] for Connect calls. The protocols
//! and the translation are `crate::e2b`'s.
//!
//! These routes are E2B's, described by E2B's own OpenAPI document and service definitions, so
//! they are not in this server's OpenAPI document.

mod control;
pub(crate) mod envd;
mod files;
mod filesystem;
mod idempotency;
mod process;
mod watch;

use aide::axum::ApiRouter;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Json;

use super::error::ApiError;
use super::AppState;

/// The control API, to be mounted behind the API key.
pub fn control_routes() -> ApiRouter<AppState> {
    ApiRouter::new()
        .route(
            "/e2b/v2/sandboxes",
            post(control::create).get(control::list),
        )
        .route("/e2b/sandboxes", post(control::create).get(control::list))
        .route(
            "/e2b/sandboxes/{id}",
            get(control::get).delete(control::kill),
        )
        .route("/e2b/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/e2b/sandboxes/{id}/connect", post(control::connect))
        .route("/e2b/sandboxes/{id}/pause", post(control::pause))
        .route("/e2b/sandboxes/{id}/metrics", get(control::metrics))
        .route("/e2b/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/e2b/sandboxes/{id}/fork", post(control::fork))
        .route(
            "/e2b/sandboxes/{id}/network",
            axum::routing::put(control::update_network),
        )
        .route(
            "/e2b/sandboxes/{id}/snapshots",
            post(control::create_snapshot),
        )
        .route("/e2b/snapshots", get(control::list_snapshots))
        .route(
            "/e2b/templates/{id}",
            axum::routing::delete(control::delete_snapshot),
        )
        .route("/e2b/{*rest}", any(control::unsupported))
}

/// envd, to be mounted without the API key: each call proves its access token instead.
pub fn envd_routes() -> ApiRouter<AppState> {
    let rpc = |method: &str| format!("/e2b/envd/{method}");
    ApiRouter::new()
        .route(&rpc("process.Process/Start"), post(process::start))
        .route(&rpc("process.Process/Connect"), post(process::connect))
        .route(&rpc("process.Process/List"), post(process::list))
        .route(&rpc("process.Process/SendInput"), post(process::send_input))
        .route(
            &rpc("process.Process/CloseStdin"),
            post(process::close_stdin),
        )
        .route(
            &rpc("process.Process/SendSignal"),
            post(process::send_signal),
        )
        .route(&rpc("process.Process/Update"), post(process::update))
        .route(&rpc("filesystem.Filesystem/Stat"), post(filesystem::stat))
        .route(
            &rpc("filesystem.Filesystem/ListDir"),
            post(filesystem::list_dir),
        )
        .route(
            &rpc("filesystem.Filesystem/MakeDir"),
            post(filesystem::make_dir),
        )
        .route(
            &rpc("filesystem.Filesystem/Move"),
            post(filesystem::move_entry),
        )
        .route(
            &rpc("filesystem.Filesystem/Remove"),
            post(filesystem::remove),
        )
        .route(
            &rpc("filesystem.Filesystem/WatchDir"),
            post(watch::watch_dir),
        )
        .route(
            &rpc("filesystem.Filesystem/CreateWatcher"),
            post(watch::create_watcher),
        )
        .route(
            &rpc("filesystem.Filesystem/GetWatcherEvents"),
            post(watch::get_watcher_events),
        )
        .route(
            &rpc("filesystem.Filesystem/RemoveWatcher"),
            post(watch::remove_watcher),
        )
        .route(
            "/e2b/envd/files",
            get(files::download)
                .post(files::upload)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/e2b/envd/health", get(files::health))
        // E2B's SDK builds signed file URLs on the envd URL's host without its path.
        .route(
            "/files",
            get(files::signed_download)
                .post(files::signed_upload)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/e2b/envd/{service}/{method}", any(envd::unimplemented))
}

/// An error as E2B's control API (and envd's HTTP API) answers it: `{"code": <HTTP status>,
/// "message": …}` with that status.
#[derive(Debug)]
pub struct E2bError {
    pub status: StatusCode,
    pub message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> E2bError {
        E2bError::new(e.status_and_code().0, e.to_string())
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({"code": self.status.as_u16(), "message": self.message});
        (self.status, Json(body)).into_response()
    }
}

/// Middleware: errors of the control API that the shared layers answered (a missing or wrong
/// API key, an unknown method) in this server's shape get E2B's, which its SDK parses.
pub async fn control_error_shape(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = request.uri().path();
    let control = path.starts_with("/e2b/") && !path.starts_with("/e2b/envd/");
    let response = next.run(request).await;
    let status = response.status();
    if !control || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .unwrap_or_default();
    let ours = serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string));
    match ours {
        Some(message) => {
            let mut fresh = E2bError::new(status, message).into_response();
            for (name, value) in parts.headers.iter() {
                if name != axum::http::header::CONTENT_TYPE
                    && name != axum::http::header::CONTENT_LENGTH
                {
                    fresh.headers_mut().insert(name.clone(), value.clone());
                }
            }
            fresh
        }
        None => Response::from_parts(parts, axum::body::Body::from(bytes)),
    }
}
