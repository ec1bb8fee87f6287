//! Starting the gateway's listeners (`dns`, `proxy`, `transparent`) on the host's address of the
//! internal network, with what the connections they accept inherit (their congestion control).
//! Apart from `gateway.rs`, whose shared state the listeners read, so that no module of the
//! gateway reaches back up to the one that starts it.

use std::net::IpAddr;
use std::sync::Arc;

use super::gateway::{write, Gateway, PROXY_PORT};
use super::transparent::TRANSPARENT_PORT;
use super::{dns, nflog, proxy, transparent};

impl Gateway {
    /// Starts the DNS server (UDP and TCP 53), the proxy ([`PROXY_PORT`]) and the transparent
    /// listener ([`TRANSPARENT_PORT`]) on `address`, the
    /// host's address on the internal network, unless they run there already.
    pub async fn listen_on(&self, address: IpAddr) -> std::io::Result<()> {
        let _one_at_a_time = self.binding.lock().await;
        if self.is_listening_on(address) {
            return Ok(());
        }
        let udp = tokio::net::UdpSocket::bind((address, 53)).await?;
        let dns_tcp = tokio::net::TcpListener::bind((address, 53)).await?;
        let proxy = tokio::net::TcpListener::bind((address, PROXY_PORT)).await?;
        let redirected = tokio::net::TcpListener::bind((address, TRANSPARENT_PORT)).await?;
        for listener in [&proxy, &redirected] {
            local_congestion_control(listener);
        }
        let shared = &self.shared;
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.push(tokio::spawn(dns::serve_udp(Arc::clone(shared), udp)));
        tasks.push(tokio::spawn(dns::serve_tcp(Arc::clone(shared), dns_tcp)));
        tasks.push(tokio::spawn(proxy::serve(Arc::clone(shared), proxy)));
        tasks.push(tokio::spawn(transparent::serve(
            Arc::clone(shared),
            redirected,
        )));
        let mut group = self.refused_group.lock().unwrap_or_else(|e| e.into_inner());
        if group.is_none() {
            match nflog::bind() {
                Ok(bound) => {
                    *group = Some(bound.number);
                    tasks.push(tokio::spawn(nflog::serve(Arc::clone(shared), bound)));
                }
                Err(error) => tracing::warn!(
                    %error,
                    "egress: cannot read refused packets (NFLOG); refused UDP and ICMP go unlogged"
                ),
            }
        }
        drop(group);
        write(&shared.listening).insert(address);
        tracing::info!(%address, "egress gateway listening (dns 53, proxy {PROXY_PORT}, transparent {TRANSPARENT_PORT})");
        Ok(())
    }
}

/// The congestion control of the gateway's connections with sandboxes (a listener's is taken by
/// the connections it accepts): `cubic`, whatever the host's default. Those connections cross one
/// local bridge; a host set to `bbr` (for its connections over the internet, which the gateway's
/// upstream connections keep) paced them, and a download through the gateway sat at about 0.6
/// of the open network's throughput under runc and gVisor alike (0.9–1.0 with `cubic`; see
/// docs/benchmarks.md, "Egress"). A kernel without `cubic` keeps its default.
fn local_congestion_control(listener: &tokio::net::TcpListener) {
    use std::os::fd::AsRawFd;
    const ALGORITHM: &[u8] = b"cubic";
    // SAFETY: setsockopt on a socket this function borrows, with a buffer of the length given.
    let failed = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_CONGESTION,
            ALGORITHM.as_ptr().cast(),
            ALGORITHM.len() as libc::socklen_t,
        )
    } != 0;
    if failed {
        tracing::debug!(
            error = %std::io::Error::last_os_error(),
            "egress: the gateway's sandbox connections keep the host's congestion control"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    fn congestion_control(socket: &impl AsRawFd) -> String {
        let mut name = [0u8; 16];
        let mut length = name.len() as libc::socklen_t;
        // SAFETY: getsockopt into a buffer of the length given.
        let status = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_CONGESTION,
                name.as_mut_ptr().cast(),
                &mut length,
            )
        };
        assert_eq!(status, 0, "{}", std::io::Error::last_os_error());
        let name = &name[..length as usize];
        String::from_utf8_lossy(name.split(|b| *b == 0).next().unwrap_or_default()).into_owned()
    }

    #[tokio::test]
    async fn a_sandbox_connection_takes_cubic_from_its_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        super::local_congestion_control(&listener);
        let address = listener.local_addr().unwrap();
        let (accepted, _client) =
            tokio::join!(listener.accept(), tokio::net::TcpStream::connect(address));
        let (accepted, _) = accepted.unwrap();
        assert_eq!(congestion_control(&accepted), "cubic");
    }
}
