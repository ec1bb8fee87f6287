//! A sandbox's containers as Docker objects: the plan a container is created from (for a
//! sandbox, or for a warm pool member), the shared helper volume every plan mounts, the swap that
//! gives a new container the sandbox's name, the choice of a new sandbox's workspace name, and the
//! removal of what a sandbox leaves behind (a replaced container and workspace, stray volumes,
//! and, once it is deleted, its killed containers and workspaces on a background task). [`Containers`]
//! is the part of the controller that knows how to do this; it decides nothing about when.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use super::error::ReconcileError;
use super::names::{self, container_name, volume_name};
use crate::config::Settings;
use crate::docker::{
    ContainerPlan, Engine, EngineError, ManagedVolume, NetworkKind, LABEL_SERVER, LABEL_UID,
};
use crate::egress::Gateway;
use crate::resource::{AppliedLimits, EffectiveSandbox, Sandbox, SandboxDefaults, SandboxPool};

/// What making, swapping and removing containers needs: Docker, the settings, this server's
/// identity (labeled on every object), and the helper volume.
pub(super) struct Containers {
    pub(super) engine: Arc<dyn Engine>,
    pub(super) settings: Arc<Settings>,
    /// This server's identity, labeled on every object it creates; garbage collection only
    /// touches objects carrying it.
    pub(super) server_id: String,
    /// The helper binary to install in the shared helper volume, when this build carries one.
    helper_binary: Option<&'static [u8]>,
    /// Name of the helper volume once it is known to be ready.
    helper_volume: tokio::sync::Mutex<Option<String>>,
    /// Image pulls, one per image.
    pub(super) pulls: super::pulls::Pulls,
    /// Sandboxes whose deletion is being finished in the background (see
    /// [`Containers::remove_deleted`]).
    removing: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    /// The egress gateway policed sandboxes go through, once the server attached one.
    pub(super) gateway: std::sync::OnceLock<Arc<Gateway>>,
    /// Open bridges whose firewall guard this server has put in place (once per run each).
    guarded: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Serializes putting firewall rules in place, so that two reconciles do not both find a
    /// rule missing and both insert it.
    firewall: tokio::sync::Mutex<()>,
    /// The file systems of workspaces with a size limit (see `workspace_disk.rs`).
    pub(super) disks: Arc<crate::disk::Disks>,
}

/// The network a container joins, and for a policed one where its gateway listens.
struct Joined {
    network: String,
    gateway: Option<IpAddr>,
    /// The gateway authority's public directory, mounted read-only in policed containers.
    ca_dir: Option<std::path::PathBuf>,
}

impl Containers {
    pub(super) fn new(
        engine: Arc<dyn Engine>,
        settings: Arc<Settings>,
        server_id: String,
        helper_binary: Option<&'static [u8]>,
        disks: Arc<crate::disk::Disks>,
    ) -> Containers {
        Containers {
            disks,
            pulls: super::pulls::Pulls::new(Arc::clone(&engine), Arc::clone(&settings)),
            engine,
            settings,
            server_id,
            helper_binary,
            helper_volume: tokio::sync::Mutex::new(None),
            removing: Arc::default(),
            gateway: std::sync::OnceLock::new(),
            guarded: std::sync::Mutex::default(),
            firewall: tokio::sync::Mutex::new(()),
        }
    }

    /// What a sandbox that leaves a property out gets.
    pub(super) fn defaults(&self) -> SandboxDefaults {
        self.settings.sandbox_defaults()
    }

    /// The shared read-only volume holding the in-sandbox helper, created on first use.
    pub(super) async fn helper_volume(&self) -> Result<Option<String>, ReconcileError> {
        let Some(binary) = self.helper_binary else {
            return Ok(None);
        };
        let mut ready = self.helper_volume.lock().await;
        if let Some(name) = ready.as_ref() {
            return Ok(Some(name.clone()));
        }
        let name = crate::docker::helper_volume_name(binary);
        self.engine.ensure_helper_volume(&name, binary).await?;
        *ready = Some(name.clone());
        Ok(Some(name))
    }

    /// The network a container gets, made sure to exist, when it gets one: the open bridge, or
    /// for `egress` the internal one whose only way out is the egress gateway (made sure to
    /// listen there).
    async fn network(&self, wanted: bool, egress: bool) -> Result<Option<Joined>, ReconcileError> {
        if !wanted {
            return Ok(None);
        }
        if !egress && self.settings.egress_required {
            return Err(ReconcileError::EgressRequired);
        }
        let (name, kind) = if egress {
            (self.settings.egress_network_name(), NetworkKind::Internal)
        } else {
            (self.settings.network_name.clone(), NetworkKind::Open)
        };
        let info = self.engine.ensure_network(&name, kind).await?;
        if kind == NetworkKind::Open && self.settings.open_network_guard {
            self.guard(&name, info.bridge.as_deref()).await?;
        }
        let gateway = match (egress, self.gateway.get()) {
            (true, Some(gateway)) => {
                let address = info
                    .gateway
                    .ok_or_else(|| ReconcileError::EgressNoAddress(name.clone()))?;
                gateway
                    .listen_on(address)
                    .await
                    .map_err(|source| ReconcileError::EgressGateway { address, source })?;
                self.redirect(&name, info.bridge.as_deref(), address)
                    .await?;
                Some(address)
            }
            _ => None,
        };
        let ca_dir = match (gateway, self.gateway.get()) {
            (Some(_), Some(gateway)) => gateway.ca_dir(),
            _ => None,
        };
        Ok(Some(Joined {
            network: name,
            gateway,
            ca_dir,
        }))
    }

    /// Puts the firewall guard of the open network `network` (on host interface `bridge`) in
    /// place, once per run: no sandbox joins it without the guard.
    async fn guard(&self, network: &str, bridge: Option<&str>) -> Result<(), ReconcileError> {
        let bridge = bridge.ok_or_else(|| ReconcileError::OpenNetworkGuard {
            network: network.to_string(),
            message: "Docker names no host interface for it".into(),
        })?;
        let done = |guarded: &std::sync::Mutex<std::collections::HashSet<String>>| {
            guarded.lock().is_ok_and(|g| g.contains(bridge))
        };
        let _one_at_a_time = self.firewall.lock().await;
        if done(&self.guarded) {
            return Ok(());
        }
        crate::firewall::guard_open_bridge(bridge)
            .await
            .map_err(|error| ReconcileError::OpenNetworkGuard {
                network: network.to_string(),
                message: error.to_string(),
            })?;
        if let Ok(mut guarded) = self.guarded.lock() {
            guarded.insert(bridge.to_string());
        }
        Ok(())
    }

    /// Puts the rule that sends TCP from the internal network `network` (host interface
    /// `bridge`) to the gateway's transparent listener at `address` in place, once per run.
    async fn redirect(
        &self,
        network: &str,
        bridge: Option<&str>,
        address: std::net::IpAddr,
    ) -> Result<(), ReconcileError> {
        let failed = |message: String| ReconcileError::EgressRedirect {
            network: network.to_string(),
            message,
        };
        let bridge =
            bridge.ok_or_else(|| failed("Docker names no host interface for it".into()))?;
        let key = format!("redirect {bridge} {address}");
        let _one_at_a_time = self.firewall.lock().await;
        if self.guarded.lock().is_ok_and(|g| g.contains(&key)) {
            return Ok(());
        }
        crate::firewall::redirect_policed_bridge(bridge, address, crate::egress::TRANSPARENT_PORT)
            .await
            .map_err(|error| failed(error.to_string()))?;
        let group = self.gateway.get().and_then(|g| g.refused_group());
        crate::firewall::refuse_policed_bridge(bridge, address, group)
            .await
            .map_err(|error| failed(error.to_string()))?;
        if let Ok(mut guarded) = self.guarded.lock() {
            guarded.insert(key);
        }
        Ok(())
    }

    /// Tells the gateway the list of `sandbox`, running in `container`, when it is policed
    /// (making sure the gateway listens, as after a restart); forgets it otherwise.
    pub(super) async fn police(
        &self,
        sandbox: &Sandbox,
        effective: &EffectiveSandbox,
        container: &str,
    ) -> Result<(), ReconcileError> {
        let Some(gateway) = self.gateway.get() else {
            return Ok(());
        };
        let name = &sandbox.metadata.key();
        if !effective.egress {
            gateway.forget(name);
            return Ok(());
        }
        // Validated on every write; a list that fails here allows nothing.
        let rules = match &sandbox.spec.egress {
            Some(egress) => egress.rules(),
            None => crate::resource::parse_allow_list(&self.settings.egress_default),
        }
        .unwrap_or_default();
        if !gateway.is_listening() {
            self.network(true, true).await?;
        }
        gateway.set_policy(
            name,
            container,
            rules,
            super::sandbox_secrets::bindings(sandbox),
        );
        Ok(())
    }

    /// `env` over the egress gateway's variables of `sandbox`, when it is policed.
    pub(super) fn egress_env(
        &self,
        sandbox: &str,
        env: &BTreeMap<String, String>,
    ) -> BTreeMap<String, String> {
        let mut merged: BTreeMap<String, String> = self
            .gateway
            .get()
            .map(|g| g.sandbox_env(sandbox).into_iter().collect())
            .unwrap_or_default();
        merged.extend(env.iter().map(|(k, v)| (k.clone(), v.clone())));
        merged
    }

    /// Whether an egress gateway carries policed sandboxes' traffic.
    pub(super) fn polices(&self) -> bool {
        self.gateway.get().is_some()
    }

    /// Forgets a deleted sandbox's list and decision log.
    pub(super) fn unpolice(&self, name: &str) {
        if let Some(gateway) = self.gateway.get() {
            gateway.forget_deleted(name);
        }
    }

    /// The container `sandbox` should have, with its workspace on `volume`. Checks that the
    /// image is present and makes sure the network and helper volume it needs exist.
    pub(super) async fn plan_for(
        &self,
        sandbox: &Sandbox,
        effective: &EffectiveSandbox,
        volume: &str,
    ) -> Result<ContainerPlan, ReconcileError> {
        self.pulls
            .ensure(&effective.image, sandbox.spec.image_pull_policy)
            .await?;
        let joined = self.network(effective.network, effective.egress).await?;
        let (network, dns, env, ca_dir) = split_joined(joined);
        Ok(ContainerPlan {
            sandbox: sandbox.metadata.key(),
            name: None,
            uid: sandbox.metadata.uid.clone().unwrap_or_default(),
            server: self.server_id.clone(),
            image: effective.image.clone(),
            cpus: effective.cpus,
            memory_mb: effective.memory_mb,
            pids_limit: effective.pids_limit,
            workspace_disk_mb: effective.disk_mb,
            network,
            read_only_rootfs: effective.read_only_rootfs,
            // Commands get the env from the spec when they start (see `container_hash`); a copy
            // in the container would only go stale. Only the gateway's proxy settings live here.
            env,
            dns,
            tmp_size_mb: self.settings.tmp_size_mb,
            user: self.settings.sandbox_user.clone(),
            runtime: non_empty(&self.settings.docker_runtime),
            spec_hash: effective.container_hash(),
            helper_volume: self.helper_volume().await?,
            workspace_volume: volume.to_string(),
            ca_dir,
        })
    }

    /// The container of pool member `member` of `pool` (Docker runtime `runtime`, `""` for the
    /// default): the server's default limits, the pool's immutable properties, labeled with
    /// `key`. Checks that the image is present.
    pub(super) async fn plan_for_member(
        &self,
        pool: &SandboxPool,
        member: &str,
        key: &str,
        runtime: String,
    ) -> Result<ContainerPlan, ReconcileError> {
        // Pools pull ahead: their members wait for the pull, not the sandboxes they serve.
        self.pulls.ensure(&pool.spec.image, None).await?;
        let network = pool.spec.network.unwrap_or(false);
        let joined = self
            .network(network, network && self.settings.egress_by_default())
            .await?;
        let (network, dns, env, ca_dir) = split_joined(joined);
        let defaults = self.defaults();
        Ok(ContainerPlan {
            sandbox: member.to_string(),
            name: None,
            uid: pool.metadata.uid.clone().unwrap_or_default(),
            server: self.server_id.clone(),
            image: pool.spec.image.clone(),
            cpus: defaults.cpus,
            memory_mb: defaults.memory_mb,
            pids_limit: defaults.pids_limit,
            workspace_disk_mb: 0,
            network,
            read_only_rootfs: pool.spec.read_only_rootfs.unwrap_or(true),
            env,
            dns,
            tmp_size_mb: self.settings.tmp_size_mb,
            user: self.settings.sandbox_user.clone(),
            runtime: (!runtime.is_empty()).then_some(runtime),
            spec_hash: key.to_string(),
            helper_volume: self.helper_volume().await?,
            // The create makes the member's workspace volume, labeled for the member.
            workspace_volume: names::member_volume(member),
            ca_dir,
        })
    }

    /// Gives the sandbox's container name to the container `new` (filled under the staging
    /// name), after renaming the current container, if any, out of the way (to a retired name, by
    /// which it is returned, to be removed once the status names `new`).
    pub(super) async fn swap_in(
        &self,
        name: &str,
        new: &str,
    ) -> Result<Option<String>, EngineError> {
        let current = container_name(name);
        let retired = names::retired_container_name(name);
        let replaced = match self.engine.rename_container(&current, &retired).await {
            Ok(()) => Some(retired),
            Err(error) if error.is_not_found() => None,
            Err(EngineError::Conflict { .. }) => {
                // The one retired before is still being removed (a rollback right after
                // another), or its removal was interrupted: this one takes a name of its own
                // rather than waiting for that removal. Garbage collection knows neither name.
                let retired = names::another_retired_container_name(name);
                self.engine.rename_container(&current, &retired).await?;
                Some(retired)
            }
            Err(error) => return Err(error),
        };
        self.engine.rename_container(new, &current).await?;
        Ok(replaced)
    }

    /// Renames the container `id` to `as_name`; whatever held that name before is removed (the
    /// caller found nothing there worth keeping).
    pub(super) async fn take_name(&self, id: &str, as_name: &str) -> Result<(), EngineError> {
        match self.engine.rename_container(id, as_name).await {
            Err(EngineError::Conflict { .. }) => {
                self.engine.remove_container(as_name).await?;
                self.engine.rename_container(id, as_name).await
            }
            other => other,
        }
    }

    /// Whether an object's labels say this server made it.
    pub(super) fn is_ours(&self, labels: &BTreeMap<String, String>) -> bool {
        labels.get(LABEL_SERVER) == Some(&self.server_id)
    }

    /// Removes the sandbox's containers (under any of its names) and every workspace volume
    /// labeled with its name — only those this server created: another server sharing the
    /// daemon may use the same name.
    pub(super) async fn remove_all_of(&self, name: &str) -> Result<(), ReconcileError> {
        for container in names::container_names(name) {
            if let Some(container) = self.engine.inspect_container(&container).await? {
                if self.is_ours(&container.labels) {
                    self.engine.remove_container(&container.id).await?;
                }
            }
        }
        for volume in self.engine.list_volumes().await? {
            if volume.sandbox() == Some(name) && self.is_ours(&volume.labels) {
                self.engine.remove_volume(&volume.name).await?;
                self.disks.forget(&volume.name).await;
            }
        }
        Ok(())
    }

    /// Removes what earlier rollback attempts of sandbox `name` left: the staging container and
    /// every workspace volume but `current`. Only for a sandbox whose rollback is not in
    /// progress.
    pub(super) async fn discard_attempts(
        &self,
        name: &str,
        current: &str,
    ) -> Result<(), ReconcileError> {
        self.engine
            .remove_container(&names::staging_container_name(name))
            .await?;
        self.remove_stray_volumes(name, current).await
    }

    /// Removes this sandbox's workspace volumes other than `current` (left by a rollback that
    /// completed, or one interrupted before it did).
    pub(super) async fn remove_stray_volumes(
        &self,
        name: &str,
        current: &str,
    ) -> Result<(), ReconcileError> {
        remove_strays(
            self.engine.as_ref(),
            &self.disks,
            &self.server_id,
            name,
            current,
        )
        .await
    }

    /// This sandbox's workspace volumes other than `current`, as Docker lists them now: what a
    /// completed rollback leaves besides the workspace it retired (volumes of attempts a crash
    /// or failure interrupted). Listed within the sandbox's reconcile, so that no later
    /// rollback's new workspace can be among them; empty when Docker cannot list them (garbage
    /// collection removes them then).
    pub(super) async fn stray_volumes(&self, name: &str, current: &str) -> Vec<String> {
        match self.engine.list_volumes().await {
            Ok(volumes) => strays(volumes, &self.server_id, name, current),
            Err(error) => {
                tracing::warn!(sandbox = name, %error, "cannot list replaced workspaces");
                Vec::new()
            }
        }
    }

    /// Removes what a completed rollback or replacement of sandbox `name` left (`retired`, in
    /// order), then the stray workspace volumes `strays` ([`Containers::stray_volumes`]), on a
    /// task of its own: the status names the successor already, and the sandbox's next request
    /// (another rollback, a command) waits for none of it. A swap that finds the retired name
    /// still taken retires its container under another name, and a removal of a container
    /// Docker is removing already waits for it (`Engine::remove_container`). What a crash leaves
    /// is garbage collection's: no status names a retired container or its workspace.
    pub(super) fn remove_retired(&self, name: &str, retired: Vec<Replaced>, strays: Vec<String>) {
        let engine = Arc::clone(&self.engine);
        let disks = Arc::clone(&self.disks);
        let name = name.to_string();
        tokio::spawn(async move {
            for replaced in retired {
                replaced.remove(engine.as_ref(), &disks).await;
            }
            if let Err(error) = remove_volumes(engine.as_ref(), &disks, &name, &strays).await {
                tracing::warn!(sandbox = name, %error, "removing replaced workspaces failed");
            }
        });
    }

    /// What Docker still has of sandbox `name`, which no longer exists: containers under its
    /// names go at once; its workspace volumes are removed in the background (unless a deletion
    /// is removing them already), as a deletion's are, so that a sandbox of the same name made
    /// meanwhile waits for none of it.
    pub(super) async fn remove_leftovers_of(&self, name: &str) -> Result<(), ReconcileError> {
        for container in names::container_names(name) {
            if let Some(container) = self.engine.inspect_container(&container).await? {
                if self.is_ours(&container.labels) {
                    self.engine.remove_container(&container.id).await?;
                }
            }
        }
        if lock(&self.removing).contains_key(name) {
            return Ok(());
        }
        let uids: Vec<String> = self
            .engine
            .list_volumes()
            .await?
            .into_iter()
            .filter(|v| v.sandbox() == Some(name) && self.is_ours(&v.labels))
            .filter_map(|v| v.labels.get(LABEL_UID).cloned())
            .collect();
        if !uids.is_empty() {
            self.remove_deleted(name, uids, Vec::new(), None);
        }
        Ok(())
    }

    /// Removes a container and workspace volume that were never recorded (a failed fill, a
    /// member that could not be made). Failures are left to garbage collection.
    pub(super) async fn discard(&self, container: &str, volume: &str) {
        let _ = self.engine.remove_container(container).await;
        if self.engine.remove_volume(volume).await.is_ok() {
            self.disks.forget(volume).await;
        }
    }

    /// The workspace volume a sandbox `name` of uid `uid` that has none yet gets: [`volume_name`],
    /// unless a volume of an earlier sandbox of that name still holds it (its removal finishes in
    /// the background: its content must never show in the new one), then
    /// [`names::uid_volume_name`]. One made by an interrupted attempt of this sandbox is taken
    /// again, so a retry after a crash mounts what the first try created.
    pub(super) async fn fresh_workspace(
        &self,
        name: &str,
        uid: &str,
    ) -> Result<String, ReconcileError> {
        let plain = volume_name(name);
        let own = names::uid_volume_name(name, uid);
        if self.engine.inspect_volume(&own).await?.is_some() {
            return Ok(own);
        }
        // A volume of the plain name that is not this sandbox's (an older sandbox of the name
        // still being removed, or one nobody here made) is never mounted into this one.
        let held_by_another = self.engine.inspect_volume(&plain).await?.is_some_and(|v| {
            v.sandbox() != Some(name) || v.labels.get(LABEL_UID).map(String::as_str) != Some(uid)
        });
        Ok(if held_by_another { own } else { plain })
    }

    /// Takes a deleted sandbox's processes down and its names away, the part of a deletion that
    /// is waited for: each container under one of the sandbox's names is renamed to its
    /// [`names::deleted_container_name`] (one whose new name is taken is removed at once), then
    /// killed under that name. Renaming first frees the names while the kill runs (Docker
    /// renames a running container), and a run after a crash between the two still finds the
    /// container to kill under its deleted name, before the deletion answers. Returns the names
    /// the containers now have, for [`Containers::remove_deleted`]. Running it again after a
    /// crash returns the same names.
    pub(super) async fn retire_deleted(
        &self,
        name: &str,
        uid: &str,
    ) -> Result<Vec<String>, ReconcileError> {
        let retirements = names::container_names(name).map(|container| async move {
            let deleted = names::deleted_container_name(&container, uid);
            match self.engine.rename_container(&container, &deleted).await {
                // Missing: nothing had this name, or an earlier run renamed it already.
                Ok(()) => {}
                Err(error) if error.is_not_found() => {}
                Err(EngineError::Conflict { .. }) => {
                    self.engine.remove_container(&container).await?;
                    return Ok(deleted);
                }
                Err(error) => return Err(error),
            }
            match self.engine.kill_container(&deleted).await {
                Ok(()) => Ok(deleted),
                Err(EngineError::Unreachable(why)) => Err(EngineError::Unreachable(why)),
                Err(error) => {
                    tracing::info!(container = %deleted, %error, "cannot kill; removing it instead");
                    self.engine.remove_container(&deleted).await?;
                    Ok(deleted)
                }
            }
        });
        let mut retired = Vec::new();
        for result in futures::future::join_all(retirements).await {
            retired.push(result?);
        }
        Ok(retired)
    }

    /// Removes, on a task of its own, what a deletion left: the containers `containers` (killed
    /// and renamed already), then the workspace volumes this server made for sandbox `name`
    /// under one of `uids`, and `recorded` (the workspace its status named: a claimed pool
    /// member's carries the member's labels). A volume labeled for another uid of that name (a
    /// sandbox of the same name made since) is never touched. Whatever fails, or is left by a
    /// crash, garbage collection removes.
    pub(super) fn remove_deleted(
        &self,
        name: &str,
        uids: Vec<String>,
        containers: Vec<String>,
        recorded: Option<String>,
    ) {
        let engine = Arc::clone(&self.engine);
        let disks = Arc::clone(&self.disks);
        let server = self.server_id.clone();
        let name = name.to_string();
        let removing = Arc::clone(&self.removing);
        *lock(&removing).entry(name.clone()).or_default() += 1;
        tokio::spawn(async move {
            let _done = Removing {
                removing,
                name: name.clone(),
            };
            for container in &containers {
                if let Err(error) = engine.remove_container(container).await {
                    tracing::warn!(container, %error, "removing a deleted sandbox's container failed");
                    return;
                }
            }
            let volumes = match engine.list_volumes().await {
                Ok(volumes) => volumes,
                Err(error) => {
                    tracing::warn!(sandbox = %name, %error, "cannot list volumes to remove");
                    return;
                }
            };
            for volume in volumes {
                if volume.labels.get(LABEL_SERVER) != Some(&server) {
                    continue;
                }
                let uid = volume.labels.get(LABEL_UID);
                let labeled = volume.sandbox() == Some(name.as_str())
                    && uid.is_some_and(|uid| uids.contains(uid));
                let other_sandbox = volume.sandbox() != Some(name.as_str());
                let was_recorded =
                    recorded.as_deref() == Some(volume.name.as_str()) && other_sandbox;
                if !(labeled || was_recorded) {
                    continue;
                }
                match engine.remove_volume(&volume.name).await {
                    Ok(()) => {
                        tracing::debug!(volume = %volume.name, "deleted sandbox's workspace removed");
                        disks.forget(&volume.name).await;
                    }
                    Err(error) => {
                        tracing::warn!(volume = %volume.name, %error, "removing a deleted sandbox's workspace failed")
                    }
                }
            }
        });
    }
}

/// What a completed rollback or container replacement left behind, to remove once its status is
/// written.
#[derive(Debug, Default)]
pub(super) struct Replaced {
    /// The previous container (ID or retired name), renamed out of the way but still there.
    pub container: Option<String>,
    /// The previous workspace volume.
    pub volume: Option<String>,
}

impl Replaced {
    /// Removes the previous container, then its workspace. Failures are left to garbage
    /// collection (a retired container belongs to no one) and the stray-volume cleanup.
    pub(super) async fn remove(self, engine: &dyn Engine, disks: &crate::disk::Disks) {
        if let Some(container) = &self.container {
            if let Err(error) = engine.remove_container(container).await {
                tracing::warn!(container, %error, "removing the replaced container failed");
                return;
            }
        }
        if let Some(volume) = &self.volume {
            match engine.remove_volume(volume).await {
                Ok(()) => disks.forget(volume).await,
                Err(error) => {
                    tracing::warn!(volume, %error, "removing the replaced workspace failed")
                }
            }
        }
    }
}

/// Removes sandbox `name`'s workspace volumes made by server `server` other than `current`.
async fn remove_strays(
    engine: &dyn Engine,
    disks: &crate::disk::Disks,
    server: &str,
    name: &str,
    current: &str,
) -> Result<(), ReconcileError> {
    let strays = strays(engine.list_volumes().await?, server, name, current);
    remove_volumes(engine, disks, name, &strays).await
}

/// The workspace volumes of sandbox `name` made by `server` among `volumes`, other than
/// `current`.
fn strays(volumes: Vec<ManagedVolume>, server: &str, name: &str, current: &str) -> Vec<String> {
    volumes
        .into_iter()
        .filter(|volume| {
            volume.sandbox() == Some(name)
                && volume.labels.get(LABEL_SERVER).map(String::as_str) == Some(server)
                && names::is_workspace_of(&volume.name, name)
                && volume.name != current
        })
        .map(|volume| volume.name)
        .collect()
}

/// Removes the replaced workspace volumes `volumes` of sandbox `name`.
async fn remove_volumes(
    engine: &dyn Engine,
    disks: &crate::disk::Disks,
    name: &str,
    volumes: &[String],
) -> Result<(), ReconcileError> {
    for volume in volumes {
        tracing::info!(volume, sandbox = name, "removing replaced workspace");
        match engine.remove_volume(volume).await {
            Ok(()) => disks.forget(volume).await,
            // Still mounted by a container retired by another rollback, whose removal runs on a
            // task of its own: that task removes its workspace once the container is gone.
            Err(EngineError::Docker { message, .. }) => {
                tracing::debug!(volume, %message, "a replaced workspace is in use");
            }
            Err(error) => return Err(error.into()),
        }
    }
    Ok(())
}

/// Marks a sandbox's background removal as finished when its task ends, however it ends.
struct Removing {
    removing: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    name: String,
}

impl Drop for Removing {
    fn drop(&mut self) {
        let mut removing = lock(&self.removing);
        if let Some(count) = removing.get_mut(&self.name) {
            *count -= 1;
            if *count == 0 {
                removing.remove(&self.name);
            }
        }
    }
}

fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The limits a container created from `plan` has.
pub(super) fn limits_of(plan: &ContainerPlan) -> AppliedLimits {
    AppliedLimits {
        cpus: plan.cpus,
        memory_mb: plan.memory_mb,
        pids_limit: plan.pids_limit,
    }
}

/// The limits a sandbox of `effective` should have.
pub(super) fn limits_for(effective: &EffectiveSandbox) -> AppliedLimits {
    AppliedLimits {
        cpus: effective.cpus,
        memory_mb: effective.memory_mb,
        pids_limit: effective.pids_limit,
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// The network name, name servers, environment and CA directory a container gets from where it
/// joins.
#[allow(clippy::type_complexity)]
fn split_joined(
    joined: Option<Joined>,
) -> (
    Option<String>,
    Vec<IpAddr>,
    BTreeMap<String, String>,
    Option<String>,
) {
    let Some(joined) = joined else {
        return (None, Vec::new(), BTreeMap::new(), None);
    };
    let ca = joined.ca_dir.is_some();
    let env = joined
        .gateway
        .map(|address| Gateway::proxy_env(address, ca).into_iter().collect())
        .unwrap_or_default();
    (
        Some(joined.network),
        joined.gateway.into_iter().collect(),
        env,
        joined.ca_dir.map(|d| d.display().to_string()),
    )
}
