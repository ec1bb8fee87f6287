//! Killing a local container through its PID 1: the signal `docker kill` ends at, without the
//! daemon's round trip through containerd and a `runc kill` or `runsc kill` process. Docker's kill
//! of a sandbox answered after 40 to 110 ms on the machines measured (it waits until it has noticed
//! the exit and cleaned up after it); this one is done in about 2 ms under runc, and a deletion
//! waits for it.
//!
//! Only for a running container of this host whose PID 1 can be proven to be the container's: the
//! PID is held by a pidfd before anything is read, so it cannot name another process meanwhile, and
//! its `/proc/<pid>/cgroup` must name the container's full ID. Under runc, when PID 1 of a PID
//! namespace dies, the kernel kills every other process in it and waits for them before PID 1's
//! exit is reported, so the pidfd turning readable means nothing of the sandbox runs any more (a
//! `docker exec`'d process included). Under gVisor the PID Docker reports is runsc's sandbox
//! process, the kernel every process of the sandbox runs on (an exec'd one too): once it is gone
//! nothing of the sandbox can act (its stub processes die with it, and can make no call without
//! it), and runsc's file server leaves when the sandbox's connections close. Docker's own kill goes
//! through runsc's control channel into that kernel, which a fork bomb inside keeps busy: 0.5 to
//! 1.7 s with two test suites running on two cores (and one deletion of such a sandbox waited past
//! its minute on a loaded machine), against about 0.1 s here for the container's cgroup to empty.
//! Docker notices the exit on its own a few tens of milliseconds later and reports the container
//! stopped from then on. Anything else (another runtime, a daemon on another host, a paused or
//! frozen container) is reported as not done, and the caller asks Docker. Nothing is signalled that
//! has not been proven to be the container's.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use super::BollardEngine;

/// How long the local kill may take to show before the caller asks Docker instead (which is
/// harmless: the container is then dead or dying already).
const SETTLE: Duration = Duration::from_secs(2);

/// How long a removal waits for Docker to record the exit of a container killed here (see
/// [`BollardEngine::await_recorded_exit`]); it takes milliseconds.
const RECORD: Duration = Duration::from_secs(20);

impl BollardEngine {
    /// Kills container `id` locally when it can: `true` once nothing of it runs (killed here,
    /// or missing, or not running to begin with), `false` when it was not done here (see the
    /// module doc) and Docker is to be asked. One inspect decides, so a name with no container
    /// (a deletion tries all of a sandbox's names) costs one call.
    pub(super) async fn kill_locally(&self, id: &str) -> bool {
        let inspected = match self.docker.inspect_container(id, None).await {
            Ok(inspected) => inspected,
            Err(e) if super::is_status(&e, 404) => return true,
            Err(_) => return false,
        };
        let state = inspected.state.as_ref();
        if state.and_then(|s| s.running) == Some(false) {
            return true;
        }
        if state.and_then(|s| s.paused) == Some(true) || !takes_the_signal_now(&inspected) {
            return false;
        }
        let (Some(full_id), Some(pid)) = (
            inspected.id.clone(),
            inspected.state.as_ref().and_then(|s| s.pid),
        ) else {
            return false;
        };
        let Some(pidfd) = signal_if_container(pid, &full_id) else {
            return false;
        };
        match tokio::time::timeout(SETTLE, exited(pidfd)).await {
            Ok(Ok(())) => {
                self.killed_here.insert(full_id);
                true
            }
            Ok(Err(error)) => {
                tracing::debug!(container = id, %error, "cannot wait for a local kill; asking Docker");
                false
            }
            Err(_) => {
                tracing::debug!(container = id, "local kill did not settle; asking Docker");
                false
            }
        }
    }

    /// Waits, within [`RECORD`], until Docker reports container `id` (killed here, and just seen
    /// running) stopped. A forced removal before that would send Docker's own kill to the
    /// container's containerd shim, and containerd 1.6's runc shim holds the container's lock
    /// while it runs the kill (`runsc kill`) and waits to reap it, while the exit of PID 1 it has
    /// reaped already waits for that same lock; its reaper then gives every other process the container left (the
    /// hundreds of gVisor stub processes a fork bomb leaves re-parented to the shim) a second
    /// each before it reaps the kill. Seen under gVisor: Docker reporting the container running,
    /// and its removal stalled, for minutes after the sandbox's kernel was dead. Without that
    /// kill, the shim reaps them all at once and Docker records the exit within milliseconds.
    pub(super) async fn await_recorded_exit(&self, id: &str) {
        // The caller's inspect has just said "running": wait before asking again.
        let deadline = tokio::time::Instant::now() + RECORD;
        loop {
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(
                    container = id,
                    "Docker has not recorded the exit of a container killed here; removing it anyway"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            match self.docker.inspect_container(id, None).await {
                Ok(inspected) if inspected.state.as_ref().and_then(|s| s.running) == Some(true) => {
                }
                Ok(_) | Err(_) => return,
            }
        }
    }
}

/// Full IDs of the containers this engine killed through their PID 1 and has not removed yet.
/// Bounded: a container removed some other way leaves an entry behind, dropped with the rest
/// once there are [`KilledHere::BOUND`].
#[derive(Default)]
pub(super) struct KilledHere(std::sync::Mutex<std::collections::HashSet<String>>);

impl KilledHere {
    const BOUND: usize = 1024;

    fn insert(&self, full_id: String) {
        let mut ids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if ids.len() >= Self::BOUND {
            ids.clear();
        }
        ids.insert(full_id);
    }

    /// Whether `full_id` was killed here; forgets it.
    pub(super) fn take(&self, full_id: &str) -> bool {
        let mut ids = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ids.remove(full_id)
    }
}

/// Whether the death of `inspected`'s PID 1 ends the whole container at once (see the module doc):
/// a runc container this host's freezer has not frozen (a SIGKILL would stay pending), or a
/// gVisor one.
fn takes_the_signal_now(inspected: &bollard::models::ContainerInspectResponse) -> bool {
    let runtime = inspected
        .host_config
        .as_ref()
        .and_then(|config| config.runtime.as_deref())
        .unwrap_or("");
    if crate::docker::is_gvisor(runtime) {
        return true;
    }
    super::freezer::of_inspected(inspected)
        .is_some_and(|freezer| !freezer.is_frozen().unwrap_or(true))
}

/// Sends SIGKILL to `pid` when it is PID 1 of container `full_id` on this host, through a pidfd
/// taken before the proof is read (so the PID cannot name another process by then). Returns the
/// pidfd, to wait for the exit on.
fn signal_if_container(pid: i64, full_id: &str) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok().filter(|p| *p > 0)?;
    if full_id.len() < 64 || !full_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = i32::try_from(fd).ok().filter(|fd| *fd >= 0)?;
    // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
    let table = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let proven = table
        .lines()
        .filter_map(|line| line.splitn(3, ':').nth(2))
        .any(|path| path.contains(full_id));
    if !proven {
        return None;
    }
    // SAFETY: pidfd_send_signal takes the pidfd, a signal, a null siginfo and flags 0.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    // ESRCH: it died between the proof and the signal, which is what was wanted.
    let died_already = std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
    (sent == 0 || died_already).then_some(pidfd)
}

/// Returns once the process behind `pidfd` has exited (its pidfd turns readable then).
async fn exited(pidfd: OwnedFd) -> std::io::Result<()> {
    // SAFETY: an OwnedFd keeps its descriptor open, and the same, for as long as it is owned.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(pidfd, tokio::io::Interest::READABLE)
    }?;
    let _ready = fd.readable().await?;
    Ok(())
}
