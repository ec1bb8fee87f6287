//! Filling the helper volume without any user image and without a registry.
//!
//! Docker can only write into a volume through a container that mounts it, so this imports a
//! tiny image from an empty root filesystem (`POST /images/create?fromSrc=-`), creates — never
//! starts — a container from it with the volume mounted, writes the binary and the loopback hosts
//! file through the archive API, and removes the container. The last entry written is a marker
//! file holding the SHA-256 of that content; a volume whose marker matches is left alone, and a
//! process that has already checked a volume only confirms that the volume still exists.
//!
//! Callers in one process are serialized by a lock; separate processes (several servers on one
//! daemon) by the filler container's fixed name, `agent-sandbox-fill-<volume>`: whoever creates
//! it fills, the others wait for it to go away and then find the marker. Rewriting a binary that
//! sandboxes are starting from would let them see a half-written file, so this matters. A filler
//! left behind by a crash is removed by the next caller: at once when its label names a process
//! of this machine's current boot that no longer runs, else once it is older than [`STALE_AFTER`].
//!
//! When the daemon runs on this host, a marker readable under the volume's mountpoint is trusted
//! without a filler at all: each new server process then costs no container to start its first
//! sandbox, and a filler orphaned by a killed server is not in its way.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, DownloadFromContainerOptions,
    RemoveContainerOptions, UploadToContainerOptions,
};
use futures::StreamExt;
use tokio::sync::Mutex;

use super::{is_status, map_err, plan::volume_mount, tarball};
use crate::docker::{
    helper_content_digest, EngineError, EngineResult, HELPER_BINARY, HELPER_HOSTS, HELPER_MOUNT,
    LABEL_MANAGED, LABEL_ROLE, LOOPBACK_HOSTS, ROLE_HELPER,
};

/// Image used only to create the never-started containers that reach into volumes.
pub const FILLER_IMAGE: &str = "agent-sandbox/volume-filler:1";
/// [`LABEL_ROLE`] of those containers, so leftovers of a crash are recognisable.
pub const ROLE_FILLER: &str = "volume-filler";
/// A filler container older than this belongs to a caller that died.
pub const STALE_AFTER: Duration = Duration::from_secs(60);
/// How long a caller waits for another process's filler before giving up: longer than
/// [`STALE_AFTER`], so a filler whose owner died on another host is always outlived.
const WAIT_FOR_OTHERS: Duration = Duration::from_secs(75);
/// Label on a filler container naming its owner, `<boot id>/<pid namespace>:<pid>`.
const LABEL_FILLER_OWNER: &str = "io.agent-sandbox.filler-owner";
/// Marker file next to the binary: the hex SHA-256 of the binary it completes.
const MARKER: &str = ".agent-sandbox-helper.sha256";
/// Label on the helper volume recording the digest it was created for (informational: a later
/// binary replaces the content, labels cannot change).
const LABEL_HELPER_DIGEST: &str = "io.agent-sandbox.helper-sha256";

/// What this process knows of helper volumes.
#[derive(Default)]
pub struct HelperCache {
    /// Volumes seen holding a given content digest.
    checked: Mutex<HashMap<String, String>>,
    /// Where the daemon keeps each volume's files (`Mountpoint`), for the hosts-file bind.
    mountpoints: std::sync::Mutex<HashMap<String, String>>,
}

impl HelperCache {
    fn remember_mountpoint(&self, volume: &str, mountpoint: &str) {
        if !mountpoint.is_empty() {
            let mut known = self.mountpoints.lock().unwrap_or_else(|e| e.into_inner());
            known.insert(volume.to_string(), mountpoint.to_string());
        }
    }
}

/// The daemon-side path of the hosts file in `volume` (a helper volume).
pub async fn hosts_path(
    docker: &bollard::Docker,
    cache: &HelperCache,
    volume: &str,
) -> EngineResult<String> {
    let known = {
        let known = cache.mountpoints.lock().unwrap_or_else(|e| e.into_inner());
        known.get(volume).cloned()
    };
    let mountpoint = match known {
        Some(mountpoint) => mountpoint,
        None => {
            let inspected = docker.inspect_volume(volume).await.map_err(map_err(
                "inspect helper volume",
                &format!("volume {volume}"),
            ))?;
            cache.remember_mountpoint(volume, &inspected.mountpoint);
            inspected.mountpoint
        }
    };
    if mountpoint.is_empty() {
        return Err(EngineError::Docker {
            operation: format!("inspect helper volume {volume}"),
            message: "Docker reports no mountpoint".into(),
        });
    }
    Ok(format!(
        "{}/{HELPER_HOSTS}",
        mountpoint.trim_end_matches('/')
    ))
}

pub async fn ensure(
    docker: &bollard::Docker,
    cache: &HelperCache,
    volume: &str,
    binary: &[u8],
) -> EngineResult<()> {
    let digest = helper_content_digest(binary);
    let mut checked = cache.checked.lock().await;
    let what = format!("volume {volume}");

    match docker.inspect_volume(volume).await {
        Ok(existing) => {
            if existing.labels.get(LABEL_ROLE).map(String::as_str) != Some(ROLE_HELPER) {
                return Err(EngineError::Conflict {
                    what: format!("{what} (not a helper volume)"),
                });
            }
            cache.remember_mountpoint(volume, &existing.mountpoint);
            if checked.get(volume) == Some(&digest) {
                return Ok(());
            }
            if host_marker(&existing.mountpoint).as_deref() == Some(digest.as_str()) {
                checked.insert(volume.to_string(), digest);
                return Ok(());
            }
        }
        Err(e) if is_status(&e, 404) => {
            let labels = HashMap::from([
                (LABEL_MANAGED.to_string(), "true".to_string()),
                (LABEL_ROLE.to_string(), ROLE_HELPER.to_string()),
                (LABEL_HELPER_DIGEST.to_string(), digest.clone()),
            ]);
            let request = VolumeCreateRequest {
                name: Some(volume.to_string()),
                labels: Some(labels),
                ..Default::default()
            };
            let created = docker
                .create_volume(request)
                .await
                .map_err(map_err("create helper volume", &what))?;
            cache.remember_mountpoint(volume, &created.mountpoint);
        }
        Err(e) => return Err(map_err("inspect helper volume", &what)(e)),
    }

    ensure_filler_image(docker).await?;
    let container = acquire_filler(docker, volume).await?;
    let filled = fill(docker, &container, binary, &digest).await;
    let removed = docker
        .remove_container(
            &container,
            Some(RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await;
    filled?;
    if let Err(e) = removed {
        tracing::warn!(container = %container, error = %e, "could not remove volume filler");
    }
    checked.insert(volume.to_string(), digest);
    Ok(())
}

async fn ensure_filler_image(docker: &bollard::Docker) -> EngineResult<()> {
    match docker.inspect_image(FILLER_IMAGE).await {
        Ok(_) => return Ok(()),
        Err(e) if is_status(&e, 404) => {}
        Err(e) => return Err(map_err("inspect image", FILLER_IMAGE)(e)),
    }
    let rootfs = tarball::empty_rootfs().map_err(|e| EngineError::Docker {
        operation: "build filler image".into(),
        message: e.to_string(),
    })?;
    let (repo, tag) = FILLER_IMAGE
        .rsplit_once(':')
        .unwrap_or((FILLER_IMAGE, "latest"));
    let options = CreateImageOptions {
        from_src: Some("-".into()),
        repo: Some(repo.into()),
        tag: Some(tag.into()),
        changes: vec![format!(
            "LABEL {LABEL_MANAGED}=true {LABEL_ROLE}={ROLE_FILLER}"
        )],
        ..Default::default()
    };
    let mut progress =
        docker.create_image(Some(options), Some(bollard::body_full(rootfs.into())), None);
    while let Some(item) = progress.next().await {
        item.map_err(map_err("import image", FILLER_IMAGE))?;
    }
    Ok(())
}

/// Creates this volume's filler container, waiting while another process holds it.
async fn acquire_filler(docker: &bollard::Docker, volume: &str) -> EngineResult<String> {
    let name = format!("agent-sandbox-fill-{volume}");
    let deadline = Instant::now() + WAIT_FOR_OTHERS;
    loop {
        match create_filler(docker, volume, &name).await {
            Ok(()) => return Ok(name),
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(map_err("create volume filler", &name)(e)),
        }
        let inspected = match docker.inspect_container(&name, None).await {
            Ok(inspected) => inspected,
            Err(e) if is_status(&e, 404) => continue,
            Err(e) => return Err(map_err("inspect volume filler", &name)(e)),
        };
        let owner = inspected
            .config
            .as_ref()
            .and_then(|config| config.labels.as_ref())
            .and_then(|labels| labels.get(LABEL_FILLER_OWNER))
            .cloned();
        let age = inspected
            .created
            .map(|c| c.to_string())
            .and_then(|c| chrono::DateTime::parse_from_rfc3339(&c).ok())
            .map(|c| chrono::Utc::now().signed_duration_since(c))
            .and_then(|age| age.to_std().ok())
            .unwrap_or_default();
        if age > STALE_AFTER || owner.as_deref().is_some_and(owner_is_gone) {
            let options = RemoveContainerOptions {
                force: true,
                ..Default::default()
            };
            match docker.remove_container(&name, Some(options)).await {
                Ok(()) => continue,
                Err(e) if is_status(&e, 404) || is_status(&e, 409) => continue,
                Err(e) => return Err(map_err("remove stale volume filler", &name)(e)),
            }
        }
        if Instant::now() > deadline {
            return Err(EngineError::Conflict {
                what: format!("container {name} (another process is filling {volume})"),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_filler(
    docker: &bollard::Docker,
    volume: &str,
    name: &str,
) -> Result<(), bollard::errors::Error> {
    let body = ContainerCreateBody {
        image: Some(FILLER_IMAGE.into()),
        // Never started; Docker only wants some command to accept the create.
        cmd: Some(vec!["/nonexistent".into()]),
        labels: Some(HashMap::from([
            (LABEL_MANAGED.to_string(), "true".to_string()),
            (LABEL_ROLE.to_string(), ROLE_FILLER.to_string()),
            (LABEL_FILLER_OWNER.to_string(), this_owner()),
        ])),
        host_config: Some(HostConfig {
            network_mode: Some("none".into()),
            mounts: Some(vec![volume_mount(volume, HELPER_MOUNT, false)]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let options = CreateContainerOptions {
        name: Some(name.to_string()),
        ..Default::default()
    };
    docker
        .create_container(Some(options), body)
        .await
        .map(|_| ())
}

async fn fill(
    docker: &bollard::Docker,
    container: &str,
    binary: &[u8],
    digest: &str,
) -> EngineResult<()> {
    if marker(docker, container).await?.as_deref() == Some(digest) {
        return Ok(());
    }
    let tar = tarball::root_files(&[
        (HELPER_BINARY, 0o555, binary),
        (HELPER_HOSTS, 0o444, LOOPBACK_HOSTS.as_bytes()),
        (MARKER, 0o444, digest.as_bytes()),
    ])
    .map_err(|e| EngineError::Docker {
        operation: "pack helper binary".into(),
        message: e.to_string(),
    })?;
    let options = UploadToContainerOptions {
        path: HELPER_MOUNT.into(),
        ..Default::default()
    };
    docker
        .upload_to_container(container, Some(options), bollard::body_full(tar.into()))
        .await
        .map_err(map_err("write helper binary", container))
}

/// The digest the marker under a volume's daemon-side `mountpoint` names, when this host can read
/// it (a local daemon); `None` sends the caller through a filler.
fn host_marker(mountpoint: &str) -> Option<String> {
    if mountpoint.is_empty() {
        return None;
    }
    let path = std::path::Path::new(mountpoint).join(MARKER);
    let content = std::fs::read(path).ok()?;
    (content.len() <= 128).then(|| String::from_utf8_lossy(&content).trim().to_string())
}

/// Where this process's IDs mean something: this machine's boot and this PID namespace, so a
/// process ID is only compared with the same numbering.
fn pid_scope() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let namespace = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let boot = boot.trim();
    (!boot.is_empty()).then(|| format!("{boot}/{}", namespace.display()))
}

/// The owner label of a filler this process creates: `<scope>:<pid>`.
fn this_owner() -> String {
    format!("{}:{}", pid_scope().unwrap_or_default(), std::process::id())
}

/// Whether a filler's owner label names a process of this scope that no longer runs. An owner
/// elsewhere (another machine, boot or PID namespace), or a label that cannot be read, is never
/// judged gone: only the filler's age retires it.
fn owner_is_gone(owner: &str) -> bool {
    let Some((scope, pid)) = owner.rsplit_once(':') else {
        return false;
    };
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    match pid_scope() {
        Some(ours) if !scope.is_empty() && ours == scope => {
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
        }
        _ => false,
    }
}

/// The digest the volume's marker names, if it has one.
async fn marker(docker: &bollard::Docker, container: &str) -> EngineResult<Option<String>> {
    const LIMIT: usize = 64 * 1024;
    let options = DownloadFromContainerOptions {
        path: format!("{HELPER_MOUNT}/{MARKER}"),
    };
    let mut stream = docker.download_from_container(container, Some(options));
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(bytes) if tar.len() + bytes.len() <= LIMIT => tar.extend_from_slice(&bytes),
            // A marker this large is not ours; rewriting replaces it.
            Ok(_) => return Ok(None),
            Err(e) if is_status(&e, 404) => return Ok(None),
            Err(e) => return Err(map_err("read helper marker", container)(e)),
        }
    }
    let content = tarball::read_file(&tar, MARKER, 128).map_err(|e| EngineError::Docker {
        operation: "read helper marker".into(),
        message: e.to_string(),
    })?;
    Ok(content.map(|c| String::from_utf8_lossy(&c).trim().to_string()))
}
