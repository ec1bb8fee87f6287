//! `relay PORT`: one TCP connection to `127.0.0.1:PORT` inside the sandbox, carried over this
//! process's stdin and stdout, so that the server, which can only `docker exec` into a sandbox
//! (one with no network at all, too), can reach what listens there. It writes
//! [`relay::CONNECTED`] once connected, then copies bytes unchanged both ways and exits as soon
//! as either direction ends: a client that went away (the server dropped the exec, so stdin
//! ended) must not leave the sandbox's server sending into nothing. It interprets nothing.
//!
//! Only TCP on the loopback address is reachable this way; the helper's own sockets (the
//! supervisor's) are abstract Unix sockets, which no port names.

use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpStream};

use helper_protocol::relay;

/// The port a `relay` argument names: 1-65535 only.
pub fn parse_port(arg: &str) -> Option<u16> {
    arg.parse::<u16>().ok().filter(|p| *p != 0)
}

pub fn relay_main(args: &[String]) -> i32 {
    let [arg] = args else {
        eprintln!("usage: agent-sandbox-helper relay PORT");
        return relay::EXIT_USAGE;
    };
    let Some(port) = parse_port(arg) else {
        eprintln!("agent-sandbox-helper: port must be from 1 to 65535, got {arg:?}");
        return relay::EXIT_USAGE;
    };
    let stream = match TcpStream::connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("connect to 127.0.0.1:{port}: {e}");
            return relay::EXIT_REFUSED;
        }
    };
    let _ = stream.set_nodelay(true);
    let Ok(to_socket) = stream.try_clone() else {
        return 1;
    };
    // When the client is gone, close the connection (the peer sees it) before ending.
    crate::splice::splice(&[relay::CONNECTED], stream, to_socket, |s| {
        let _ = s.shutdown(Shutdown::Both);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_outside_the_range_are_refused() {
        assert_eq!(parse_port("1"), Some(1));
        assert_eq!(parse_port("65535"), Some(65535));
        for bad in ["0", "65536", "-1", "", "80x", " 80"] {
            assert_eq!(parse_port(bad), None, "{bad:?}");
        }
    }
}
