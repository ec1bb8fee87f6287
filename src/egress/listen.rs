//! Starting the gateway's listeners (`dns`, `proxy`, `transparent`) on the host's address of the internal
//! network. Apart from `gateway.rs`, whose shared state the listeners read, so that no module of
//! the gateway reaches back up to the one that starts it.

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
