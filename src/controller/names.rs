//! Every Docker name the controller gives an object: a sandbox's container under each name it can
//! have (its own, staging while a replacement is built, retired until removed, and deleted: killed
//! and waiting for its removal after the sandbox is gone), its workspace volumes (named for the
//! sandbox, or for its uid while an earlier sandbox's of the same name is still being removed), and a warm pool member's id, container and volume. The reconcilers and garbage
//! collection read names only from here, so that what one builds the other recognises. This
//! module only makes and parses names; it talks to nothing.

pub(super) use crate::docker::{container_name, volume_name};

/// Prefix of a pool member's `io.agent-sandbox.id`.
pub(super) const MEMBER_PREFIX: &str = "pool.";

/// Suffix of a staging container's name (a dot never occurs in a sandbox name).
pub(super) const STAGING_SUFFIX: &str = ".restore";

/// Name of the container a rollback fills before it takes over the sandbox's name. It is the
/// sandbox's own (garbage collection keeps it while the sandbox lives; a retry replaces it).
pub(super) fn staging_container_name(sandbox: &str) -> String {
    format!("{}{STAGING_SUFFIX}", container_name(sandbox))
}

/// Name a replaced container has from the swap until it is removed.
pub(super) fn retired_container_name(sandbox: &str) -> String {
    format!("{}.retired", container_name(sandbox))
}

/// A retired name of its own for a container replaced while [`retired_container_name`] is still
/// held by the one replaced before it (whose removal runs in the background): like that name,
/// no sandbox's, so garbage collection removes what a crash leaves under it.
pub(super) fn another_retired_container_name(sandbox: &str) -> String {
    format!(
        "{}-{:08x}",
        retired_container_name(sandbox),
        rand::random::<u32>()
    )
}

/// Name a container of a deleted sandbox has from its kill until it is removed in the
/// background: `container` (one of [`container_names`]) marked with the sandbox's `uid`, so that
/// the sandbox's names are free at once and a later sandbox of the same name never maps to it.
pub(super) fn deleted_container_name(container: &str, uid: &str) -> String {
    format!("{container}.deleted-{}", short_uid(uid))
}

/// The workspace volume of sandbox `name` of uid `uid` when [`volume_name`] is still held by an
/// earlier sandbox of that name (whose removal finishes in the background).
pub(super) fn uid_volume_name(name: &str, uid: &str) -> String {
    format!("{}-{}", volume_name(name), short_uid(uid))
}

/// Enough of a `metadata.uid` to tell sandboxes of one name apart, in characters a Docker name
/// allows.
fn short_uid(uid: &str) -> String {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(12)
        .collect();
    if short.is_empty() {
        "0".into()
    } else {
        short
    }
}

/// Every Docker name a container of the sandbox can have: its own, while being built, and
/// while waiting to be removed after a replacement.
pub(super) fn container_names(sandbox: &str) -> [String; 3] {
    [
        container_name(sandbox),
        staging_container_name(sandbox),
        retired_container_name(sandbox),
    ]
}

/// The sandbox whose staging container carries `container`, if it is one (`None` for any other
/// name, ours or not).
pub(super) fn staging_of(container: &str) -> Option<&str> {
    container
        .strip_prefix(CONTAINER_PREFIX)?
        .strip_suffix(STAGING_SUFFIX)
}

/// The sandbox whose own container name `container` is, if it is one of ours by its form.
pub(super) fn sandbox_of(container: &str) -> Option<&str> {
    container.strip_prefix(CONTAINER_PREFIX)
}

/// What `container_name` puts before a sandbox's name.
const CONTAINER_PREFIX: &str = "agent-sandbox-";

/// A new workspace volume for a rollback attempt: one per attempt, since one left by an
/// interrupted attempt may still be mounted by its container.
pub(super) fn attempt_volume_name(sandbox: &str) -> String {
    format!("{}-{:08x}", volume_name(sandbox), rand::random::<u32>())
}

/// Whether `volume` is one of the workspace volumes of `sandbox` (its first, or an attempt's).
pub(super) fn is_workspace_of(volume: &str, sandbox: &str) -> bool {
    volume.starts_with(&volume_name(sandbox))
}

/// A new member id of pool `pool`: `pool.<pool>.<random>`.
pub(super) fn new_member(pool: &str) -> String {
    format!("{MEMBER_PREFIX}{pool}.{:08x}", rand::random::<u32>())
}

/// The id prefix every member of pool `pool` carries.
pub(super) fn member_prefix(pool: &str) -> String {
    format!("{MEMBER_PREFIX}{pool}.")
}

/// Whether `id` (an `io.agent-sandbox.id`) is a pool member's.
pub(super) fn is_member(id: &str) -> bool {
    id.starts_with(MEMBER_PREFIX)
}

/// The pool a member id (`pool.<pool>.<random>`) belongs to.
pub(super) fn pool_of_member(id: &str) -> Option<&str> {
    id.strip_prefix(MEMBER_PREFIX)?
        .rsplit_once('.')
        .map(|(pool, _)| pool)
}

/// The workspace volume of pool member `member`.
pub(super) fn member_volume(member: &str) -> String {
    volume_name(member)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        assert_eq!(staging_of(&staging_container_name("a")), Some("a"));
        assert_eq!(staging_of(&container_name("a")), None);
        assert_eq!(sandbox_of(&container_name("a")), Some("a"));
        let member = new_member("p");
        assert!(is_member(&member));
        assert!(member.starts_with(&member_prefix("p")));
        assert_eq!(pool_of_member(&member), Some("p"));
        assert_eq!(
            member_volume("pool.p.1"),
            "agent-sandbox-pool.p.1-workspace"
        );
        assert!(is_workspace_of(&attempt_volume_name("a"), "a"));
        assert_eq!(container_names("a").len(), 3);
        let uid = "0f3c2a9e-1b2c-4d5e-8f90-123456789abc";
        let deleted = deleted_container_name(&container_name("a"), uid);
        assert_eq!(deleted, "agent-sandbox-a.deleted-0f3c2a9e1b2c");
        assert_eq!(staging_of(&deleted), None);
        assert_ne!(sandbox_of(&deleted), Some("a"));
        let own = uid_volume_name("a", uid);
        assert!(is_workspace_of(&own, "a"));
        assert_ne!(own, volume_name("a"));
    }
}
