//! The TCP ports something listens on in the calling thread's network namespace, asked of the
//! kernel over a `NETLINK_SOCK_DIAG` socket with a dump of listening sockets only (what `ss -ltn`
//! asks). Why not `/proc/net/tcp`: reading that file walks the host's whole table of established
//! connections (hundreds of thousands of buckets, shared by every namespace) to print a
//! sandbox's few lines, milliseconds of CPU per read; a dump restricted to the listening state
//! walks only the small listening table.
//!
//! This module owns the request, the bounded reading of the answer and its parsing. It must not
//! choose the namespace: the caller ([`super::direct`]) runs it on a thread that joined the
//! container's, after proving the namespace is the container's.

use std::collections::BTreeSet;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `SOCK_DIAG_BY_FAMILY` (linux/sock_diag.h).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `TCP_LISTEN` (the kernel's TCP states); `1 << TCP_LISTEN` is the state mask that asks for it
/// alone.
const TCP_LISTEN: u8 = 10;
/// Size of `struct nlmsghdr`.
const HEADER: usize = 16;
/// Size of `struct inet_diag_req_v2`.
const REQUEST: usize = 56;
/// Size of `struct inet_diag_msg`.
const MESSAGE: usize = 72;
/// The most answer bytes read for one family: a listener is 72 bytes plus its header, so this
/// holds far more listeners than a sandbox makes; a namespace with more is cut off, not waited on.
const MAX_ANSWER: usize = 8 << 20;
/// How long one answer may take (the kernel answers at once; this only bounds a surprise).
const RECEIVE_TIMEOUT_SECONDS: libc::time_t = 2;

/// The ports listened on over IPv4 and IPv6 (an IPv6 listener on `::` serves both) in the
/// calling thread's network namespace, ascending.
pub fn listening_ports() -> io::Result<BTreeSet<u16>> {
    let socket = open()?;
    let mut ports = dump(&socket, libc::AF_INET as u8, 1)?;
    match dump(&socket, libc::AF_INET6 as u8, 2) {
        Ok(v6) => ports.extend(v6),
        // A kernel without IPv6 has no such family to dump.
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
        Err(e) => return Err(e),
    }
    Ok(ports)
}

fn open() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a descriptor we just opened and nothing else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let timeout = libc::timeval {
        tv_sec: RECEIVE_TIMEOUT_SECONDS,
        tv_usec: 0,
    };
    // SAFETY: setsockopt with a timeval of the size we pass.
    let set = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&timeout as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if set != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(socket)
}

/// The `SOCK_DIAG_BY_FAMILY` dump request for TCP sockets of `family` in the listening state.
fn request(family: u8, sequence: u32) -> [u8; HEADER + REQUEST] {
    let mut bytes = [0u8; HEADER + REQUEST];
    bytes[0..4].copy_from_slice(&((HEADER + REQUEST) as u32).to_ne_bytes());
    bytes[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    let flags = (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16;
    bytes[6..8].copy_from_slice(&flags.to_ne_bytes());
    bytes[8..12].copy_from_slice(&sequence.to_ne_bytes());
    // inet_diag_req_v2: family, protocol, extensions (none), padding, states; the socket id
    // (all zero) matches any.
    bytes[HEADER] = family;
    bytes[HEADER + 1] = libc::IPPROTO_TCP as u8;
    bytes[HEADER + 4..HEADER + 8].copy_from_slice(&(1u32 << TCP_LISTEN).to_ne_bytes());
    bytes
}

fn dump(socket: &OwnedFd, family: u8, sequence: u32) -> io::Result<BTreeSet<u16>> {
    let request = request(family, sequence);
    // SAFETY: a zeroed sockaddr_nl is valid; the kernel is pid 0.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: sendto with a buffer and an address of the sizes we pass.
    let sent = unsafe {
        libc::sendto(
            socket.as_raw_fd(),
            request.as_ptr().cast(),
            request.len(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut ports = BTreeSet::new();
    let mut buffer = vec![0u8; 64 << 10];
    let mut read = 0usize;
    loop {
        // SAFETY: recv into a buffer we own, of the length we pass.
        let got = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        if got < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = got as usize;
        if got == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the kernel closed the diagnostics socket",
            ));
        }
        read += got;
        match parse(&buffer[..got], sequence, &mut ports)? {
            Parsed::Done => return Ok(ports),
            Parsed::More if read >= MAX_ANSWER => return Ok(ports),
            Parsed::More => {}
        }
    }
}

#[derive(Debug, PartialEq)]
enum Parsed {
    Done,
    More,
}

/// Parses one datagram of the kernel's answer into `ports`: listening sockets' local ports,
/// until `NLMSG_DONE`; an `NLMSG_ERROR` becomes its errno. Messages of other sequences are
/// skipped; a truncated or malformed message is an error, never a panic.
fn parse(datagram: &[u8], sequence: u32, ports: &mut BTreeSet<u16>) -> io::Result<Parsed> {
    let malformed = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed sock_diag answer: {what}"),
        )
    };
    let mut rest = datagram;
    while !rest.is_empty() {
        if rest.len() < HEADER {
            return Err(malformed("a header is cut short"));
        }
        let field =
            |at: usize| u32::from_ne_bytes([rest[at], rest[at + 1], rest[at + 2], rest[at + 3]]);
        let length = field(0) as usize;
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        if length < HEADER || length > rest.len() {
            return Err(malformed("a message's length is out of bounds"));
        }
        let payload = &rest[HEADER..length];
        if field(8) == sequence {
            match i32::from(kind) {
                libc::NLMSG_DONE => return Ok(Parsed::Done),
                libc::NLMSG_ERROR => {
                    let code = payload
                        .get(0..4)
                        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
                        .ok_or_else(|| malformed("an error without its code"))?;
                    return Err(io::Error::from_raw_os_error(code.saturating_neg()));
                }
                _ if kind == SOCK_DIAG_BY_FAMILY => {
                    if payload.len() < MESSAGE {
                        return Err(malformed("a socket's record is cut short"));
                    }
                    if payload[1] == TCP_LISTEN {
                        ports.insert(u16::from_be_bytes([payload[4], payload[5]]));
                    }
                }
                _ => {}
            }
        }
        // Messages are aligned to four bytes.
        let next = length.div_ceil(4) * 4;
        rest = rest.get(next..).unwrap_or_default();
    }
    Ok(Parsed::More)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(&((HEADER + payload.len()) as u32).to_ne_bytes());
        bytes.extend_from_slice(&kind.to_ne_bytes());
        bytes.extend_from_slice(&2u16.to_ne_bytes());
        bytes.extend_from_slice(&sequence.to_ne_bytes());
        bytes.extend_from_slice(&0u32.to_ne_bytes());
        bytes.extend_from_slice(payload);
        while bytes.len() % 4 != 0 {
            bytes.push(0);
        }
        bytes
    }

    fn socket(state: u8, port: u16) -> Vec<u8> {
        let mut record = vec![0u8; MESSAGE];
        record[0] = libc::AF_INET as u8;
        record[1] = state;
        record[4..6].copy_from_slice(&port.to_be_bytes());
        record
    }

    #[test]
    fn listeners_are_read_until_done() {
        let mut datagram = message(SOCK_DIAG_BY_FAMILY, 7, &socket(TCP_LISTEN, 8000));
        datagram.extend(message(SOCK_DIAG_BY_FAMILY, 7, &socket(TCP_LISTEN, 22)));
        // Not listening, and another request's: neither counts.
        datagram.extend(message(SOCK_DIAG_BY_FAMILY, 7, &socket(1, 9999)));
        datagram.extend(message(SOCK_DIAG_BY_FAMILY, 8, &socket(TCP_LISTEN, 1234)));
        let mut ports = BTreeSet::new();
        assert_eq!(parse(&datagram, 7, &mut ports).unwrap(), Parsed::More);
        assert_eq!(ports.iter().copied().collect::<Vec<_>>(), [22, 8000]);
        let done = message(libc::NLMSG_DONE as u16, 7, &0i32.to_ne_bytes());
        assert_eq!(parse(&done, 7, &mut ports).unwrap(), Parsed::Done);
    }

    #[test]
    fn an_error_answer_is_its_errno() {
        let mut payload = (-libc::EPERM).to_ne_bytes().to_vec();
        payload.extend_from_slice(&[0u8; HEADER]);
        let error = parse(
            &message(libc::NLMSG_ERROR as u16, 3, &payload),
            3,
            &mut BTreeSet::new(),
        )
        .unwrap_err();
        assert_eq!(error.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn hostile_lengths_are_errors_not_panics() {
        let mut ports = BTreeSet::new();
        // Cut short, a length past the end, a length under a header, a record cut short.
        assert!(parse(&[1, 2, 3], 1, &mut ports).is_err());
        let mut long = message(SOCK_DIAG_BY_FAMILY, 1, &socket(TCP_LISTEN, 80));
        long[0..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&long, 1, &mut ports).is_err());
        let mut short = message(SOCK_DIAG_BY_FAMILY, 1, &[]);
        short[0..4].copy_from_slice(&4u32.to_ne_bytes());
        assert!(parse(&short, 1, &mut ports).is_err());
        assert!(parse(&message(SOCK_DIAG_BY_FAMILY, 1, &[0u8; 8]), 1, &mut ports).is_err());
        assert!(ports.is_empty());
    }

    #[test]
    fn the_request_asks_for_listening_tcp_sockets_of_the_family() {
        let bytes = request(libc::AF_INET6 as u8, 9);
        assert_eq!(u32::from_ne_bytes(bytes[0..4].try_into().unwrap()), 72);
        assert_eq!(
            u16::from_ne_bytes([bytes[4], bytes[5]]),
            SOCK_DIAG_BY_FAMILY
        );
        assert_eq!(bytes[HEADER], libc::AF_INET6 as u8);
        assert_eq!(bytes[HEADER + 1], libc::IPPROTO_TCP as u8);
        assert_eq!(
            u32::from_ne_bytes(bytes[HEADER + 4..HEADER + 8].try_into().unwrap()),
            1 << 10
        );
    }

    #[test]
    fn a_listener_of_this_process_is_found() {
        // This test's own namespace: a listener made here is in the answer.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        match listening_ports() {
            Ok(ports) => assert!(ports.contains(&port), "{port} not in {ports:?}"),
            // A kernel built without socket diagnostics: the caller falls back to /proc.
            Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EPROTONOSUPPORT), "{e}"),
        }
    }
}
