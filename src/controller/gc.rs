//! Garbage collection: containers and volumes labeled as ours that belong to no resource (or to an
//! earlier resource of the same name) are removed — but only after the store has completed a full
//! load, because a partial view of desired state is never a reason to delete. Only objects labeled
//! with this server's identity are considered.

use std::collections::HashMap;

use super::{Controller, ReconcileError};
use crate::docker::{LABEL_ROLE, LABEL_SERVER, LABEL_UID};
use crate::resource::Kind;

pub(super) async fn collect_garbage(ctl: &Controller) -> Result<usize, ReconcileError> {
    if !ctl.store.is_fully_loaded() {
        tracing::debug!("store not fully loaded yet; garbage collection waits");
        return Ok(0);
    }
    let live: HashMap<String, Option<String>> = ctl
        .store
        .list(Kind::Sandbox)
        .into_iter()
        .map(|e| {
            (
                e.resource.name().to_string(),
                e.resource.metadata().uid.clone(),
            )
        })
        .collect();
    let belongs =
        |sandbox: Option<&str>, uid: Option<&String>| match sandbox.and_then(|s| live.get(s)) {
            Some(live_uid) => uid.is_none() || live_uid.as_ref() == uid,
            None => false,
        };
    // Objects of other servers sharing this daemon are not ours to judge.
    let ours = |labels: &std::collections::BTreeMap<String, String>| {
        labels.get(LABEL_SERVER) == Some(&ctl.server_id)
    };
    let mut removed = 0;
    for container in ctl.engine.list_containers().await? {
        if container.labels.contains_key(LABEL_ROLE) || !ours(&container.labels) {
            continue;
        }
        if !belongs(container.sandbox(), container.labels.get(LABEL_UID)) {
            tracing::info!(container = %container.name, "removing orphaned container");
            ctl.engine.remove_container(&container.id).await?;
            removed += 1;
        }
    }
    for volume in ctl.engine.list_volumes().await? {
        // Helper volumes are shared by every server on the daemon, whatever its version: not
        // ours to remove.
        if volume.labels.contains_key(LABEL_ROLE) {
            continue;
        }
        if ours(&volume.labels) && !belongs(volume.sandbox(), volume.labels.get(LABEL_UID)) {
            tracing::info!(volume = %volume.name, "removing orphaned volume");
            ctl.engine.remove_volume(&volume.name).await?;
            removed += 1;
        }
    }
    Ok(removed)
}
