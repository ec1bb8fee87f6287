//! Egress policy: what a sandbox with `spec.egress` (or the server's default list) may reach.
//! Such sandboxes sit on an internal Docker network with no route out of the host (the
//! controller puts them there); this module owns the decisions on their lookups and connections
//! and the gateway that carries out the allowed ones: a DNS server, an HTTP proxy and a transparent
//! listener (for TCP the host's firewall redirects to it) on the host's address of that network. The controller tells the gateway each sandbox's list; the
//! gateway asks the `docker` module who holds a source address and writes its decisions through
//! the `store`. It never touches Docker or the data directory itself.

mod bounds;
mod ca;
mod dns;
mod gateway;
mod http1;
mod inject;
mod intercept;
mod listen;
mod nflog;
pub mod policy;
mod proxy;
mod relay;
mod resolve;
mod transparent;

pub use ca::{Authority, CaError, CA_MOUNT};
pub use gateway::{
    Decision, DecisionObserver, Gateway, GatewaySettings, SecretBinding, PROXY_PORT,
};
pub use inject::placeholder;
pub use policy::{decide_address, decide_name, protected_block, Protected, Verdict};
pub use transparent::TRANSPARENT_PORT;
