//! Pausing a local container through its cgroup's freezer: the kernel interface `docker pause`
//! ends at, without the daemon's round trip through containerd and a `runc pause` process (about
//! 10 ms to pause and as much to unpause on the machines measured, against 0.1 ms here). A snapshot
//! pauses its sandbox for exactly as long as it reads the workspace, so this is most of a small
//! snapshot's time.
//!
//! Only for a container whose cgroup this host can see and prove to be the container's (its
//! path, read from `/proc/<pid>/cgroup` of the container's PID 1, names the container's full ID)
//! and only under runc: gVisor's processes are its own kernel's, and its pause is runsc's. Anything
//! else, or a freeze that does not settle in time, is reported so the caller asks Docker instead.
//! Docker does not learn of a freeze made here; the engine reports such a container as paused
//! (found from the cgroup, so a freeze left by a crashed run is found too, and the sandbox
//! reconcile thaws it) and thaws it on unpause.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{map_err, server_message, BollardEngine, EngineResult};

/// How long a freeze may take to settle before it is undone and Docker is asked instead. A task
/// in an uninterruptible sleep (a FUSE request, say) can hold a cgroup v1 freeze in `FREEZING`.
const SETTLE: Duration = Duration::from_millis(200);

/// How long an unpause waits for Docker's record to say so (see `settle_unpaused`).
const DOCKER_SETTLE: Duration = Duration::from_secs(2);

/// A cgroup's freezer, v1 or v2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Freezer {
    /// `freezer.state`: write `FROZEN` / `THAWED`, read until it says `FROZEN`.
    V1(PathBuf),
    /// The cgroup's directory: `cgroup.freeze` takes `1` / `0`, `cgroup.events` says `frozen 1`.
    V2(PathBuf),
}

/// The freezer of the container `id` whose PID 1 is `pid` on this host, if it can be proven to
/// be that container's.
pub(super) fn of(id: &str, pid: i64) -> Option<Freezer> {
    if pid <= 0 || id.len() < 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let table = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mut unified = None;
    for line in table.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        if !path.contains(id) || path.contains("..") {
            continue;
        }
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|c| c == "freezer") {
            let state = Path::new("/sys/fs/cgroup/freezer")
                .join(relative)
                .join("freezer.state");
            return state.is_file().then_some(Freezer::V1(state));
        }
        if controllers.is_empty() {
            unified = Some(Path::new("/sys/fs/cgroup").join(relative));
        }
    }
    let dir = unified?;
    dir.join("cgroup.freeze")
        .is_file()
        .then_some(Freezer::V2(dir))
}

impl Freezer {
    /// Freezes every task of the cgroup and waits until the kernel says all are frozen. A freeze
    /// that does not settle within [`SETTLE`] is undone and reported.
    pub fn freeze(&self) -> std::io::Result<()> {
        self.write(true)?;
        let started = Instant::now();
        loop {
            if self.is_frozen()? {
                return Ok(());
            }
            if started.elapsed() > SETTLE {
                let _ = self.write(false);
                return Err(std::io::Error::other(format!(
                    "the freeze did not settle within {} ms",
                    SETTLE.as_millis()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn thaw(&self) -> std::io::Result<()> {
        self.write(false)
    }

    pub fn is_frozen(&self) -> std::io::Result<bool> {
        Ok(match self {
            Freezer::V1(state) => std::fs::read_to_string(state)?.trim() == "FROZEN",
            Freezer::V2(dir) => std::fs::read_to_string(dir.join("cgroup.events"))?
                .lines()
                .any(|line| line.trim() == "frozen 1"),
        })
    }

    fn write(&self, frozen: bool) -> std::io::Result<()> {
        match self {
            Freezer::V1(state) => std::fs::write(state, if frozen { "FROZEN" } else { "THAWED" }),
            Freezer::V2(dir) => {
                std::fs::write(dir.join("cgroup.freeze"), if frozen { "1" } else { "0" })
            }
        }
    }
}

/// Whether a container of Docker runtime `runtime` runs its processes as host tasks in its cgroup.
fn is_runc(runtime: &str) -> bool {
    runtime.is_empty() || (runtime.contains("runc") && !crate::docker::is_gvisor(runtime))
}

/// The freezer of `inspected`, when it is a running runc container of this host.
pub(super) fn of_inspected(
    inspected: &bollard::models::ContainerInspectResponse,
) -> Option<Freezer> {
    let state = inspected.state.as_ref()?;
    let runtime = inspected
        .host_config
        .as_ref()?
        .runtime
        .as_deref()
        .unwrap_or("");
    if state.running != Some(true) || !is_runc(runtime) {
        return None;
    }
    of(inspected.id.as_deref()?, state.pid.unwrap_or(0))
}

impl BollardEngine {
    /// Freezes the container locally when it can, else asks Docker to pause it.
    pub(super) async fn freeze_or_pause(&self, id: &str) -> EngineResult<()> {
        if let Some((full_id, freezer)) = self.local_freezer(id).await? {
            let attempt = freezer.clone();
            match tokio::task::spawn_blocking(move || attempt.freeze()).await {
                Ok(Ok(())) => {
                    self.lock_frozen().insert(full_id, freezer);
                    return Ok(());
                }
                Ok(Err(error)) => {
                    tracing::debug!(container = id, %error, "cannot freeze locally; asking Docker")
                }
                Err(error) => tracing::debug!(container = id, %error, "freeze task failed"),
            }
        }
        match self.docker.pause_container(id).await {
            Ok(()) => Ok(()),
            // Docker's own word, or the runtime's shim answering for a record of Docker's that
            // lags (see `settle_unpaused`).
            Err(e)
                if server_message(&e).is_some_and(|m| {
                    m.contains("already paused") || m.contains("cannot pause a paused container")
                }) =>
            {
                Ok(())
            }
            Err(e) => Err(map_err("pause", &format!("container {id}"))(e)),
        }
    }

    /// Thaws what [`Self::freeze_or_pause`] froze, whichever way it did, and a local freeze an
    /// earlier run of this server left behind.
    pub(super) async fn thaw_or_unpause(&self, id: &str) -> EngineResult<()> {
        if let Some(freezer) = self.take_frozen(id) {
            return freezer.thaw().map_err(|e| map_io("unpause", id, e));
        }
        let resumed = match self.docker.unpause_container(id).await {
            Ok(()) => true,
            // The runtime runs it already while Docker's record still says paused.
            Err(e)
                if server_message(&e)
                    .is_some_and(|m| m.contains("cannot resume a running process")) =>
            {
                true
            }
            Err(e) if server_message(&e).is_some_and(|m| m.contains("is not paused")) => false,
            Err(e) => return Err(map_err("unpause", &format!("container {id}"))(e)),
        };
        if resumed {
            self.settle_unpaused(id).await;
            return Ok(());
        }
        if let Some((_, freezer)) = self.local_freezer(id).await? {
            if freezer.is_frozen().unwrap_or(false) {
                freezer.thaw().map_err(|e| map_io("unpause", id, e))?;
            }
        }
        Ok(())
    }

    /// Waits (a little, at most [`DOCKER_SETTLE`]) until Docker's record of `id` no longer says
    /// paused. Docker 20.10 learns of a pause from the runtime's event as well as from its own
    /// call, and an event handled late sets the record back to paused after an unpause returned:
    /// an exec then is refused ("is paused"), and a second unpause reaches the runtime, whose
    /// shim answers "cannot resume a running process". Seen under gVisor (runc containers are
    /// frozen here, without Docker). The record converges once the resume's event is handled.
    async fn settle_unpaused(&self, id: &str) {
        let started = Instant::now();
        while started.elapsed() < DOCKER_SETTLE {
            match self.docker.inspect_container(id, None).await {
                Ok(inspected) if inspected.state.as_ref().and_then(|s| s.paused) == Some(true) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                _ => return,
            }
        }
        tracing::debug!(container = id, "Docker still records the container paused");
    }

    /// Thaws and forgets a freeze of a container about to be removed, so that the record does
    /// not outlive the container. (runc thaws a frozen cgroup when it kills it anyway.)
    pub(super) fn thaw_before_removal(&self, id: &str) {
        if let Some(freezer) = self.take_frozen(id) {
            if let Err(error) = freezer.thaw() {
                tracing::warn!(container = id, %error, "cannot thaw before removal");
            }
        }
    }

    async fn local_freezer(&self, id: &str) -> EngineResult<Option<(String, Freezer)>> {
        let inspected = match self.docker.inspect_container(id, None).await {
            Ok(inspected) => inspected,
            Err(e) => return Err(map_err("inspect", &format!("container {id}"))(e)),
        };
        let Some(freezer) = of_inspected(&inspected) else {
            return Ok(None);
        };
        Ok(inspected.id.map(|full_id| (full_id, freezer)))
    }

    fn lock_frozen(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Freezer>> {
        self.frozen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The freeze of `id` (a full ID or a unique prefix of one) this engine made, forgotten.
    fn take_frozen(&self, id: &str) -> Option<Freezer> {
        let mut frozen = self.lock_frozen();
        let key = frozen
            .keys()
            .find(|k| k.starts_with(id) && !id.is_empty())?
            .clone();
        frozen.remove(&key)
    }
}

fn map_io(operation: &str, id: &str, error: std::io::Error) -> super::EngineError {
    super::EngineError::Docker {
        operation: format!("{operation} container {id}"),
        message: format!("cgroup freezer: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_freezer_without_a_provable_cgroup() {
        let id = "a".repeat(64);
        assert_eq!(of(&id, 0), None, "no process");
        assert_eq!(of("abc", 1), None, "not a full container ID");
        assert_eq!(of(&"z".repeat(64), 1), None, "not hex");
        // This test's own process is in no cgroup named after that ID.
        assert_eq!(of(&id, std::process::id() as i64), None);
    }

    #[test]
    fn a_v1_freezer_writes_and_reads_its_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("freezer.state");
        std::fs::write(&state, "THAWED\n").unwrap();
        let freezer = Freezer::V1(state.clone());
        assert!(!freezer.is_frozen().unwrap());
        // A plain file keeps what was written, as a settled kernel freezer reads back.
        freezer.freeze().unwrap();
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "FROZEN");
        freezer.thaw().unwrap();
        assert_eq!(std::fs::read_to_string(&state).unwrap(), "THAWED");
    }

    #[test]
    fn a_freeze_that_does_not_settle_is_undone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        std::fs::write(dir.path().join("cgroup.freeze"), "0").unwrap();
        let freezer = Freezer::V2(dir.path().to_path_buf());
        assert!(freezer.freeze().is_err());
        let freeze = std::fs::read_to_string(dir.path().join("cgroup.freeze")).unwrap();
        assert_eq!(freeze, "0", "thawed again");
    }
}
