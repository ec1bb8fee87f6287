//! `GET /healthz` (no key): answers 200 while Docker answers, 503 in the common error shape when
//! it does not. It checks the daemon and nothing else; it changes nothing.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use schemars::JsonSchema;
use serde::Serialize;

use super::error::{ErrorBody, ErrorDetail};
use super::AppState;

/// A ping that takes longer than this counts as a failure.
const PING_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Serialize, JsonSchema, Clone, Debug, PartialEq)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
    /// Always `docker`.
    pub backend: String,
    /// The server's version.
    pub version: String,
}

pub async fn healthz(State(state): State<AppState>) -> Response {
    let failure = match tokio::time::timeout(PING_TIMEOUT, state.engine.ping()).await {
        Ok(Ok(())) => {
            return Json(Health {
                status: "ok".into(),
                backend: "docker".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            })
            .into_response()
        }
        Ok(Err(e)) => format!("Docker is unreachable: {e}"),
        Err(_) => format!("Docker did not answer a ping within {PING_TIMEOUT:?}"),
    };
    let body = ErrorBody {
        error: ErrorDetail {
            code: "backend_error".into(),
            message: failure,
        },
    };
    (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
}
