//! A warm pool member taking a snapshot's copy-on-write view while it runs. A plain pool's
//! members start with an empty workspace, since they do not know which snapshot (if any) their
//! sandbox will restore; filling one by copying grows with the snapshot. Instead, the snapshot's
//! view (the same tree, upper and work directories `views.rs` gives a new container)
//! is mounted over the member's workspace on this host and inside its mount namespace
//! ([`crate::view_mount`]), which costs the same whatever the snapshot holds.
//!
//! Used only where it verifiably works: views are usable for the runtime, the runtime is not
//! gVisor (its gofer keeps the directory it opened at the start), and the mount has not been
//! shown impossible on this host; after the mount, the view is proven as every view is (the
//! container's `/workspace` is the volume's directory here, and that directory is the overlay
//! with this upper directory). When it cannot be done the caller gives the member back to
//! removal and mounts a view on a new container instead.
//!
//! The view's directories are named after the member's volume, so they live as long as it does
//! and are collected with it; the store keeps their tree meanwhile (a view's directory names its
//! tree). Removing the volume takes the host's mount away first (`docker` does that). A mount
//! the host lost (a reboot) is made again before the workspace is used ([`keep`]): Docker binds
//! the volume's directory as it finds it when the container starts.

use super::content::Validated;
use super::error::ReconcileError;
use super::views::{self, ViewContext};
use super::workspace::WORKSPACE;
use crate::docker::{is_gvisor, volume_directory_mounted, Engine, ViewPaths};
use crate::store::Store;
use crate::view_mount::{self, Overlay, ViewMountError};

/// Whether a member of `runtime` may take a view here, as far as is known.
pub(super) fn possible(ctl: &ViewContext<'_>, runtime: &str) -> bool {
    !is_gvisor(runtime)
        && views::usable(ctl, runtime)
        && ctl.workspaces.mount_access.get(runtime) != Some(false)
}

/// Mounts a view of `snapshot` over the workspace of the running member `container_id`, whose
/// volume is `volume`. `false` when it could not be done: nothing is mounted then, and the
/// member must not be used (its workspace may be neither empty nor the snapshot).
pub(super) async fn mount(
    ctl: &ViewContext<'_>,
    container_id: &str,
    volume: &str,
    runtime: &str,
    snapshot: &Validated,
) -> Result<bool, ReconcileError> {
    if !possible(ctl, runtime) {
        return Ok(false);
    }
    let Some((key, owner, lower)) = views::tree_of(ctl, snapshot).await? else {
        return Ok(false);
    };
    let dirs = match ctl.store.create_view(volume, &key, owner).await {
        Ok(dirs) => dirs,
        Err(error) => {
            tracing::warn!(%error, "a view's directories cannot be made");
            return Ok(false);
        }
    };
    // The member's volume is there already.
    ctl.store.view_volume_made(volume);
    let paths = ViewPaths {
        lower,
        upper: dirs.upper.clone(),
        work: dirs.work,
    };
    let details = ctl.engine.inspect_container(container_id).await?;
    let Some((pid, host_dir)) = details.and_then(|d| Some((d.pid, d.workspace_source?))) else {
        ctl.store.remove_view(volume).await;
        return Ok(false);
    };
    let id = container_id.to_string();
    let mounted = tokio::task::spawn_blocking(move || {
        let overlay = Overlay {
            lower: &paths.lower,
            upper: &paths.upper,
            work: &paths.work,
        };
        view_mount::mount_into_running(&overlay, &host_dir, pid, &id, WORKSPACE)
    })
    .await
    .unwrap_or_else(|e| Err(ViewMountError::Failed(e.to_string())));
    let outcome = match mounted {
        Ok(()) => views::verify(ctl, container_id, runtime, &dirs.upper)
            .await
            .map_err(|unavailable| unavailable.reason),
        Err(ViewMountError::Unsupported(reason)) => {
            ctl.workspaces.mount_access.learn(runtime, false);
            Err(reason)
        }
        Err(ViewMountError::Failed(reason)) => Err(reason),
    };
    match outcome {
        Ok(()) => {
            ctl.workspaces.mount_access.learn(runtime, true);
            Ok(true)
        }
        Err(reason) => {
            // A mount that did not prove itself stays until the member's volume is removed,
            // which takes it away; the directories go once nothing is mounted on them.
            tracing::info!(%reason, "a pool member could not take the view; using a new container");
            Ok(false)
        }
    }
}

/// Mounts the view of volume `volume` over its directory on this host again when it is a pool
/// member's view (Docker knows it as a plain volume) and nothing is mounted there (after a
/// reboot), so the container started next, or a snapshot of the stopped sandbox, finds its
/// workspace. Anything else is left alone.
pub(super) async fn keep(
    store: &Store,
    engine: &dyn Engine,
    volume: &str,
) -> Result<(), ReconcileError> {
    let Some(key) = store.view_tree(volume).await else {
        return Ok(());
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| ReconcileError::HostWrite(format!("the mount table: {e}")))?;
    if volume_directory_mounted(&table, volume) || engine.view_of_volume(volume).await?.is_some() {
        return Ok(());
    }
    let Some(dir) = engine.volume_directory(volume).await? else {
        return Ok(());
    };
    let lost = |what: &str| ReconcileError::HostWrite(format!("view {volume}: {what}"));
    let lower = store
        .tree_layers(&key)
        .await
        .ok_or_else(|| lost("its tree is gone"))?;
    let dirs = store.view_dirs(volume, &key);
    tracing::info!(volume, "mounting a pool member's view again");
    tokio::task::spawn_blocking(move || {
        let overlay = Overlay {
            lower: &lower,
            upper: &dirs.upper,
            work: &dirs.work,
        };
        view_mount::mount_on_host(&overlay, &dir)
    })
    .await
    .map_err(|e| lost(&e.to_string()))?
    .map_err(|e| lost(&e.to_string()))
}
