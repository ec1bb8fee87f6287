//! Sandbox lifecycle of `/v1`: create, list, get, delete and timeout. Each call validates in the
//! reference's order, writes desired state to the store, and answers from what the controller
//! then observes. [`create_from_spec`] is shared with fork.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};

use super::common::{
    create_with_new_id, live_sandbox, sandbox_info, sandbox_not_found, store_error,
};
use super::lax::{Bound, Fields};
use super::request::json_object;
use super::rules::{resolve, Wanted};
use super::wait::{self, Poll};
use super::wire::{self, SandboxInfo, SandboxList};
use super::{path_id, V1Options};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::authz::{namespace_of, Principal};
use crate::resource::{AnyResource, Condition, Kind, Sandbox, SandboxPhase, SandboxSpec};
use crate::store::{StoreError, WriteOptions};

/// Sandboxes that count against `max_sandboxes`: all but those being deleted or expired.
fn live_count(state: &AppState) -> usize {
    state
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| {
            s.metadata.deletion_timestamp.is_none()
                && !s
                    .status
                    .as_ref()
                    .is_some_and(|st| st.phase == SandboxPhase::Expired)
        })
        .count()
}

/// Writes a new sandbox (within `max_sandboxes`, without races) and waits until it runs. A
/// sandbox that fails or does not come up in time is deleted again: its caller never learns its
/// ID, so nobody else would.
/// The sandbox is made in `namespace` (the caller's first); its `/v1` ID is its key there.
pub async fn create_from_spec(
    state: &AppState,
    opts: &V1Options,
    spec: SandboxSpec,
    namespace: &str,
) -> Result<SandboxInfo, ApiError> {
    let namespace = namespace.to_string();
    let sandbox = create_running(state, opts, move |id| {
        let mut sandbox = Sandbox::new(id, spec.clone());
        sandbox.metadata.namespace = namespace.clone();
        sandbox
    })
    .await?;
    Ok(sandbox_info(&sandbox, &state.settings))
}

/// Writes the sandbox `make` builds around a new ID (within `max_sandboxes`, without races)
/// and answers it once it runs; one that fails or does not come up in time is deleted again.
/// Shared with the E2B API, whose sandboxes carry annotations too.
pub(crate) async fn create_running<F>(
    state: &AppState,
    opts: &V1Options,
    make: F,
) -> Result<Sandbox, ApiError>
where
    F: Fn(String) -> Sandbox + Send + 'static,
{
    let events = state.store.subscribe();
    let created = {
        let _guard = state.create_lock.lock().await;
        if live_count(state) >= state.settings.max_sandboxes {
            return Err(ApiError::LimitExceeded(format!(
                "the server already runs the maximum of {} sandboxes",
                state.settings.max_sandboxes
            )));
        }
        crate::api::quota::check(state, &make(String::new()).into())?;
        create_with_new_id(&state.store, "sb_", move |id| make(id).into()).await?
    };
    let id = created.key();
    let generation = created.metadata().generation.unwrap_or(0);
    let result = wait::until(
        &state.store,
        events,
        Kind::Sandbox,
        &id,
        opts.wait_timeout,
        &format!("sandbox {id} to start"),
        |entry| running(entry.and_then(|e| e.resource.as_sandbox()), &id, generation),
    )
    .await;
    match result {
        Ok(sandbox) => Ok(sandbox),
        Err(err) => {
            let name = id.clone();
            let deleted = state
                .store
                .write(move |store| store.delete(Kind::Sandbox, &name, WriteOptions::default()));
            if let Err(cleanup) = deleted.await {
                tracing::warn!(sandbox = %id, error = %cleanup, "cannot delete a sandbox that failed to start");
            }
            Err(err)
        }
    }
}

/// Deletes sandbox `id` and waits (up to `timeout`) until it is gone: its processes dead and its
/// name free. Shared with the E2B API's `kill`.
pub(crate) async fn delete_and_wait(
    state: &AppState,
    id: &str,
    timeout: std::time::Duration,
) -> Result<(), ApiError> {
    let events = state.store.subscribe();
    live_sandbox(&state.store, id)?;
    let name = id.to_string();
    state
        .store
        .write(move |store| store.delete(Kind::Sandbox, &name, WriteOptions::default()))
        .await
        .map_err(store_error)?;
    wait::until(
        &state.store,
        events,
        Kind::Sandbox,
        id,
        timeout,
        &format!("sandbox {id} to be removed"),
        |entry| match entry {
            None => Poll::Done(()),
            Some(e) => Poll::Pending(
                match e.resource.as_sandbox().and_then(|s| s.status.as_ref()) {
                    Some(status) => format!("phase {:?}", status.phase),
                    None => "no status yet".into(),
                },
            ),
        },
    )
    .await
}

/// Ends sandbox `id` at `deadline`: its time to live gives way to the absolute time. A sandbox
/// being deleted is not given a new end. Shared with the E2B API's `set_timeout`.
pub(crate) async fn set_shutdown_time(
    state: &AppState,
    id: &str,
    deadline: chrono::DateTime<chrono::Utc>,
) -> Result<AnyResource, StoreError> {
    let name = id.to_string();
    state
        .store
        .write(move |store| {
            store.update(Kind::Sandbox, &name, |resource| match resource {
                AnyResource::Sandbox(sandbox) => {
                    if sandbox.metadata.deletion_timestamp.is_some() {
                        return Err(StoreError::Terminating {
                            kind: Kind::Sandbox,
                            name: sandbox.metadata.key(),
                        });
                    }
                    sandbox.spec.shutdown_time = Some(deadline);
                    sandbox.spec.ttl_seconds = None;
                    Ok(())
                }
                _ => Err(StoreError::Invalid(format!("{name} is not a sandbox"))),
            })
        })
        .await
}

/// Whether a sandbox runs the given generation of its spec, has failed, or is still on its way.
pub fn running(sandbox: Option<&Sandbox>, id: &str, generation: u64) -> Poll<Sandbox> {
    let Some(sandbox) = sandbox else {
        return Poll::Fail(ApiError::Backend(format!(
            "sandbox {id} was deleted before it started"
        )));
    };
    if sandbox.metadata.deletion_timestamp.is_some() {
        return Poll::Fail(ApiError::Backend(format!("sandbox {id} is being deleted")));
    }
    let Some(status) = sandbox.status.as_ref() else {
        return Poll::Pending("no status yet".into());
    };
    let current = status.observed_generation.unwrap_or(0) >= generation;
    let condition = wait::ready_condition(&status.conditions, generation);
    if status.phase == SandboxPhase::Failed && current {
        let message = wait::explain(&status.message, condition, &format!("sandbox {id} failed"));
        return Poll::Fail(failure(sandbox, condition, message));
    }
    if let Some(failed) = wait::terminal_failure(&status.conditions, generation) {
        let message = wait::explain(
            &failed.message,
            Some(failed),
            &format!("sandbox {id} failed"),
        );
        return Poll::Fail(failure(sandbox, Some(failed), message));
    }
    if status.phase == SandboxPhase::Running && current && status.container_id.is_some() {
        return Poll::Done(sandbox.clone());
    }
    let mut state = format!("phase {:?}", status.phase);
    if !status.message.is_empty() {
        state.push_str(": ");
        state.push_str(&status.message);
    }
    Poll::Pending(state)
}

/// A sandbox failure as the client should see it: a vanished snapshot is a 404 like the
/// reference's, anything else a backend error that says why.
fn failure(sandbox: &Sandbox, condition: Option<&Condition>, message: String) -> ApiError {
    if condition.is_some_and(|c| c.reason == "SnapshotNotFound") {
        let snapshot = sandbox
            .spec
            .rollback
            .as_ref()
            .map(|r| r.snapshot.clone())
            .or_else(|| sandbox.spec.source.as_ref().map(|s| s.snapshot.clone()))
            .unwrap_or_default();
        return super::common::snapshot_not_found(&snapshot);
    }
    ApiError::Backend(message)
}

pub async fn create(
    State(state): State<AppState>,
    Extension(opts): Extension<V1Options>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let obj = json_object(&headers, body, true).await?.unwrap_or_default();
    let mut f = Fields::new(&obj);
    let wanted = Wanted {
        image: f.opt_str("image", None),
        cpus: f.opt_float("cpus", Bound::Gt(0.0)),
        memory_mb: f.opt_int("memory_mb", Bound::Ge(16)),
        pids_limit: f.opt_int("pids_limit", Bound::Ge(8)),
        network: f.bool_or("network", false),
        read_only_rootfs: f.bool_or("read_only_rootfs", true),
        timeout_seconds: f.opt_int("timeout_seconds", Bound::Ge(1)),
        env: f.env("env"),
    };
    f.finish()?;
    let spec = resolve(&state.settings, wanted)?;
    let info = create_from_spec(&state, &opts, spec, principal.home_namespace()).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
) -> Json<SandboxList> {
    let mut sandboxes: Vec<(Option<chrono::DateTime<chrono::Utc>>, SandboxInfo)> = state
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox())
        .filter(|s| namespace_of(&s.metadata) == principal.home_namespace())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .map(|s| {
            (
                s.metadata.creation_timestamp,
                sandbox_info(s, &state.settings),
            )
        })
        .collect();
    sandboxes.sort_by_key(|a| a.0);
    Json(SandboxList {
        sandboxes: sandboxes.into_iter().map(|(_, info)| info).collect(),
    })
}

pub async fn get(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<SandboxInfo>, ApiError> {
    let id = path_id(path)?;
    let sandbox = live_sandbox(&state.store, &id)?;
    Ok(Json(sandbox_info(&sandbox, &state.settings)))
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(opts): Extension<V1Options>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = path_id(path)?;
    delete_and_wait(&state, &id, opts.wait_timeout).await?;
    Ok(StatusCode::NO_CONTENT)
}

pub async fn set_timeout(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SandboxInfo>, ApiError> {
    let id = path_id(path)?;
    let obj = json_object(&headers, body, true).await?.unwrap_or_default();
    let mut f = Fields::new(&obj);
    let timeout = f.req_int("timeout_seconds", Bound::Ge(1));
    f.finish()?;
    let timeout = timeout.unwrap_or(1);
    let max = state.settings.max_timeout_seconds;
    if timeout < 1 || timeout > i128::from(max) {
        return Err(ApiError::InvalidRequest(format!(
            "timeout_seconds must be in [1, {max}]"
        )));
    }
    live_sandbox(&state.store, &id)?;
    let seconds = i64::try_from(timeout).unwrap_or(i64::MAX);
    let deadline = wire::truncate_to_micros(chrono::Utc::now())
        + chrono::TimeDelta::try_seconds(seconds).unwrap_or(chrono::TimeDelta::MAX);
    let updated = set_shutdown_time(&state, &id, deadline)
        .await
        .map_err(store_error)?;
    let sandbox = updated.as_sandbox().ok_or_else(|| sandbox_not_found(&id))?;
    let mut info = sandbox_info(sandbox, &state.settings);
    info.expires_at = Some(wire::timestamp(deadline));
    Ok(Json(info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(err: ApiError) -> (u16, String) {
        (err.status_and_code().0.as_u16(), err.to_string())
    }

    fn with_status(status: serde_json::Value, spec: SandboxSpec) -> Sandbox {
        let mut sb = Sandbox::new("sb_1", spec);
        sb.metadata.generation = Some(2);
        sb.status = Some(serde_json::from_value(status).unwrap());
        sb
    }

    fn ready_false(reason: &str, generation: u64) -> serde_json::Value {
        serde_json::json!([{"type": "Ready", "status": "False", "reason": reason,
            "message": format!("{reason} happened"), "lastTransitionTime": "2026-01-01T00:00:00Z",
            "observedGeneration": generation}])
    }

    #[test]
    fn waiting_tells_progress_from_failure() {
        let spec = SandboxSpec::default();
        let pending = with_status(serde_json::json!({"phase": "Creating"}), spec.clone());
        assert!(matches!(
            running(Some(&pending), "sb_1", 2),
            Poll::Pending(_)
        ));
        let stale = with_status(
            serde_json::json!({"phase": "Running", "observedGeneration": 1, "containerID": "c"}),
            spec.clone(),
        );
        assert!(matches!(running(Some(&stale), "sb_1", 2), Poll::Pending(_)));
        let done = with_status(
            serde_json::json!({"phase": "Running", "observedGeneration": 2, "containerID": "c"}),
            spec.clone(),
        );
        assert!(matches!(running(Some(&done), "sb_1", 2), Poll::Done(_)));
        // A transient failure not yet judged against this generation: keep waiting.
        let retrying = with_status(
            serde_json::json!({"phase": "Failed", "message": "docker hiccup"}),
            spec.clone(),
        );
        assert!(matches!(
            running(Some(&retrying), "sb_1", 2),
            Poll::Pending(_)
        ));
        let failed = with_status(
            serde_json::json!({"phase": "Failed", "observedGeneration": 2,
                "message": "image x is not present on the docker host",
                "conditions": ready_false("ImageMissing", 2)}),
            spec.clone(),
        );
        match running(Some(&failed), "sb_1", 2) {
            Poll::Fail(e) => assert_eq!(
                message(e),
                (502, "image x is not present on the docker host".into())
            ),
            _ => panic!("expected a failure"),
        }
        // A failed rollback leaves the sandbox running; its condition says what went wrong.
        let rollback = with_status(
            serde_json::json!({"phase": "Running", "observedGeneration": 2, "containerID": "c",
                "conditions": ready_false("RollbackFailed", 2)}),
            spec.clone(),
        );
        match running(Some(&rollback), "sb_1", 2) {
            Poll::Fail(e) => assert_eq!(message(e), (502, "RollbackFailed happened".into())),
            _ => panic!("expected a failure"),
        }
        // ... unless the condition is about an older generation.
        let old = with_status(
            serde_json::json!({"phase": "Running", "observedGeneration": 2, "containerID": "c",
                "conditions": ready_false("RollbackFailed", 1)}),
            spec.clone(),
        );
        assert!(matches!(running(Some(&old), "sb_1", 2), Poll::Done(_)));
        let forked = SandboxSpec {
            source: Some(crate::resource::SandboxSource {
                snapshot: "snap_1".into(),
            }),
            ..SandboxSpec::default()
        };
        let gone = with_status(
            serde_json::json!({"phase": "Failed", "observedGeneration": 2,
                "conditions": ready_false("SnapshotNotFound", 2)}),
            forked,
        );
        match running(Some(&gone), "sb_1", 2) {
            Poll::Fail(e) => assert_eq!(message(e), (404, "snapshot snap_1 not found".into())),
            _ => panic!("expected a failure"),
        }
        assert!(matches!(running(None, "sb_1", 2), Poll::Fail(_)));
    }
}
