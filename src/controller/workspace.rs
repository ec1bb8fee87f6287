//! Making a sandbox's `/workspace` ready: owned by the sandbox user (mode 0755) and, for a
//! restore, holding a snapshot's content — on this host when its copy of the volume is verifiably
//! the container's, else through Docker's archive API. Snapshots read the workspace the same way
//! ([`open_host_root`]).
//!
//! Docker's archive API always works (remote daemons, gVisor, a server that is not root), but
//! every call has the daemon mount the container's file systems and stream through its HTTP
//! connection: 60–100 ms for the one-entry tar that gives `/workspace` to the sandbox user, far
//! more for a snapshot's content. So when the volume's directory (`Mounts[].Source`) can be
//! opened here *and* is the very inode the container's process sees as `/workspace`
//! (`/proc/<pid>/root/workspace`, which rules out a remote daemon's path and gVisor, whose
//! sandbox process does not show the container's files), the controller uses that directory
//! itself: it sets the owner through the directory's descriptor and unpacks with
//! [`archive::unpack`], which never follows a symlink nor replaces a name. The proof needs a
//! running process, so such containers are started first and made ready after (nothing runs in
//! them before the sandbox is reported running); a restore into a new container, once the proof
//! has held for its runtime, unpacks while Docker starts the container and makes the proof when
//! it runs. [`HostAccess`] remembers per runtime whether the proof has held; until it has, a
//! workspace is prepared through the archive API before the start, and the proof is tried after
//! it. `AGENT_SANDBOX_HOST_WORKSPACE_ACCESS=false` turns the host path off. This module decides
//! nothing about when a workspace is made; its callers do.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Write};
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::Mutex;

use futures::StreamExt;
use tokio_stream::wrappers::ReceiverStream;

use std::sync::Arc;

use super::content::{restore_policy, Validated};
use super::error::ReconcileError;
use crate::archive::{self, ArchiveError, ChannelWriter};
use crate::config::Settings;
use crate::docker::{ContainerDetails, Engine};

/// The workspace inside every sandbox.
pub(super) const WORKSPACE: &str = "/workspace";
/// Mode of the workspace root, as `prepare_workspace` sets it.
const WORKSPACE_MODE: libc::mode_t = 0o755;

/// Whether the host path has been proven to work, per Docker runtime (`""` is the default).
#[derive(Default)]
pub(super) struct HostAccess {
    learned: Mutex<HashMap<String, bool>>,
}

impl HostAccess {
    pub(super) fn get(&self, runtime: &str) -> Option<bool> {
        self.learned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(runtime)
            .copied()
    }

    pub(super) fn learn(&self, runtime: &str, works: bool) {
        let mut learned = self.learned.lock().unwrap_or_else(|e| e.into_inner());
        if learned.insert(runtime.to_string(), works) != Some(works) {
            tracing::info!(
                runtime = if runtime.is_empty() {
                    "default"
                } else {
                    runtime
                },
                works,
                "workspaces on this host: learned whether they can be used directly"
            );
        }
    }
}

/// Why this host's copy of a workspace cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("the workspace cannot be used on this host: {reason}")]
pub(super) struct HostUnavailable {
    pub reason: String,
    /// Whether it says something about this host (a path that is not there, not readable or
    /// not the container's), rather than about a container that stopped meanwhile.
    pub lasting: bool,
}

impl HostUnavailable {
    pub(super) fn lasting(reason: String) -> HostUnavailable {
        HostUnavailable {
            reason,
            lasting: true,
        }
    }

    /// A reason about a container (stopped, vanished) or a failed Docker call, not this host.
    pub(super) fn passing(reason: String) -> HostUnavailable {
        HostUnavailable {
            reason,
            lasting: false,
        }
    }

    fn gone() -> HostUnavailable {
        HostUnavailable {
            reason: "the container has no process".into(),
            lasting: false,
        }
    }
}

/// Opens the volume's directory on this host, if it is the container's `/workspace`: the same
/// inode as `/workspace` seen through the container's root (so a remote daemon's path, or one
/// this process cannot open, is never trusted).
pub(super) fn open_host_root(details: &ContainerDetails) -> Result<File, HostUnavailable> {
    let root = open_host_source(details)?;
    prove_container_root(&root, details)?;
    Ok(root)
}

/// Opens the directory Docker names for the container's workspace volume (created or running),
/// not yet proven to be the container's.
fn open_host_source(details: &ContainerDetails) -> Result<File, HostUnavailable> {
    let source = details
        .workspace_source
        .as_ref()
        .ok_or_else(|| HostUnavailable::lasting("Docker names no directory for it".into()))?;
    archive::open_root(source)
        .map_err(|e| HostUnavailable::lasting(format!("{}: {e}", source.display())))
}

/// Proves that `root` is the very directory the running container's process sees as
/// `/workspace`.
fn prove_container_root(root: &File, details: &ContainerDetails) -> Result<(), HostUnavailable> {
    if details.pid <= 0 {
        return Err(HostUnavailable::gone());
    }
    let ours = root
        .metadata()
        .map_err(|e| HostUnavailable::lasting(format!("the workspace directory: {e}")))?;
    let process = PathBuf::from(format!("/proc/{}", details.pid));
    let seen = process.join(format!("root{WORKSPACE}"));
    let theirs = match std::fs::metadata(&seen) {
        Ok(theirs) => theirs,
        Err(_) if !process.exists() => return Err(HostUnavailable::gone()),
        // The process is there but shows no such directory (gVisor's sandbox process).
        Err(e) => return Err(HostUnavailable::lasting(format!("{}: {e}", seen.display()))),
    };
    if (ours.dev(), ours.ino()) != (theirs.dev(), theirs.ino()) {
        let source = details.workspace_source.clone().unwrap_or_default();
        return Err(HostUnavailable::lasting(format!(
            "{} is not the container's {WORKSPACE}",
            source.display()
        )));
    }
    Ok(())
}

/// Whether the workspace root still has to be given to the sandbox user.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Prepare {
    Workspace,
    /// A pool member: prepared when it was made.
    AlreadyDone,
}

/// What making a workspace ready needs: Docker, the settings, and what this host has shown.
pub(super) struct Workspaces {
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    /// Whether workspaces can be used on this host, as learned so far.
    pub(super) host_access: HostAccess,
    /// Whether copy-on-write views work on this host, as learned so far (see `views.rs`).
    pub(super) view_access: HostAccess,
    /// Whether views can be mounted into running pool members here (see `member_views.rs`).
    pub(super) mount_access: HostAccess,
}

impl Workspaces {
    pub(super) fn new(engine: Arc<dyn Engine>, settings: Arc<Settings>) -> Workspaces {
        Workspaces {
            engine,
            settings,
            host_access: HostAccess::default(),
            view_access: HostAccess::default(),
            mount_access: HostAccess::default(),
        }
    }

    /// The details of container `id`, which must be there (`when` says, for the error, when it
    /// was found gone).
    pub(super) async fn inspect_present(
        &self,
        id: &str,
        when: &'static str,
    ) -> Result<ContainerDetails, ReconcileError> {
        self.engine
            .inspect_container(id)
            .await?
            .ok_or_else(|| ReconcileError::Vanished {
                container: id.to_string(),
                when,
            })
    }

    /// Whether a workspace may be carried on this host under the runtime `runtime`, as far as
    /// is known: allowed, and not shown to fail.
    pub(super) fn may_use_host(&self, runtime: &str) -> bool {
        self.host_allowed() && self.host_access.get(runtime) != Some(false)
    }

    /// Whether the settings and the engine allow workspaces on this host at all.
    fn host_allowed(&self) -> bool {
        self.settings.host_workspace_access && self.engine.capabilities().host_workspace_access
    }

    /// Starts the created container `id` (of Docker runtime `runtime`, `""` for the default) with
    /// its `/workspace` ready: the sandbox user's and, given a snapshot, holding its content.
    pub(super) async fn start_with_workspace(
        &self,
        id: &str,
        runtime: &str,
        content: Option<&Validated>,
    ) -> Result<(), ReconcileError> {
        let allowed = self.host_allowed();
        if allowed && self.host_access.get(runtime) == Some(true) {
            let Some(content) = content else {
                self.engine.start_container(id).await?;
                return self.make_ready(id, runtime, Prepare::Workspace, None).await;
            };
            if let Some(root) = self.open_created_workspace(id, runtime).await? {
                return self.fill_while_starting(id, runtime, root, content).await;
            }
            // Learned just now that this host cannot: the archive API below.
        }
        self.ready_through_docker(id, Prepare::Workspace, content)
            .await?;
        self.engine.start_container(id).await?;
        if allowed && self.host_access.get(runtime).is_none() {
            // Learn, on a container already made ready, whether the next ones can skip the
            // archive API.
            if let Some(details) = self.engine.inspect_container(id).await? {
                match open_host_root(&details) {
                    Ok(_) => self.host_access.learn(runtime, true),
                    Err(error) => {
                        tracing::debug!(%error, "workspaces are made ready through Docker");
                        if error.lasting {
                            self.host_access.learn(runtime, false);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The directory Docker names for the workspace of the created container `id`, opened on
    /// this host; `None` (and the host path given up for `runtime`) when it cannot be.
    async fn open_created_workspace(
        &self,
        id: &str,
        runtime: &str,
    ) -> Result<Option<File>, ReconcileError> {
        let created = self.inspect_present(id, "").await?;
        match open_host_source(&created) {
            Ok(root) => Ok(Some(root)),
            Err(error) => {
                tracing::debug!(container = id, %error, "making the workspace ready through Docker");
                self.host_access.learn(runtime, false);
                Ok(None)
            }
        }
    }

    /// Starts the created container `id` while its workspace directory `root` (opened on this
    /// host, the host path having held for `runtime` before) gets the snapshot's content: the
    /// unpack overlaps the start, most of a cold restore's time. `root` is proven to be the
    /// container's `/workspace` once it runs; if it is not, the restore fails (its caller
    /// discards container and volume, which nothing has used yet) and the host path is not taken
    /// again.
    async fn fill_while_starting(
        &self,
        id: &str,
        runtime: &str,
        root: File,
        content: &Validated,
    ) -> Result<(), ReconcileError> {
        let written = root
            .try_clone()
            .map_err(|e| ReconcileError::HostWrite(e.to_string()))?;
        let (started, filled) = tokio::join!(
            self.engine.start_container(id),
            self.ready_on_host(written, Prepare::Workspace, Some(content)),
        );
        started?;
        let running = self.inspect_present(id, " while starting").await?;
        if let Err(error) = prove_container_root(&root, &running) {
            if error.lasting {
                self.host_access.learn(runtime, false);
            }
            return Err(ReconcileError::HostUnavailable(error.to_string()));
        }
        if let Err(ReconcileError::HostWrite(_)) = &filled {
            self.host_access.learn(runtime, false);
        }
        filled
    }

    /// Makes the workspace of the running container `id` ready: on this host when its copy is
    /// verifiably the container's, else through the archive API. On error the workspace may hold
    /// part of the content and must be discarded.
    pub(super) async fn make_ready(
        &self,
        id: &str,
        runtime: &str,
        prepare: Prepare,
        content: Option<&Validated>,
    ) -> Result<(), ReconcileError> {
        if self.may_use_host(runtime) {
            let details = self
                .inspect_present(id, " before its workspace was ready")
                .await?;
            match open_host_root(&details) {
                Ok(root) => {
                    let written = self.ready_on_host(root, prepare, content).await;
                    if let Err(ReconcileError::HostWrite(_)) = &written {
                        // Whatever broke here breaks the next time too: use Docker from now on.
                        self.host_access.learn(runtime, false);
                    } else {
                        self.host_access.learn(runtime, true);
                    }
                    return written;
                }
                Err(error) => {
                    tracing::debug!(container = id, %error, "making the workspace ready through Docker");
                    if error.lasting {
                        self.host_access.learn(runtime, false);
                    }
                }
            }
        }
        self.ready_through_docker(id, prepare, content).await
    }

    async fn ready_on_host(
        &self,
        root: File,
        prepare: Prepare,
        content: Option<&Validated>,
    ) -> Result<(), ReconcileError> {
        let owner = self.settings.sandbox_uid_gid()?;
        let policy = restore_policy(&self.settings)?;
        let snapshot = content.map(|c| (c.name.clone(), c.path.clone()));
        tokio::task::spawn_blocking(move || {
            if prepare == Prepare::Workspace {
                own(&root, owner).map_err(|e| ReconcileError::HostWrite(e.to_string()))?;
            }
            let Some((name, path)) = snapshot else {
                return Ok(());
            };
            let file = File::open(&path).map_err(|error| ReconcileError::DataUnreadable {
                path: path.display().to_string(),
                error,
            })?;
            let input = BufReader::with_capacity(64 * 1024, file);
            match archive::unpack(input, root, &policy) {
                Ok(_) => Ok(()),
                Err(ArchiveError::Write(message)) => Err(ReconcileError::HostWrite(message)),
                // The data changed since it was validated.
                Err(error) => Err(ReconcileError::Refused { name, error }),
            }
        })
        .await?
    }

    /// The archive API's way: the root's owner through a one-entry tar, the content as the
    /// rewritten snapshot streamed into `/workspace`. Works on a created or a running container.
    async fn ready_through_docker(
        &self,
        container: &str,
        prepare: Prepare,
        content: Option<&Validated>,
    ) -> Result<(), ReconcileError> {
        if prepare == Prepare::Workspace {
            let (uid, gid) = self.settings.sandbox_uid_gid()?;
            self.engine.prepare_workspace(container, uid, gid).await?;
        }
        let Some(snapshot) = content else {
            return Ok(());
        };
        let policy = restore_policy(&self.settings)?;
        let path = snapshot.path.clone();
        let (writer, chunks) = ChannelWriter::new(8);
        let rewrite = tokio::task::spawn_blocking(move || {
            let file = File::open(&path)
                .map_err(|e| ArchiveError::Read(format!("{}: {e}", path.display())))?;
            let (_, mut writer) = archive::transform(BufReader::new(file), writer, &policy)?;
            writer
                .flush()
                .map_err(|e| ArchiveError::Write(e.to_string()))
        });
        let put = self
            .engine
            .archive_put(container, WORKSPACE, ReceiverStream::new(chunks).boxed())
            .await;
        let rewritten = rewrite.await?;
        // The data may have changed since validation: then the put got a cut-off archive, and
        // what Docker made of it is discarded with the volume.
        rewritten.map_err(|error| ReconcileError::Refused {
            name: snapshot.name.clone(),
            error,
        })?;
        put?;
        Ok(())
    }
}

/// Gives the workspace root (an open directory) to the sandbox user, mode 0755.
fn own(root: &File, (uid, gid): (u32, u32)) -> std::io::Result<()> {
    let fd = root.as_raw_fd();
    // SAFETY: plain system calls on a descriptor this function borrows.
    if unsafe { libc::fchown(fd, uid, gid) } != 0
        || unsafe { libc::fchmod(fd, WORKSPACE_MODE) } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
