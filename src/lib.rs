//! agent-sandbox: disposable, hardened Docker sandboxes for AI agents, run as a Kubernetes-style
//! declarative controller.
//!
//! Where to start reading:
//!
//! - [`resource`]: the `Sandbox`, `Snapshot`, `Fork` and `SandboxPool` documents, their schemas,
//!   and YAML (the only place YAML is parsed).
//! - [`store`]: desired state on disk (the data directory and watched folders) and change events.
//! - [`controller`]: the reconcile loop that drives Docker to match the store, and writes status:
//!   one reconcile function per kind, a work queue, garbage collection.
//! - [`docker`]: the only code that talks to Docker, behind the [`docker::Engine`] trait.
//! - [`dataplane`]: exec and file I/O against a running sandbox, through the in-sandbox helper
//!   ([`helper_protocol`] is the wire format; the helper itself lives in `helper/`).
//! - [`archive`]: validation of snapshot tars before anything is restored.
//! - [`api`]: the HTTP server: the resource API, the `/v1` wire contract, health and OpenAPI.
//! - [`cli`]: the command line (`serve`, kubectl-style client commands, `mcp`).
//! - [`gc`]: `agent-sandbox gc`, removing labeled objects no running server claims, and the
//!   heartbeat by which a running server claims its own.
//! - [`config`]: settings; [`server`]: wiring it all together for `agent-sandbox serve`.
//!
//! Data flows one way: the API and folders write the store; the controller reads the store and
//! writes Docker and status; exec and file calls go straight to a sandbox's container.

pub mod api;
pub mod archive;
pub mod cli;
pub mod config;
pub mod controller;
pub mod dataplane;
pub mod docker;
pub mod gc;
pub mod helper_binary;
pub mod helper_protocol;
pub mod resource;
pub mod server;
pub mod store;
