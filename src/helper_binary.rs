//! The in-sandbox helper binary this build carries, when it was built (see `build.rs`).

/// The static helper executable, installed read-only into every sandbox; `None` when this build
/// was made without it (sandboxes then fall back to plain `docker exec`).
pub fn helper_binary() -> Option<&'static [u8]> {
    None
}
