//! The only module that talks to Docker. [`Engine`] is what the rest of the crate sees: labeled
//! volumes and hardened containers for the controller, exec and archive streams for the data plane.
//! [`BollardEngine`] implements it against the daemon; [`ObservedEngine`] wraps any engine and
//! times its calls for a [`CallObserver`] (the server's metrics); `fake::FakeEngine` implements it
//! in memory for tests, and exists only in test builds (`cfg(test)` or the `test-support` feature, which
//! the crate's own integration tests enable).
//!
//! Docker's own words (its error messages) are read only here: callers match [`EngineError`]
//! variants, and ask [`Engine::capabilities`] instead of assuming what Docker can do.
//!
//! Hardening is not negotiable here: [`ContainerPlan`] has no field that could weaken it (no
//! privileged, capabilities, devices, binds or root user); every container this module creates gets
//! the full security model of `SECURITY.md`.

mod bollard_engine;
#[cfg(any(test, feature = "test-support"))]
pub mod fake;
mod observed;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use tokio::io::AsyncWrite;

pub use bollard_engine::{gvisor_pids_limit, BollardEngine, DaemonReport, RUNSC_PIDS_HEADROOM};
pub use observed::{CallObserver, ObservedEngine};

/// Label on every container and volume this server manages.
pub const LABEL_MANAGED: &str = "io.agent-sandbox.managed";
/// Label naming the resource (sandbox name) a container or volume belongs to.
pub const LABEL_ID: &str = "io.agent-sandbox.id";
/// Label with the `metadata.uid` of that resource, so a re-created resource of the same name does
/// not adopt its predecessor's objects.
pub const LABEL_UID: &str = "io.agent-sandbox.uid";
/// Label with the hash of the container-shaping part of the spec the container was built from.
pub const LABEL_SPEC_HASH: &str = "io.agent-sandbox.spec-hash";
/// Label naming the server instance (its data directory's identity) that owns an object. Garbage
/// collection only ever touches objects carrying its own value, so several servers — or test
/// servers running side by side — can share one daemon.
pub const LABEL_SERVER: &str = "io.agent-sandbox.server";
/// Label on a copy-on-write workspace volume naming the snapshot tree it is a view of (a key of
/// the store's trees): the tree stays while any volume names it.
pub const LABEL_TREE: &str = "io.agent-sandbox.tree";
/// Label on the image of a `Full` snapshot's root filesystem, naming the snapshot's uid.
pub const LABEL_SNAPSHOT: &str = "io.agent-sandbox.snapshot";
/// Repository of the images of Full snapshots (taken or imported); the tag is the snapshot's
/// `metadata.uid`.
pub const SNAPSHOT_REPOSITORY: &str = "agent-sandbox-snapshot";
/// Label on shared, server-owned objects that belong to no sandbox (the helper volume).
pub const LABEL_ROLE: &str = "io.agent-sandbox.role";

/// Whether Docker runtime `runtime` is gVisor: `runsc`, or a variant registered beside it under a
/// `runsc-` name (another release or platform, e.g. `runsc-kvm`). gVisor sandboxes get the pids
/// headroom and `RLIMIT_NPROC` of the create body and cannot change limits while running.
pub fn is_gvisor(runtime: &str) -> bool {
    runtime == "runsc" || runtime.starts_with("runsc-")
}

/// Whether mount table `table` (`/proc/self/mountinfo`) shows something mounted at the directory
/// Docker's `local` driver keeps volume `volume`'s files in (`…/volumes/<volume>/_data`).
pub fn volume_directory_mounted(table: &str, volume: &str) -> bool {
    let suffix = format!("/volumes/{volume}/_data");
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|at| at.ends_with(&suffix))
}

/// Docker's name for a sandbox's container.
pub fn container_name(sandbox: &str) -> String {
    format!("agent-sandbox-{sandbox}")
}

/// Docker's name for a sandbox's workspace volume.
pub fn volume_name(sandbox: &str) -> String {
    format!("agent-sandbox-{sandbox}-workspace")
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("docker is unreachable: {0}")]
    Unreachable(String),
    #[error("{what} not found")]
    NotFound { what: String },
    #[error("{what} already exists")]
    Conflict { what: String },
    #[error(
        "image {0} is not present on the docker host, and no image is pulled: load it there \
         (`docker pull {0}` where a registry is reachable, or `docker load`), or use another \
         (AGENT_SANDBOX_DEFAULT_IMAGE sets the default; `scripts/build-test-images.sh` in the \
         source tree builds a small offline one); `agent-sandbox doctor` checks this"
    )]
    ImageMissing(String),
    #[error("docker refused {operation}: {message}")]
    Docker { operation: String, message: String },
    /// A pull the registry (or the daemon on its behalf) refused; `message` is theirs.
    #[error(
        "image {image} is not present on the docker host and pulling it failed: {message}; load \
         it there (`docker load`, or a pull from a reachable registry), or use another \
         (AGENT_SANDBOX_DEFAULT_IMAGE sets the default; `scripts/build-test-images.sh` in the \
         source tree builds a small offline one); `agent-sandbox doctor` checks this"
    )]
    PullFailed { image: String, message: String },
    /// The container exists but is not running (stopped, or paused), so it cannot take an exec.
    /// Told apart from [`EngineError::Docker`] here, where Docker's words are known, so that no
    /// caller has to read them.
    #[error("docker refused {operation}: {message}")]
    NotRunning { operation: String, message: String },
    /// The engine cannot do this at all (see [`EngineCapabilities`]).
    #[error("{operation} is not supported by this engine")]
    Unsupported { operation: String },
    /// The container cannot start again: its runtime still holds the task of it from before the
    /// Docker daemon restarted (gVisor's does when the restart found the container paused), so
    /// every start is refused with "id already in use". Only a new container gets past it.
    #[error(
        "docker refused start container {container}: the runtime kept its task across a daemon \
         restart (id already in use); the container is replaced"
    )]
    StaleRuntimeTask { container: String },
}

impl EngineError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, EngineError::NotFound { .. })
    }
}

/// The directories of a copy-on-write view on the daemon's host (see
/// [`Engine::create_view_volume`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewPaths {
    /// The read-only trees, top first (a snapshot's delta above the trees it changed).
    pub lower: Vec<std::path::PathBuf>,
    pub upper: std::path::PathBuf,
    pub work: std::path::PathBuf,
}

impl ViewPaths {
    /// The overlay mount options; `None` when a path cannot be written into them (a comma, colon
    /// or backslash would be read as a separator, and a relative path is not the host's), or
    /// there is no lower directory.
    pub fn overlay_options(&self) -> Option<String> {
        let text = |path: &std::path::Path| {
            let text = path.to_str()?;
            let plain =
                path.is_absolute() && !text.contains([',', ':', '\\', '=', ' ', '\t', '\n']);
            plain.then(|| text.to_string())
        };
        if self.lower.is_empty() {
            return None;
        }
        let lower: Vec<String> = self.lower.iter().map(|p| text(p)).collect::<Option<_>>()?;
        // index=on: hard links of the tree stay links when one of them is written.
        Some(format!(
            "lowerdir={},upperdir={},workdir={},index=on",
            lower.join(":"),
            text(&self.upper)?,
            text(&self.work)?
        ))
    }

    /// The view that overlay mount options `options` (as [`ViewPaths::overlay_options`] writes
    /// them) describe; `None` when they lack a lower, upper or work directory.
    pub fn from_overlay_options(options: &str) -> Option<ViewPaths> {
        let option = |name: &str| {
            options
                .split(',')
                .find_map(|o| o.strip_prefix(name)?.strip_prefix('='))
                .filter(|value| !value.is_empty())
        };
        Some(ViewPaths {
            lower: option("lowerdir")?
                .split(':')
                .map(std::path::PathBuf::from)
                .collect(),
            upper: option("upperdir")?.into(),
            work: option("workdir")?.into(),
        })
    }
}

/// What an engine can do beyond creating, starting, removing and running commands in
/// containers. The controller asks instead of assuming Docker; an engine without one of these
/// still implements the method and answers [`EngineError::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineCapabilities {
    /// Freeze and thaw a running container ([`Engine::pause`], [`Engine::unpause`]): snapshots
    /// of a running sandbox freeze it while its workspace is read.
    pub pause: bool,
    /// Rename a container in place ([`Engine::rename_container`]): how a warm-pool member is
    /// handed to its sandbox and how a replacement container is swapped in.
    pub rename: bool,
    /// Change the limits of a live container ([`Engine::update_limits`]); without it a change of
    /// limits replaces the container. Even where it is offered a runtime may refuse (runsc), and
    /// the controller replaces the container then too.
    pub live_limits: bool,
    /// A container's workspace may be reachable as a directory of this host
    /// ([`ContainerDetails::workspace_source`]); the server's `host_workspace_access` setting
    /// must allow it too, and every use checks that the directory is the container's.
    pub host_workspace_access: bool,
}

impl EngineCapabilities {
    /// Everything: what the Docker engine offers.
    pub const ALL: EngineCapabilities = EngineCapabilities {
        pause: true,
        rename: true,
        live_limits: true,
        host_workspace_access: true,
    };
}

pub type EngineResult<T> = Result<T, EngineError>;

/// What a sandbox network leads to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NetworkKind {
    /// A bridge with a route out of the host.
    Open,
    /// A bridge created `--internal`: no route out; only the host's address on it is reachable.
    Internal,
}

/// A sandbox network as the host sees it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkInfo {
    /// The host's own address on it (its gateway), when Docker reports one.
    pub gateway: Option<IpAddr>,
    /// The host's interface of the bridge (`br-…`, or the name its options give it).
    pub bridge: Option<String>,
}

/// Everything that shapes one sandbox container. Limits can later change in place
/// ([`Engine::update_limits`]); the rest needs a new container.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerPlan {
    /// Sandbox name; the container is [`container_name`] of it unless `name` says otherwise.
    pub sandbox: String,
    /// Docker name of the container when it is not [`container_name`] of the sandbox: one built
    /// under a staging name while the sandbox's current container still serves.
    pub name: Option<String>,
    /// `metadata.uid` of the sandbox resource.
    pub uid: String,
    /// Value of [`LABEL_SERVER`]: the identity of the server that owns the container.
    pub server: String,
    pub image: String,
    pub cpus: f64,
    pub memory_mb: u64,
    pub pids_limit: u64,
    /// The dedicated bridge to join, or `None` for loopback only.
    pub network: Option<String>,
    pub read_only_rootfs: bool,
    pub env: BTreeMap<String, String>,
    /// Name servers the container uses instead of Docker's (the egress gateway's), if any.
    pub dns: Vec<IpAddr>,
    pub tmp_size_mb: u64,
    /// `uid:gid`, never root (settings validation guarantees it).
    pub user: String,
    /// Docker runtime, e.g. `runsc`; `None` for the daemon default.
    pub runtime: Option<String>,
    /// Value of [`LABEL_SPEC_HASH`].
    pub spec_hash: String,
    /// The read-only volume holding the in-sandbox helper, mounted at [`HELPER_MOUNT`].
    pub helper_volume: Option<String>,
    /// The volume mounted at `/workspace`; normally [`volume_name`] of the sandbox.
    pub workspace_volume: String,
    /// The size in MiB of the disk the workspace lives on (its `spec.diskMB`); 0 for a plain
    /// volume. The controller makes such a volume before the create (see [`crate::disk`]); the
    /// engine only mounts it.
    pub workspace_disk_mb: u64,
    /// A host directory mounted read-only at [`CA_MOUNT`]: the egress
    /// gateway's CA bundle, for policed sandboxes.
    pub ca_dir: Option<String>,
}

impl ContainerPlan {
    /// The Docker name the container is created under.
    pub fn docker_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| container_name(&self.sandbox))
    }
}

/// Where sandboxes find the egress gateway's authority: a read-only mount of the store's public
/// CA directory (the egress module decides when; the plan only mounts it).
pub const CA_MOUNT: &str = "/etc/agent-sandbox-ca";

/// Where the helper volume is mounted inside sandboxes.
pub const HELPER_MOUNT: &str = "/opt/agent-sandbox";

/// A container carrying [`LABEL_MANAGED`].
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedContainer {
    pub id: String,
    /// Docker's name without the leading `/`.
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// Docker's state word: `created`, `running`, `paused`, `exited`, `dead`, ...
    pub state: String,
}

impl ManagedContainer {
    pub fn sandbox(&self) -> Option<&str> {
        self.labels.get(LABEL_ID).map(String::as_str)
    }

    pub fn uid(&self) -> Option<&str> {
        self.labels.get(LABEL_UID).map(String::as_str)
    }

    pub fn spec_hash(&self) -> Option<&str> {
        self.labels.get(LABEL_SPEC_HASH).map(String::as_str)
    }

    pub fn is_running(&self) -> bool {
        self.state == "running"
    }
}

/// A volume carrying [`LABEL_MANAGED`].
#[derive(Clone, Debug, PartialEq)]
pub struct ManagedVolume {
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

impl ManagedVolume {
    pub fn sandbox(&self) -> Option<&str> {
        self.labels.get(LABEL_ID).map(String::as_str)
    }
}

/// Details of one container, from inspect.
#[derive(Clone, Debug, PartialEq)]
pub struct ContainerDetails {
    pub id: String,
    /// Its name, without Docker's leading `/`.
    pub name: String,
    pub state: String,
    pub running: bool,
    pub paused: bool,
    pub exit_code: Option<i64>,
    /// Docker's `State.OOMKilled`: the container's main process was killed for want of memory
    /// (a command killed inside a running container leaves it false; see [`EngineEvent`]).
    pub oom_killed: bool,
    /// When the container last stopped (none while it never has).
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Whether the container's main process is the in-sandbox helper (its supervisor).
    pub helper_main: bool,
    /// Docker's own error when the container failed to start.
    pub error: String,
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Host PID of the container's PID 1 (0 when not running).
    pub pid: i64,
    /// The Docker runtime the container was made with (`HostConfig.Runtime`), e.g. `runc` or
    /// `runsc`; `None` when Docker does not say.
    pub runtime: Option<String>,
    pub labels: BTreeMap<String, String>,
    /// Where the volume mounted at `/workspace` lives on the daemon's host (Docker's
    /// `Mounts[].Source`), when there is one. Only a hint: a remote daemon's path means nothing
    /// here, so callers check that the directory they open is the container's before trusting it.
    pub workspace_source: Option<std::path::PathBuf>,
}

/// An image listed by [`Engine::list_images_with_label`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabeledImage {
    pub id: String,
    /// Its `repository:tag` names.
    pub tags: Vec<String>,
    pub labels: BTreeMap<String, String>,
    /// When Docker made it, in seconds since the epoch.
    pub created: i64,
}

/// What [`Engine::commit_rootfs`] made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommittedRootfs {
    /// The image's ID (`sha256:…`).
    pub image_id: String,
    /// `sha256:…` of the uncompressed tar of the changes (the image's top layer).
    pub layer_digest: String,
    /// How many bytes the changes add to the base image.
    pub layer_bytes: u64,
}

/// Something happened to a managed object; the controller turns it into a reconcile.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EngineEvent {
    /// `container` or `volume`.
    pub object: String,
    /// Docker's action: `die`, `destroy`, `stop`, `start`, `oom`, ...
    pub action: String,
    /// The sandbox named by the object's [`LABEL_ID`], when it has one.
    pub sandbox: Option<String>,
    /// The object's [`LABEL_SERVER`]. Only container events carry labels; for volumes (whose
    /// events name the volume and nothing else) this is `None`, so a server sharing the daemon
    /// must not treat a volume event as proof that the object is its own.
    pub server: Option<String>,
    /// The container's ID (container events only).
    pub container: Option<String>,
    /// `die`: the main process's exit code.
    pub exit_code: Option<i64>,
    /// `kill`: the signal Docker was asked to send (someone stopped or killed the container).
    pub signal: Option<i64>,
    /// When Docker saw it.
    pub at: Option<chrono::DateTime<chrono::Utc>>,
}

/// What a `docker exec` should run.
#[derive(Clone, Debug, Default)]
pub struct ExecPlan {
    pub argv: Vec<String>,
    /// `KEY=VALUE` entries.
    pub env: Vec<String>,
    pub workdir: Option<String>,
    /// `uid:gid`; the sandbox user unless the data plane has a reason.
    pub user: String,
    /// Attach stdin (for channels such as the helper's).
    pub stdin: bool,
}

/// One chunk of exec output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecOutput {
    Stdout(Bytes),
    Stderr(Bytes),
}

/// A started exec: its output stream, its stdin (when asked for) and its ID for inspection.
pub struct ExecSession {
    pub exec_id: String,
    pub output: BoxStream<'static, EngineResult<ExecOutput>>,
    pub input: Option<Pin<Box<dyn AsyncWrite + Send>>>,
}

/// State of an exec, from inspect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecState {
    pub running: bool,
    pub exit_code: Option<i64>,
    /// Host PID of the exec's process (0 when unknown, e.g. under gVisor).
    pub pid: i64,
}

#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Answers when the daemon does.
    async fn ping(&self) -> EngineResult<()>;
    /// What this engine can do beyond the basics; constant for the engine's lifetime.
    fn capabilities(&self) -> EngineCapabilities;

    // --- control plane, used by the controller ---

    /// Every container labeled [`LABEL_MANAGED`], running or not.
    async fn list_containers(&self) -> EngineResult<Vec<ManagedContainer>>;
    /// Every volume labeled [`LABEL_MANAGED`].
    async fn list_volumes(&self) -> EngineResult<Vec<ManagedVolume>>;
    /// The volume of that name, whatever its labels (`None` when there is none): one lookup where
    /// listing every managed volume would cost a scan per sandbox.
    async fn inspect_volume(&self, name: &str) -> EngineResult<Option<ManagedVolume>>;
    /// Removes the volume; a missing volume is not an error.
    async fn remove_volume(&self, name: &str) -> EngineResult<()>;
    /// Creates a volume nothing mounts, as a marker carrying `labels`; an existing one is kept.
    async fn create_marker_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<()>;
    /// Creates volume `name` carrying `labels` as a copy-on-write view: Docker's `local` driver
    /// mounts an overlay of `view.lower` (read-only) under `view.upper` (its writes, with
    /// `view.work` as overlay's work directory) when a container mounts it. The directories are
    /// paths of the daemon's host. An existing volume of that name is an error.
    async fn create_view_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        view: &ViewPaths,
    ) -> EngineResult<()>;
    /// The view volume `name` is, as [`Engine::create_view_volume`] made it; `None` for a
    /// missing volume or one of any other kind. What a workspace stacks can be read here while
    /// no container mounts it (the host's mount table then shows nothing).
    async fn view_of_volume(&self, name: &str) -> EngineResult<Option<ViewPaths>>;
    /// Where the daemon keeps volume `name`'s files (its `Mountpoint`); `None` for a missing
    /// volume.
    async fn volume_directory(&self, name: &str) -> EngineResult<Option<std::path::PathBuf>>;
    /// Creates volume `name` carrying `labels` as a bind of the daemon host's directory
    /// `source` (a workspace with a disk limit: the directory is the root of its own file
    /// system, see [`crate::disk`]). Docker's `local` driver binds it when a container mounts the
    /// volume; a start fails while the directory is missing. An existing volume of that name is
    /// an error.
    async fn create_bind_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        source: &std::path::Path,
    ) -> EngineResult<()>;
    /// Every volume carrying the label `key`, whatever its value and whether managed or not.
    async fn list_volumes_with_label(&self, key: &str) -> EngineResult<Vec<ManagedVolume>>;
    /// Creates (does not start) the hardened container of `plan`; returns its ID. Its workspace
    /// volume is created with it, labeled for `plan.sandbox`, if it does not exist yet.
    async fn create_container(&self, plan: &ContainerPlan) -> EngineResult<String>;
    async fn start_container(&self, id: &str) -> EngineResult<()>;
    /// Force-removes the container; a missing container is not an error.
    async fn remove_container(&self, id: &str) -> EngineResult<()>;
    /// `None` when the container does not exist.
    async fn inspect_container(&self, id: &str) -> EngineResult<Option<ContainerDetails>>;
    /// Applies new CPU, memory (= memory + swap) and pids limits to a live container.
    async fn update_limits(
        &self,
        id: &str,
        cpus: f64,
        memory_mb: u64,
        pids_limit: u64,
    ) -> EngineResult<()>;
    async fn pause(&self, id: &str) -> EngineResult<()>;
    async fn unpause(&self, id: &str) -> EngineResult<()>;
    /// Creates the dedicated bridge (inter-container traffic disabled) unless it exists, and
    /// returns the host's address and interface on it. An [`NetworkKind::Internal`] network
    /// that exists without Docker's `internal` flag is an error, never used: its sandboxes
    /// would have a route out.
    async fn ensure_network(&self, name: &str, kind: NetworkKind) -> EngineResult<NetworkInfo>;
    /// The running managed containers on network `name`, by container name and address there:
    /// how the egress gateway tells who is speaking.
    async fn network_members(&self, name: &str) -> EngineResult<Vec<(String, IpAddr)>>;
    async fn image_exists(&self, image: &str) -> EngineResult<bool>;
    /// Commits the root filesystem changes of container `container` (running, paused or
    /// stopped) as image `reference` carrying only `labels` and the base image's environment;
    /// `pause` asks Docker to freeze the container meanwhile (pass false when the caller already
    /// froze it). Volumes and tmpfs mounts are not part of it.
    async fn commit_rootfs(
        &self,
        container: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
        pause: bool,
    ) -> EngineResult<CommittedRootfs>;
    /// Writes the top layer of image `reference` (the changes a commit recorded, deletions as
    /// whiteout entries) to `out`, which must be open for reading and writing: the uncompressed
    /// layer tar whose sha256 is `digest`. Answers its size and `out`, rewound.
    async fn export_top_layer(
        &self,
        reference: &str,
        digest: &str,
        out: std::fs::File,
    ) -> EngineResult<(u64, std::fs::File)>;
    /// Makes image `reference` from base image `base` (which must be on the host) and the layer
    /// tar read from `layer` (`size` bytes, sha256 `digest`, already validated by the caller),
    /// with the base image's config and only `labels`; answers its ID. Docker checks the
    /// layer's digest as it loads.
    async fn load_rootfs(
        &self,
        base: &str,
        layer: std::fs::File,
        size: u64,
        digest: &str,
        reference: &str,
        labels: &BTreeMap<String, String>,
    ) -> EngineResult<String>;
    /// Every image carrying the label `key`, whatever its value.
    async fn list_images_with_label(&self, key: &str) -> EngineResult<Vec<LabeledImage>>;
    /// Removes image `reference` (never forced); a missing one is not an error,
    /// [`EngineError::Conflict`] while a container uses it.
    async fn remove_image(&self, reference: &str) -> EngineResult<()>;
    /// Events about managed objects, as they happen. The stream ends if the daemon goes away;
    /// callers re-subscribe.
    fn events(&self) -> BoxStream<'static, EngineResult<EngineEvent>>;

    // --- data plane, used by exec and files ---

    async fn exec(&self, container: &str, plan: &ExecPlan) -> EngineResult<ExecSession>;
    async fn inspect_exec(&self, exec_id: &str) -> EngineResult<ExecState>;
    /// Streams a tar of `path` inside the container (Docker's archive API; runs as root).
    async fn archive_get(
        &self,
        container: &str,
        path: &str,
    ) -> EngineResult<BoxStream<'static, EngineResult<Bytes>>>;
    /// Extracts a tar into `path` inside the container (Docker's archive API: runs as root and
    /// follows symlinks, so callers must only aim it at trusted destinations).
    async fn archive_put(
        &self,
        container: &str,
        path: &str,
        tar: BoxStream<'static, Bytes>,
    ) -> EngineResult<()>;

    // --- setup of server-owned content (required too: no sandbox is made without them) ---

    /// Makes sure `volume` (labeled [`LABEL_MANAGED`] and [`LABEL_ROLE`]` = helper`) holds
    /// `binary` as `agent-sandbox-helper` (mode 0555, owned by root) and [`LOOPBACK_HOSTS`] as
    /// [`HELPER_HOSTS`] at its root, so that sandboxes can mount it read-only at
    /// [`HELPER_MOUNT`]. Needs no user image and pulls nothing. Idempotent and cheap once the
    /// volume holds this exact content; different content replaces the old in place.
    async fn ensure_helper_volume(&self, volume: &str, binary: &[u8]) -> EngineResult<()>;

    /// Makes the root of the container's `/workspace` volume owned by `uid:gid` (mode 0755), so
    /// the sandbox user can write there. Works on a created, not yet started container (and on a
    /// running one); needs no extra container. Idempotent; call it after every create.
    async fn prepare_workspace(&self, container: &str, uid: u32, gid: u32) -> EngineResult<()>;

    /// Renames a container, given by ID or name (how a warm-pool container is handed to its
    /// sandbox). [`EngineError::Conflict`] if the new name is taken, [`EngineError::NotFound`]
    /// if there is no such container. Pools and rollbacks depend on it.
    async fn rename_container(&self, id: &str, new_name: &str) -> EngineResult<()>;

    /// Kills the container's processes (SIGKILL) and returns once they are dead: directly through
    /// its PID 1 when that is a local runc process (Docker then reports the container running
    /// for a few milliseconds more, until it notices), else through Docker, which answers once
    /// it has stopped. The container itself stays, to be renamed or removed later. A missing or stopped container is not an
    /// error. A deletion depends on it.
    async fn kill_container(&self, id: &str) -> EngineResult<()>;

    /// Stops the container the way `docker stop` does (SIGTERM, then SIGKILL after `grace`),
    /// thawing it first if it is paused; the container, its root filesystem and its volumes stay,
    /// and [`Engine::start_container`] starts the same container again. A missing or stopped
    /// container is not an error.
    async fn stop_container(&self, id: &str, grace: std::time::Duration) -> EngineResult<()>;

    /// Pulls `image` from its registry, with the credentials of `auth_file` (a Docker client
    /// config) or the server user's own Docker config when they name its registry, reporting
    /// `(bytes done, bytes total)` over its layers to `progress` as they arrive.
    /// [`EngineError::PullFailed`] carries the registry's reason.
    async fn pull_image(
        &self,
        image: &str,
        auth_file: Option<&std::path::Path>,
        progress: PullProgress,
    ) -> EngineResult<()>;
}

/// Where a pull reports its bytes: `(done, total)` over the image's layers.
pub type PullProgress = Box<dyn Fn(u64, u64) + Send + Sync>;

/// File name of the helper binary at the root of the helper volume.
pub const HELPER_BINARY: &str = "agent-sandbox-helper";
/// File name, at the root of the helper volume, of the hosts file that sandboxes without a
/// network see as `/etc/hosts` (such containers get no Docker network sandbox, so Docker writes
/// none for them).
pub const HELPER_HOSTS: &str = "hosts";
/// Content of [`HELPER_HOSTS`]: what Docker itself writes for a container on the `none` network.
pub const LOOPBACK_HOSTS: &str = "127.0.0.1\tlocalhost\n\
    ::1\tlocalhost ip6-localhost ip6-loopback\n\
    fe00::0\tip6-localnet\n\
    ff00::0\tip6-mcastprefix\n\
    ff02::1\tip6-allnodes\n\
    ff02::2\tip6-allrouters\n";

/// Name of the helper volume for `binary`: content-addressed over everything the volume holds,
/// so that a new server version never mounts a volume filled for an old one.
pub fn helper_volume_name(binary: &[u8]) -> String {
    format!(
        "agent-sandbox-helper-{}",
        &helper_content_digest(binary)[..12]
    )
}

/// Hex SHA-256 over the helper volume's whole content: the binary and the hosts file.
pub fn helper_content_digest(binary: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    hasher.update(binary);
    hasher.update([0]);
    hasher.update(LOOPBACK_HOSTS.as_bytes());
    hex::encode(hasher.finalize())
}
/// Value of [`LABEL_ROLE`] on the helper volume.
pub const ROLE_HELPER: &str = "helper";

#[cfg(test)]
mod tests {
    use super::{volume_directory_mounted, ViewPaths};

    #[test]
    fn a_volumes_directory_is_found_mounted_by_its_whole_name() {
        let table = "58 45 0:50 / /var/lib/docker/volumes/v-workspace/_data rw - overlay none rw\n";
        assert!(volume_directory_mounted(table, "v-workspace"));
        assert!(!volume_directory_mounted(table, "workspace"));
        assert!(!volume_directory_mounted(table, "v-workspace-2"));
    }

    #[test]
    fn a_views_overlay_options_read_back_as_the_same_view() {
        let view = ViewPaths {
            lower: vec!["/data/trees/b".into(), "/data/trees/a".into()],
            upper: "/data/views/v/upper".into(),
            work: "/data/views/v/work".into(),
        };
        let options = view.overlay_options().unwrap();
        assert_eq!(ViewPaths::from_overlay_options(&options), Some(view));
        assert_eq!(
            ViewPaths::from_overlay_options("upperdir=/u,workdir=/w"),
            None,
            "no lower directory"
        );
        assert_eq!(
            ViewPaths::from_overlay_options("lowerdir=,upperdir=/u,workdir=/w"),
            None
        );
        assert_eq!(ViewPaths::from_overlay_options("size=10m"), None);
    }
}
