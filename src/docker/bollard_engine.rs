//! [`Engine`] against the Docker daemon through bollard, negotiating the API version (a 20.10
//! daemon speaks API 1.41).
//!
//! This file owns the calls and the mapping of Docker's answers to [`EngineError`]: 404 is
//! [`EngineError::NotFound`] (or success where the trait promises idempotence), a name clash on
//! create is [`EngineError::Conflict`], a missing image is [`EngineError::ImageMissing`] (nothing
//! is ever pulled), a broken connection is [`EngineError::Unreachable`]. The container's shape
//! lives in [`plan`], events in [`events`], the helper volume in [`helper`], a local kill in
//! [`kill`].
//!
//! Workspace ownership: a fresh volume's root belongs to root, and the sandbox user cannot
//! change that (it has no capabilities; neither has `docker exec -u 0`). Instead of running an
//! extra container, [`Engine::prepare_workspace`] PUTs a one-entry tar through the archive API
//! into `/workspace` of the created (not yet started) container; Docker mounts the container's
//! volumes for that, the path is a volume so a read-only root filesystem does not refuse it, and
//! the entry named `/` makes Docker apply its owner and mode to `/workspace` itself (see
//! [`tarball::root_dir`]). Volumes are mounted with `NoCopy`, so Docker never copies image content
//! into them nor resets that owner when a later container mounts the volume. (When this host's
//! copy of the volume is verifiably the container's, the controller sets the owner there itself
//! and needs no archive call at all.)

mod commit;
mod daemon;
mod dataplane;
mod events;
mod freezer;
mod helper;
mod kill;
mod layer;
mod plan;
mod pull;

pub use daemon::DaemonReport;
pub use plan::{gvisor_pids_limit, RUNSC_PIDS_HEADROOM};
mod tarball;
mod twins;

use std::collections::{BTreeMap, HashMap};

use async_trait::async_trait;
use bollard::errors::Error as BollardError;
use bollard::models::{ContainerUpdateBody, NetworkCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, InspectNetworkOptions, ListContainersOptions, ListVolumesOptions,
    RemoveContainerOptions, RemoveVolumeOptions,
};
use bytes::Bytes;
use futures::stream::BoxStream;
use tokio::sync::Mutex;

use super::*;

pub struct BollardEngine {
    docker: bollard::Docker,
    helpers: helper::HelperCache,
    /// Docker 20.10 happily creates two networks of one name; one creator at a time prevents
    /// that within this process.
    networks: Mutex<()>,
    /// One container removal at a time. A 20.10 daemon (before 20.10.27) can deadlock for good
    /// when containers leave their networks concurrently: libnetwork takes its controller and
    /// network locks in opposite orders on the two paths (moby/moby#46661, fixed by
    /// moby/libnetwork#2679). Removing 1,000 sandboxes eight at a time hung such a daemon within
    /// minutes; one at a time it did not, and took about a third longer. Only the Docker call is
    /// serialized: waiting for someone else's removal holds no one up.
    removals: Mutex<()>,
    /// Containers this engine froze through their cgroup (see `freezer`), by full ID.
    frozen: std::sync::Mutex<HashMap<String, freezer::Freezer>>,
    /// Containers this engine killed through their PID 1 (see `kill`), by full ID, until their
    /// removal: Docker may not have recorded the exit yet.
    killed_here: kill::KilledHere,
    /// The runtime the daemon uses when a container names none (`runc` unless configured).
    default_runtime: Option<String>,
}

impl BollardEngine {
    /// A volume of Docker's `local` driver with mount options (an overlay view, a bind of a
    /// directory of the host).
    async fn create_local_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        options: [(&str, &str); 3],
    ) -> EngineResult<()> {
        let request = bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            driver: Some("local".to_string()),
            driver_opts: Some(
                options
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<HashMap<_, _>>(),
            ),
            labels: Some(labels.clone().into_iter().collect()),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map(drop)
            .map_err(map_err("create", &format!("volume {name}")))
    }

    /// Connects to the local daemon (DOCKER_HOST or the default socket) and negotiates the API
    /// version, so that a 20.10 daemon (API 1.41) works.
    pub async fn connect() -> EngineResult<BollardEngine> {
        let docker = bollard::Docker::connect_with_local_defaults()
            .map_err(|e| EngineError::Unreachable(e.to_string()))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(|e| EngineError::Unreachable(e.to_string()))?;
        let default_runtime = docker
            .info()
            .await
            .map_err(|e| EngineError::Unreachable(e.to_string()))?
            .default_runtime;
        Ok(BollardEngine {
            docker,
            helpers: helper::HelperCache::default(),
            networks: Mutex::new(()),
            removals: Mutex::new(()),
            frozen: Default::default(),
            killed_here: Default::default(),
            default_runtime,
        })
    }
}

impl BollardEngine {
    /// Volumes matching Docker's list `filters`, with their labels.
    async fn volumes_matching(
        &self,
        filters: HashMap<String, Vec<String>>,
    ) -> EngineResult<Vec<ManagedVolume>> {
        let options = ListVolumesOptions {
            filters: Some(filters),
        };
        let response = self
            .docker
            .list_volumes(Some(options))
            .await
            .map_err(map_err("list", "volumes"))?;
        Ok(response
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| ManagedVolume {
                name: v.name,
                labels: v.labels.into_iter().collect(),
            })
            .collect())
    }

    /// Docker's inspection of volume `name`; `None` when there is none.
    async fn volume(&self, name: &str) -> EngineResult<Option<bollard::models::Volume>> {
        match self.docker.inspect_volume(name).await {
            Ok(volume) => Ok(Some(volume)),
            Err(e) if is_status(&e, 404) => Ok(None),
            Err(e) => Err(map_err("inspect", &format!("volume {name}"))(e)),
        }
    }

    /// Thaws the container if it is paused, by Docker or by a freeze of this host's (a missing
    /// container is left to the caller).
    async fn thaw_if_paused(&self, id: &str) -> EngineResult<()> {
        match self.inspect_container(id).await? {
            Some(details) if details.paused => self.thaw_or_unpause(id).await,
            _ => Ok(()),
        }
    }

    async fn wait_gone(&self, id: &str) -> EngineResult<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.inspect_container(id).await?.is_some() {
            if std::time::Instant::now() > deadline {
                return Err(EngineError::Docker {
                    operation: format!("remove container {id}"),
                    message: "another removal did not finish within 10 s".into(),
                });
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

fn is_status(e: &BollardError, code: u16) -> bool {
    matches!(e, BollardError::DockerResponseServerError { status_code, .. } if *status_code == code)
}

fn server_message(e: &BollardError) -> Option<&str> {
    match e {
        BollardError::DockerResponseServerError { message, .. } => Some(message),
        _ => None,
    }
}

/// Whether Docker's refusal says the container is stopped or paused ("Container … is not
/// running", "Container … is paused, unpause the container before exec"): the one place that
/// reads these words.
fn says_not_running(message: &str) -> bool {
    message.contains("is not running") || message.contains("is paused")
}

/// Maps a bollard error for `operation` on `what` (e.g. "container agent-sandbox-x").
fn map_err(
    operation: &str,
    what: &str,
) -> impl Fn(BollardError) -> EngineError + Clone + Send + Sync + 'static {
    let operation = operation.to_string();
    let what = what.to_string();
    move |e| match e {
        BollardError::DockerResponseServerError {
            status_code: 404, ..
        } => EngineError::NotFound { what: what.clone() },
        BollardError::DockerResponseServerError { message, .. } if says_not_running(&message) => {
            EngineError::NotRunning {
                operation: format!("{operation} {what}"),
                message,
            }
        }
        BollardError::DockerResponseServerError { message, .. } => EngineError::Docker {
            operation: format!("{operation} {what}"),
            message,
        },
        BollardError::IOError { .. }
        | BollardError::HyperResponseError { .. }
        | BollardError::HttpClientError { .. }
        | BollardError::RequestTimeoutError
        | BollardError::SocketNotFoundError(_) => {
            EngineError::Unreachable(format!("{operation} {what}: {e}"))
        }
        other => EngineError::Docker {
            operation: format!("{operation} {what}"),
            message: other.to_string(),
        },
    }
}

fn managed_filter() -> HashMap<String, Vec<String>> {
    HashMap::from([("label".to_string(), vec![format!("{LABEL_MANAGED}=true")])])
}

fn to_btree(labels: Option<HashMap<String, String>>) -> BTreeMap<String, String> {
    labels.unwrap_or_default().into_iter().collect()
}

/// A time Docker reports (`StartedAt`, `FinishedAt`), or `None` for its zero time.
fn started_at(value: Option<&str>) -> Option<chrono::DateTime<chrono::Utc>> {
    let parsed = chrono::DateTime::parse_from_rfc3339(value?).ok()?;
    // Docker reports the zero time for containers that never started.
    (parsed.timestamp() > 0).then(|| parsed.with_timezone(&chrono::Utc))
}

#[async_trait]
impl Engine for BollardEngine {
    fn capabilities(&self) -> EngineCapabilities {
        EngineCapabilities::ALL
    }

    async fn ping(&self) -> EngineResult<()> {
        self.docker
            .ping()
            .await
            .map(|_| ())
            .map_err(|e| EngineError::Unreachable(e.to_string()))
    }

    async fn list_containers(&self) -> EngineResult<Vec<ManagedContainer>> {
        let options = ListContainersOptions {
            all: true,
            filters: Some(managed_filter()),
            ..Default::default()
        };
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(map_err("list", "containers"))?;
        Ok(summaries
            .into_iter()
            .filter_map(|c| {
                let name = c.names?.first()?.trim_start_matches('/').to_string();
                Some(ManagedContainer {
                    id: c.id?,
                    name,
                    labels: to_btree(c.labels),
                    state: c.state.map(|s| s.to_string()).unwrap_or_default(),
                })
            })
            .collect())
    }

    async fn network_members(&self, name: &str) -> EngineResult<Vec<(String, std::net::IpAddr)>> {
        let mut filters = managed_filter();
        filters.insert("network".into(), vec![name.to_string()]);
        filters.insert("status".into(), vec!["running".into()]);
        let options = ListContainersOptions {
            filters: Some(filters),
            ..Default::default()
        };
        let summaries = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(map_err("list", &format!("containers on network {name}")))?;
        Ok(summaries
            .into_iter()
            .filter_map(|c| {
                let container = c
                    .names
                    .as_ref()?
                    .first()?
                    .trim_start_matches('/')
                    .to_string();
                let address = c
                    .network_settings?
                    .networks?
                    .get(name)?
                    .ip_address
                    .as_deref()?
                    .parse()
                    .ok()?;
                Some((container, address))
            })
            .collect())
    }

    async fn list_volumes(&self) -> EngineResult<Vec<ManagedVolume>> {
        self.volumes_matching(managed_filter()).await
    }

    async fn inspect_volume(&self, name: &str) -> EngineResult<Option<ManagedVolume>> {
        Ok(self.volume(name).await?.map(|volume| ManagedVolume {
            name: volume.name,
            labels: volume.labels.into_iter().collect(),
        }))
    }

    async fn remove_volume(&self, name: &str) -> EngineResult<()> {
        self.unmount_twin(name).await?;
        match self
            .docker
            .remove_volume(name, None::<RemoveVolumeOptions>)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(map_err("remove", &format!("volume {name}"))(e)),
        }
    }

    async fn create_marker_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<()> {
        let request = bollard::models::VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels.clone().into_iter().collect()),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map(drop)
            .map_err(map_err("create", &format!("volume {name}")))
    }

    async fn create_view_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        view: &ViewPaths,
    ) -> EngineResult<()> {
        let options = view.overlay_options().ok_or_else(|| EngineError::Docker {
            operation: format!("create volume {name}"),
            message: "the view's paths cannot be written as mount options".into(),
        })?;
        self.create_local_volume(
            name,
            labels,
            [("type", "overlay"), ("device", "overlay"), ("o", &options)],
        )
        .await
    }

    async fn view_of_volume(&self, name: &str) -> EngineResult<Option<ViewPaths>> {
        let Some(volume) = self.volume(name).await? else {
            return Ok(None);
        };
        let options = &volume.options;
        let overlay = volume.driver == "local"
            && options.get("type").map(String::as_str) == Some("overlay")
            && options.get("device").map(String::as_str) == Some("overlay");
        Ok(overlay
            .then(|| options.get("o"))
            .flatten()
            .and_then(|o| ViewPaths::from_overlay_options(o)))
    }

    async fn volume_directory(&self, name: &str) -> EngineResult<Option<std::path::PathBuf>> {
        Ok(self
            .volume(name)
            .await?
            .map(|volume| volume.mountpoint.into())
            .filter(|path: &std::path::PathBuf| path.is_absolute()))
    }

    async fn create_bind_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        source: &std::path::Path,
    ) -> EngineResult<()> {
        let device = source
            .to_str()
            .filter(|s| source.is_absolute() && !s.contains([',', ':', '=', ' ']))
            .ok_or_else(|| EngineError::Docker {
                operation: format!("create volume {name}"),
                message: "the directory's path cannot be written as mount options".into(),
            })?;
        self.create_local_volume(
            name,
            labels,
            [("type", "none"), ("o", "bind"), ("device", device)],
        )
        .await
    }

    async fn list_volumes_with_label(&self, key: &str) -> EngineResult<Vec<ManagedVolume>> {
        self.volumes_matching(HashMap::from([(
            "label".to_string(),
            vec![key.to_string()],
        )]))
        .await
    }

    async fn create_container(&self, plan: &ContainerPlan) -> EngineResult<String> {
        let name = plan.docker_name();
        // Only runc brings up `lo` in the fresh network namespace of a container with networking
        // disabled; gVisor (run with `--network=host`) leaves it down, so such a sandbox keeps
        // Docker's network sandbox and Docker's own /etc/hosts.
        let runtime = plan.runtime.as_deref().or(self.default_runtime.as_deref());
        let loopback_hosts = match (&plan.helper_volume, &plan.network, runtime) {
            (Some(helper), None, Some("runc")) => {
                Some(helper::hosts_path(&self.docker, &self.helpers, helper).await?)
            }
            _ => None,
        };
        let body = plan::create_body(plan, loopback_hosts.as_deref())?;
        let options = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        match self.docker.create_container(Some(options), body).await {
            Ok(created) => Ok(created.id),
            Err(e) if is_status(&e, 409) => Err(EngineError::Conflict {
                what: format!("container {name}"),
            }),
            // 404 names the image, the network or a volume driver; only the image is likely.
            Err(e) if is_status(&e, 404) && !self.image_exists(&plan.image).await? => {
                Err(EngineError::ImageMissing(plan.image.clone()))
            }
            Err(e) => {
                let message = server_message(&e).unwrap_or_default().to_string();
                Err(match map_err("create", &format!("container {name}"))(e) {
                    EngineError::NotFound { what } => EngineError::NotFound {
                        what: format!("{what}: {message}"),
                    },
                    other => other,
                })
            }
        }
    }

    async fn start_container(&self, id: &str) -> EngineResult<()> {
        // 304 (already running) counts as success in bollard.
        match self.docker.start_container(id, None).await {
            Err(BollardError::DockerResponseServerError { message, .. })
                if message.contains("id already in use") =>
            {
                Err(EngineError::StaleRuntimeTask {
                    container: id.to_string(),
                })
            }
            other => other.map_err(map_err("start", &format!("container {id}"))),
        }
    }

    async fn remove_container(&self, id: &str) -> EngineResult<()> {
        let options = RemoveContainerOptions {
            force: true,
            ..Default::default()
        };
        self.thaw_before_removal(id);
        // A frozen cgroup's processes take no SIGKILL until thawed. A name that holds no
        // container (the usual case for a staging name) does not queue behind the removals of
        // others.
        match self.inspect_container(id).await {
            Ok(None) => return Ok(()),
            Ok(Some(details)) if details.paused => {
                if let Err(error) = self.thaw_or_unpause(id).await {
                    tracing::debug!(container = id, %error, "cannot thaw before removal");
                }
            }
            Ok(Some(details)) if self.killed_here.take(&details.id) && details.running => {
                self.await_recorded_exit(id).await;
            }
            Ok(Some(_)) => {}
            Err(error) => tracing::debug!(container = id, %error, "cannot inspect before removal"),
        }
        let removed = {
            let _one_at_a_time = self.removals.lock().await;
            self.docker.remove_container(id, Some(options)).await
        };
        match removed {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            // Someone else is removing it: done once that finishes (callers remove the volume
            // next, which Docker refuses while the container exists).
            Err(e) if server_message(&e).is_some_and(|m| m.contains("already in progress")) => {
                self.wait_gone(id).await
            }
            Err(e) => Err(map_err("remove", &format!("container {id}"))(e)),
        }
    }

    async fn inspect_container(&self, id: &str) -> EngineResult<Option<ContainerDetails>> {
        let inspected = match self.docker.inspect_container(id, None).await {
            Ok(i) => i,
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(map_err("inspect", &format!("container {id}"))(e)),
        };
        // A container frozen here (by this run or one before it) is paused, whatever Docker says.
        let frozen_here = freezer::of_inspected(&inspected)
            .is_some_and(|freezer| freezer.is_frozen().unwrap_or(false));
        let state = inspected.state.unwrap_or_default();
        let helper_main = inspected
            .config
            .as_ref()
            .and_then(|c| c.entrypoint.as_ref()?.first().cloned())
            .is_some_and(|main| main == format!("{HELPER_MOUNT}/{HELPER_BINARY}"));
        let workspace_source = inspected
            .mounts
            .unwrap_or_default()
            .into_iter()
            .find(|m| {
                m.destination.as_deref() == Some(plan::WORKSPACE)
                    && m.typ.as_deref() == Some("volume")
            })
            .and_then(|m| m.source)
            .filter(|s| !s.is_empty())
            .map(std::path::PathBuf::from);
        Ok(Some(ContainerDetails {
            id: inspected.id.unwrap_or_default(),
            name: inspected
                .name
                .as_deref()
                .map(|n| n.trim_start_matches('/').to_string())
                .unwrap_or_default(),
            state: match state.status {
                _ if frozen_here => "paused".to_string(),
                Some(status) => status.to_string(),
                None => String::new(),
            },
            running: state.running.unwrap_or(false),
            paused: state.paused.unwrap_or(false) || frozen_here,
            exit_code: state.exit_code,
            oom_killed: state.oom_killed.unwrap_or(false),
            finished_at: started_at(state.finished_at.as_deref()),
            helper_main,
            error: state.error.unwrap_or_default(),
            started_at: started_at(state.started_at.as_deref()),
            pid: state.pid.unwrap_or(0),
            runtime: inspected
                .host_config
                .and_then(|h| h.runtime)
                .filter(|r| !r.is_empty())
                .or_else(|| self.default_runtime.clone()),
            labels: to_btree(inspected.config.and_then(|c| c.labels)),
            workspace_source,
        }))
    }

    async fn update_limits(
        &self,
        id: &str,
        cpus: f64,
        memory_mb: u64,
        pids_limit: u64,
    ) -> EngineResult<()> {
        let what = format!("container {id}");
        let invalid = |message: String| EngineError::Docker {
            operation: format!("update {what}"),
            message,
        };
        let memory = plan::memory_bytes(memory_mb)
            .ok_or_else(|| invalid(format!("memory of {memory_mb} MiB is out of range")))?;
        let nano_cpus = plan::nano_cpus(cpus).ok_or_else(|| invalid(format!("cpus {cpus}")))?;
        let pids = i64::try_from(pids_limit)
            .map_err(|_| invalid(format!("pids limit {pids_limit} is out of range")))?;
        let body = ContainerUpdateBody {
            nano_cpus: Some(nano_cpus),
            memory: Some(memory),
            memory_swap: Some(memory),
            pids_limit: Some(pids),
            ..Default::default()
        };
        self.docker
            .update_container(id, body)
            .await
            .map_err(map_err("update", &what))
    }

    async fn pause(&self, id: &str) -> EngineResult<()> {
        self.freeze_or_pause(id).await
    }

    async fn unpause(&self, id: &str) -> EngineResult<()> {
        self.thaw_or_unpause(id).await
    }

    async fn rename_container(&self, id: &str, new_name: &str) -> EngineResult<()> {
        let options = bollard::query_parameters::RenameContainerOptions {
            name: new_name.to_string(),
        };
        match self.docker.rename_container(id, options).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 409) => Err(EngineError::Conflict {
                what: format!("container {new_name}"),
            }),
            Err(e) => Err(map_err("rename", &format!("container {id} to {new_name}"))(
                e,
            )),
        }
    }

    async fn kill_container(&self, id: &str) -> EngineResult<()> {
        // A frozen container takes no signal: Docker refuses to kill a paused one (409), and a
        // cgroup frozen here, by this run or one before it, would hold the SIGKILL pending.
        self.thaw_before_removal(id);
        if self.kill_locally(id).await {
            return Ok(());
        }
        self.thaw_if_paused(id).await?;
        // Docker answers a SIGKILL only once the container has stopped.
        let options = bollard::query_parameters::KillContainerOptions {
            signal: "SIGKILL".into(),
        };
        match self.docker.kill_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            // Missing, or not running (Docker's 409): nothing runs.
            Err(e) if is_status(&e, 404) || is_status(&e, 409) => Ok(()),
            Err(e) => Err(map_err("kill", &format!("container {id}"))(e)),
        }
    }

    async fn pull_image(
        &self,
        image: &str,
        auth_file: Option<&std::path::Path>,
        progress: PullProgress,
    ) -> EngineResult<()> {
        self.pull(image, auth_file, progress).await
    }

    async fn stop_container(&self, id: &str, grace: std::time::Duration) -> EngineResult<()> {
        self.thaw_before_removal(id);
        self.thaw_if_paused(id).await?;
        let options = bollard::query_parameters::StopContainerOptions {
            t: Some(i32::try_from(grace.as_secs()).unwrap_or(i32::MAX)),
            signal: None,
        };
        // 304 (already stopped) counts as success in bollard.
        match self.docker.stop_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(e) if is_status(&e, 404) => Ok(()),
            Err(e) => Err(map_err("stop", &format!("container {id}"))(e)),
        }
    }

    async fn ensure_network(&self, name: &str, kind: NetworkKind) -> EngineResult<NetworkInfo> {
        let what = format!("network {name}");
        let internal = kind == NetworkKind::Internal;
        let _one_creator = self.networks.lock().await;
        for attempt in 0..2 {
            match self
                .docker
                .inspect_network(name, None::<InspectNetworkOptions>)
                .await
            {
                Ok(network) => {
                    if internal && network.internal != Some(true) {
                        return Err(EngineError::Docker {
                            operation: format!("use of {what}"),
                            message:
                                "it exists but is not internal (it has a route out of the \
                                      host); remove it or choose another AGENT_SANDBOX_NETWORK_NAME"
                                    .into(),
                        });
                    }
                    let gateway = network
                        .ipam
                        .and_then(|ipam| ipam.config)
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(|config| config.gateway?.parse().ok())
                        .find(std::net::IpAddr::is_ipv4);
                    // Docker names a bridge's interface after the network's ID unless an
                    // option names it.
                    let bridge = network
                        .options
                        .and_then(|o| o.get("com.docker.network.bridge.name").cloned())
                        .or_else(|| {
                            let id = network.id?;
                            Some(format!("br-{}", id.get(..12)?))
                        });
                    return Ok(NetworkInfo { gateway, bridge });
                }
                Err(e) if is_status(&e, 404) && attempt == 0 => {}
                Err(e) => return Err(map_err("inspect", &what)(e)),
            }
            create_network(&self.docker, name, internal).await?;
        }
        Err(EngineError::NotFound { what })
    }

    async fn image_exists(&self, image: &str) -> EngineResult<bool> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(true),
            Err(e) if is_status(&e, 404) => Ok(false),
            Err(e) => Err(map_err("inspect", &format!("image {image}"))(e)),
        }
    }

    async fn commit_rootfs(
        &self,
        container: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
        pause: bool,
    ) -> EngineResult<CommittedRootfs> {
        self.commit(container, reference, labels, pause).await
    }

    async fn list_images_with_label(&self, key: &str) -> EngineResult<Vec<LabeledImage>> {
        self.images_with_label(key).await
    }

    async fn remove_image(&self, reference: &str) -> EngineResult<()> {
        self.delete_image(reference).await
    }

    async fn export_top_layer(
        &self,
        reference: &str,
        digest: &str,
        out: std::fs::File,
    ) -> EngineResult<(u64, std::fs::File)> {
        BollardEngine::export_top_layer(self, reference, digest, out).await
    }

    async fn load_rootfs(
        &self,
        base: &str,
        layer: std::fs::File,
        size: u64,
        digest: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<String> {
        BollardEngine::load_rootfs(self, base, layer, size, digest, reference, labels).await
    }

    fn events(&self) -> BoxStream<'static, EngineResult<EngineEvent>> {
        events::stream(&self.docker)
    }

    async fn exec(&self, container: &str, plan: &ExecPlan) -> EngineResult<ExecSession> {
        dataplane::exec(&self.docker, container, plan).await
    }

    async fn inspect_exec(&self, exec_id: &str) -> EngineResult<ExecState> {
        dataplane::inspect_exec(&self.docker, exec_id).await
    }

    async fn archive_get(
        &self,
        container: &str,
        path: &str,
    ) -> EngineResult<BoxStream<'static, EngineResult<Bytes>>> {
        dataplane::archive_get(&self.docker, container, path).await
    }

    async fn archive_put(
        &self,
        container: &str,
        path: &str,
        tar: BoxStream<'static, Bytes>,
    ) -> EngineResult<()> {
        dataplane::archive_put(&self.docker, container, path, tar).await
    }

    async fn ensure_helper_volume(&self, volume: &str, binary: &[u8]) -> EngineResult<()> {
        helper::ensure(&self.docker, &self.helpers, volume, binary).await
    }

    async fn prepare_workspace(&self, container: &str, uid: u32, gid: u32) -> EngineResult<()> {
        dataplane::prepare_workspace(&self.docker, container, uid, gid).await
    }
}

/// Creates a labeled sandbox bridge with inter-container traffic disabled; `internal` ones have
/// no route out of the host. An existing one (a concurrent creator won) is no error.
async fn create_network(docker: &bollard::Docker, name: &str, internal: bool) -> EngineResult<()> {
    let request = NetworkCreateRequest {
        name: name.to_string(),
        driver: Some("bridge".into()),
        internal: Some(internal),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_string(),
            "false".to_string(),
        )])),
        labels: Some(HashMap::from([(
            LABEL_MANAGED.to_string(),
            "true".to_string(),
        )])),
        ..Default::default()
    };
    match docker.create_network(request).await {
        Ok(_) => Ok(()),
        Err(e) if is_status(&e, 409) => Ok(()),
        Err(e) => Err(map_err("create", &format!("network {name}"))(e)),
    }
}
