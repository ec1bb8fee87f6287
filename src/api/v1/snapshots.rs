//! Snapshots of `/v1` and what is built from them: take, list, get and delete a snapshot; roll a
//! sandbox back to one; fork a new sandbox from one. Like the sandbox calls, each writes desired
//! state and waits for the controller's observed status.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::{Extension, Json};

use super::common::{
    create_with_new_id, live_sandbox, new_id, ready_snapshot, ready_snapshots, sandbox_info,
    sandbox_not_found, snapshot_info, snapshot_not_found, store_error,
};
use super::lax::{Bound, Fields};
use super::request::{json_object, query_params};
use super::rules::{resolve, Wanted};
use super::sandboxes::{create_from_spec, running};
use super::wait::{self, Poll};
use super::wire::{SandboxInfo, SnapshotInfo, SnapshotList};
use super::{path_id, V1Options};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::authz::Principal;
use crate::resource::{
    split_key, AnyResource, ConditionStatus, Kind, RollbackRequest, SandboxState, Snapshot,
    SnapshotPhase, SnapshotScope, SnapshotSpec,
};
use crate::store::{StoreError, WriteOptions};

pub async fn create(
    State(state): State<AppState>,
    Extension(opts): Extension<V1Options>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<SnapshotInfo>), ApiError> {
    let sandbox_id = path_id(path)?;
    let obj = json_object(&headers, body, false)
        .await?
        .unwrap_or_default();
    let mut f = Fields::new(&obj);
    let name = f.opt_str("name", Some(128));
    let scope = f
        .opt_choice("scope", &["Workspace", "Full"])
        .map(|scope| match scope {
            "Full" => SnapshotScope::Full,
            _ => SnapshotScope::Workspace,
        });
    f.finish()?;
    let snapshot = take(&state, &opts, &sandbox_id, name, scope).await?;
    Ok((StatusCode::CREATED, Json(snapshot_info(&snapshot))))
}

/// Takes a snapshot of `sandbox_id` and waits until it is ready (a failed one is deleted, its
/// ID never handed out). Shared by `/v1` and E2B's snapshot and fork calls.
pub(crate) async fn take(
    state: &AppState,
    opts: &V1Options,
    sandbox_id: &str,
    name: Option<String>,
    scope: Option<SnapshotScope>,
) -> Result<Snapshot, ApiError> {
    let sandbox_id = sandbox_id.to_string();
    // A paused or stopped sandbox is snapshotted as it is, and stays so (the controller reads
    // its workspace without waking it); the call still counts as the sandbox's activity.
    live_sandbox(&state.store, &sandbox_id)?;
    state.activity.touch(&sandbox_id);

    let events = state.store.subscribe();
    // The snapshot lives in its sandbox's namespace, and names it there.
    let (namespace, sandbox_name) = split_key(&sandbox_id);
    let namespace = namespace.to_string();
    let spec = SnapshotSpec {
        sandbox: sandbox_name.to_string(),
        display_name: name,
        scope,
    };
    let in_namespace = move |id: &str| {
        let mut snapshot = Snapshot::new(id, spec.clone());
        snapshot.metadata.namespace = namespace.clone();
        snapshot
    };
    let created = {
        let _admission = state.create_lock.lock().await;
        crate::api::quota::check(state, &in_namespace("").into())?;
        create_with_new_id(&state.store, "snap_", move |id| in_namespace(&id).into()).await?
    };
    let id = created.key();
    let result = wait::until(
        &state.store,
        events,
        Kind::Snapshot,
        &id,
        opts.wait_timeout,
        &format!("snapshot {id} of sandbox {sandbox_id}"),
        |entry| {
            let snapshot = entry.and_then(|e| e.resource.as_snapshot());
            snapshot_ready(
                snapshot,
                &id,
                &sandbox_id,
                state.settings.max_snapshot_bytes,
            )
        },
    )
    .await;
    match result {
        Ok(snapshot) => Ok(snapshot),
        Err(err) => {
            // A failed snapshot is of no use to anyone and its ID was never handed out.
            let name = id.clone();
            let deleted = state
                .store
                .write(move |store| store.delete(Kind::Snapshot, &name, WriteOptions::default()));
            if let Err(cleanup) = deleted.await {
                tracing::warn!(snapshot = %id, error = %cleanup, "cannot delete a failed snapshot");
            }
            Err(err)
        }
    }
}

fn snapshot_ready(
    snapshot: Option<&Snapshot>,
    id: &str,
    sandbox_id: &str,
    limit: u64,
) -> Poll<Snapshot> {
    let Some(snapshot) = snapshot else {
        return Poll::Fail(ApiError::Backend(format!(
            "snapshot {id} was deleted before it was taken"
        )));
    };
    let Some(status) = snapshot.status.as_ref() else {
        return Poll::Pending("no status yet".into());
    };
    let condition = status.conditions.iter().find(|c| c.type_ == "Ready");
    let failed = status.phase == SnapshotPhase::Failed
        || wait::terminal_failure(&status.conditions, 0).is_some();
    if failed {
        let message = wait::explain(
            &status.message,
            condition,
            &format!("snapshot of sandbox {sandbox_id} failed"),
        );
        let reason = condition
            .filter(|c| c.status == ConditionStatus::False)
            .map(|c| c.reason.as_str());
        return Poll::Fail(match reason {
            Some("TooLarge") => ApiError::PayloadTooLarge(format!(
                "workspace exceeds the snapshot limit of {limit} bytes"
            )),
            Some("SandboxNotFound") => sandbox_not_found(sandbox_id),
            Some("SandboxNotRunning") => {
                ApiError::InvalidRequest(format!("sandbox {sandbox_id} is not running"))
            }
            // Asked for a Full snapshot of a sandbox whose root filesystem is read-only.
            Some("ReadOnlyRootfs") => ApiError::InvalidRequest(message),
            // Its size, known once taken, would pass a ResourceQuota's snapshotBytes.
            Some("QuotaExceeded") => ApiError::QuotaExceeded(message),
            _ => ApiError::Backend(message),
        });
    }
    if status.phase == SnapshotPhase::Ready {
        return Poll::Done(snapshot.clone());
    }
    Poll::Pending(format!("phase {:?}", status.phase))
}

pub async fn list(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    RawQuery(query): RawQuery,
) -> Json<SnapshotList> {
    let filter = query_params(query.as_deref()).remove("sandbox_id");
    let mut snapshots: Vec<_> = ready_snapshots(&state.store, principal.home_namespace())
        .iter()
        .filter(|s| {
            filter
                .as_ref()
                .is_none_or(|f| *f == s.metadata.sibling(&s.spec.sandbox))
        })
        .map(|s| (s.metadata.creation_timestamp, snapshot_info(s)))
        .collect();
    snapshots.sort_by_key(|a| a.0);
    Json(SnapshotList {
        snapshots: snapshots.into_iter().map(|(_, info)| info).collect(),
    })
}

pub async fn get(
    State(state): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<SnapshotInfo>, ApiError> {
    let id = path_id(path)?;
    Ok(Json(snapshot_info(&ready_snapshot(&state.store, &id)?)))
}

pub async fn delete(
    State(state): State<AppState>,
    Extension(opts): Extension<V1Options>,
    path: Result<Path<String>, PathRejection>,
) -> Result<StatusCode, ApiError> {
    let id = path_id(path)?;
    remove(&state, &opts, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes the snapshot `id` and waits until it is gone (404 when there is none).
pub(crate) async fn remove(state: &AppState, opts: &V1Options, id: &str) -> Result<(), ApiError> {
    let id = id.to_string();
    let events = state.store.subscribe();
    let exists = state
        .store
        .get(Kind::Snapshot, &id)
        .is_some_and(|e| e.resource.metadata().deletion_timestamp.is_none());
    if !exists {
        return Err(snapshot_not_found(&id));
    }
    let name = id.clone();
    state
        .store
        .write(move |store| store.delete(Kind::Snapshot, &name, WriteOptions::default()))
        .await
        .map_err(store_error)?;
    wait::until(
        &state.store,
        events,
        Kind::Snapshot,
        &id,
        opts.wait_timeout,
        &format!("snapshot {id} to be removed"),
        |entry| match entry {
            None => Poll::Done(()),
            Some(_) => Poll::Pending("deletion in progress".into()),
        },
    )
    .await
}

pub async fn rollback(
    State(state): State<AppState>,
    Extension(opts): Extension<V1Options>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<SandboxInfo>, ApiError> {
    let id = path_id(path)?;
    let obj = json_object(&headers, body, true).await?.unwrap_or_default();
    let mut f = Fields::new(&obj);
    let snapshot_id = f.req_str("snapshot_id");
    f.finish()?;
    let snapshot_id = snapshot_id.unwrap_or_default();
    // The reference looks the snapshot up first: an unknown snapshot wins over an unknown sandbox.
    // A sandbox rolls back only to a snapshot of its own namespace; any other is unknown to it.
    if split_key(&snapshot_id).0 != split_key(&id).0 {
        return Err(super::common::snapshot_not_found(&snapshot_id));
    }
    ready_snapshot(&state.store, &snapshot_id)?;
    let sandbox = live_sandbox(&state.store, &id)?;
    // The answer is the sandbox running on the snapshot's content: a paused or stopped one is
    // resumed by the same write (or the call refused without `autoResume`), as exec does.
    let wake = crate::api::power::wake_with_change(&state, &sandbox)?;

    let events = state.store.subscribe();
    let request_id = new_id("r-");
    let request = RollbackRequest {
        snapshot: split_key(&snapshot_id).1.to_string(),
        request_id: request_id.clone(),
    };
    let name = id.clone();
    let updated = state
        .store
        .write(move |store| {
            store.update(Kind::Sandbox, &name, |resource| match resource {
                AnyResource::Sandbox(sandbox) if sandbox.metadata.deletion_timestamp.is_none() => {
                    sandbox.spec.rollback = Some(request.clone());
                    if wake {
                        sandbox.spec.state = Some(SandboxState::Running);
                    }
                    Ok(())
                }
                _ => Err(StoreError::NotFound {
                    kind: Kind::Sandbox,
                    name: name.clone(),
                }),
            })
        })
        .await
        .map_err(store_error)?;
    let generation = updated.metadata().generation.unwrap_or(0);
    let sandbox = wait::until(
        &state.store,
        events,
        Kind::Sandbox,
        &id,
        opts.wait_timeout,
        &format!("sandbox {id} to roll back to {snapshot_id}"),
        |entry| {
            let sandbox = entry.and_then(|e| e.resource.as_sandbox());
            let done = sandbox
                .and_then(|s| s.status.as_ref())
                .and_then(|s| s.last_rollback.as_ref())
                .is_some_and(|r| r.request_id == request_id);
            match running(sandbox, &id, generation) {
                Poll::Done(s) if done => Poll::Done(s),
                Poll::Done(_) => Poll::Pending("rollback not done yet".into()),
                other => other,
            }
        },
    )
    .await?;
    let mut info = sandbox_info(&sandbox, &state.settings);
    info.source_snapshot_id = Some(snapshot_id);
    Ok(Json(info))
}

pub async fn fork(
    State(state): State<AppState>,
    Extension(opts): Extension<V1Options>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<SandboxInfo>), ApiError> {
    let snapshot_id = path_id(path)?;
    let obj = json_object(&headers, body, false)
        .await?
        .unwrap_or_default();
    let mut f = Fields::new(&obj);
    let timeout_seconds = f.opt_int("timeout_seconds", Bound::Ge(1));
    let network = f.opt_bool("network");
    let cpus = f.opt_float("cpus", Bound::Gt(0.0));
    let memory_mb = f.opt_int("memory_mb", Bound::Ge(16));
    f.finish()?;
    let spec = spec_from_snapshot(
        &state,
        &snapshot_id,
        timeout_seconds,
        network,
        cpus,
        memory_mb,
        Default::default(),
    )?;
    let namespace = split_key(&snapshot_id).0;
    let info = create_from_spec(&state, &opts, spec, namespace).await?;
    Ok((StatusCode::CREATED, Json(info)))
}

/// The spec of a new sandbox started from the ready snapshot `snapshot_id`: the spec it captured,
/// with the given overrides (`env` merged over the captured environment), the snapshot as
/// `source`, and its own lifetime, never the source's. Shared by `/v1` fork and E2B.
pub(crate) fn spec_from_snapshot(
    state: &AppState,
    snapshot_id: &str,
    timeout_seconds: Option<i128>,
    network: Option<bool>,
    cpus: Option<f64>,
    memory_mb: Option<i128>,
    env: std::collections::BTreeMap<String, String>,
) -> Result<crate::resource::SandboxSpec, ApiError> {
    let snapshot = ready_snapshot(&state.store, snapshot_id)?;
    let captured = snapshot
        .status
        .as_ref()
        .and_then(|s| s.sandbox_spec.clone())
        .unwrap_or_default();
    let mut merged = captured.env.clone();
    merged.extend(env);
    let wanted = Wanted {
        image: captured.image.clone(),
        cpus: cpus.or(captured.cpus),
        memory_mb: memory_mb.or(captured.memory_mb.map(i128::from)),
        pids_limit: captured.pids_limit.map(i128::from),
        network: network.unwrap_or(captured.network.unwrap_or(false)),
        read_only_rootfs: captured.read_only_rootfs.unwrap_or(true),
        env: merged,
        // Like the reference: the new sandbox gets its own lifetime, never the source's.
        timeout_seconds,
    };
    let mut spec = resolve(&state.settings, wanted)?;
    // The source names the snapshot in the new sandbox's namespace, which is the snapshot's.
    spec.source = Some(crate::resource::SandboxSource {
        snapshot: split_key(snapshot_id).1.to_string(),
    });
    Ok(spec)
}
