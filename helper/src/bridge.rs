//! `bridge`: relays this process's stdin to the supervisor's socket and the socket back to stdout,
//! so that the server, which can only `docker exec` into a sandbox, can talk to the supervisor.
//! Once connected it writes [`SUPERVISOR_VERSION`] (four bytes, big-endian) to stdout, so the
//! server can tell a working bridge from a container without a supervisor; then it copies bytes
//! unchanged both ways and exits as soon as either direction ends. It interprets nothing.

use std::os::unix::net::UnixStream;

use helper_protocol::supervisor::SUPERVISOR_VERSION;

use crate::supervisor::address;

/// Exit code when the supervisor cannot be reached.
pub const EXIT_NO_SUPERVISOR: i32 = 3;

pub fn bridge() -> i32 {
    let stream = match address().and_then(|a| UnixStream::connect_addr(&a)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("agent-sandbox-helper: the process supervisor is not reachable: {e}");
            return EXIT_NO_SUPERVISOR;
        }
    };
    let Ok(to_socket) = stream.try_clone() else {
        return 1;
    };
    crate::splice::splice(&SUPERVISOR_VERSION.to_be_bytes(), stream, to_socket, |_| {})
}
