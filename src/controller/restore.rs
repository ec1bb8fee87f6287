//! Restoring a snapshot into a sandbox: the first workspace of a sandbox started from
//! `spec.source`, and rollbacks (`spec.rollback`). Both make a NEW workspace: a member of a
//! pooled template on the snapshot (which holds it already), a warm pool member's filled here, or
//! a new volume mounted by a new container (a view of the snapshot, or a copy: see `views.rs`
//! and `workspace.rs`).
//!
//! Order is what makes this safe. The stored tar is validated whole by [`crate::archive`] before
//! Docker is touched (once per unchanged file: see `content.rs`), so a refused snapshot changes
//! nothing; it is checked (and rewritten: owner forced, fresh headers) a second time while it is
//! written, and any difference aborts the restore. A rollback builds its new container under a
//! staging name while the old one keeps serving, and swaps the names only once the new workspace
//! is complete. A workspace counts as restored only once `status.workspaceVolume` names it: an
//! interrupted restore leaves an unrecorded container and volume that the retry replaces or the
//! cleanup of stray objects removes. This module decides nothing about when to restore;
//! `sandbox.rs` does.

use chrono::Utc;

use super::claims::{ClaimName, Claimed};
use super::container::limits_of;
use super::container::Replaced;
use super::content::{self, Validated};
use super::context::SandboxContext;
use super::error::ReconcileError;
use super::names::{self, container_name, staging_container_name};
use super::status::{clear_condition, note_immutable};
use super::workspace::Prepare;
use crate::docker::ContainerPlan;
use crate::resource::{EffectiveSandbox, RollbackRecord, RootfsRecord, Sandbox, SandboxStatus};

/// The snapshot `name`, validated, from the store.
async fn validated(ctl: &SandboxContext<'_>, name: &str) -> Result<Validated, ReconcileError> {
    content::validated(ctl.store, ctl.settings, ctl.validated_files, name).await
}

/// The root filesystem a sandbox restored from `snapshot` runs on: a `Full` snapshot's image,
/// checked to be there and to fit the sandbox's `spec.image`; `None` for a `Workspace` snapshot.
async fn rootfs_of(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    snapshot: &Validated,
) -> Result<Option<RootfsRecord>, ReconcileError> {
    let Some(rootfs) = &snapshot.rootfs else {
        return Ok(None);
    };
    let record = RootfsRecord {
        snapshot: snapshot.name.clone(),
        image: rootfs.image.clone(),
        base_image: rootfs.base.clone(),
    };
    if !record.applies_to(sandbox.spec.image.as_deref()) {
        return Err(ReconcileError::RootfsImageMismatch {
            snapshot: snapshot.name.clone(),
            base: rootfs.base.clone(),
            image: sandbox.spec.image.clone().unwrap_or_default(),
        });
    }
    if !ctl.engine.image_exists(&rootfs.image).await? {
        return Err(ReconcileError::RootfsImageMissing {
            snapshot: snapshot.name.clone(),
            image: rootfs.image.clone(),
        });
    }
    Ok(Some(record))
}

/// Makes `plan.workspace_volume` a new volume holding the snapshot (a copy-on-write view of it
/// where views work here, see `views.rs`; else a copy), mounted by a newly created and started
/// container of `plan`, whose ID is returned. The container's name must be free.
/// On error both are removed again.
pub(super) async fn populate_volume(
    ctl: &SandboxContext<'_>,
    plan: &ContainerPlan,
    snapshot: &Validated,
) -> Result<String, ReconcileError> {
    let volume = plan.workspace_volume.as_str();
    // Whatever an interrupted attempt left there is not trusted; the create makes it anew,
    // labeled for the sandbox (a disk of its own first, for a plan with a disk limit).
    ctl.engine.remove_volume(volume).await?;
    if plan.workspace_disk_mb > 0 {
        ctl.containers.disks.remove(volume).await?;
        super::workspace_disk::ensure_volume(ctl, plan).await?;
    } else if let Some(id) = super::views::populate_view(&ctl.views(), plan, snapshot).await? {
        return Ok(id);
    }
    let id = match ctl.engine.create_container(plan).await {
        Ok(id) => id,
        Err(error) => {
            let _ = ctl.engine.remove_volume(volume).await;
            return Err(error.into());
        }
    };
    let runtime = plan.runtime.clone().unwrap_or_default();
    match ctl
        .workspaces
        .start_with_workspace(&id, &runtime, Some(snapshot))
        .await
    {
        Ok(()) => Ok(id),
        Err(error) => {
            ctl.containers.discard(&id, volume).await;
            Err(error)
        }
    }
}

/// Before a sandbox's first container: builds its first workspace from `spec.source`, in a
/// running container of `effective` that `status` then names; returns whether it did so now.
/// Later changes of `spec.source` never rebuild anything; they are reported in a condition.
pub(super) async fn ensure_source(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &mut SandboxStatus,
) -> Result<bool, ReconcileError> {
    let name = &sandbox.metadata.key();
    let Some(source) = &sandbox.spec.source else {
        clear_condition(&mut status.conditions, SOURCE_CONDITION);
        return Ok(false);
    };
    if status.workspace_volume.is_some() {
        note_source_change(status, sandbox, &source.snapshot);
        return Ok(false);
    }
    let snapshot = validated(ctl, &sandbox.metadata.sibling(&source.snapshot)).await?;
    let rootfs = rootfs_of(ctl, sandbox, &snapshot).await?;
    // A template's pool members already hold its snapshot, root filesystem and all.
    let record = status.template.clone();
    if let Some(claimed) =
        super::template_pool::claim(ctl, sandbox, record.as_ref(), effective).await?
    {
        claimed.record(status, effective);
        status.source_snapshot = Some(source.snapshot.clone());
        status.rootfs = rootfs;
        return Ok(true);
    }
    // So do the members of a pooled template on this snapshot, for a sandbox shaped as they are.
    if effective.disk_mb == 0 {
        let claimed = super::template_pool::claim_holding(
            ctl,
            &snapshot.name,
            name,
            effective,
            ClaimName::Own,
        )
        .await?;
        if let Some(claimed) = claimed {
            claimed.record(status, effective);
            status.source_snapshot = Some(source.snapshot.clone());
            status.rootfs = rootfs;
            return Ok(true);
        }
    }
    // Warm pool members run the plain image: they serve Workspace snapshots only, and have no
    // disk limit.
    if rootfs.is_none() && effective.disk_mb == 0 {
        if let Some(claimed) =
            claim_filled(ctl, sandbox, effective, &container_name(name), &snapshot).await?
        {
            claimed.record(status, effective);
            status.source_snapshot = Some(source.snapshot.clone());
            return Ok(true);
        }
    }
    let uid = sandbox.metadata.uid.as_deref().unwrap_or_default();
    let volume = ctl.containers.fresh_workspace(name, uid).await?;
    let mut plan = ctl.containers.plan_for(sandbox, effective, &volume).await?;
    if let Some(rootfs) = &rootfs {
        plan.image = rootfs.image.clone();
    }
    ctl.engine.remove_container(&container_name(name)).await?;
    let id = populate_volume(ctl, &plan, &snapshot).await?;
    status.workspace_volume = Some(volume);
    status.container_id = Some(id);
    status.started_at = Some(Utc::now());
    status.applied_limits = Some(limits_of(&plan));
    status.source_snapshot = Some(source.snapshot.clone());
    status.rootfs = rootfs;
    Ok(true)
}

const SOURCE_CONDITION: &str = "SourceApplied";

/// `spec.source` is immutable: a workspace built from one snapshot (or from none) stays.
fn note_source_change(status: &mut SandboxStatus, sandbox: &Sandbox, wanted: &str) {
    if status.last_rollback.is_some() {
        // The workspace has been replaced since; the original source no longer shows.
        return;
    }
    if status.source_snapshot.as_deref() == Some(wanted) {
        clear_condition(&mut status.conditions, SOURCE_CONDITION);
        return;
    }
    let built_from = match &status.source_snapshot {
        Some(snapshot) => format!("snapshot {snapshot:?}"),
        None => "no snapshot".to_string(),
    };
    note_immutable(
        &mut status.conditions,
        SOURCE_CONDITION,
        format!(
            "spec.source is immutable: the workspace was built from {built_from}; the change \
             to snapshot {wanted:?} is ignored (use a rollback to replace the workspace)"
        ),
        sandbox.metadata.generation,
    );
}

/// Carries out a new `spec.rollback` request: a fresh workspace holding the snapshot in a fresh
/// container, and only then the old one goes. Returns `None` when there was nothing to do.
/// The caller must persist `status` at once: that write is what makes the rollback complete;
/// after it, the returned leftovers are removed.
///
/// The new container is a warm pool member when a pool has one, else a new container on a new
/// volume; either way it is filled while running under a staging name, and the old container
/// keeps serving until the two names are swapped, so the sandbox is never down.
pub(super) async fn ensure_rollback(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &mut SandboxStatus,
) -> Result<Option<Replaced>, ReconcileError> {
    let name = &sandbox.metadata.key();
    let Some(request) = sandbox.spec.pending_rollback(Some(status)) else {
        return Ok(None);
    };
    // A snapshot of this sandbox in progress finishes first.
    let _lock = ctl.snapshots.lock(name).await;
    let snapshot = validated(ctl, &sandbox.metadata.sibling(&request.snapshot)).await?;
    // A rollback makes a new container: on a Full snapshot's root filesystem, or on the plain
    // image (whose warm pool members may serve it).
    let rootfs = rootfs_of(ctl, sandbox, &snapshot).await?;
    let staging = staging_container_name(name);
    let old_volume = status.workspace_volume.clone();
    // A member of a pooled template on the snapshot holds it already (root filesystem and all);
    // a plain pool's member runs the plain image and is filled here. Neither has a disk limit.
    let claimed = if effective.disk_mb > 0 {
        None
    } else if let Some(claimed) = super::template_pool::claim_holding(
        ctl,
        &snapshot.name,
        name,
        effective,
        ClaimName::Now(&staging),
    )
    .await?
    {
        Some(claimed)
    } else if rootfs.is_some() {
        None
    } else {
        claim_filled(ctl, sandbox, effective, &staging, &snapshot).await?
    };
    let replaced = if let Some(claimed) = claimed {
        let replaced = ctl.containers.swap_in(name, &claimed.container_id).await?;
        claimed.record(status, effective);
        replaced
    } else {
        // A new volume per attempt: one left by an interrupted attempt may still be mounted by
        // its container, and the stray-volume cleanup removes it after the rollback.
        let volume = names::attempt_volume_name(name);
        let mut plan = ctl.containers.plan_for(sandbox, effective, &volume).await?;
        plan.name = Some(staging.clone());
        if let Some(rootfs) = &rootfs {
            plan.image = rootfs.image.clone();
        }
        ctl.engine.remove_container(&staging).await?;
        let id = populate_volume(ctl, &plan, &snapshot).await?;
        let replaced = ctl.containers.swap_in(name, &id).await?;
        status.workspace_volume = Some(volume);
        status.container_id = Some(id);
        status.started_at = Some(Utc::now());
        status.applied_limits = Some(limits_of(&plan));
        status.claimed_from = None;
        status.container_hash = None;
        replaced
    };
    status.source_snapshot = Some(request.snapshot.clone());
    status.rootfs = rootfs;
    status.last_rollback = Some(RollbackRecord {
        request_id: request.request_id.clone(),
        snapshot: request.snapshot.clone(),
        completed_at: Utc::now(),
    });
    Ok(Some(Replaced {
        container: replaced,
        volume: old_volume,
    }))
}

/// Claims a warm pool member as `as_name` and gives its (running) workspace the snapshot: a
/// copy-on-write view mounted into it where members can take one (`member_views.rs`: runc, on
/// this host), which costs the same whatever the snapshot holds; else a copy, unless the
/// snapshot is better served by a view on a new container (see
/// [`super::views::outgrows_pool`]). `None` when no pool has a member ready, or the snapshot is
/// to go onto a new container (a member claimed for a view that could not be mounted is
/// removed again). On a failed fill the member is removed again.
async fn claim_filled(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    as_name: &str,
    snapshot: &Validated,
) -> Result<Option<Claimed>, ReconcileError> {
    let runtime = ctl.settings.docker_runtime.clone();
    let views = ctl.views();
    let as_view = snapshot.uid.is_some() && super::member_views::possible(&views, &runtime);
    if !as_view && super::views::outgrows_pool(&views, snapshot, &runtime) {
        return Ok(None);
    }
    let name = &sandbox.metadata.key();
    let Some(claimed) = ctl
        .pools
        .claim_as(name, effective, ClaimName::Now(as_name))
        .await?
    else {
        return Ok(None);
    };
    let filled = if as_view {
        let (id, volume) = (&claimed.container_id, &claimed.volume);
        match super::member_views::mount(&views, id, volume, &runtime, snapshot).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                ctl.containers.discard(id, volume).await;
                return Ok(None);
            }
            Err(error) => Err(error),
        }
    } else {
        ctl.workspaces
            .make_ready(
                &claimed.container_id,
                &runtime,
                Prepare::AlreadyDone,
                Some(snapshot),
            )
            .await
    };
    if let Err(error) = filled {
        ctl.containers
            .discard(&claimed.container_id, &claimed.volume)
            .await;
        return Err(error);
    }
    Ok(Some(claimed))
}
