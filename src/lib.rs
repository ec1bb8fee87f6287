//! agent-sandbox: disposable, hardened Docker sandboxes for AI agents, run as a Kubernetes-style
//! declarative controller.
//!
//! Where to start reading:
//!
//! - [`resource`]: the `Sandbox`, `Snapshot` and `Fork` documents, their schemas, and YAML.
//! - [`store`]: desired state on disk (the data directory and watched folders) and change events.
//! - [`controller`]: the reconcile loop that drives Docker to match the store, and writes status.
//! - [`docker`]: the only code that talks to Docker, behind the [`docker::Engine`] trait.
//! - [`api`]: the HTTP server: the resource API, the `/v1` wire contract, health and OpenAPI.
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
pub mod helper_binary;
pub mod helper_protocol;
pub mod resource;
pub mod server;
pub mod store;
