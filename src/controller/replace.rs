//! Replacing a sandbox's container without taking the sandbox down, keeping its workspace: by a
//! warm pool member that the workspace is carried into on this host ([`from_pool`]), or by a new
//! container built under the staging name while the old one keeps serving ([`with_new`]). Either
//! way the new container takes the sandbox's name only once it is ready. The sandbox reconcile
//! (`sandbox.rs`) decides when a container is replaced; rollbacks (`restore.rs`) replace the
//! workspace as well.

use super::claims::ClaimName;
use super::container::Replaced;
use super::context::SandboxContext;
use super::error::ReconcileError;
use super::names::staging_container_name;
use super::workspace::open_host_root;
use crate::archive;
use crate::docker::{ContainerDetails, ContainerPlan};
use crate::resource::{EffectiveSandbox, SandboxStatus};

/// Builds and starts the container of `plan` in place of the container `old` that holds the
/// sandbox's name, without taking the sandbox down: the new one is made ready under the staging
/// name while the old one keeps serving (on the same workspace), then the names are swapped.
/// Returns the new container and the old one, to remove once the status names the new one.
pub(super) async fn with_new(
    ctl: &SandboxContext<'_>,
    name: &str,
    plan: &mut ContainerPlan,
    old: &str,
) -> Result<(String, Option<String>), ReconcileError> {
    let staging = staging_container_name(name);
    plan.name = Some(staging.clone());
    // Left by an interrupted replacement or rollback: never trusted.
    ctl.engine.remove_container(&staging).await?;
    let id = ctl.engine.create_container(plan).await?;
    let runtime = plan.runtime.clone().unwrap_or_default();
    let swapped = async {
        ctl.workspaces
            .start_with_workspace(&id, &runtime, None)
            .await?;
        Ok::<_, ReconcileError>(ctl.containers.swap_in(name, &id).await?)
    };
    match swapped.await {
        Ok(replaced) => Ok((id, replaced.or_else(|| Some(old.to_string())))),
        Err(error) => {
            let _ = ctl.engine.remove_container(&id).await;
            Err(error)
        }
    }
}

/// Replaces the sandbox's container `old` (running, on this host) with a warm pool member
/// that matches `effective`, carrying the workspace over on this host by hard links: no byte
/// is copied, and the old workspace stays whole until the status names the new one, so a
/// crash at any point leaves the sandbox as it was. The old container is paused while the
/// tree is carried (nothing may change it meanwhile) and serves again if anything fails.
/// `None` when this cannot be done here (no host access, no free member): the caller builds
/// a new container instead. On success `status` describes the member and the returned
/// leftovers (the old container and workspace) go once it is written.
pub(super) async fn from_pool(
    ctl: &SandboxContext<'_>,
    name: &str,
    effective: &EffectiveSandbox,
    old: &ContainerDetails,
    status: &mut SandboxStatus,
) -> Result<Option<Replaced>, ReconcileError> {
    let runtime = ctl.settings.docker_runtime.clone();
    if !ctl.workspaces.may_use_host(&runtime) {
        return Ok(None);
    }
    // Only the container the status records is known to mount the recorded workspace (one
    // left by an interrupted replacement, or by an earlier resource of this name, may not).
    if status.container_id.as_deref() != Some(old.id.as_str()) || status.workspace_volume.is_none()
    {
        return Ok(None);
    }
    // Proven before anything changes: the old workspace is the old container's.
    let from = match open_host_root(old) {
        Ok(from) => {
            ctl.workspaces.host_access.learn(&runtime, true);
            from
        }
        Err(error) => {
            tracing::debug!(sandbox = name, %error, "the workspace cannot be carried on this host");
            if error.lasting {
                ctl.workspaces.host_access.learn(&runtime, false);
            }
            return Ok(None);
        }
    };
    let staging = staging_container_name(name);
    let Some(claimed) = ctl
        .pools
        .claim_as(name, effective, ClaimName::Now(&staging))
        .await?
    else {
        return Ok(None);
    };
    let carried = async {
        ctl.engine.pause(&old.id).await?;
        let member = ctl
            .workspaces
            .inspect_present(&claimed.container_id, " after its claim")
            .await?;
        let to =
            open_host_root(&member).map_err(|e| ReconcileError::HostUnavailable(e.to_string()))?;
        let count = tokio::task::spawn_blocking(move || archive::link_tree(from, to))
            .await?
            .map_err(|e| ReconcileError::HostWrite(e.to_string()))?;
        ctl.containers.swap_in(name, &claimed.container_id).await?;
        Ok::<_, ReconcileError>(count)
    }
    .await;
    match carried {
        Ok(count) => {
            tracing::info!(
                sandbox = name,
                entries = count,
                "workspace carried into a warm container"
            );
            let old_volume = status.workspace_volume.clone();
            claimed.record(status, effective);
            Ok(Some(Replaced {
                container: Some(old.id.clone()),
                volume: old_volume,
            }))
        }
        Err(error) => {
            tracing::info!(sandbox = name, %error, "cannot carry the workspace into a warm container; building a new one");
            ctl.containers
                .discard(&claimed.container_id, &claimed.volume)
                .await;
            ctl.engine.unpause(&old.id).await?;
            Ok(None)
        }
    }
}
