//! The gateway's reader of refused packets: the host's firewall (`crate::firewall`) rejects UDP
//! (but DNS to the gateway) and ICMP from the policed bridge, and copies the head of each such
//! packet to an NFLOG group; this module binds that group over netlink (`NETLINK_NETFILTER`),
//! reads the packets' addresses, and records each as a refused `udp` or `icmp` decision of the
//! sandbox that sent it. It never answers or lets anything through: the firewall has already
//! refused the packet. A group one process holds cannot be bound by another, so the gateway takes
//! the first free group of a small range and the firewall's rules name it.

use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use tokio::io::unix::AsyncFd;

use super::gateway::{Decision, Shared};

/// The first NFLOG group tried; [`GROUPS`] are tried in turn.
const FIRST_GROUP: u16 = 0x4153;
const GROUPS: u16 = 64;
/// Bytes of each packet copied: the IP header and the ports.
const COPY_RANGE: u32 = 96;

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_ULOG: u16 = 4;
const NFULNL_MSG_PACKET: u16 = 0;
const NFULNL_MSG_CONFIG: u16 = 1;
const NFULA_CFG_CMD: u16 = 1;
const NFULA_CFG_MODE: u16 = 2;
const NFULNL_CFG_CMD_BIND: u8 = 1;
const NFULNL_COPY_PACKET: u8 = 2;
const NFULA_PAYLOAD: u16 = 9;
const NLMSG_ERROR: u16 = 2;

/// A bound NFLOG group.
pub(super) struct Group {
    pub number: u16,
    socket: OwnedFd,
}

fn attribute(out: &mut Vec<u8>, kind: u16, payload: &[u8]) {
    let length = 4 + payload.len();
    out.extend_from_slice(&(length as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(payload);
    out.resize(out.len() + (4 - length % 4) % 4, 0);
}

/// A config message for `group` carrying `attributes`.
fn config(group: u16, sequence: u32, attributes: &[u8]) -> Vec<u8> {
    let length = 16 + 4 + attributes.len();
    let mut message = Vec::with_capacity(length);
    message.extend_from_slice(&(length as u32).to_ne_bytes());
    message.extend_from_slice(&((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG).to_ne_bytes());
    // NLM_F_REQUEST | NLM_F_ACK
    message.extend_from_slice(&(1u16 | 4).to_ne_bytes());
    message.extend_from_slice(&sequence.to_ne_bytes());
    message.extend_from_slice(&0u32.to_ne_bytes());
    message.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    message.extend_from_slice(&group.to_be_bytes());
    message.extend_from_slice(attributes);
    message
}

/// Sends `message` and waits for its acknowledgement: `Ok` or the kernel's errno.
fn request(socket: &OwnedFd, message: &[u8]) -> std::io::Result<()> {
    // SAFETY: the buffer is valid for its length; the descriptor is open.
    let sent = unsafe {
        libc::send(
            socket.as_raw_fd(),
            message.as_ptr().cast(),
            message.len(),
            0,
        )
    };
    if sent < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buffer = [0u8; 4096];
    // SAFETY: as above; the socket is still blocking here.
    let read = unsafe {
        libc::recv(
            socket.as_raw_fd(),
            buffer.as_mut_ptr().cast(),
            buffer.len(),
            0,
        )
    };
    if read < 20 {
        return Err(std::io::Error::last_os_error());
    }
    let kind = u16::from_ne_bytes([buffer[4], buffer[5]]);
    if kind != NLMSG_ERROR {
        return Ok(());
    }
    let code = i32::from_ne_bytes([buffer[16], buffer[17], buffer[18], buffer[19]]);
    if code == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(-code))
    }
}

/// Binds the first free group of the range, copying packet heads.
pub(super) fn bind() -> std::io::Result<Group> {
    let mut last = std::io::Error::from_raw_os_error(libc::EBUSY);
    for number in FIRST_GROUP..FIRST_GROUP + GROUPS {
        // SAFETY: plain socket creation; the descriptor is owned right after.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_NETFILTER,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new descriptor no one else owns.
        let socket = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: a zeroed sockaddr_nl is valid; the kernel picks the port id.
        let bound = unsafe {
            let mut address: libc::sockaddr_nl = std::mem::zeroed();
            address.nl_family = libc::AF_NETLINK as u16;
            libc::bind(
                socket.as_raw_fd(),
                (&address as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            )
        };
        if bound < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut command = Vec::new();
        attribute(&mut command, NFULA_CFG_CMD, &[NFULNL_CFG_CMD_BIND]);
        match request(&socket, &config(number, 1, &command)) {
            Ok(()) => {}
            Err(error) => {
                last = error;
                continue;
            }
        }
        let mut mode = Vec::new();
        let mut payload = COPY_RANGE.to_be_bytes().to_vec();
        payload.extend_from_slice(&[NFULNL_COPY_PACKET, 0]);
        attribute(&mut mode, NFULA_CFG_MODE, &payload);
        request(&socket, &config(number, 2, &mode))?;
        // SAFETY: fcntl on an open descriptor.
        unsafe {
            let flags = libc::fcntl(socket.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(socket.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        return Ok(Group { number, socket });
    }
    Err(last)
}

/// A refused packet as far as the log says: who sent it, where to, and how.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Refused {
    pub source: IpAddr,
    pub destination: IpAddr,
    pub protocol: &'static str,
    pub port: Option<u16>,
}

/// The refused packets in one netlink read.
pub(super) fn parse(buffer: &[u8]) -> Vec<Refused> {
    let mut found = Vec::new();
    let mut rest = buffer;
    while rest.len() >= 16 {
        let length = u32::from_ne_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if length < 16 || length > rest.len() {
            break;
        }
        let kind = u16::from_ne_bytes([rest[4], rest[5]]);
        if kind == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET && length >= 20 {
            let mut attributes = &rest[20..length];
            while attributes.len() >= 4 {
                let size = u16::from_ne_bytes([attributes[0], attributes[1]]) as usize;
                let kind = u16::from_ne_bytes([attributes[2], attributes[3]]) & 0x3fff;
                if size < 4 || size > attributes.len() {
                    break;
                }
                if kind == NFULA_PAYLOAD {
                    if let Some(refused) = packet(&attributes[4..size]) {
                        found.push(refused);
                    }
                }
                attributes = &attributes[((size + 3) & !3).min(attributes.len())..];
            }
        }
        rest = &rest[((length + 3) & !3).min(rest.len())..];
    }
    found
}

/// The addresses of an IPv4 packet.
fn packet(bytes: &[u8]) -> Option<Refused> {
    if bytes.len() < 20 || bytes[0] >> 4 != 4 {
        return None;
    }
    let header = usize::from(bytes[0] & 0x0f) * 4;
    let source = Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]);
    let destination = Ipv4Addr::new(bytes[16], bytes[17], bytes[18], bytes[19]);
    let (protocol, port) = match bytes[9] {
        1 => ("icmp", None),
        17 => (
            "udp",
            bytes
                .get(header + 2..header + 4)
                .map(|p| u16::from_be_bytes([p[0], p[1]])),
        ),
        _ => return None,
    };
    Some(Refused {
        source: IpAddr::V4(source),
        destination: IpAddr::V4(destination),
        protocol,
        port,
    })
}

/// Reads `group` until the task is aborted, recording each refused packet.
pub(super) async fn serve(shared: Arc<Shared>, group: Group) {
    // SAFETY: the descriptor is owned by the value registered, and closed only when it drops.
    let Ok(socket) = (unsafe { AsyncFd::register(group.socket) }) else {
        return;
    };
    let mut buffer = vec![0u8; 65536];
    loop {
        let Ok(mut ready) = socket.readable().await else {
            return;
        };
        // SAFETY: the buffer is valid for its length; the descriptor is open and non-blocking.
        let read = unsafe {
            libc::recv(
                socket.get_ref().as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                0,
            )
        };
        if read < 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::WouldBlock {
                ready.clear_ready();
            } else {
                // ENOBUFS: the kernel dropped messages while the gateway was behind.
                tracing::debug!(%error, "egress: the refused-packet log skipped some");
            }
            continue;
        }
        for refused in parse(&buffer[..read as usize]) {
            let Some(tenant) = shared.tenant(refused.source).await else {
                continue;
            };
            let rule = match refused.protocol {
                "udp" => "udp is not allowed (only DNS to the gateway)",
                _ => "icmp is not allowed",
            };
            let host = refused.destination.to_string();
            shared.record(
                &tenant.sandbox,
                Decision::new(
                    refused.protocol,
                    &host,
                    Some(refused.destination),
                    refused.port,
                    false,
                    rule.to_string(),
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(payload: &[u8]) -> Vec<u8> {
        let mut attributes = Vec::new();
        attribute(&mut attributes, 4, &7u32.to_be_bytes());
        attribute(&mut attributes, NFULA_PAYLOAD, payload);
        let mut out = config(0x4153, 0, &attributes);
        out[4..6].copy_from_slice(&((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET).to_ne_bytes());
        out
    }

    #[test]
    fn refused_udp_and_icmp_packets_are_read() {
        let mut udp = vec![0x45, 0, 0, 40, 0, 0, 0, 0, 64, 17, 0, 0];
        udp.extend_from_slice(&[172, 30, 0, 2, 198, 51, 100, 7]);
        udp.extend_from_slice(&[0x9c, 0x40, 0x00, 0x35, 0, 8, 0, 0]);
        let mut icmp = udp.clone();
        icmp[9] = 1;
        let mut both = message(&udp);
        both.extend(message(&icmp));
        let found = parse(&both);
        assert_eq!(
            found,
            [
                Refused {
                    source: "172.30.0.2".parse().unwrap(),
                    destination: "198.51.100.7".parse().unwrap(),
                    protocol: "udp",
                    port: Some(53),
                },
                Refused {
                    source: "172.30.0.2".parse().unwrap(),
                    destination: "198.51.100.7".parse().unwrap(),
                    protocol: "icmp",
                    port: None,
                }
            ]
        );
        assert!(parse(&both[..30]).is_empty());
        assert!(parse(&message(&[0x60; 40])).is_empty());
    }
}
