//! The in-sandbox helper binary this build carries, when `build.rs` could build it.

/// The static helper executable, installed read-only into every sandbox; `None` when this build
/// was made without it (sandboxes then fall back to plain `docker exec`).
pub fn helper_binary() -> Option<&'static [u8]> {
    #[cfg(agent_sandbox_helper)]
    {
        Some(include_bytes!(env!("AGENT_SANDBOX_HELPER_PATH")))
    }
    #[cfg(not(agent_sandbox_helper))]
    {
        None
    }
}
