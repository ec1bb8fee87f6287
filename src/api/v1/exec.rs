//! Exec of `/v1`, buffered and streamed. Validation happens here, in the reference's order and
//! with its messages; running the command is the data plane's job. Every refusal is an ordinary
//! JSON error sent before a stream starts.

use std::convert::Infallible;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::StreamExt;
use serde_json::Value;

use super::common::live_sandbox;
use super::lax::{Bound, Fields};
use super::request::json_object;
use super::rules::check_env;
use super::wire::{self, ndjson_line, py_number};
use super::{awake_target, dataplane_error, path_id, valid_path};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::dataplane::{Command, ExecRequest, SandboxTarget};

pub async fn exec(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::ExecResponse>, ApiError> {
    let (target, request) = prepare(&state, path, &headers, body).await?;
    let _busy = state.activity.busy(&target.name);
    let response = state
        .dataplane
        .exec(&target, request)
        .await
        .map_err(dataplane_error)?;
    Ok(Json(response.into()))
}

pub async fn exec_stream(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let (target, request) = prepare(&state, path, &headers, body).await?;
    let events = state
        .dataplane
        .exec_stream(&target, request)
        .await
        .map_err(dataplane_error)?;
    // The sandbox is busy for as long as the stream runs.
    let busy = state.activity.busy(&target.name);
    let lines = events.map(move |event| {
        let _busy = &busy;
        Ok::<_, Infallible>(Bytes::from(ndjson_line(&event)))
    });
    let mut response = (StatusCode::OK, Body::from_stream(lines)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

/// Reads and checks an exec request; returns where and what to run (defaults are the data
/// plane's).
async fn prepare(
    state: &AppState,
    path: Result<Path<String>, PathRejection>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(SandboxTarget, ExecRequest), ApiError> {
    let id = path_id(path)?;
    let obj = json_object(headers, body, true).await?.unwrap_or_default();
    let mut f = Fields::new(&obj);
    let command = read_command(&mut f);
    let env = f.env("env");
    let workdir = f.opt_str("workdir", None);
    let timeout = f.opt_float("timeout_seconds", Bound::Gt(0.0));
    f.finish()?;

    let sandbox = live_sandbox(&state.store, &id)?;
    let command = match command {
        Some(Command::Shell(s)) if s.trim().is_empty() => {
            return Err(ApiError::InvalidRequest("command must not be empty".into()))
        }
        Some(Command::Argv(argv)) if argv.is_empty() => {
            return Err(ApiError::InvalidRequest(
                "command must be a non-empty string or list of strings".into(),
            ))
        }
        Some(command) => command,
        None => return Err(ApiError::Validation("body.command: Field required".into())),
    };
    // Only what the client sent is checked here; the data plane applies the defaults (settings
    // validation keeps the default timeout within the maximum).
    let max = state.settings.max_exec_timeout_seconds;
    if let Some(timeout) = timeout {
        if timeout.is_nan() || timeout <= 0.0 || timeout > max {
            return Err(ApiError::InvalidRequest(format!(
                "timeout_seconds must be in (0, {}]",
                py_number(max)
            )));
        }
    }
    check_env(&env)?;
    let workdir = match workdir.filter(|w| !w.is_empty()) {
        None => None,
        Some(w) => Some(valid_path(&w)?),
    };
    let target = awake_target(state, sandbox, true).await?;
    Ok((
        target,
        ExecRequest {
            command,
            env,
            workdir,
            timeout_seconds: timeout,
        },
    ))
}

/// `command`: a string or a list of strings, required, never null.
fn read_command(f: &mut Fields<'_>) -> Option<Command> {
    match f.raw("command") {
        None => {
            f.push_error("command", "Field required");
            None
        }
        Some(Value::String(s)) => Some(Command::Shell(s.clone())),
        Some(Value::Array(items)) => {
            let mut argv = Vec::with_capacity(items.len());
            let mut ok = true;
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => argv.push(s.clone()),
                    _ => {
                        f.push_error(&format!("command.{i}"), "Input should be a valid string");
                        ok = false;
                    }
                }
            }
            ok.then_some(Command::Argv(argv))
        }
        Some(_) => {
            f.push_error(
                "command",
                "Input should be a valid string or a list of strings",
            );
            None
        }
    }
}
