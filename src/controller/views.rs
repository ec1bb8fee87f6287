//! Copy-on-write workspaces: a restore (a sandbox's `source`, a fork's child, a rollback) mounts
//! a view of the snapshot instead of copying its bytes: on a new container here, or over the
//! workspace of a warm pool member that runs already (`member_views.rs`). The
//! snapshot's content is unpacked once into a tree of the data directory (by the store, under the
//! same rules every restore is checked against, so refused content never becomes a tree), and
//! each workspace is a Docker `local` volume of type overlay: the tree as its read-only lower
//! directory, and an upper and work directory of its own (the store's view directories), so a
//! restore costs the same whatever the snapshot holds and only what the sandbox writes takes new
//! space. Owners, modes, symlinks, empty directories and mtimes are the tree's; hard links stay
//! links when written (`index=on`); `/tmp` and processes are the new container's.
//!
//! A view is only used where it verifiably works: the server runs as root (the upper root is
//! given to the sandbox user), the host path has not failed for the runtime, and once the
//! container runs, both the host path's proof holds (see `workspace.rs`: the volume's directory
//! here is the container's `/workspace`; gVisor's sandbox process cannot show it, so under gVisor
//! this part is left out, and its gofer serves the view to the sandbox like any volume) and this
//! host's mount table shows Docker's overlay with this very upper directory at the volume's
//! directory (a remote daemon, or one in another mount namespace, shows nothing there). Where
//! that fails the view is discarded, views are given up for the runtime, and the restore copies
//! the content as before. `AGENT_SANDBOX_COPY_ON_WRITE=false` turns views off.
//!
//! Volumes name their (top) tree in a label ([`LABEL_TREE`]); garbage collection keeps a tree
//! while a snapshot of its uid or a volume naming it exists, with every tree below it, so
//! deleting a snapshot leaves its views working, and removes view directories whose volume is
//! gone. A snapshot of a view reads the merged workspace like any other (the full tar: its size
//! and digest do not depend on how the workspace was made); what the view had written, read from
//! its upper directory in the same frozen instant ([`changes_of`]), lets the store make the
//! snapshot's tree a delta over the view's trees (`store/layers.rs`), and its restores stack
//! the delta on them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::container::Containers;
use super::content::{restore_policy, Validated};
use super::error::ReconcileError;
use super::workspace::{open_host_root, HostUnavailable, Workspaces};
use crate::config::Settings;
use crate::docker::{
    is_gvisor, ContainerDetails, ContainerPlan, Engine, EngineError, ViewPaths, LABEL_ID,
    LABEL_MANAGED, LABEL_SERVER, LABEL_TREE, LABEL_UID,
};
use crate::store::{Store, TreeError, ViewChanges};

/// What views work with: the store's trees and view directories, Docker, the containers' labels,
/// settings and disposal, and what workspaces learned of this host. Sandboxes (restores) and
/// template pools (members holding a snapshot) build one from their own contexts.
pub(super) struct ViewContext<'a> {
    pub(super) store: &'a Store,
    pub(super) engine: &'a dyn Engine,
    pub(super) containers: &'a Containers,
    pub(super) workspaces: &'a Workspaces,
}

/// Whether views may be tried at all: allowed by the settings and the engine, and the server is
/// root.
pub(super) fn enabled(settings: &Settings, engine: &dyn Engine) -> bool {
    // SAFETY: geteuid has no preconditions.
    settings.copy_on_write
        && settings.host_workspace_access
        && engine.capabilities().host_workspace_access
        && unsafe { libc::geteuid() } == 0
}

/// The name of snapshot `uid`'s tree with its content owned by `owner`.
pub(super) fn tree_key(uid: &str, owner: (u32, u32)) -> String {
    format!("{uid}.{}.{}", owner.0, owner.1)
}

/// The snapshot uid a tree key starts with.
pub(super) fn snapshot_of_tree(key: &str) -> &str {
    key.split('.').next().unwrap_or(key)
}

/// Says that snapshot `uid`'s tree is to be a delta over the trees of the view it was taken of,
/// which had written `changes` (see [`Store::expect_delta`]).
pub(super) fn expect_delta(store: &Store, settings: &Settings, uid: &str, changes: ViewChanges) {
    if let Ok(owner) = settings.sandbox_uid_gid() {
        store.expect_delta(&tree_key(uid, owner), changes);
    }
}

/// Unpacks snapshot `uid`'s data at `path` into its tree ahead of its first restore (a delta
/// when [`expect_delta`] said so, else whole). A failure is only logged (the restore tries
/// again, or copies).
pub(super) async fn prepare_tree(store: &Store, settings: &Settings, uid: &str, path: &Path) {
    let prepared = async {
        let owner = settings.sandbox_uid_gid()?;
        let policy = restore_policy(settings)?;
        store
            .ensure_tree(&tree_key(uid, owner), path, policy, None)
            .await
            .map_err(|e| ReconcileError::HostWrite(e.to_string()))
    };
    if let Err(error) = prepared.await {
        tracing::warn!(%error, "the snapshot's tree could not be made ahead of a restore");
    }
}

/// Whether views may be tried for containers of `runtime` (`""` for the daemon's default). Views
/// are part of the host path: not where it has failed for this runtime (and each view proves it
/// again, see `verify`). gVisor never shows the container's `/workspace` to the host, so its
/// views stand on the mount table alone.
pub(super) fn usable(ctl: &ViewContext<'_>, runtime: &str) -> bool {
    let host_path = is_gvisor(runtime) || ctl.workspaces.may_use_host(runtime);
    enabled(&ctl.containers.settings, ctl.engine)
        && host_path
        && ctl.workspaces.view_access.get(runtime) != Some(false)
}

/// Where a warm pool member cannot take a view while it runs (gVisor, see `member_views.rs`),
/// snapshots whose tar is larger than this restore onto a view on a new container even when a
/// member is ready. Such a member's workspace can only be filled by copying, which grows with
/// the content (a 1 GiB fill took 1.5 to 3 s in docs/benchmarks.md), while a view costs a
/// container's create and start whatever the snapshot holds (a few hundred ms); below this size
/// the member's copy is the faster of the two.
pub(super) const POOL_FILL_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// Whether a restore of `snapshot` onto a container of `runtime` should leave warm pool members
/// alone and mount a view instead: the snapshot is past [`POOL_FILL_LIMIT_BYTES`] and views may
/// be tried here (should the view fail after all, the restore copies onto a new container).
pub(super) fn outgrows_pool(ctl: &ViewContext<'_>, snapshot: &Validated, runtime: &str) -> bool {
    snapshot.size_bytes > POOL_FILL_LIMIT_BYTES && snapshot.uid.is_some() && usable(ctl, runtime)
}

/// The key, owner and layers (top first) of `snapshot`'s tree, made now unless it is there.
/// `None` when it cannot be made here (the restore copies instead); refused content is an
/// error.
pub(super) async fn tree_of(
    ctl: &ViewContext<'_>,
    snapshot: &Validated,
) -> Result<Option<(String, (u32, u32), Vec<PathBuf>)>, ReconcileError> {
    let Some(uid) = snapshot.uid.as_deref() else {
        return Ok(None);
    };
    let owner = ctl.containers.settings.sandbox_uid_gid()?;
    let key = tree_key(uid, owner);
    let policy = restore_policy(&ctl.containers.settings)?;
    match ctl
        .store
        .ensure_tree(&key, &snapshot.path, policy, None)
        .await
    {
        Ok(lower) => Ok(Some((key, owner, lower))),
        Err(TreeError::Refused(error)) => Err(ReconcileError::Refused {
            name: snapshot.name.clone(),
            error,
        }),
        Err(error) => {
            tracing::warn!(%error, "the snapshot's tree cannot be made; copying it instead");
            Ok(None)
        }
    }
}

/// Makes `plan.workspace_volume` (which must not exist) a view of `snapshot`, mounted by a newly
/// created and started container of `plan`, whose ID is returned. `None` when views cannot be
/// used here: nothing is left behind and the caller copies the content instead.
pub(super) async fn populate_view(
    ctl: &ViewContext<'_>,
    plan: &ContainerPlan,
    snapshot: &Validated,
) -> Result<Option<String>, ReconcileError> {
    let runtime = plan.runtime.clone().unwrap_or_default();
    if !usable(ctl, &runtime) {
        return Ok(None);
    }
    let Some((key, owner, lower)) = tree_of(ctl, snapshot).await? else {
        return Ok(None);
    };
    let volume = plan.workspace_volume.as_str();
    let dirs = match ctl.store.create_view(volume, &key, owner).await {
        Ok(dirs) => dirs,
        Err(error) => {
            tracing::warn!(%error, "a view's directories cannot be made; copying instead");
            return Ok(None);
        }
    };
    let paths = ViewPaths {
        lower,
        upper: dirs.upper.clone(),
        work: dirs.work,
    };
    if paths.overlay_options().is_none() {
        ctl.store.remove_view(volume).await;
        ctl.workspaces.view_access.learn(&runtime, false);
        return Ok(None);
    }
    let labels = view_labels(ctl.containers, plan, &key);
    match ctl.engine.create_view_volume(volume, &labels, &paths).await {
        Ok(()) => ctl.store.view_volume_made(volume),
        Err(EngineError::Docker { message, .. }) => {
            // The daemon has no overlay volumes to give.
            tracing::info!(%message, "copy-on-write volumes are refused; copying instead");
            ctl.store.remove_view(volume).await;
            ctl.workspaces.view_access.learn(&runtime, false);
            return Ok(None);
        }
        Err(error) => {
            ctl.store.remove_view(volume).await;
            return Err(error.into());
        }
    }
    let id = match ctl.engine.create_container(plan).await {
        Ok(id) => id,
        Err(error) => {
            let _ = ctl.engine.remove_volume(volume).await;
            ctl.store.remove_view(volume).await;
            return Err(error.into());
        }
    };
    let started = match ctl.engine.start_container(&id).await {
        Ok(()) => verify(ctl, &id, &runtime, &dirs.upper).await,
        // The mount is made at the start: a daemon that cannot make it refuses the start.
        Err(EngineError::Docker { message, .. }) => Err(HostUnavailable::lasting(message)),
        Err(error) => {
            discard(ctl, &id, volume).await;
            return Err(error.into());
        }
    };
    match started {
        Ok(()) => {
            ctl.workspaces.view_access.learn(&runtime, true);
            Ok(Some(id))
        }
        Err(HostUnavailable { reason, lasting }) => {
            tracing::info!(
                %reason,
                lasting,
                "a copy-on-write workspace did not work here; copying instead"
            );
            discard(ctl, &id, volume).await;
            if lasting {
                ctl.workspaces.view_access.learn(&runtime, false);
            }
            Ok(None)
        }
    }
}

/// The labels of a view volume: those `create_container` gives a workspace, and its tree.
fn view_labels(
    containers: &Containers,
    plan: &ContainerPlan,
    key: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED.to_string(), "true".to_string()),
        (LABEL_SERVER.to_string(), containers.server_id.clone()),
        (LABEL_ID.to_string(), plan.sandbox.clone()),
        (LABEL_UID.to_string(), plan.uid.clone()),
        (LABEL_TREE.to_string(), key.to_string()),
    ])
}

/// Checks that the running container `id`'s workspace is the volume's directory on this host
/// (the host path's proof, learned for `runtime`; not under gVisor, whose sandbox process shows
/// the host no `/workspace`) and that this directory is the overlay whose upper directory is
/// `upper`, as this host's mount table shows it: the daemon that started the container mounted
/// this very view here, and Docker binds a volume's directory at its destination. A failure is
/// lasting when it says something about this host (views are then given up for the runtime),
/// passing when the container stopped or vanished meanwhile or a Docker call failed (that
/// restore copies instead, and the next one tries a view again).
pub(super) async fn verify(
    ctl: &ViewContext<'_>,
    id: &str,
    runtime: &str,
    upper: &Path,
) -> Result<(), HostUnavailable> {
    let details = ctl
        .engine
        .inspect_container(id)
        .await
        .map_err(|e| HostUnavailable::passing(e.to_string()))?
        .ok_or_else(|| HostUnavailable::passing("the container vanished while starting".into()))?;
    if !is_gvisor(runtime) {
        match open_host_root(&details) {
            Ok(_) => ctl.workspaces.host_access.learn(runtime, true),
            Err(error) => {
                if error.lasting {
                    ctl.workspaces.host_access.learn(runtime, false);
                }
                return Err(error);
            }
        }
    }
    let source = details.workspace_source.ok_or_else(|| {
        HostUnavailable::lasting("Docker names no directory for the workspace".into())
    })?;
    let table = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| HostUnavailable::lasting(format!("the mount table: {e}")))?;
    if overlay_mounted(&table, &source, upper) {
        return Ok(());
    }
    let reason = format!(
        "{} is not this host's overlay of the view",
        source.display()
    );
    // Docker unmounts a stopped container's volumes: only a container that still runs shows
    // something about this host.
    match ctl.engine.inspect_container(id).await {
        Ok(Some(now)) if now.running && now.pid == details.pid => {
            Err(HostUnavailable::lasting(reason))
        }
        _ => Err(HostUnavailable::passing(reason)),
    }
}

/// Whether mount table `table` (`/proc/self/mountinfo`) has an overlay at `at` whose upper
/// directory is `upper`.
fn overlay_mounted(table: &str, at: &Path, upper: &Path) -> bool {
    overlays_at(table, at).any(|mounted| mounted.upper == upper)
}

/// The overlays mount table `table` shows at `at`, read as views (the kernel shows their
/// options as they were given).
fn overlays_at<'t>(table: &'t str, at: &Path) -> impl Iterator<Item = ViewPaths> + 't {
    let at = at.to_str().map(str::to_string);
    table.lines().filter_map(move |line| {
        let mut halves = line.splitn(2, " - ");
        let (mount, fs) = (halves.next()?, halves.next()?);
        let mut fs_fields = fs.split(' ');
        let fs_type = fs_fields.next();
        let options = fs_fields.nth(1).unwrap_or_default();
        if at.is_none() || mount.split(' ').nth(4) != at.as_deref() || fs_type != Some("overlay") {
            return None;
        }
        ViewPaths::from_overlay_options(options)
    })
}

/// What the workspace of the container `details` describes has written over its trees, when it
/// is a view of this host (its overlay at the workspace's directory, with this store's
/// directories). Read while the container is frozen (or not running), for a snapshot to be a
/// delta. A stopped container's workspace is mounted nowhere: its layers are then read from
/// its volume, `volume`, which nothing can write meanwhile.
pub(super) async fn changes_of(
    store: &Store,
    settings: &Settings,
    engine: &dyn Engine,
    details: &ContainerDetails,
    volume: Option<&str>,
) -> Option<ViewChanges> {
    if !enabled(settings, engine) {
        return None;
    }
    let source = details.workspace_source.as_ref()?;
    let table = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let mut overlays = overlays_at(&table, source);
    match (overlays.next(), overlays.next()) {
        (Some(view), None) => store.view_changes(&view.lower, &view.upper).await,
        // Stacked mounts: which one the container sees is not clear here.
        (Some(_), Some(_)) => None,
        (None, _) if !details.running => {
            let volume = volume?;
            let view = engine.view_of_volume(volume).await.ok()??;
            // The store names a view's directories after its volume.
            let named = view.upper.parent()?.file_name()? == volume;
            if !named {
                return None;
            }
            store.view_changes(&view.lower, &view.upper).await
        }
        (None, _) => None,
    }
}

async fn discard(ctl: &ViewContext<'_>, id: &str, volume: &str) {
    ctl.containers.discard(id, volume).await;
    ctl.store.remove_view(volume).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_views_own_overlay_at_the_volume_counts() {
        let table = "\
36 25 0:31 / /var/lib/docker/volumes/v/_data rw,relatime - overlay overlay rw,lowerdir=/d/trees/k,upperdir=/d/views/v/upper,workdir=/d/views/v/work,index=on
37 25 0:32 / /var/lib/docker/volumes/w/_data rw,relatime - ext4 /dev/vda rw
";
        let at = Path::new("/var/lib/docker/volumes/v/_data");
        assert!(overlay_mounted(table, at, Path::new("/d/views/v/upper")));
        assert!(!overlay_mounted(table, at, Path::new("/d/views/w/upper")));
        let other = Path::new("/var/lib/docker/volumes/w/_data");
        assert!(!overlay_mounted(
            table,
            other,
            Path::new("/d/views/v/upper")
        ));
    }

    #[test]
    fn a_tree_key_names_its_snapshot() {
        let key = tree_key("6c1f-uid", (1000, 1000));
        assert_eq!(key, "6c1f-uid.1000.1000");
        assert_eq!(snapshot_of_tree(&key), "6c1f-uid");
    }
}
