//! A TCP connection to `127.0.0.1:PORT` inside a runc container, made from this host: a
//! short-lived thread joins the container's network namespace, connects, and leaves with the
//! socket (a socket stays in the namespace it was made in). No `docker exec`, no relay process
//! in the sandbox: the bytes move between two sockets of one kernel. The same thread, asking the
//! kernel's socket diagnostics instead, lists the ports listened on there.
//!
//! This module owns only that connect and that list. It must not be used for gVisor (a runsc
//! sandbox's sockets live in its own network stack, not in the namespace Docker made) and it
//! proves that the namespace is the container's before using it: the process Docker named must
//! belong to the container's cgroup, which a remote daemon's PID or a reused PID does not. Where
//! it cannot (no CAP_SYS_ADMIN, another PID namespace, a remote daemon) it says so and the caller
//! relays.

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::Duration;

/// How long a connect to the sandbox's loopback may take (it is local: refused or made at once).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why no direct connection was made.
#[derive(Debug, thiserror::Error)]
pub enum DirectError {
    /// Nothing listens on the port: the answer is final, a relay would meet the same.
    #[error("connection refused")]
    Refused,
    /// The direct path is not possible here; the caller relays instead.
    #[error("{0}")]
    Unavailable(String),
}

/// Connects to `127.0.0.1:port` in the network namespace of `pid`, the host PID of container
/// `container_id`'s first process. Blocks for at most [`CONNECT_TIMEOUT`]; call it off the async
/// runtime's threads.
pub fn connect(pid: i64, container_id: &str, port: u16) -> Result<TcpStream, DirectError> {
    in_namespace(pid, container_id, "port-connect", move || {
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        match TcpStream::connect_timeout(&address, CONNECT_TIMEOUT) {
            Ok(stream) => Ok(stream),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Err(DirectError::Refused),
            Err(e) => Err(unavailable("connect", e)),
        }
    })
}

/// The TCP ports listened on in the network namespace of `pid`, the host PID of container
/// `container_id`'s first process, asked of the kernel's socket diagnostics from inside that
/// namespace (see [`super::sock_diag`] for why not `/proc/net/tcp`). Proven the container's as
/// [`connect`] does. Blocks briefly; call it off the async runtime's threads.
pub fn listening_ports(pid: i64, container_id: &str) -> Result<BTreeSet<u16>, DirectError> {
    in_namespace(pid, container_id, "port-listeners", || {
        super::sock_diag::listening_ports().map_err(|e| unavailable("sock_diag", e))
    })
}

fn unavailable(what: &str, e: io::Error) -> DirectError {
    DirectError::Unavailable(format!("{what}: {e}"))
}

/// Runs `work` on a thread of its own that joined the network namespace of `pid` once `pid` is
/// proven a process of container `container_id` (no process at all is `Unavailable` at once).
/// A failed join is `Unavailable("setns: …")`.
fn in_namespace<T: Send + 'static>(
    pid: i64,
    container_id: &str,
    thread: &str,
    work: impl FnOnce() -> Result<T, DirectError> + Send + 'static,
) -> Result<T, DirectError> {
    if pid <= 0 || container_id.len() < 12 {
        return Err(DirectError::Unavailable(
            "the container has no process".into(),
        ));
    }
    // The namespace first, then the proof that the process was the container's: a PID reused
    // between the two fails the proof, and the open file keeps the namespace it names.
    let namespace =
        File::open(format!("/proc/{pid}/ns/net")).map_err(|e| unavailable("netns", e))?;
    is_the_containers(pid, container_id)?;
    // A thread of its own: joining a namespace changes the calling thread for good, and this
    // one ends with the work.
    let joined = std::thread::Builder::new()
        .name(thread.into())
        .spawn(move || {
            // SAFETY: setns on this thread only, with a descriptor we hold open.
            if unsafe { libc::setns(namespace.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(unavailable("setns", io::Error::last_os_error()));
            }
            work()
        })
        .map_err(|e| unavailable("thread", e))?;
    joined
        .join()
        .map_err(|_| DirectError::Unavailable(format!("the {thread} thread panicked")))?
}

/// Whether `pid` is a process of container `container_id` on this host: its cgroup names it.
fn is_the_containers(pid: i64, container_id: &str) -> Result<(), DirectError> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .map_err(|e| DirectError::Unavailable(format!("cgroup: {e}")))?;
    if !cgroups.contains(container_id) {
        return Err(DirectError::Unavailable(
            "the process is not the container's on this host".into(),
        ));
    }
    Ok(())
}

/// The text (at most `max` bytes) of `/proc/<pid>/net/<table>` (`tcp`, `tcp6`): the socket table
/// of the network namespace of container `container_id`, whose first process is `pid`, read
/// from this host without entering the container (nothing runs in it, so a frozen container
/// costs nothing either). Proven the container's as [`connect`] does.
pub fn read_net_table(
    pid: i64,
    container_id: &str,
    table: &str,
    max: usize,
) -> Result<String, DirectError> {
    use std::io::Read;
    if pid <= 0 || container_id.len() < 12 || !matches!(table, "tcp" | "tcp6") {
        return Err(DirectError::Unavailable("no such table".into()));
    }
    let file = File::open(format!("/proc/{pid}/net/{table}"))
        .map_err(|e| DirectError::Unavailable(format!("{table}: {e}")))?;
    is_the_containers(pid, container_id)?;
    let mut text = String::new();
    file.take(max as u64)
        .read_to_string(&mut text)
        .map_err(|e| DirectError::Unavailable(format!("{table}: {e}")))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_outside_the_container_is_refused() {
        // This test's own process is in no container of that ID.
        let me = i64::from(std::process::id());
        let err = connect(me, "0123456789abcdef0123456789abcdef", 80).unwrap_err();
        assert!(
            matches!(err, DirectError::Unavailable(ref why) if why.contains("not the container's")),
            "{err}"
        );
    }

    #[test]
    fn a_table_of_a_process_outside_the_container_is_not_read() {
        let me = i64::from(std::process::id());
        let id = "0123456789abcdef0123456789abcdef";
        assert!(read_net_table(me, id, "tcp", 1 << 20).is_err());
        assert!(read_net_table(me, id, "../status", 1 << 20).is_err());
        let refused = listening_ports(me, id).unwrap_err();
        assert!(
            matches!(refused, DirectError::Unavailable(ref why) if why.contains("not the container's")),
            "{refused}"
        );
        assert!(listening_ports(0, id).is_err());
    }

    #[test]
    fn no_process_no_connection() {
        for pid in [0, -1] {
            assert!(matches!(
                connect(pid, "0123456789abcdef", 80),
                Err(DirectError::Unavailable(_))
            ));
        }
        let gone = connect(i64::from(i32::MAX), "0123456789abcdef", 80).unwrap_err();
        assert!(
            matches!(gone, DirectError::Unavailable(ref why) if why.starts_with("netns")),
            "{gone}"
        );
    }
}
