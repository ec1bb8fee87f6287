//! What `agent-sandbox doctor` (and `serve` at start) asks the daemon about itself: its release,
//! the API version agreed on, the runtimes it has registered, and whether a runtime really starts
//! a hardened container. Read-only except for the one short-lived, labeled container that
//! [`BollardEngine::try_runtime`] starts and removes (and such containers that a killed process
//! left behind).

use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use futures::StreamExt;

use super::helper::FILLER_IMAGE;
use super::plan::volume_mount;
use super::{map_err, BollardEngine};
use crate::docker::{
    EngineError, EngineResult, HELPER_BINARY, HELPER_MOUNT, LABEL_MANAGED, LABEL_ROLE,
};

/// [`LABEL_ROLE`] of the container that tries a runtime.
pub const ROLE_RUNTIME_CHECK: &str = "runtime-check";
/// How long a runtime may take to run the helper's `--version`.
const TRY_TIMEOUT: Duration = Duration::from_secs(60);
/// A runtime-check container older than this was left by a process that died mid-check.
const STALE_AFTER: Duration = Duration::from_secs(120);

/// The daemon, as it describes itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonReport {
    /// Docker's release, e.g. `20.10.24+dfsg1`.
    pub server_version: String,
    /// The API version this client and the daemon agreed on, e.g. `1.41`.
    pub api_version: String,
    /// Runtimes registered with the daemon, sorted.
    pub runtimes: Vec<String>,
    /// The `runtimeArgs` each registered runtime was given (none for most).
    pub runtime_args: std::collections::BTreeMap<String, Vec<String>>,
    /// The runtime used when a container names none.
    pub default_runtime: String,
    /// Where the daemon keeps its data (volumes live below it).
    pub root_dir: String,
    /// Where this client reaches the daemon (`DOCKER_HOST`, or the local socket).
    pub endpoint: String,
}

impl BollardEngine {
    /// Asks the daemon for its release, runtimes and data root.
    pub async fn daemon_report(&self) -> EngineResult<DaemonReport> {
        let info = self
            .docker
            .info()
            .await
            .map_err(|e| EngineError::Unreachable(e.to_string()))?;
        let version = self.docker.client_version();
        let registered = info.runtimes.unwrap_or_default();
        let runtime_args = registered
            .iter()
            .map(|(name, r)| (name.clone(), r.runtime_args.clone().unwrap_or_default()))
            .collect();
        let mut runtimes: Vec<String> = registered.into_keys().collect();
        runtimes.sort();
        Ok(DaemonReport {
            server_version: info.server_version.unwrap_or_default(),
            api_version: format!("{}.{}", version.major_version, version.minor_version),
            runtimes,
            runtime_args,
            default_runtime: info.default_runtime.unwrap_or_else(|| "runc".into()),
            root_dir: info.docker_root_dir.unwrap_or_default(),
            endpoint: std::env::var("DOCKER_HOST")
                .unwrap_or_else(|_| "unix:///var/run/docker.sock".into()),
        })
    }

    /// Runs the in-sandbox helper's `--version` in a container of runtime `runtime` (`""` for
    /// the daemon's default), hardened like a sandbox (sandbox user, no capabilities, no
    /// network, read-only root), from the server's own empty image and the helper volume
    /// `helper_volume` (filled first with [`crate::docker::Engine::ensure_helper_volume`]).
    /// Answers how long the container took from create to exit; removes it in every case.
    pub async fn try_runtime(
        &self,
        runtime: &str,
        helper_volume: &str,
        user: &str,
    ) -> EngineResult<Duration> {
        self.remove_stale_checks().await;
        let started = Instant::now();
        let name = format!(
            "agent-sandbox-runtime-check-{}",
            hex::encode(rand::random::<[u8; 6]>())
        );
        let body = ContainerCreateBody {
            image: Some(FILLER_IMAGE.into()),
            cmd: Some(vec![
                format!("{HELPER_MOUNT}/{HELPER_BINARY}"),
                "--version".into(),
            ]),
            user: Some(user.into()),
            network_disabled: Some(true),
            labels: Some(
                [
                    (LABEL_MANAGED.to_string(), "true".to_string()),
                    (LABEL_ROLE.to_string(), ROLE_RUNTIME_CHECK.to_string()),
                ]
                .into(),
            ),
            host_config: Some(HostConfig {
                runtime: (!runtime.is_empty()).then(|| runtime.to_string()),
                network_mode: Some("none".into()),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                readonly_rootfs: Some(true),
                mounts: Some(vec![volume_mount(helper_volume, HELPER_MOUNT, true)]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let options = CreateContainerOptions {
            name: Some(name.clone()),
            ..Default::default()
        };
        self.docker
            .create_container(Some(options), body)
            .await
            .map_err(map_err("create runtime check", &name))?;
        let outcome = tokio::time::timeout(TRY_TIMEOUT, self.run_to_exit(&name)).await;
        let _ = self
            .docker
            .remove_container(
                &name,
                Some(RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                }),
            )
            .await;
        match outcome {
            Ok(Ok(())) => Ok(started.elapsed()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(EngineError::Docker {
                operation: format!("run a container with runtime {runtime:?}"),
                message: format!("it did not exit within {TRY_TIMEOUT:?}"),
            }),
        }
    }

    /// Removes runtime-check containers that a killed process left behind (best effort: a
    /// failure here must not fail the check).
    async fn remove_stale_checks(&self) {
        let options = ListContainersOptions {
            all: true,
            filters: Some(
                [(
                    "label".to_string(),
                    vec![format!("{LABEL_ROLE}={ROLE_RUNTIME_CHECK}")],
                )]
                .into(),
            ),
            ..Default::default()
        };
        let Ok(found) = self.docker.list_containers(Some(options)).await else {
            return;
        };
        let now = chrono::Utc::now().timestamp();
        let stale = found.into_iter().filter(|c| {
            c.created
                .is_some_and(|created| now - created > STALE_AFTER.as_secs() as i64)
        });
        for container in stale {
            if let Some(id) = container.id {
                let options = RemoveContainerOptions {
                    force: true,
                    ..Default::default()
                };
                let _ = self.docker.remove_container(&id, Some(options)).await;
            }
        }
    }

    async fn run_to_exit(&self, name: &str) -> EngineResult<()> {
        self.docker
            .start_container(name, None)
            .await
            .map_err(map_err("start runtime check", name))?;
        let mut wait = self.docker.wait_container(name, None);
        match wait.next().await {
            Some(Ok(response)) if response.status_code == 0 => Ok(()),
            Some(Ok(response)) => Err(exited(name, response.status_code)),
            Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => {
                Err(exited(name, code))
            }
            Some(Err(e)) => Err(map_err("wait for runtime check", name)(e)),
            None => Err(exited(name, -1)),
        }
    }
}

fn exited(name: &str, code: i64) -> EngineError {
    EngineError::Docker {
        operation: format!("run {name}"),
        message: format!("the helper's --version exited with {code}"),
    }
}
