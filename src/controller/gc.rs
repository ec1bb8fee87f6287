//! Garbage collection: containers and volumes labeled as ours that belong to no resource (or to an
//! earlier resource of the same name) are removed — but only after the store has completed a full
//! load, because a partial view of desired state is never a reason to delete. Only objects labeled
//! with this server's identity are considered.
//!
//! An object belongs when a sandbox's status names it (a claimed pool container keeps its pool
//! labels), when it is under a live sandbox's container name (or its staging name while a rollback
//! is pending or its container is being replaced), when its labels name a live sandbox of the same uid and it is under that
//! sandbox's name (a container a rollback replaced is not), or when it is an unclaimed member of a
//! live pool. A volume labeled for a live sandbox belongs to it unless the sandbox, with nothing in
//! progress, names another workspace (the volume was replaced and its removal was interrupted).
//!
//! Copy-on-write views (see `views.rs`): the store then removes the directories of views whose
//! volume Docker no longer lists, and snapshot trees that neither a snapshot (by uid), a
//! volume's [`LABEL_TREE`] nor a remaining view's directory refers to (a pool member's view has
//! no label: see `member_views.rs`), sparing what was made after Docker was listed.
//!
//! Images of Full snapshots (see `snapshot/rootfs.rs`) go when their snapshot is gone, no
//! sandbox's status names them and no container uses them, and they are older than
//! [`FRESH_IMAGE`]: an import loads a snapshot's image a moment before the snapshot is stored.
//!
//! A deleted sandbox's containers (killed, renamed to a deleted name that is no live sandbox's) and
//! its workspaces (labeled with a uid no live sandbox has) are finished off by a background task
//! right after the deletion; whatever that task did not finish, a crash included, falls under
//! these rules as belonging to nobody.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::context::GcContext;
use super::error::ReconcileError;
use super::names::{container_name, is_member, pool_of_member, sandbox_of, staging_of};
use super::views::snapshot_of_tree;
use crate::docker::{LABEL_ROLE, LABEL_SNAPSHOT, LABEL_TREE, LABEL_UID};
use crate::resource::{Kind, SandboxPhase};

pub(super) async fn collect_garbage(ctl: &GcContext<'_>) -> Result<usize, ReconcileError> {
    if !ctl.store.is_fully_loaded() {
        tracing::debug!("store not fully loaded yet; garbage collection waits");
        return Ok(0);
    }
    // Docker first, then the store: every object listed was made by a reconcile of a resource that
    // was already in the store, so a resource created meanwhile cannot lose its fresh objects.
    let listed = std::time::Instant::now();
    let containers = ctl.engine.list_containers().await?;
    let volumes = ctl.engine.list_volumes().await?;
    let images = match ctl.engine.list_images_with_label(LABEL_SNAPSHOT).await {
        Ok(images) => images,
        Err(error) => {
            tracing::warn!(%error, "cannot list snapshot images");
            Vec::new()
        }
    };
    let sandboxes = ctl.store.list(Kind::Sandbox);
    let live: HashMap<String, Option<String>> = sandboxes
        .iter()
        .map(|e| (e.resource.key(), e.resource.metadata().uid.clone()))
        .collect();
    // Sandboxes with a rollback requested and not yet done, or not yet running at their
    // generation (a container being replaced): only they may have a staging container.
    let rebuilding: HashSet<String> = sandboxes
        .iter()
        .filter_map(|e| {
            let sandbox = e.resource.as_sandbox()?;
            let status = sandbox.status.as_ref();
            let settled = status.is_some_and(|s| {
                s.phase == SandboxPhase::Running
                    && s.observed_generation == sandbox.metadata.generation
            });
            let pending = sandbox.spec.pending_rollback(status).is_some();
            (pending || !settled).then(|| sandbox.metadata.key())
        })
        .collect();
    let statuses: Vec<_> = sandboxes
        .iter()
        .filter_map(|e| e.resource.as_sandbox()?.status.clone())
        .collect();
    let referenced_containers: HashSet<String> = statuses
        .iter()
        .filter_map(|s| s.container_id.clone())
        .collect();
    let referenced_volumes: HashSet<String> = statuses
        .iter()
        .filter_map(|s| s.workspace_volume.clone())
        .collect();
    // The workspace of each sandbox with nothing in progress: any other volume labeled for it
    // was replaced (by a rollback, or carried into a warm container) and is left over.
    let settled_workspace: HashMap<String, String> = sandboxes
        .iter()
        .filter_map(|e| {
            let sandbox = e.resource.as_sandbox()?;
            let volume = sandbox.status.as_ref()?.workspace_volume.clone()?;
            (!rebuilding.contains(&sandbox.metadata.key()))
                .then(|| (sandbox.metadata.key(), volume))
        })
        .collect();
    let pools: HashSet<String> = ctl
        .store
        .list(Kind::SandboxPool)
        .into_iter()
        .map(|e| e.resource.key())
        .chain(super::template_pool::live_pools(ctl.store))
        .collect();
    let labeled_for_live =
        |sandbox: Option<&str>, uid: Option<&String>| match sandbox.and_then(|s| live.get(s)) {
            Some(live_uid) => uid.is_none() || live_uid.as_ref() == uid,
            None => false,
        };
    let live_pool_member = |id: Option<&str>| {
        id.and_then(pool_of_member)
            .is_some_and(|p| pools.contains(p))
    };
    // Objects of other servers sharing this daemon are not ours to judge.
    let ours = |labels: &BTreeMap<String, String>| ctl.containers.is_ours(labels);

    let mut removed = 0;
    let unclaimed_members: HashSet<String> = containers
        .iter()
        .filter_map(|c| {
            let id = c.sandbox()?;
            (is_member(id) && c.name == container_name(id)).then(|| id.to_string())
        })
        .collect();
    for container in &containers {
        if container.labels.contains_key(LABEL_ROLE) || !ours(&container.labels) {
            continue;
        }
        let id = container.sandbox();
        // A pool container just claimed carries its sandbox's name (or, while a rollback fills
        // it or a replacement builds it, the sandbox's staging name) before the status names it.
        let named_for_live = match staging_of(&container.name) {
            Some(sandbox) => rebuilding.contains(sandbox),
            None => sandbox_of(&container.name).is_some_and(|n| live.contains_key(n)),
        };
        // A container replaced by a rollback keeps its labels but loses its name: only a
        // container under its sandbox's name is that sandbox's by its labels.
        let under_own_name = id.is_some_and(|id| container.name == container_name(id));
        let belongs = referenced_containers.contains(&container.id)
            || named_for_live
            || (under_own_name && labeled_for_live(id, container.labels.get(LABEL_UID)))
            || (live_pool_member(id) && id.is_some_and(|id| unclaimed_members.contains(id)));
        if !belongs {
            tracing::info!(container = %container.name, "removing orphaned container");
            match ctl.engine.remove_container(&container.id).await {
                Ok(()) => removed += 1,
                Err(error) => tracing::warn!(container = %container.name, %error, "cannot remove"),
            }
        }
    }
    let mut present: HashSet<String> = HashSet::new();
    let mut trees_in_use: HashSet<String> = HashSet::new();
    for volume in volumes {
        if let Some(tree) = volume.labels.get(LABEL_TREE) {
            trees_in_use.insert(tree.clone());
        }
        present.insert(volume.name.clone());
        // Helper volumes are shared by every server on the daemon, whatever its version: not
        // ours to remove.
        if volume.labels.contains_key(LABEL_ROLE) || !ours(&volume.labels) {
            continue;
        }
        let id = volume.sandbox();
        let superseded = id
            .and_then(|id| settled_workspace.get(id))
            .is_some_and(|current| *current != volume.name);
        let belongs = referenced_volumes.contains(&volume.name)
            || (labeled_for_live(id, volume.labels.get(LABEL_UID)) && !superseded)
            || (live_pool_member(id) && id.is_some_and(|id| unclaimed_members.contains(id)));
        if !belongs {
            tracing::info!(volume = %volume.name, "removing orphaned volume");
            // Docker refuses to remove a volume still mounted (one claimed a moment ago, say):
            // not an error, the next pass judges it again.
            match ctl.engine.remove_volume(&volume.name).await {
                Ok(()) => {
                    removed += 1;
                    present.remove(&volume.name);
                }
                Err(error) => tracing::debug!(volume = %volume.name, %error, "volume kept"),
            }
        }
    }
    // Copy-on-write views whose volume is gone, and trees no snapshot and no volume needs.
    let snapshots: HashSet<String> = ctl
        .store
        .list(Kind::Snapshot)
        .iter()
        .filter_map(|e| e.resource.metadata().uid.clone())
        .collect();
    removed += collect_rootfs_images(ctl, images, &snapshots, &sandboxes, &ours).await;
    let keep_tree =
        move |key: &str| trees_in_use.contains(key) || snapshots.contains(snapshot_of_tree(key));
    // Disks of workspaces whose volume is gone (a crash between the two, or a failed removal).
    if ctl.store.is_fully_loaded() {
        removed += ctl.containers.disks.collect(listed, &present).await;
    }
    removed += ctl
        .store
        .collect_views_and_trees(listed, present, keep_tree)
        .await;
    Ok(removed)
}

/// How old a snapshot image must be before collection considers it: an imported snapshot's image
/// is loaded before the snapshot is stored, and a pass that listed the image but read the store
/// before the snapshot appeared would otherwise remove it.
const FRESH_IMAGE: std::time::Duration = std::time::Duration::from_secs(30);

/// Images of Full snapshots (this server's, by [`LABEL_SNAPSHOT`]) whose snapshot is gone and
/// that no sandbox's status names: removed once no container uses them (Docker refuses while
/// one does, and the next pass judges again).
async fn collect_rootfs_images(
    ctl: &GcContext<'_>,
    images: Vec<crate::docker::LabeledImage>,
    snapshots: &HashSet<String>,
    sandboxes: &[crate::store::Entry],
    ours: &impl Fn(&BTreeMap<String, String>) -> bool,
) -> usize {
    let named: HashSet<String> = sandboxes
        .iter()
        .filter_map(|e| e.resource.as_sandbox()?.status.as_ref()?.rootfs.clone())
        .map(|rootfs| rootfs.image)
        .collect();
    let mut removed = 0;
    let now = chrono::Utc::now().timestamp();
    for image in images {
        if now.saturating_sub(image.created) < FRESH_IMAGE.as_secs() as i64 {
            continue;
        }
        // Judged by its label, never by its tag: a commit in progress is untagged for a moment.
        let live = image
            .labels
            .get(LABEL_SNAPSHOT)
            .is_some_and(|uid| snapshots.contains(uid));
        if live || !ours(&image.labels) || image.tags.iter().any(|t| named.contains(t)) {
            continue;
        }
        let reference = image.tags.first().cloned().unwrap_or(image.id.clone());
        match ctl.engine.remove_image(&reference).await {
            Ok(()) => {
                tracing::info!(image = %reference, "removed the image of a deleted snapshot");
                removed += 1;
            }
            Err(error) => tracing::debug!(image = %reference, %error, "snapshot image kept"),
        }
    }
    removed
}
