//! Egress policy: what a sandbox with `spec.egress` (or the server's default list) may reach.
//! Such sandboxes sit on an internal Docker network with no route out of the host (the
//! controller puts them there); this module owns the decisions on their connections. It reads
//! rules parsed by `resource` and never talks to Docker or the data directory itself.

pub mod policy;

pub use policy::{decide_address, decide_name, protected_block, Protected, Verdict};
