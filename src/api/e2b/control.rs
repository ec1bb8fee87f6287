//! E2B's control API: create, list, get, kill, set a timeout, connect, pause, fork and
//! snapshots (taken, listed and deleted as this server's own `Snapshot` resources). Sandboxes are written
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
use crate::api::v1::common::{
    lifetime_anchor, live_sandbox, ready_snapshot, ready_snapshots, spec_expiry, store_error,
};
use crate::api::v1::rules::{check_env, resolve, Wanted as V1Wanted};
use crate::api::v1::sandboxes::create_running;
use crate::api::v1::snapshots::{spec_from_snapshot, take};
use crate::api::v1::V1Options;
use crate::api::AppState;
use crate::authz::{namespace_of, Principal};
use crate::e2b::control::{self, ControlError, Created, Egress, NewSandbox};
use crate::resource::{object_key, Kind, Sandbox, SnapshotScope};

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

/// The store key of the object an E2B ID names. E2B's calls act in the first namespace of the
/// caller's key (as `/v1` creates do), where IDs are plain names as E2B's are; an ID that is not
/// a plain name names nothing, so that no ID reaches into another namespace.
pub(super) fn key_of(principal: &Principal, id: &str, what: &str) -> Result<String, E2bError> {
    if !crate::resource::is_valid_name(id) {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("{what} {id} not found"),
        ));
    }
    Ok(object_key(principal.home_namespace(), id))
}

fn created(state: &AppState, sandbox: &Sandbox) -> Created {
    Created {
        template_id: control::template_of(sandbox),
        sandbox_id: sandbox.metadata.name.clone(),
        client_id: control::CLIENT_ID,
        envd_version: control::ENVD_VERSION,
        envd_access_token: super::envd::access_token(state, sandbox),
        traffic_access_token: super::envd::traffic_token(state, sandbox),
        domain: control::sandbox_domain(sandbox, state.settings.preview_domain.as_deref()),
    }
}

pub async fn create(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Result<Response, E2bError> {
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let key = v.to_str().unwrap_or("").to_string();
            control::check_idempotency_key(&key).map_err(control_error)?;
            Some(key)
        }
    };
    let serial = match &key {
        Some(_) => Some(super::idempotency::CREATES.lock().await),
        None => None,
    };
    if let Some(sandbox) = key
        .as_deref()
        .and_then(|key| super::idempotency::earlier(&state, &principal, key))
    {
        let replayed = [("idempotent-replayed", "true")];
        let answer = Json(created(&state, &sandbox));
        return Ok((StatusCode::CREATED, replayed, answer).into_response());
    }
    let request: NewSandbox = json_body(&body)?;
    // `templateID` may name a snapshot (what `create_snapshot` answered): the sandbox starts
    // from it, as a `/v1` fork does.
    let home = principal.home_namespace().to_string();
    let snapshot = request
        .template_id
        .as_deref()
        .filter(|t| t.starts_with("snap_"))
        .and_then(|t| key_of(&principal, t, "snapshot").ok())
        .and_then(|key| ready_snapshot(&state.store, &key).ok());
    let store = state.store.clone();
    let from_snapshot = snapshot.is_some();
    let wanted = control::plan(request, |name| {
        from_snapshot || store.get(Kind::SandboxTemplate, name).is_some()
    })
    .map_err(control_error)?;
    let settings = &state.settings;
    let spec = if let Some(snapshot) = &snapshot {
        check_env(&wanted.env)?;
        spec_from_snapshot(
            &state,
            &snapshot.metadata.key(),
            Some(i128::from(
                wanted
                    .timeout_seconds
                    .unwrap_or(settings.default_timeout_seconds as i64),
            )),
            match &wanted.egress {
                Some(Egress::Only(_) | Egress::Nothing) => Some(false),
                _ => wanted.allow_internet_access.filter(|allowed| !allowed),
            },
            None,
            None,
            wanted.env.clone(),
        )?
    } else if wanted.from_template {
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
                // (`allow_network`) decides what "unless" means here. An allow list's network
                // is put in below, past the rule that wants one for open networks.
                network: match &wanted.egress {
                    Some(Egress::Only(_) | Egress::Nothing) => false,
                    _ => wanted
                        .allow_internet_access
                        .unwrap_or(settings.allow_network),
                },
                read_only_rootfs: true,
                env: wanted.env.clone(),
                timeout_seconds: wanted.timeout_seconds.map(i128::from),
            },
        )?
    };
    let mut spec = spec;
    spec.expiry_action = wanted.expiry_action;
    spec.auto_resume = wanted.auto_resume;
    if let Some(egress) = &wanted.egress {
        if matches!(egress, Egress::Only(_)) && !settings.allow_network && !wanted.from_template {
            return Err(E2bError::new(
                StatusCode::FORBIDDEN,
                "this server does not allow sandboxes with network access",
            ));
        }
        control::apply_egress(&mut spec, egress);
    }
    let mut annotations = wanted.annotations;
    if let Some(key) = &key {
        annotations.insert(control::IDEMPOTENCY_KEY.to_string(), key.clone());
    }
    // The create, and the keeping of its key, go on when the client leaves before the answer
    // (the handler is dropped, the task is not): a retry then finds the sandbox, and once the
    // sandbox is deleted, the record of its key. The task holds the creates' lock until both
    // are done, so no create with the same key slips in between.
    let creating = tokio::spawn({
        let state = state.clone();
        async move {
            let _serial = serial;
            let sandbox = create_running(&state, &V1Options::default(), move |id| {
                let mut sandbox = Sandbox::new(id, spec.clone());
                sandbox.metadata.namespace = home.clone();
                sandbox.metadata.annotations = annotations.clone();
                sandbox
            })
            .await?;
            if let Some(key) = key {
                super::idempotency::remember(&state, key, &sandbox).await;
            }
            Ok::<_, E2bError>(sandbox)
        }
    });
    let sandbox = creating.await.map_err(|e| {
        E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the create failed: {e}"),
        )
    })??;
    Ok((StatusCode::CREATED, Json(created(&state, &sandbox))).into_response())
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    metadata: Option<String>,
    state: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
    /// `asc` or `desc` (the default: newest first), by start time.
    order: Option<String>,
    /// Only sandboxes started at or after this time (RFC 3339).
    started_after: Option<String>,
    /// Only sandboxes of this template (its name, or `base`).
    template: Option<String>,
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
    let newest_first = match query.order.as_deref() {
        None | Some("") | Some("desc") => true,
        Some("asc") => false,
        Some(other) => {
            return Err(E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("order {other:?} is not one of asc, desc"),
            ))
        }
    };
    let started_after = match query.started_after.as_deref() {
        None | Some("") => None,
        Some(t) => Some(
            DateTime::parse_from_rfc3339(t)
                .map(|t| t.with_timezone(&Utc))
                .map_err(|e| {
                    E2bError::new(
                        StatusCode::BAD_REQUEST,
                        format!("startedAfter {t:?} is not an RFC 3339 time: {e}"),
                    )
                })?,
        ),
    };
    let template = query.template.as_deref().filter(|t| !t.is_empty());
    let start = page_start(query.next_token.as_deref())?;
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let mut sandboxes: Vec<Sandbox> = state
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| namespace_of(&s.metadata) == principal.home_namespace())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter(|s| control::state_of(s).is_some_and(|st| states.iter().any(|w| w == st)))
        .filter(|s| control::matches(s, &filter))
        .filter(|s| {
            started_after.is_none_or(|after| {
                s.metadata
                    .creation_timestamp
                    .is_some_and(|started| started >= after)
            })
        })
        .filter(|s| template.is_none_or(|t| control::template_of(s) == t))
        .cloned()
        .collect();
    sandboxes.sort_by(|a, b| {
        let order = (a.metadata.creation_timestamp, &a.metadata.name)
            .cmp(&(b.metadata.creation_timestamp, &b.metadata.name));
        if newest_first {
            order.reverse()
        } else {
            order
        }
    });
    let total = sandboxes.len();
    let page: Vec<control::Detail> = sandboxes
        .iter()
        .skip(start)
        .take(limit)
        .map(|s| detail(&state, s))
        .collect();
    Ok(paged(page, start, limit, total))
}

fn detail(state: &AppState, sandbox: &Sandbox) -> control::Detail {
    let mut detail = control::detail(
        sandbox,
        spec_expiry(sandbox),
        (
            state.settings.default_cpus,
            state.settings.default_memory_mb,
        ),
    );
    detail.domain = control::sandbox_domain(sandbox, state.settings.preview_domain.as_deref());
    detail
}

pub async fn get(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<Json<control::Detail>, E2bError> {
    let sandbox = live_sandbox(&state.store, &key_of(&principal, &id, "sandbox")?)?;
    Ok(Json(detail(&state, &sandbox)))
}

pub async fn kill(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let key = key_of(&principal, &id, "sandbox")?;
    let timeout = V1Options::default().wait_timeout;
    crate::api::v1::sandboxes::delete_and_wait(&state, &key, timeout).await?;
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
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bError> {
    let key = key_of(&principal, &id, "sandbox")?;
    let request: TimeoutRequest = json_body(&body)?;
    let seconds = request
        .timeout
        .ok_or_else(|| E2bError::new(StatusCode::BAD_REQUEST, "timeout is required"))?;
    let end = deadline(&state, seconds)?;
    live_sandbox(&state.store, &key)?;
    set_end(&state, &key, end).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Connects to a sandbox: resumes it if it is paused or stopped, keeps it alive for at least
/// `timeout` more seconds, and answers its envd access token.
pub async fn connect(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Created>, E2bError> {
    let key = key_of(&principal, &id, "sandbox")?;
    let request: TimeoutRequest = json_body(&body)?;
    let end = request
        .timeout
        .map(|seconds| deadline(&state, seconds))
        .transpose()?;
    let sandbox = live_sandbox(&state.store, &key)?;
    // An explicit resume: whatever `autoResume` says (E2B resumes on connect either way).
    let mut sandbox = crate::api::power::resume(&state, sandbox, end).await?;
    if let Some(end) = end {
        if crate::api::power::ends_before(&sandbox.spec, lifetime_anchor(&sandbox), end) {
            sandbox = set_end(&state, &key, end).await?;
        }
    }
    Ok(Json(created(&state, &sandbox)))
}

/// Pauses a running sandbox: every process frozen, memory kept (`spec.state: Paused`); a
/// connect resumes it where it was. 409 when it is not running (the SDK's `False`).
pub async fn pause(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let key = key_of(&principal, &id, "sandbox")?;
    let sandbox = live_sandbox(&state.store, &key)?;
    if control::state_of(&sandbox) != Some("running") {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is not running"),
        ));
    }
    crate::api::power::set_state(
        &state.store,
        &key,
        crate::resource::SandboxState::Paused,
        crate::api::power::STATE_WAIT,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The sandbox's CPU and memory over the last hour, as the server sampled it.
/// `start` and `end` of a metrics query: Unix seconds, either bound left out.
#[derive(Debug, Default, Deserialize)]
pub struct MetricsQuery {
    start: Option<i64>,
    end: Option<i64>,
}

pub async fn metrics(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    query: Result<Query<MetricsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Vec<control::Metric>>, E2bError> {
    let Query(query) = query.map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let key = key_of(&principal, &id, "sandbox")?;
    let sandbox = live_sandbox(&state.store, &key)?;
    let samples: Vec<_> = state
        .metrics
        .history(&key)
        .into_iter()
        .map(|p| (p.at, p.cpu_seconds, p.memory_bytes, p.memory_limit_bytes))
        .collect();
    let cpus = sandbox
        .resolved_spec()
        .cpus
        .unwrap_or(state.settings.default_cpus);
    let within = |m: &control::Metric| {
        query.start.is_none_or(|start| m.timestamp_unix >= start)
            && query.end.is_none_or(|end| m.timestamp_unix <= end)
    };
    Ok(Json(
        control::metrics(&samples, cpus)
            .into_iter()
            .filter(within)
            .collect(),
    ))
}

/// The snapshot scope E2B's snapshots take: everything the sandbox can change (`Full`) when its
/// root filesystem is writable, else its workspace.
fn e2b_scope(sandbox: &Sandbox) -> SnapshotScope {
    if sandbox.resolved_spec().read_only_rootfs.unwrap_or(true) {
        SnapshotScope::Workspace
    } else {
        SnapshotScope::Full
    }
}

/// `POST /sandboxes/{id}/snapshots`: a `Snapshot` of the sandbox, ready when this answers.
pub async fn create_snapshot(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<control::SnapshotInfo>), E2bError> {
    let request: control::SnapshotRequest = json_body(&body)?;
    let name = control::snapshot_request(request).map_err(control_error)?;
    let key = key_of(&principal, &id, "sandbox")?;
    let sandbox = live_sandbox(&state.store, &key)?;
    let snapshot = take(
        &state,
        &V1Options::default(),
        &key,
        name,
        Some(e2b_scope(&sandbox)),
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(control::snapshot_info(
            &snapshot.metadata.name,
            snapshot.spec.display_name.as_deref(),
        )),
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotQuery {
    #[serde(rename = "sandboxID")]
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: Option<usize>,
    next_token: Option<String>,
}

/// `GET /snapshots`: the ready snapshots the key reaches, oldest first, filtered by source
/// sandbox and name, in pages with `x-next-token`.
pub async fn list_snapshots(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    query: Result<Query<SnapshotQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, E2bError> {
    let Query(query) = query.map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, e.body_text()))?;
    let start = page_start(query.next_token.as_deref())?;
    let limit = query.limit.unwrap_or(100).clamp(1, MAX_PAGE);
    let mut snapshots: Vec<_> = ready_snapshots(&state.store, principal.home_namespace())
        .iter()
        .filter(|s| {
            query
                .sandbox_id
                .as_deref()
                .is_none_or(|id| id.is_empty() || id == s.spec.sandbox)
        })
        .filter(|s| {
            query.name.as_deref().is_none_or(|n| {
                n.is_empty()
                    || control::snapshot_matches(
                        n,
                        &s.metadata.name,
                        s.spec.display_name.as_deref(),
                    )
            })
        })
        .map(|s| {
            (
                s.metadata.creation_timestamp,
                s.metadata.name.clone(),
                control::snapshot_info(&s.metadata.name, s.spec.display_name.as_deref()),
            )
        })
        .collect();
    snapshots.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let total = snapshots.len();
    let page: Vec<control::SnapshotInfo> = snapshots
        .into_iter()
        .skip(start)
        .take(limit)
        .map(|(_, _, info)| info)
        .collect();
    Ok(paged(page, start, limit, total))
}

/// `DELETE /templates/{id}`: deletes a snapshot (what `delete_snapshot` calls). Templates are
/// not deleted through E2B: any other ID is not found.
pub async fn delete_snapshot(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
) -> Result<StatusCode, E2bError> {
    let key = key_of(&principal, &id, "snapshot")?;
    if state.store.get(Kind::Snapshot, &key).is_none() {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("snapshot {id} not found"),
        ));
    }
    crate::api::v1::snapshots::remove(&state, &V1Options::default(), &key).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/fork`: one snapshot of the sandbox (which runs on, its end untouched),
/// then `count` sandboxes started from it, each answered with its own outcome. The snapshot is
/// kept (listed by `list_snapshots`): the forks were built from it.
pub async fn fork(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<(StatusCode, Json<Vec<control::ForkResult>>), E2bError> {
    let request: control::ForkRequest = json_body(&body)?;
    let count = control::fork_count(&request).map_err(control_error)?;
    let key = key_of(&principal, &id, "sandbox")?;
    let source = live_sandbox(&state.store, &key)?;
    let snapshot = take(
        &state,
        &V1Options::default(),
        &key,
        Some(format!("fork of {id}")),
        Some(e2b_scope(&source)),
    )
    .await?;
    let ttl = request
        .timeout
        .map_or(state.settings.default_timeout_seconds as i64, |t| t);
    let spec = spec_from_snapshot(
        &state,
        &snapshot.metadata.key(),
        Some(i128::from(ttl)),
        None,
        None,
        None,
        Default::default(),
    )?;
    let mut annotations = std::collections::BTreeMap::new();
    annotations.insert(control::TEMPLATE.to_string(), control::template_of(&source));
    if let Some(metadata) = source.metadata.annotations.get(control::METADATA) {
        annotations.insert(control::METADATA.to_string(), metadata.clone());
    }
    let namespace = source.metadata.namespace.clone();
    let forks = (0..count).map(|_| {
        let spec = spec.clone();
        let annotations = annotations.clone();
        let (state, namespace) = (state.clone(), namespace.clone());
        async move {
            create_running(&state, &V1Options::default(), move |id| {
                let mut sandbox = Sandbox::new(id, spec.clone());
                sandbox.metadata.namespace = namespace.clone();
                sandbox.metadata.annotations = annotations.clone();
                sandbox
            })
            .await
        }
    });
    let results = futures::future::join_all(forks)
        .await
        .into_iter()
        .map(|outcome| match outcome {
            Ok(sandbox) => control::ForkResult {
                sandbox: Some(created(&state, &sandbox)),
                error: None,
            },
            Err(e) => {
                let e = E2bError::from(e);
                control::ForkResult {
                    sandbox: None,
                    error: Some(control::ForkError {
                        code: e.status.as_u16(),
                        message: e.message,
                    }),
                }
            }
        })
        .collect();
    Ok((StatusCode::CREATED, Json(results)))
}

fn page_start(token: Option<&str>) -> Result<usize, E2bError> {
    match token {
        None | Some("") => Ok(0),
        Some(t) => t.parse().map_err(|_| {
            E2bError::new(
                StatusCode::BAD_REQUEST,
                format!("nextToken {t:?} is not valid"),
            )
        }),
    }
}

/// A page as E2B's lists answer it: the items, and `x-next-token` when more follow.
fn paged<T: serde::Serialize>(page: Vec<T>, start: usize, limit: usize, total: usize) -> Response {
    let mut response = Json(page).into_response();
    if start + limit < total {
        if let Ok(v) = HeaderValue::from_str(&(start + limit).to_string()) {
            response.headers_mut().insert("x-next-token", v);
        }
    }
    response
}

/// `PUT /sandboxes/{id}/network`: replaces the sandbox's allow list, in place (the next
/// connection follows it). A change between no network, an open network and an allow list would
/// replace the sandbox's container and end its processes, so it is refused (409), not done.
pub async fn update_network(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<StatusCode, E2bError> {
    let config: control::NetworkConfig = json_body(&body)?;
    let egress = control::egress_of(&config, config.allow_internet_access, "network")
        .map_err(control_error)?;
    let key = key_of(&principal, &id, "sandbox")?;
    let sandbox = live_sandbox(&state.store, &key)?;
    let spec = sandbox.resolved_spec();
    let network = spec.network.unwrap_or(false);
    match (&egress, network, spec.egress.is_some()) {
        (Egress::Only(allow), true, true) => {
            let allow = allow.clone();
            let name = key.clone();
            state
                .store
                .write(move |store| {
                    store.update(Kind::Sandbox, &name, |resource| match resource {
                        crate::resource::AnyResource::Sandbox(sandbox)
                            if sandbox.metadata.deletion_timestamp.is_none() =>
                        {
                            control::apply_egress(&mut sandbox.spec, &Egress::Only(allow.clone()));
                            Ok(())
                        }
                        _ => Err(crate::store::StoreError::Invalid(format!(
                            "sandbox {name} is going away"
                        ))),
                    })
                })
                .await
                .map_err(store_error)?;
            Ok(StatusCode::NO_CONTENT)
        }
        (Egress::Nothing, false, _) | (Egress::Open, true, false) => Ok(StatusCode::NO_CONTENT),
        _ => Err(E2bError::new(
            StatusCode::CONFLICT,
            format!(
                "sandbox {id} has {}: changing between no network, an open network and an \
                 allow list would replace its container and end its processes, so \
                 update_network only changes an allow list; create the sandbox with the \
                 network it needs",
                match (network, spec.egress.is_some()) {
                    (false, _) => "no network",
                    (true, false) => "an open network",
                    (true, true) => "an allow list",
                }
            ),
        )),
    }
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
