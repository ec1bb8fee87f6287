//! Reaching what listens inside a sandbox: TCP connections to `127.0.0.1:PORT` in its container,
//! made from this host inside a runc container's network namespace (`direct.rs`) or relayed by
//! the in-sandbox helper (`tunnel.rs`; both work with `network: false`), HTTP requests
//! forwarded over them with streaming bodies and upgrades (`proxy.rs`), and signed preview
//! tokens (`preview.rs`).
//!
//! This module owns no routes and knows nothing of authentication by API key: the handlers in
//! `api/ports.rs` (proxy, port-forward) and `api/previews.rs` (preview links and hosts) decide
//! who may reach which sandbox and port, then call [`Ports`]. It never talks to Docker itself
//! (the tunnel goes through the [`Engine`]) and never touches the data directory itself (the
//! preview secret and revocations go through `store`).

mod direct;
pub mod preview;
pub mod proxy;
mod sock_diag;
mod tunnel;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
pub use direct::{listening_ports, read_net_table, DirectError};
pub use proxy::Forwarded;
pub use tunnel::Tunnel;

use crate::config::Settings;
use crate::docker::{is_gvisor, Engine, EngineError};

#[derive(Debug, thiserror::Error)]
pub enum PortError {
    #[error("port must be an integer from 1 to 65535, got {0:?}")]
    BadPort(String),
    /// The connection was refused inside the sandbox.
    #[error("nothing listens on port {port} in the sandbox ({why})")]
    NotListening { port: u16, why: String },
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The relay broke or said something unexpected.
    #[error("the connection into the sandbox failed: {0}")]
    Relay(String),
    /// The sandbox's server answered something that is not HTTP, or broke off.
    #[error("the server on port {port} in the sandbox failed: {why}")]
    Upstream { port: u16, why: String },
}

/// A port from a path or query: 1-65535.
pub fn parse_port(text: &str) -> Result<u16, PortError> {
    text.parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| PortError::BadPort(text.to_string()))
}

/// How long an idle kept-alive connection into a sandbox is kept for the next request.
const IDLE_KEEP: Duration = Duration::from_secs(15);
/// Idle connections kept per sandbox container and port.
const IDLE_PER_PORT: usize = 8;

/// Idle kept-alive connections by (container, port), each with when it was kept.
type IdleConnections = HashMap<(String, u16), Vec<(Instant, proxy::Sender)>>;

fn lock(pool: &Mutex<IdleConnections>) -> std::sync::MutexGuard<'_, IdleConnections> {
    // A panic while holding this lock leaves plain data behind; keep going.
    pool.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops closed and stale idle connections (dropping one closes it).
fn sweep(idle: &mut IdleConnections) {
    idle.retain(|_, senders| {
        senders.retain(|(at, s)| !s.is_closed() && at.elapsed() < IDLE_KEEP);
        !senders.is_empty()
    });
}

/// Connections into sandboxes, as the sandbox user.
pub struct Ports {
    engine: Arc<dyn Engine>,
    user: String,
    previews: Option<preview::Previews>,
    /// Signs and checks the access tokens of E2B's envd (`api/e2b`): tokens of port 0, which no
    /// preview host can name, bound to one sandbox's name and uid. A secret of this process
    /// unless the server gives the data directory's ([`Ports::with_envd_tokens`]).
    envd_tokens: preview::Previews,
    /// Whether connections may be made from this host in the container's network namespace;
    /// turned off for good the first time the host refuses it (no privilege for it).
    direct: AtomicBool,
    /// Kept-alive HTTP connections by (container, port), so that a request need not start a
    /// relay (one `docker exec`) when the sandbox's server keeps connections open.
    idle: Arc<Mutex<IdleConnections>>,
}

impl Ports {
    pub fn new(engine: Arc<dyn Engine>, settings: &Settings) -> Ports {
        Ports {
            engine,
            user: settings.sandbox_user.clone(),
            previews: None,
            envd_tokens: preview::Previews::in_memory(rand::random()),
            direct: AtomicBool::new(settings.direct_ports),
            idle: Arc::default(),
        }
    }

    /// With preview tokens signed and checked by `previews`.
    pub fn with_previews(mut self, previews: preview::Previews) -> Ports {
        self.previews = Some(previews);
        self
    }

    /// With envd access tokens signed by `tokens` (the data directory's secret, so that they
    /// survive a restart of the server).
    pub fn with_envd_tokens(mut self, tokens: preview::Previews) -> Ports {
        self.envd_tokens = tokens;
        self
    }

    /// The signer of E2B envd access tokens.
    pub fn envd_tokens(&self) -> &preview::Previews {
        &self.envd_tokens
    }

    /// The preview tokens, when preview hosts are on.
    pub fn previews(&self) -> Option<&preview::Previews> {
        self.previews.as_ref()
    }

    /// One TCP connection to `127.0.0.1:port` in `container`: made directly where it can be,
    /// relayed by the helper otherwise.
    pub async fn connect(&self, container: &str, port: u16) -> Result<Tunnel, PortError> {
        if port == 0 {
            return Err(PortError::BadPort(port.to_string()));
        }
        if self.direct.load(Ordering::Relaxed) {
            if let Some(tunnel) = self.connect_direct(container, port).await? {
                return Ok(tunnel);
            }
        }
        Tunnel::relay(&self.engine, container, &self.user, port).await
    }

    /// A connection made from this host, `None` where that is not possible for this container.
    async fn connect_direct(
        &self,
        container: &str,
        port: u16,
    ) -> Result<Option<Tunnel>, PortError> {
        let Some(details) = self.engine.inspect_container(container).await? else {
            return Ok(None);
        };
        if !details.running || details.paused || details.runtime.as_deref().is_none_or(is_gvisor) {
            return Ok(None);
        }
        let (pid, id) = (details.pid, details.id.clone());
        let made = tokio::task::spawn_blocking(move || direct::connect(pid, &id, port))
            .await
            .map_err(|e| PortError::Relay(e.to_string()))?;
        match made.and_then(|stream| {
            stream
                .set_nodelay(true)
                .and_then(|()| stream.set_nonblocking(true))
                .and_then(|()| tokio::net::TcpStream::from_std(stream))
                .map_err(|e| direct::DirectError::Unavailable(e.to_string()))
        }) {
            Ok(stream) => Ok(Some(Tunnel::direct(stream))),
            Err(direct::DirectError::Refused) => Err(PortError::NotListening {
                port,
                why: "connection refused".into(),
            }),
            Err(direct::DirectError::Unavailable(why)) => {
                if why.starts_with("setns") {
                    // The host will not let this server join namespaces: relay from now on.
                    self.direct.store(false, Ordering::Relaxed);
                    tracing::info!("sandbox ports are relayed through docker exec: {why}");
                } else {
                    tracing::debug!(container, "no direct connection, relaying: {why}");
                }
                Ok(None)
            }
        }
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, IdleConnections> {
        lock(&self.idle)
    }

    /// An idle connection to `key` ready for a request; closed and stale ones are dropped.
    fn take_idle(&self, key: &(String, u16)) -> Option<proxy::Sender> {
        let mut idle = self.idle();
        let senders = idle.get_mut(key)?;
        senders.retain(|(at, s)| !s.is_closed() && at.elapsed() < IDLE_KEEP);
        let ready = senders.iter().position(|(_, s)| s.is_ready());
        ready.map(|i| senders.swap_remove(i).1)
    }

    /// Keeps `sender` for the next request to `key` (it takes one once its answer has ended).
    fn keep(&self, key: (String, u16), sender: proxy::Sender) {
        let mut idle = self.idle();
        sweep(&mut idle);
        if idle.is_empty() {
            // The first idle connection starts a sweeper, which ends once none is left: an
            // idle connection holds a relay inside the sandbox, so none outlives IDLE_KEEP by
            // much even when no request comes again.
            let pool = Arc::clone(&self.idle);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(IDLE_KEEP / 2).await;
                    let mut idle = lock(&pool);
                    sweep(&mut idle);
                    if idle.is_empty() {
                        return;
                    }
                }
            });
        }
        let senders = idle.entry(key).or_default();
        if senders.len() >= IDLE_PER_PORT {
            senders.remove(0);
        }
        senders.push((Instant::now(), sender));
    }

    /// Forwards `request` to `127.0.0.1:port` in `container` and returns the sandbox's answer,
    /// over a kept-alive connection when one is free (upgrades always get their own).
    pub async fn proxy(
        &self,
        container: &str,
        port: u16,
        request: axum::extract::Request,
        forwarded: &Forwarded,
    ) -> Result<axum::response::Response, PortError> {
        let upstream = |why: String| PortError::Upstream { port, why };
        let proxy::Prepared {
            mut outgoing,
            client_upgrade,
        } = proxy::prepare(request, port, forwarded)?;
        let key = (container.to_string(), port);
        if client_upgrade.is_none() {
            while let Some(mut sender) = self.take_idle(&key) {
                match sender.try_send_request(outgoing).await {
                    Ok(answer) => {
                        self.keep(key, sender);
                        return proxy::finish(answer, None, port, None);
                    }
                    // The connection closed before the request went out: try another.
                    Err(mut e) => match e.take_message() {
                        Some(request) => outgoing = request,
                        None => return Err(upstream(e.into_error().to_string())),
                    },
                }
            }
        }
        let tunnel = self
            .connect(container, port)
            .await?
            .counting(forwarded.activity.clone());
        let mut sender = proxy::handshake(tunnel, port).await?;
        let answer = sender
            .send_request(outgoing)
            .await
            .map_err(|e| upstream(e.to_string()))?;
        if client_upgrade.is_none() && answer.status() != StatusCode::SWITCHING_PROTOCOLS {
            self.keep(key, sender);
        }
        proxy::finish(answer, client_upgrade, port, forwarded.stop.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_one_to_65535() {
        assert_eq!(parse_port("8000").unwrap(), 8000);
        for bad in ["0", "65536", "", "-1", "80a", "1e3"] {
            assert!(parse_port(bad).is_err(), "{bad}");
        }
    }
}
