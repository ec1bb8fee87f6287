//! E2B's control API: create, list, get, kill, set a timeout, connect. Sandboxes are written
//! and removed through the store exactly as `/v1` does it (`v1::sandboxes`), with the E2B
//! request translated by `crate::e2b::control`.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::E2bError;
use crate::api::v1::common::{live_sandbox, spec_expiry, store_error};
use crate::api::v1::rules::{check_env, resolve, Wanted as V1Wanted};
use crate::api::v1::sandboxes::create_running;
use crate::api::v1::V1Options;
use crate::api::AppState;
use crate::authz::{namespace_of, Principal};
use crate::e2b::control::{self, ControlError, Created, NewSandbox};
use crate::resource::{Kind, Sandbox};

fn control_error(e: ControlError) -> E2bError {
    match e {
        ControlError::Invalid(m) => E2bError::new(StatusCode::BAD_REQUEST, m),
        e @ ControlError::TemplateNotFound(_) => {
            E2bError::new(StatusCode::NOT_FOUND, e.to_string())
        }
    }
}

fn json_body<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, E2bError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("the body is not a valid request: {e}"),
        )
    })
}

fn created(state: &AppState, sandbox: &Sandbox) -> Created {
    Created {
        template_id: control::template_of(sandbox),
        sandbox_id: sandbox.metadata.name.clone(),
        client_id: control::CLIENT_ID,
        envd_version: control::ENVD_VERSION,
        envd_access_token: super::envd::access_token(state, sandbox),
        domain: None,
    }
}

/// Serializes creates that carry an `Idempotency-Key`, so that two at once with the same key
/// make one sandbox (creates without a key never wait on it).
static IDEMPOTENT_CREATES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<Created>), E2bError> {
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v.to_str().unwrap_or("").to_string();
            control::check_idempotency_key(&key).map_err(control_error)?;
            Some(key)
        }
    };
    let _serial = match &key {
        Some(_) => Some(IDEMPOTENT_CREATES.lock().await),
        None => None,
    };
    if let Some(key) = &key {
        let now = Utc::now();
        let earlier = state
            .store
            .list(Kind::Sandbox)
            .iter()
            .filter_map(|e| e.resource.as_sandbox())
            .filter(|s| principal.reaches(namespace_of(&s.metadata)))
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .find(|s| control::created_with_key(s, key, now))
            .cloned();
        if let Some(sandbox) = earlier {
            return Ok((StatusCode::CREATED, Json(created(&state, &sandbox))));
        }
    }
    let request: NewSandbox = json_body(&body)?;
    let store = state.store.clone();
    let wanted = control::plan(request, |name| {
        store.get(Kind::SandboxTemplate, name).is_some()
    })
    .map_err(control_error)?;
    let settings = &state.settings;
    let spec = if wanted.from_template {
        let ttl = wanted
            .timeout_seconds
            .map_or(settings.default_timeout_seconds, |t| t as u64);
        if ttl > settings.max_timeout_seconds {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "timeout must be at most {} seconds",
                    settings.max_timeout_seconds
                ),
            ));
        }
        check_env(&wanted.env)?;
        control::template_spec(&wanted, ttl)
    } else {
        resolve(
            settings,
            V1Wanted {
                image: None,
                cpus: None,
                memory_mb: None,
                pids_limit: None,
                // E2B sandboxes reach the internet unless asked not to; this server's rule
                // (`allow_network`) decides what "unless" means here.
                network: wanted
                    .allow_internet_access
                    .unwrap_or(settings.allow_network),
                read_only_rootfs: true,
                env: wanted.env.clone(),
                timeout_seconds: wanted.timeout_seconds.map(i128::from),
            },
        )?
    };
    let mut annotations = wanted.annotations;
    if let Some(key) = key {
        annotations.insert(control::IDEMPOTENCY_KEY.to_string(), key);
    }
    let sandbox = create_running(&state, &V1Options::default(), move |id| {
        let mut sandbox = Sandbox::new(id, spec.clone());
        sandbox.metadata.annotations = annotations.clone();
        sandbox
    })
    .await?;
    Ok((StatusCode::CREATED, Json(created(&state, &sandbox))))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// The largest page a list answers.
const MAX_PAGE: usize = 1000;

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let Query(query) = query.map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let filter =
        control::metadata_filter(query.metadata.as_deref().unwrap_or("")).map_err(control_error)?;
    let states: Vec<String> = match query.state.as_deref() {
        None | Some("") => vec!["running".into(), "paused".into()],
        Some(s) => s.split(',').map(|s| s.trim().to_string()).collect(),
    };
    if let Some(bad) = states
        .iter()
        .find(|s| !matches!(s.as_str(), "running" | "paused"))
    {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("state {bad:?} is not one of running, paused"),
        ));
    }
    let start: usize = match query.next_token.as_deref() {
        None | Some("") => 0,
        Some(t) => t.parse().map_err(|_| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("nextToken {t:?} is not valid"),
            )
        })?,
    };
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let mut sandboxes: Vec<Sandbox> = state
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| principal.reaches(namespace_of(&s.metadata)))
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| control::state_of(s).is_some_and(|st| states.iter().any(|w| w == st)))
        .filter(|s| control::matches(s, &filter))
        .cloned()
        .collect();
    sandboxes.sort_by(|a, b| {
        (a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(b.metadata.creation_timestamp, &b.metadata.name))
    });
    let total = sandboxes.len();
    let page: Vec<control::Detail> = sandboxes
        .iter()
        .skip(start)
        .take(limit)
        .map(|s| detail(&state, s))
        .collect();
    let mut response = Json(page).into_response();
    if start + limit < total {
        if let Ok(v) = HeaderValue::from_str(&(start + limit).to_string()) {
            response.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(response)
}

fn detail(state: &AppState, sandbox: &Sandbox) -> control::Detail {
    control::detail(
        sandbox,
        spec_expiry(sandbox),
        (
            state.settings.default_cpus,
            state.settings.default_memory_mb,
        ),
    )
}

pub async fn get(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<control::Detail>, E2bError> {
    let sandbox = live_sandbox(&state.store, &id)?;
    Ok(Json(detail(&state, &sandbox)))
}

pub async fn kill(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let timeout = V1Options::default().wait_timeout;
    crate::api::v1::sandboxes::delete_and_wait(&state, &id, timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Default, Deserialize)]
pub struct TimeoutRequest {
    timeout: Option<i64>,
}

/// Sets the sandbox's end to `deadline` (its time to live gives way to the absolute time).
async fn set_end(state: &AppState, id: &str, deadline: DateTime<Utc>) -> Result<Sandbox, E2bError> {
    let updated = crate::api::v1::sandboxes::set_shutdown_time(state, id, deadline)
        .await
        .map_err(store_error)?;
    updated
        .as_sandbox()
        .cloned()
        .ok_or_else(|| E2bError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found")))
}

fn deadline(state: &AppState, seconds: i64) -> Result<DateTime<Utc>, E2bError> {
    let max = state.settings.max_timeout_seconds;
    if seconds < 1 || seconds as u64 > max {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("timeout must be between 1 and {max} seconds, not {seconds}"),
        ));
    }
    Ok(Utc::now() + chrono::TimeDelta::seconds(seconds))
}

pub async fn set_timeout(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bError> {
    let request: TimeoutRequest = json_body(&body)?;
    let seconds = request
        .timeout
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "timeout is required"))?;
    let end = deadline(&state, seconds)?;
    live_sandbox(&state.store, &id)?;
    set_end(&state, &id, end).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Connects to a sandbox: resumes it if it is paused or stopped, keeps it alive for at least
/// `timeout` more seconds, and answers its envd access token.
pub async fn connect(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Created>, E2bError> {
    let request: TimeoutRequest = json_body(&body)?;
    let sandbox = live_sandbox(&state.store, &id)?;
    let mut sandbox = crate::api::power::awake(&state, sandbox).await?;
    if let Some(seconds) = request.timeout {
        let end = deadline(&state, seconds)?;
        if spec_expiry(&sandbox).is_none_or(|current| current < end) {
            sandbox = set_end(&state, &id, end).await?;
        }
    }
    Ok(Json(created(&state, &sandbox)))
}

/// Pauses a running sandbox: every process frozen, memory kept (`spec.state: Paused`); a
/// connect resumes it where it was. 409 when it is not running (the SDK's `False`).
pub async fn pause(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let sandbox = live_sandbox(&state.store, &id)?;
    if control::state_of(&sandbox) != Some("running") {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is not running"),
        ));
    }
    crate::api::power::set_state(
        &state.store,
        &id,
        crate::resource::SandboxState::Paused,
        crate::api::power::STATE_WAIT,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox's CPU and memory over the last hour, as the server sampled it.
pub async fn metrics(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Vec<control::Metric>>, E2bError> {
    let sandbox = live_sandbox(&state.store, &id)?;
    let samples: Vec<_> = state
        .metrics
        .history(&id)
        .into_iter()
        .map(|p| (p.at, p.cpu_seconds, p.memory_bytes, p.memory_limit_bytes))
        .collect();
    let cpus = sandbox
        .resolved_spec()
        .cpus
        .unwrap_or(state.settings.default_cpus);
    Ok(Json(control::metrics(&samples, cpus)))
}

/// Every other call of E2B's control API: not served (yet), said plainly.
pub async fn unsupported(method: axum::http::Method, uri: Uri) -> E2bError {
    E2bError::new(
        StatusCode::NOT_IMPLEMENTED,
        format!(
            "{method} {} is not supported by this server yet (see docs/e2b.md for what is)",
            uri.path()
        ),
    )
}
