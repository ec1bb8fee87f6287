//! The root filesystem part of a `Full` snapshot: the image Docker commits from the sandbox's
//! container while it is frozen (its layer holds every file added, changed or deleted outside
//! the volumes, deletions as whiteout entries), how it is named and labeled, and its removal.
//! Restores start their containers from that image (see `restore.rs`), so the changes are in
//! place before the container's first process runs. This module decides nothing about when a
//! snapshot is taken or deleted; `mod.rs` does.

use std::collections::BTreeMap;

use crate::docker::{Engine, EngineError, LABEL_SERVER, LABEL_SNAPSHOT};
use crate::resource::{Snapshot, SnapshotScope};

/// Repository of the images of Full snapshots; the tag is the snapshot's `metadata.uid`.
pub(in crate::controller) const REPOSITORY: &str = crate::docker::SNAPSHOT_REPOSITORY;

/// The image reference a Full snapshot's root filesystem is committed as; `None` for a
/// Workspace snapshot (or one without a uid, which the store always gives).
pub(super) fn reference(snapshot: &Snapshot) -> Option<String> {
    if snapshot.spec.scope() != SnapshotScope::Full {
        return None;
    }
    let uid = snapshot.metadata.uid.as_deref()?;
    Some(format!("{REPOSITORY}:{}", uid.to_ascii_lowercase()))
}

/// The labels of the committed image: this server's identity and the snapshot's uid, for
/// garbage collection. Containers made from the image inherit them, which is harmless: each
/// container's own [`LABEL_SERVER`] replaces the image's, and nothing reads [`LABEL_SNAPSHOT`]
/// off a container.
pub(super) fn labels(server: &str, snapshot: &Snapshot) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_SERVER.to_string(), server.to_string()),
        (
            LABEL_SNAPSHOT.to_string(),
            snapshot.metadata.uid.clone().unwrap_or_default(),
        ),
    ])
}

/// Removes the image; one still in use by containers stays for garbage collection, and any
/// other failure is logged (garbage collection tries again).
pub(in crate::controller) async fn remove(engine: &dyn Engine, reference: &str) {
    match engine.remove_image(reference).await {
        Ok(()) => {}
        Err(EngineError::Conflict { .. }) => {
            tracing::info!(
                image = reference,
                "the snapshot's root filesystem image is still in use; it goes once unused"
            );
        }
        Err(error) => {
            tracing::warn!(image = reference, %error, "removing a snapshot's root filesystem image failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::SnapshotSpec;

    #[test]
    fn only_full_snapshots_have_an_image() {
        let mut snapshot = Snapshot::new(
            "s",
            SnapshotSpec {
                sandbox: "a".into(),
                display_name: None,
                scope: None,
            },
        );
        snapshot.metadata.uid = Some("AbC-1".into());
        assert_eq!(reference(&snapshot), None);
        snapshot.spec.scope = Some(SnapshotScope::Full);
        assert_eq!(
            reference(&snapshot).as_deref(),
            Some("agent-sandbox-snapshot:abc-1")
        );
        assert_eq!(
            labels("srv", &snapshot)
                .get(LABEL_SNAPSHOT)
                .map(String::as_str),
            Some("AbC-1")
        );
    }
}
