//! Reaching what listens inside a sandbox: TCP connections to `127.0.0.1:PORT` in its container
//! through the in-sandbox helper (`tunnel.rs`, so it works with `network: false`), HTTP requests
//! forwarded over them with streaming bodies and upgrades (`proxy.rs`), and signed preview
//! tokens (`preview.rs`).
//!
//! This module owns no routes and knows nothing of authentication by API key: the handlers in
//! `api/ports.rs` (proxy, port-forward) and `api/previews.rs` (preview links and hosts) decide
//! who may reach which sandbox and port, then call [`Ports`]. It never talks to Docker itself
//! (the tunnel goes through the [`Engine`]) and never touches the data directory itself (the
//! preview secret and revocations go through `store`).

pub mod preview;
pub mod proxy;
mod tunnel;

use std::sync::Arc;

pub use proxy::Forwarded;
pub use tunnel::Tunnel;

use crate::config::Settings;
use crate::docker::{Engine, EngineError};

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

/// Connections into sandboxes, as the sandbox user.
pub struct Ports {
    engine: Arc<dyn Engine>,
    user: String,
    previews: Option<preview::Previews>,
}

impl Ports {
    pub fn new(engine: Arc<dyn Engine>, settings: &Settings) -> Ports {
        Ports {
            engine,
            user: settings.sandbox_user.clone(),
            previews: None,
        }
    }

    /// With preview tokens signed and checked by `previews`.
    pub fn with_previews(mut self, previews: preview::Previews) -> Ports {
        self.previews = Some(previews);
        self
    }

    /// The preview tokens, when preview hosts are on.
    pub fn previews(&self) -> Option<&preview::Previews> {
        self.previews.as_ref()
    }

    /// One TCP connection to `127.0.0.1:port` in `container`.
    pub async fn connect(&self, container: &str, port: u16) -> Result<Tunnel, PortError> {
        Tunnel::open(&self.engine, container, &self.user, port).await
    }

    /// Forwards `request` to `127.0.0.1:port` in `container` (see [`proxy::forward`]).
    pub async fn proxy(
        &self,
        container: &str,
        port: u16,
        request: axum::extract::Request,
        forwarded: &Forwarded,
    ) -> Result<axum::response::Response, PortError> {
        let tunnel = self.connect(container, port).await?;
        proxy::forward(tunnel, port, request, forwarded).await
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
