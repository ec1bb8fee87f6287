//! An in-memory [`Engine`] for tests of the controller and the API, built only for tests
//! (`cfg(test)`, or the `test-support` feature that the crate's own tests turn on); it must never
//! reach a release build. It records calls and keeps containers,
//! volumes and networks in maps. It has no data plane (exec and archive calls fail), and it never
//! emits events on its own: tests push them with [`FakeEngine::emit`], because the real daemon's
//! timing of events is exactly what the controller must not depend on.
//!
//! Failures are injected per operation name, which is the trait method's name
//! (`"create_container"`, `"start_container"`, ...).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::broadcast;
use tokio_stream::wrappers::BroadcastStream;

use super::*;

/// A container the fake holds.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeContainer {
    pub id: String,
    /// Docker's name: the plan's until a rename.
    pub docker_name: String,
    pub plan: ContainerPlan,
    pub state: String,
    pub exit_code: Option<i64>,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_limit: u64,
    /// Set by [`Engine::prepare_workspace`].
    pub workspace_owner: Option<(u32, u32)>,
}

impl FakeContainer {
    pub fn name(&self) -> String {
        self.docker_name.clone()
    }

    fn labels(&self) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_ID.to_string(), self.plan.sandbox.clone()),
            (LABEL_UID.to_string(), self.plan.uid.clone()),
            (LABEL_SPEC_HASH.to_string(), self.plan.spec_hash.clone()),
        ]);
        if !self.plan.server.is_empty() {
            labels.insert(LABEL_SERVER.to_string(), self.plan.server.clone());
        }
        labels
    }
}

#[derive(Default)]
struct State {
    containers: BTreeMap<String, FakeContainer>,
    volumes: BTreeMap<String, BTreeMap<String, String>>,
    /// What each view volume was made as ([`Engine::create_view_volume`]).
    views: BTreeMap<String, ViewPaths>,
    networks: BTreeSet<String>,
    /// `None`: every image exists.
    images: Option<BTreeSet<String>>,
    helper_volumes: BTreeMap<String, Vec<u8>>,
    next_failures: HashMap<String, VecDeque<EngineError>>,
    always_failing: BTreeSet<String>,
    /// `exec` never answers (a daemon stuck on a frozen container).
    exec_hangs: bool,
    calls: Vec<String>,
    next_id: u64,
    unreachable: bool,
    /// Where every container's workspace appears on this host, and its process, if set.
    host_workspace: Option<(std::path::PathBuf, i64)>,
    /// What [`Engine::capabilities`] answers; `None`: everything.
    capabilities: Option<EngineCapabilities>,
}

pub struct FakeEngine {
    state: Mutex<State>,
    events: broadcast::Sender<EngineEvent>,
}

impl Default for FakeEngine {
    fn default() -> Self {
        FakeEngine::new()
    }
}

impl FakeEngine {
    pub fn new() -> FakeEngine {
        let (events, _) = broadcast::channel(1024);
        FakeEngine {
            state: Mutex::new(State::default()),
            events,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking test thread must not hide the state from the others.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// From now on the fake says it can do only `capabilities` (it still serves every call: what
    /// is tested is that the controller asks).
    pub fn set_capabilities(&self, capabilities: EngineCapabilities) {
        self.lock().capabilities = Some(capabilities);
    }

    /// The next call of `op` fails with [`EngineError::Docker`]. Calls stack: two calls make the
    /// next two calls fail.
    pub fn fail_next(&self, op: &str) {
        self.fail_next_with(
            op,
            EngineError::Docker {
                operation: op.to_string(),
                message: "injected failure".into(),
            },
        );
    }

    /// The next call of `op` fails with `error`.
    pub fn fail_next_with(&self, op: &str, error: EngineError) {
        self.lock()
            .next_failures
            .entry(op.to_string())
            .or_default()
            .push_back(error);
    }

    /// Every call of `op` fails until [`FakeEngine::clear_failures`].
    pub fn fail_always(&self, op: &str) {
        self.lock().always_failing.insert(op.to_string());
    }

    /// From now on `exec` never answers, as Docker may not for a frozen container.
    pub fn hang_exec(&self) {
        self.lock().exec_hangs = true;
    }

    pub fn clear_failures(&self) {
        let mut state = self.lock();
        state.next_failures.clear();
        state.always_failing.clear();
    }

    /// Every call fails with [`EngineError::Unreachable`] while set.
    pub fn set_unreachable(&self, unreachable: bool) {
        self.lock().unreachable = unreachable;
    }

    /// Every call so far, as `"<op> <argument>"` (e.g. `"create_container demo"`).
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// How many calls of `op` were made.
    pub fn call_count(&self, op: &str) -> usize {
        self.lock()
            .calls
            .iter()
            .filter(|c| c.split(' ').next() == Some(op))
            .count()
    }

    pub fn clear_calls(&self) {
        self.lock().calls.clear();
    }

    /// Delivers `event` to every stream returned by [`Engine::events`] so far.
    pub fn emit(&self, event: EngineEvent) {
        // No subscriber is not an error: the daemon drops events nobody listens to as well.
        let _ = self.events.send(event);
    }

    /// Changes a container's state word (`exited`, `dead`, ...), as if it happened outside.
    /// Returns false when there is no such container (by ID or name).
    pub fn set_state(&self, id: &str, state: &str) -> bool {
        let mut guard = self.lock();
        let Some(key) = find(&guard, id) else {
            return false;
        };
        if let Some(c) = guard.containers.get_mut(&key) {
            c.state = state.to_string();
            if state == "exited" && c.exit_code.is_none() {
                c.exit_code = Some(137);
            }
        }
        true
    }

    /// Removes a container as if someone did `docker rm -f` (no call is logged).
    pub fn vanish_container(&self, id: &str) -> bool {
        let mut guard = self.lock();
        match find(&guard, id) {
            Some(key) => guard.containers.remove(&key).is_some(),
            None => false,
        }
    }

    /// Makes every container's workspace appear at `dir` on this host and, while it runs, its
    /// process be `pid` (not the container's, of course: a proof against it must fail).
    pub fn set_host_workspace(&self, dir: std::path::PathBuf, pid: i64) {
        self.lock().host_workspace = Some((dir, pid));
    }

    /// Restricts the images that exist to `images` (by default every image exists).
    pub fn set_images(&self, images: &[&str]) {
        self.lock().images = Some(images.iter().map(|i| i.to_string()).collect());
    }

    /// Snapshot of the containers, keyed by ID.
    pub fn containers(&self) -> Vec<FakeContainer> {
        self.lock().containers.values().cloned().collect()
    }

    /// The container of `sandbox`, if any.
    pub fn container_of(&self, sandbox: &str) -> Option<FakeContainer> {
        self.lock()
            .containers
            .values()
            .find(|c| c.plan.sandbox == sandbox)
            .cloned()
    }

    /// Volume names with their labels.
    pub fn volumes(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        self.lock().volumes.clone()
    }

    pub fn networks(&self) -> BTreeSet<String> {
        self.lock().networks.clone()
    }

    /// Content written by [`Engine::ensure_helper_volume`] into `volume`.
    pub fn helper_binary(&self, volume: &str) -> Option<Vec<u8>> {
        self.lock().helper_volumes.get(volume).cloned()
    }

    /// Logs the call and returns the injected failure, if any.
    fn enter(&self, op: &str, arg: &str) -> EngineResult<MutexGuard<'_, State>> {
        let mut state = self.lock();
        state.calls.push(format!("{op} {arg}"));
        if state.unreachable {
            return Err(EngineError::Unreachable(
                "fake engine set unreachable".into(),
            ));
        }
        if let Some(error) = state
            .next_failures
            .get_mut(op)
            .and_then(VecDeque::pop_front)
        {
            return Err(error);
        }
        if state.always_failing.contains(op) {
            return Err(EngineError::Docker {
                operation: op.to_string(),
                message: "injected failure".into(),
            });
        }
        Ok(state)
    }
}

/// The key of the container with this ID or name.
fn find(state: &State, id_or_name: &str) -> Option<String> {
    state
        .containers
        .values()
        .find(|c| c.id == id_or_name || c.name() == id_or_name)
        .map(|c| c.id.clone())
}

fn with_container<T>(
    state: &mut State,
    id: &str,
    f: impl FnOnce(&mut FakeContainer) -> EngineResult<T>,
) -> EngineResult<T> {
    let key = find(state, id).ok_or_else(|| EngineError::NotFound {
        what: format!("container {id}"),
    })?;
    match state.containers.get_mut(&key) {
        Some(c) => f(c),
        None => Err(EngineError::NotFound {
            what: format!("container {id}"),
        }),
    }
}

fn refuse(op: &str, id: &str, message: &str) -> EngineError {
    EngineError::Docker {
        operation: format!("{op} container {id}"),
        message: message.to_string(),
    }
}

fn no_data_plane(op: &str) -> EngineError {
    EngineError::Docker {
        operation: op.to_string(),
        message: "fake engine has no data plane".into(),
    }
}

#[async_trait]
impl Engine for FakeEngine {
    async fn ping(&self) -> EngineResult<()> {
        self.enter("ping", "").map(|_| ())
    }

    fn capabilities(&self) -> EngineCapabilities {
        self.lock().capabilities.unwrap_or(EngineCapabilities::ALL)
    }

    async fn list_containers(&self) -> EngineResult<Vec<ManagedContainer>> {
        let state = self.enter("list_containers", "")?;
        Ok(state
            .containers
            .values()
            .map(|c| ManagedContainer {
                id: c.id.clone(),
                name: c.name(),
                labels: c.labels(),
                state: c.state.clone(),
            })
            .collect())
    }

    async fn list_volumes(&self) -> EngineResult<Vec<ManagedVolume>> {
        let state = self.enter("list_volumes", "")?;
        Ok(state
            .volumes
            .iter()
            .filter(|(_, labels)| labels.get(LABEL_MANAGED).map(String::as_str) == Some("true"))
            .map(|(name, labels)| ManagedVolume {
                name: name.clone(),
                labels: labels.clone(),
            })
            .collect())
    }

    async fn create_marker_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<()> {
        let mut state = self.enter("create_marker_volume", name)?;
        state
            .volumes
            .entry(name.to_string())
            .or_insert_with(|| labels.clone());
        Ok(())
    }

    async fn create_view_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        view: &ViewPaths,
    ) -> EngineResult<()> {
        let mut state = self.enter("create_view_volume", name)?;
        if state.volumes.contains_key(name) {
            return Err(EngineError::Conflict {
                what: format!("volume {name}"),
            });
        }
        state.volumes.insert(name.to_string(), labels.clone());
        state.views.insert(name.to_string(), view.clone());
        Ok(())
    }

    async fn view_of_volume(&self, name: &str) -> EngineResult<Option<ViewPaths>> {
        let state = self.enter("view_of_volume", name)?;
        Ok(state.views.get(name).cloned())
    }

    async fn volume_directory(&self, name: &str) -> EngineResult<Option<std::path::PathBuf>> {
        let state = self.enter("volume_directory", name)?;
        // The fake keeps no files: its volumes have no directory anywhere.
        let _ = state.volumes.get(name);
        Ok(None)
    }

    async fn create_bind_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        _source: &std::path::Path,
    ) -> EngineResult<()> {
        let mut state = self.enter("create_bind_volume", name)?;
        if state.volumes.contains_key(name) {
            return Err(EngineError::Conflict {
                what: format!("volume {name}"),
            });
        }
        state.volumes.insert(name.to_string(), labels.clone());
        Ok(())
    }

    async fn list_volumes_with_label(&self, key: &str) -> EngineResult<Vec<ManagedVolume>> {
        let state = self.enter("list_volumes_with_label", key)?;
        Ok(state
            .volumes
            .iter()
            .filter(|(_, labels)| labels.contains_key(key))
            .map(|(name, labels)| ManagedVolume {
                name: name.clone(),
                labels: labels.clone(),
            })
            .collect())
    }

    async fn inspect_volume(&self, name: &str) -> EngineResult<Option<ManagedVolume>> {
        let state = self.enter("inspect_volume", name)?;
        Ok(state.volumes.get(name).map(|labels| ManagedVolume {
            name: name.to_string(),
            labels: labels.clone(),
        }))
    }

    async fn remove_volume(&self, name: &str) -> EngineResult<()> {
        let mut state = self.enter("remove_volume", name)?;
        let in_use = state.containers.values().any(|c| {
            c.plan.workspace_volume == name || c.plan.helper_volume.as_deref() == Some(name)
        });
        if in_use && state.volumes.contains_key(name) {
            return Err(EngineError::Docker {
                operation: format!("remove volume {name}"),
                message: "volume is in use".into(),
            });
        }
        state.volumes.remove(name);
        state.views.remove(name);
        state.helper_volumes.remove(name);
        Ok(())
    }

    async fn create_container(&self, plan: &ContainerPlan) -> EngineResult<String> {
        let mut state = self.enter("create_container", &plan.sandbox)?;
        if let Some(images) = &state.images {
            if !images.contains(&plan.image) {
                return Err(EngineError::ImageMissing(plan.image.clone()));
            }
        }
        let name = plan.docker_name();
        if find(&state, &name).is_some() {
            return Err(EngineError::Conflict {
                what: format!("container {name}"),
            });
        }
        // Like Docker: a missing workspace volume is made with the sandbox's labels, a missing
        // helper volume without any.
        let labels = BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_SERVER.to_string(), plan.server.clone()),
            (LABEL_ID.to_string(), plan.sandbox.clone()),
            (LABEL_UID.to_string(), plan.uid.clone()),
        ]);
        state
            .volumes
            .entry(plan.workspace_volume.clone())
            .or_insert(labels);
        if let Some(helper) = &plan.helper_volume {
            state.volumes.entry(helper.clone()).or_default();
        }
        state.next_id += 1;
        let id = format!("{:064x}", state.next_id);
        state.containers.insert(
            id.clone(),
            FakeContainer {
                id: id.clone(),
                docker_name: name,
                plan: plan.clone(),
                state: "created".into(),
                exit_code: None,
                cpus: plan.cpus,
                memory_mb: plan.memory_mb,
                pids_limit: plan.pids_limit,
                workspace_owner: None,
            },
        );
        Ok(id)
    }

    async fn start_container(&self, id: &str) -> EngineResult<()> {
        let mut state = self.enter("start_container", id)?;
        with_container(&mut state, id, |c| {
            match c.state.as_str() {
                "running" => {}
                "paused" => return Err(refuse("start", id, "container is paused")),
                _ => {
                    c.state = "running".into();
                    c.exit_code = None;
                }
            }
            Ok(())
        })
    }

    async fn remove_container(&self, id: &str) -> EngineResult<()> {
        let mut state = self.enter("remove_container", id)?;
        if let Some(key) = find(&state, id) {
            state.containers.remove(&key);
        }
        Ok(())
    }

    async fn inspect_container(&self, id: &str) -> EngineResult<Option<ContainerDetails>> {
        let state = self.enter("inspect_container", id)?;
        let Some(key) = find(&state, id) else {
            return Ok(None);
        };
        let host = state.host_workspace.clone();
        Ok(state.containers.get(&key).map(|c| ContainerDetails {
            id: c.id.clone(),
            name: c.docker_name.clone(),
            state: c.state.clone(),
            running: c.state == "running" || c.state == "paused",
            paused: c.state == "paused",
            exit_code: c.exit_code,
            oom_killed: false,
            finished_at: None,
            helper_main: false,
            error: String::new(),
            started_at: None,
            pid: match (&host, c.state == "running") {
                (_, false) => 0,
                (Some((_, pid)), true) => *pid,
                (None, true) => 4242,
            },
            runtime: None,
            labels: c.labels(),
            // Nothing of the fake lives on this host, unless a test says so.
            workspace_source: host.map(|(dir, _)| dir),
        }))
    }

    async fn update_limits(
        &self,
        id: &str,
        cpus: f64,
        memory_mb: u64,
        pids_limit: u64,
    ) -> EngineResult<()> {
        let mut state = self.enter("update_limits", id)?;
        with_container(&mut state, id, |c| {
            c.cpus = cpus;
            c.memory_mb = memory_mb;
            c.pids_limit = pids_limit;
            Ok(())
        })
    }

    async fn pause(&self, id: &str) -> EngineResult<()> {
        let mut state = self.enter("pause", id)?;
        with_container(&mut state, id, |c| match c.state.as_str() {
            "running" | "paused" => {
                c.state = "paused".into();
                Ok(())
            }
            _ => Err(EngineError::NotRunning {
                operation: format!("pause container {id}"),
                message: "container is not running".into(),
            }),
        })
    }

    async fn unpause(&self, id: &str) -> EngineResult<()> {
        let mut state = self.enter("unpause", id)?;
        with_container(&mut state, id, |c| {
            if c.state == "paused" {
                c.state = "running".into();
            }
            Ok(())
        })
    }

    async fn ensure_network(&self, name: &str, _kind: NetworkKind) -> EngineResult<NetworkInfo> {
        let mut state = self.enter("ensure_network", name)?;
        state.networks.insert(name.to_string());
        Ok(NetworkInfo::default())
    }

    async fn network_members(&self, name: &str) -> EngineResult<Vec<(String, std::net::IpAddr)>> {
        let _state = self.enter("network_members", name)?;
        Ok(Vec::new())
    }

    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        let state = self.enter("image_exists", image)?;
        Ok(state.images.as_ref().is_none_or(|i| i.contains(image)))
    }

    async fn commit_rootfs(
        &self,
        container: &str,
        reference: &str,
        _labels: &BTreeMap<String, String>,
        _pause: bool,
    ) -> EngineResult<CommittedRootfs> {
        let mut state = self.enter("commit_rootfs", container)?;
        if !state.containers.contains_key(container)
            && !state
                .containers
                .values()
                .any(|c| c.docker_name == container)
        {
            return Err(EngineError::NotFound {
                what: format!("container {container}"),
            });
        }
        if let Some(images) = state.images.as_mut() {
            images.insert(reference.to_string());
        }
        Ok(CommittedRootfs {
            image_id: format!("sha256:fake-{reference}"),
            layer_digest: format!("sha256:fake-layer-{reference}"),
            layer_bytes: 0,
        })
    }

    async fn list_images_with_label(&self, key: &str) -> EngineResult<Vec<LabeledImage>> {
        let _state = self.enter("list_images_with_label", key)?;
        Ok(Vec::new())
    }

    async fn remove_image(&self, reference: &str) -> EngineResult<()> {
        let mut state = self.enter("remove_image", reference)?;
        if let Some(images) = state.images.as_mut() {
            images.remove(reference);
        }
        Ok(())
    }

    /// The fake keeps no layers: a commit's layer cannot be exported.
    async fn export_top_layer(
        &self,
        reference: &str,
        _digest: &str,
        _out: std::fs::File,
    ) -> EngineResult<(u64, std::fs::File)> {
        let _state = self.enter("export_top_layer", reference)?;
        Err(EngineError::Unsupported {
            operation: format!("exporting the layer of image {reference}"),
        })
    }

    /// Records the image as present when the base image is.
    async fn load_rootfs(
        &self,
        base: &str,
        _layer: std::fs::File,
        _size: u64,
        _digest: &str,
        reference: &str,
        _labels: &BTreeMap<String, String>,
    ) -> EngineResult<String> {
        let mut state = self.enter("load_rootfs", reference)?;
        if let Some(images) = state.images.as_mut() {
            if !images.contains(base) {
                return Err(EngineError::NotFound {
                    what: format!("image {base}"),
                });
            }
            images.insert(reference.to_string());
        }
        Ok(format!("sha256:fake-{reference}"))
    }

    fn events(&self) -> BoxStream<'static, EngineResult<EngineEvent>> {
        self.lock().calls.push("events ".into());
        // A lagging test subscriber loses events, as a slow client of the daemon would.
        BroadcastStream::new(self.events.subscribe())
            .filter_map(|item| std::future::ready(item.ok().map(Ok)))
            .boxed()
    }

    async fn exec(&self, container: &str, _plan: &ExecPlan) -> EngineResult<ExecSession> {
        let hangs = self.enter("exec", container)?.exec_hangs;
        if hangs {
            futures::future::pending::<()>().await;
        }
        Err(no_data_plane("exec"))
    }

    async fn inspect_exec(&self, exec_id: &str) -> EngineResult<ExecState> {
        drop(self.enter("inspect_exec", exec_id)?);
        Err(no_data_plane("inspect_exec"))
    }

    async fn archive_get(
        &self,
        container: &str,
        _path: &str,
    ) -> EngineResult<BoxStream<'static, EngineResult<Bytes>>> {
        drop(self.enter("archive_get", container)?);
        Err(no_data_plane("archive_get"))
    }

    async fn archive_put(
        &self,
        container: &str,
        _path: &str,
        _tar: BoxStream<'static, Bytes>,
    ) -> EngineResult<()> {
        drop(self.enter("archive_put", container)?);
        Err(no_data_plane("archive_put"))
    }

    async fn ensure_helper_volume(&self, volume: &str, binary: &[u8]) -> EngineResult<()> {
        let mut state = self.enter("ensure_helper_volume", volume)?;
        let labels = BTreeMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_ROLE.to_string(), ROLE_HELPER.to_string()),
        ]);
        state.volumes.entry(volume.to_string()).or_insert(labels);
        state
            .helper_volumes
            .insert(volume.to_string(), binary.to_vec());
        Ok(())
    }

    async fn rename_container(&self, id: &str, new_name: &str) -> EngineResult<()> {
        let mut state = self.enter("rename_container", id)?;
        if find(&state, new_name).is_some() {
            return Err(EngineError::Conflict {
                what: format!("container {new_name}"),
            });
        }
        with_container(&mut state, id, |c| {
            c.docker_name = new_name.to_string();
            Ok(())
        })
    }

    async fn kill_container(&self, id: &str) -> EngineResult<()> {
        let mut state = self.enter("kill_container", id)?;
        if find(&state, id).is_none() {
            return Ok(());
        }
        with_container(&mut state, id, |c| {
            if c.state == "running" || c.state == "paused" {
                c.state = "exited".into();
                c.exit_code = Some(137);
            }
            Ok(())
        })
    }

    async fn stop_container(&self, id: &str, _grace: std::time::Duration) -> EngineResult<()> {
        let mut state = self.enter("stop_container", id)?;
        if find(&state, id).is_none() {
            return Ok(());
        }
        with_container(&mut state, id, |c| {
            if c.state == "running" || c.state == "paused" {
                c.state = "exited".into();
                c.exit_code = Some(0);
            }
            Ok(())
        })
    }

    async fn pull_image(
        &self,
        image: &str,
        _auth_file: Option<&std::path::Path>,
        progress: super::PullProgress,
    ) -> EngineResult<()> {
        let mut state = self.enter("pull_image", image)?;
        if let Some(images) = state.images.as_mut() {
            images.insert(image.to_string());
        }
        progress(1, 1);
        Ok(())
    }

    async fn prepare_workspace(&self, container: &str, uid: u32, gid: u32) -> EngineResult<()> {
        let mut state = self.enter("prepare_workspace", container)?;
        with_container(&mut state, container, |c| {
            c.workspace_owner = Some((uid, gid));
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(name: &str) -> ContainerPlan {
        ContainerPlan {
            sandbox: name.into(),
            name: None,
            uid: "u1".into(),
            server: "s1".into(),
            image: "img".into(),
            cpus: 1.0,
            memory_mb: 128,
            pids_limit: 32,
            network: None,
            read_only_rootfs: true,
            env: BTreeMap::new(),
            dns: Vec::new(),
            tmp_size_mb: 16,
            user: "1000:1000".into(),
            runtime: None,
            spec_hash: "h1".into(),
            helper_volume: None,
            workspace_volume: volume_name(name),
            ca_dir: None,
            workspace_disk_mb: 0,
        }
    }

    #[tokio::test]
    async fn lifecycle_and_call_log() {
        let engine = FakeEngine::new();
        let id = engine.create_container(&plan("a")).await.unwrap();
        assert!(matches!(
            engine.create_container(&plan("a")).await,
            Err(EngineError::Conflict { .. })
        ));
        engine.start_container(&id).await.unwrap();
        let listed = engine.list_containers().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].sandbox(), Some("a"));
        assert!(listed[0].is_running());
        assert!(engine.set_state("agent-sandbox-a", "exited"));
        let details = engine.inspect_container(&id).await.unwrap().unwrap();
        assert!(!details.running);
        engine.remove_container(&id).await.unwrap();
        engine.remove_container(&id).await.unwrap();
        assert_eq!(engine.inspect_container(&id).await.unwrap(), None);
        assert_eq!(engine.call_count("remove_container"), 2);
        assert_eq!(engine.calls()[0], "create_container a");
    }

    #[tokio::test]
    async fn injected_failures_fire_once_in_order() {
        let engine = FakeEngine::new();
        engine.fail_next("create_container");
        engine.fail_next_with("create_container", EngineError::Unreachable("gone".into()));
        assert!(matches!(
            engine.create_container(&plan("a")).await,
            Err(EngineError::Docker { .. })
        ));
        assert!(matches!(
            engine.create_container(&plan("a")).await,
            Err(EngineError::Unreachable(_))
        ));
        engine.create_container(&plan("a")).await.unwrap();
        let volumes = engine.volumes();
        let labels = volumes
            .get(&volume_name("a"))
            .expect("made with the container");
        assert_eq!(labels.get(LABEL_ID).map(String::as_str), Some("a"));
    }

    #[tokio::test]
    async fn missing_images_and_events() {
        let engine = FakeEngine::new();
        engine.set_images(&["other"]);
        assert!(matches!(
            engine.create_container(&plan("a")).await,
            Err(EngineError::ImageMissing(_))
        ));
        let mut events = engine.events();
        let event = EngineEvent {
            object: "container".into(),
            action: "die".into(),
            sandbox: Some("a".into()),
            ..Default::default()
        };
        engine.emit(event.clone());
        assert_eq!(events.next().await.unwrap().unwrap(), event);
    }
}
