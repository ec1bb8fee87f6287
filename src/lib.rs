//! agent-sandbox: disposable, hardened Docker sandboxes for AI agents, run as a Kubernetes-style
//! declarative controller.
//!
//! Where to start reading:
//!
//! - [`resource`]: the `Sandbox`, `Snapshot`, `Fork`, `SandboxPool` and `SandboxTemplate` documents, their schemas,
//!   and YAML (the only place YAML is parsed).
//! - [`store`]: desired state on disk (the data directory and watched folders) and change events;
//!   the only code that touches the data directory. A folder manifest that disappears is pruned
//!   in `store/index.rs`; snapshot data files live in `store/snapshots.rs`.
//! - [`controller`]: the reconcile loop that drives Docker to match the store, and writes status:
//!   one reconcile function per kind, a work queue, garbage collection. Its module doc maps every
//!   file: a rollback is `controller/restore.rs`, a pool claim `controller/claims.rs`.
//! - [`docker`]: the only code that talks to Docker, behind the [`docker::Engine`] trait (what an
//!   engine offers beyond the basics: [`docker::EngineCapabilities`]).
//! - [`dataplane`]: exec and file I/O against a running sandbox, through the in-sandbox helper.
//!   Its wire format is the `helper_protocol` crate (`crates/helper-protocol/`, std only, shared
//!   with the helper); the helper binary itself is `helper/` (start at `helper/src/main.rs`).
//! - [`processes`]: long-lived processes of a sandbox (background commands, stdin, terminals,
//!   output replayed by byte offset), owned by the in-sandbox supervisor (`helper/src/supervisor.rs`).
//! - [`watches`]: directory watches of a sandbox (inotify in the same supervisor), for E2B's
//!   `watch_dir`.
//! - [`ports`]: reaching what listens inside a sandbox (the proxy subresource), through the
//!   helper's `relay` mode, so it works with no network.
//! - [`services`]: declared services (`spec.services`) kept running as processes, restarted
//!   with backoff and checked for readiness; the ports something listens on in a sandbox.
//! - [`archive`]: validation of snapshot tars before anything is restored.
//! - [`snapshot_archive`]: a snapshot as one portable file (export, and import as hostile
//!   input), format in `docs/snapshot-archive.md`.
//! - [`api`]: the HTTP server: the resource API, the `/v1` wire contract, health and OpenAPI.
//! - [`export`]: the same resources as Kubernetes objects for the kubernetes-sigs/agent-sandbox
//!   controllers (`agent-sandbox export --to kubernetes`), with what does not carry over.
//! - [`e2b`]: E2B compatibility (its control API and envd, served under `/e2b`), the protocols
//!   and the mapping onto resources; its routes are `api/e2b`.
//! - [`cli`]: the command line (`serve`, kubectl-style client commands, `mcp`).
//! - [`gc`]: `agent-sandbox gc`, removing labeled objects no running server claims, and the
//!   heartbeat by which a running server claims its own.
//! - [`secrets`]: a `Secret`'s write-only value, from the store, the environment or a file.
//! - [`egress`]: the egress policy of sandboxes with `spec.egress` (which destinations a
//!   connection may reach, which addresses are always refused).
//! - [`firewall`]: the host's `iptables` rules that refuse link-local destinations and the
//!   host's own addresses to sandboxes on the open network.
//! - [`webhooks`]: delivering events to `Webhook` receivers, signed, from a durable outbox.
//! - [`metrics`]: `GET /metrics` (what happens, recorded through a handle the working parts are
//!   given; what is, read from the store and the host's cgroups at each scrape) and a sandbox's
//!   usage.
//! - [`ui`]: the web dashboard at `/ui` (page, script and style embedded in the binary); its
//!   routes are `api/ui.rs`, its session cookie and CSRF check `api/session.rs`.
//! - [`authz`]: who a key is (role, namespaces) and what it may do; the keys file, reloaded live.
//! - [`quota`]: what a namespace's sandboxes and snapshots use, and whether a change fits its
//!   `ResourceQuota`s.
//! - [`audit`]: which requests the audit trail records, and its lines (kept by the store).
//! - [`activity`]: which sandboxes are in use (API calls, running commands), for idle policies.
//! - [`view_mount`]: a snapshot's copy-on-write view mounted into a container that already runs
//!   (a warm pool member), and over its volume's directory on this host.
//! - [`config`]: settings; [`server`]: wiring it all together for `agent-sandbox serve`;
//!   [`doctor`]: the start-up checks `agent-sandbox doctor` prints and `serve` logs.
//!
//! Data flows one way: the API and folders write the store; the controller reads the store and
//! writes Docker and status; exec and file calls go straight to a sandbox's container.

pub mod activity;
pub mod api;
pub mod archive;
pub mod audit;
pub mod authz;
pub mod cli;
pub mod config;
pub mod controller;
pub mod dataplane;
pub mod disk;
pub mod docker;
pub mod doctor;
pub mod e2b;
pub mod egress;
pub mod export;
pub mod firewall;
pub mod gc;
pub mod helper_binary;
pub mod metrics;
pub mod ports;
pub mod processes;
pub mod quota;
pub mod resource;
pub mod secrets;
pub mod server;
pub mod services;
pub mod snapshot_archive;
pub mod store;
pub mod ui;
pub mod view_mount;
pub mod watches;
pub mod webhooks;
