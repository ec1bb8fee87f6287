//! Workspaces with a size limit (`spec.diskMB`): before a container of such a plan is created,
//! its workspace volume is made as a bind of a disk of that size ([`crate::disk`]); a volume that
//! exists already keeps what it is (a plain volume stays unlimited until a rollback makes a new
//! workspace). At every reconcile of a sandbox whose workspace has a disk, [`keep`] mounts it
//! again if needed (after a reboot) and sets its limit to the current `diskMB`, live. A disk outlives its
//! volume only until the volume's removal or garbage collection removes it too.
//!
//! Copy-on-write views (`views.rs`) and warm-pool members are plain volumes: a sandbox with a
//! limit never claims a pool member, and its restores copy the snapshot into its disk (so a
//! snapshot larger than the limit fails to restore, with the space error).

use std::collections::BTreeMap;

use super::context::SandboxContext;
use super::error::ReconcileError;
use crate::docker::{ContainerPlan, EngineError, LABEL_ID, LABEL_MANAGED, LABEL_SERVER, LABEL_UID};
use crate::resource::EffectiveSandbox;

/// Makes `plan`'s workspace volume a disk of `plan.workspace_disk_mb` MiB unless the volume
/// exists; nothing for a plan without a limit.
pub(super) async fn ensure_volume(
    ctl: &SandboxContext<'_>,
    plan: &ContainerPlan,
) -> Result<(), ReconcileError> {
    if plan.workspace_disk_mb == 0 {
        return Ok(());
    }
    let volume = plan.workspace_volume.as_str();
    let disks = &ctl.containers.disks;
    let owner = ctl.settings.sandbox_uid_gid()?;
    if ctl.engine.inspect_volume(volume).await?.is_some() {
        disks.apply(volume, plan.workspace_disk_mb, owner).await?;
        return Ok(());
    }
    let source = disks.ensure(volume, plan.workspace_disk_mb, owner).await?;
    let labels = BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SERVER.to_string(), plan.server.clone()),
        (LABEL_ID.to_string(), plan.sandbox.clone()),
        (LABEL_UID.to_string(), plan.uid.clone()),
    ]);
    match ctl
        .engine
        .create_bind_volume(volume, &labels, &source)
        .await
    {
        // Made meanwhile by another reconcile of the same plan: the same disk.
        Ok(()) | Err(EngineError::Conflict { .. }) => {}
        Err(error) => return Err(error.into()),
    }
    disks.touch(volume);
    Ok(())
}

/// Keeps the disk of workspace `volume`, if it has one, mounted and limited to
/// `effective.disk_mb` MiB (a change applies live; 0 lifts the limit to the whole image).
pub(super) async fn keep(
    ctl: &SandboxContext<'_>,
    volume: &str,
    effective: &EffectiveSandbox,
) -> Result<(), ReconcileError> {
    let disks = &ctl.containers.disks;
    if !disks.exists(volume) {
        return Ok(());
    }
    let owner = ctl.settings.sandbox_uid_gid()?;
    disks.apply(volume, effective.disk_mb, owner).await?;
    Ok(())
}
