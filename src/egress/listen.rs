//! Starting the gateway's listeners (`dns`, `proxy`) on the host's address of the internal
//! network. Apart from `gateway.rs`, whose shared state the listeners read, so that no module of
//! the gateway reaches back up to the one that starts it.

use std::net::IpAddr;
use std::sync::Arc;

use super::gateway::{write, Gateway, PROXY_PORT};
use super::{dns, proxy};

impl Gateway {
    /// Starts the DNS server (UDP and TCP 53) and the proxy ([`PROXY_PORT`]) on `address`, the
    /// host's address on the internal network, unless they run there already.
    pub async fn listen_on(&self, address: IpAddr) -> std::io::Result<()> {
        let _one_at_a_time = self.binding.lock().await;
        if self.is_listening_on(address) {
            return Ok(());
        }
        let udp = tokio::net::UdpSocket::bind((address, 53)).await?;
        let dns_tcp = tokio::net::TcpListener::bind((address, 53)).await?;
        let proxy = tokio::net::TcpListener::bind((address, PROXY_PORT)).await?;
        let shared = &self.shared;
        let mut tasks = self.tasks.lock().unwrap_or_else(|e| e.into_inner());
        tasks.push(tokio::spawn(dns::serve_udp(Arc::clone(shared), udp)));
        tasks.push(tokio::spawn(dns::serve_tcp(Arc::clone(shared), dns_tcp)));
        tasks.push(tokio::spawn(proxy::serve(Arc::clone(shared), proxy)));
        write(&shared.listening).insert(address);
        tracing::info!(%address, "egress gateway listening (dns 53, proxy {PROXY_PORT})");
        Ok(())
    }
}
