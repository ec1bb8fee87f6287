//! `POST {PREFIX}/sandboxes/{name}/pause` and `…/resume`: conveniences that write a sandbox's
//! `spec.state` (see `api::power`) and answer the sandbox once the controller reports it so.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use schemars::JsonSchema;
use serde::Deserialize;

use crate::api::body::{read_body, respond, response_format, MAX_JSON_BODY};
use crate::api::error::ApiError;
use crate::api::power::{set_state, STATE_WAIT};
use crate::api::AppState;
use crate::resource::{Kind, SandboxState};
use crate::store::StoreError;

/// The body of a pause: how far to take the sandbox down.
#[derive(Deserialize, JsonSchema, Debug, Default)]
#[serde(deny_unknown_fields)]
pub struct PauseRequest {
    /// `Paused` (the default: processes frozen, memory kept) or `Stopped` (container stopped,
    /// files kept).
    #[serde(default)]
    pub mode: Option<PauseMode>,
}

#[derive(Deserialize, JsonSchema, Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseMode {
    Paused,
    Stopped,
}

fn exists(state: &AppState, name: &str) -> Result<(), ApiError> {
    match state.store.get(Kind::Sandbox, name) {
        Some(_) => Ok(()),
        None => Err(StoreError::NotFound {
            kind: Kind::Sandbox,
            name: name.to_string(),
        }
        .into()),
    }
}

pub(super) async fn pause(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(&headers, body, MAX_JSON_BODY).await?;
    let request: PauseRequest = if bytes.trim_ascii().is_empty() {
        PauseRequest::default()
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::Validation(format!("the pause request: {e}")))?
    };
    exists(&state, &name)?;
    let target = match request.mode {
        None | Some(PauseMode::Paused) => SandboxState::Paused,
        Some(PauseMode::Stopped) => SandboxState::Stopped,
    };
    let sandbox = set_state(&state.store, &name, target, STATE_WAIT).await?;
    respond(StatusCode::OK, &sandbox, response_format(&headers))
}

pub(super) async fn resume(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    exists(&state, &name)?;
    state.activity.touch(&name);
    let sandbox = set_state(&state.store, &name, SandboxState::Running, STATE_WAIT).await?;
    respond(StatusCode::OK, &sandbox, response_format(&headers))
}
