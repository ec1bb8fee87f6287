//! What the `/v1` handlers share: looking resources up the way the reference answers (a sandbox
//! being deleted is already gone), turning resources into wire objects, new IDs, and the mapping
//! of store errors to the reference's messages, and running store writes off the async workers.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::wire::{self, SandboxInfo, SnapshotInfo};
use crate::api::error::ApiError;
use crate::config::Settings;
use crate::resource::{AnyResource, Kind, Sandbox, SandboxPhase, Snapshot, SnapshotPhase};
use crate::store::{Store, StoreError, WriteOptions};

/// `<prefix>` + 16 lowercase hex digits, like the reference's `secrets.token_hex(8)`.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}{}", hex::encode(rand::random::<[u8; 8]>()))
}

pub fn sandbox_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("sandbox {id} not found"))
}

pub fn snapshot_not_found(id: &str) -> ApiError {
    ApiError::NotFound(format!("snapshot {id} not found"))
}

/// A sandbox that exists and is not being deleted.
pub fn live_sandbox(store: &Store, id: &str) -> Result<Sandbox, ApiError> {
    store
        .get(Kind::Sandbox, id)
        .and_then(|e| e.resource.as_sandbox().cloned())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| sandbox_not_found(id))
}

/// Whether a snapshot is ready (the wire has no way to show one that is not) and not being
/// deleted.
fn is_ready(snapshot: &Snapshot) -> bool {
    snapshot.metadata.deletion_timestamp.is_none()
        && snapshot
            .status
            .as_ref()
            .is_some_and(|st| st.phase == SnapshotPhase::Ready)
}

/// A snapshot that is ready and not being deleted.
pub fn ready_snapshot(store: &Store, id: &str) -> Result<Snapshot, ApiError> {
    store
        .get(Kind::Snapshot, id)
        .and_then(|e| e.resource.as_snapshot().cloned())
        .filter(is_ready)
        .ok_or_else(|| snapshot_not_found(id))
}

/// The ready snapshots of `namespace` (what `/v1` and E2B list), not being deleted.
pub fn ready_snapshots(store: &Store, namespace: &str) -> Vec<Snapshot> {
    store
        .list(Kind::Snapshot)
        .iter()
        .filter_map(|e| e.resource.as_snapshot())
        .filter(|s| s.metadata.namespace == namespace && is_ready(s))
        .cloned()
        .collect()
}

/// Creates the resource `make` builds around a new ID (`prefix` and random hex), drawing again
/// when the ID happens to be taken; the store writes off the async workers.
pub async fn create_with_new_id<F>(
    store: &Arc<Store>,
    prefix: &'static str,
    make: F,
) -> Result<AnyResource, ApiError>
where
    F: Fn(String) -> AnyResource + Send + 'static,
{
    store
        .write(move |store| {
            let mut attempt = 0;
            loop {
                match store.create(make(new_id(prefix)), WriteOptions::default()) {
                    Err(StoreError::AlreadyExists { .. }) if attempt < 3 => attempt += 1,
                    other => return other,
                }
            }
        })
        .await
        .map_err(store_error)
}

/// Store refusals in the reference's words where it has some.
pub fn store_error(err: StoreError) -> ApiError {
    match err {
        StoreError::NotFound { kind, name } | StoreError::Terminating { kind, name } => {
            match kind {
                Kind::Snapshot => snapshot_not_found(&name),
                _ => sandbox_not_found(&name),
            }
        }
        StoreError::ReadOnly { .. } => ApiError::Forbidden(err.to_string()),
        StoreError::AlreadyExists { .. } | StoreError::Conflict { .. } => {
            ApiError::Conflict(err.to_string())
        }
        StoreError::Invalid(message) => ApiError::InvalidRequest(message),
        StoreError::Immutable { .. } => ApiError::Validation(err.to_string()),
        StoreError::Io { .. } | StoreError::Interrupted(_) => ApiError::Internal(err.to_string()),
    }
}

fn creation(meta_ts: Option<DateTime<Utc>>) -> DateTime<Utc> {
    meta_ts.unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// When the sandbox's current lifetime started: its last start, or its creation.
pub fn lifetime_anchor(sandbox: &Sandbox) -> DateTime<Utc> {
    sandbox
        .status
        .as_ref()
        .and_then(|s| s.active_since)
        .unwrap_or(creation(sandbox.metadata.creation_timestamp))
}

/// When the sandbox's lifetime ends according to its spec alone.
pub fn spec_expiry(sandbox: &Sandbox) -> Option<DateTime<Utc>> {
    sandbox.spec.expires_at(lifetime_anchor(sandbox))
}

/// A sandbox as `/v1` shows it. Unset limits show the server's defaults (API-created sandboxes
/// have every value written out; folder-declared ones may not).
pub fn sandbox_info(sandbox: &Sandbox, settings: &Settings) -> SandboxInfo {
    // As it runs: with what its template gave it.
    let resolved = sandbox.resolved_spec();
    let spec = resolved.as_ref();
    let status = sandbox.status.as_ref();
    let generation = sandbox.metadata.generation.unwrap_or(0);
    // The observed deadline is only trusted when it was computed from the current spec.
    let observed_expiry = status
        .filter(|s| s.observed_generation.unwrap_or(0) >= generation)
        .and_then(|s| s.expires_at);
    let expires_at = observed_expiry.or_else(|| spec_expiry(sandbox));
    let running = status.is_some_and(|s| s.phase == SandboxPhase::Running);
    SandboxInfo {
        id: sandbox.metadata.key(),
        status: if running { "running" } else { "stopped" }.to_string(),
        image: spec
            .image
            .clone()
            .unwrap_or_else(|| settings.default_image.clone()),
        cpus: spec.cpus.unwrap_or(settings.default_cpus),
        memory_mb: spec.memory_mb.unwrap_or(settings.default_memory_mb),
        pids_limit: spec.pids_limit.unwrap_or(settings.default_pids_limit),
        network: spec.network.unwrap_or(false),
        read_only_rootfs: spec.read_only_rootfs.unwrap_or(true),
        created_at: wire::timestamp(creation(sandbox.metadata.creation_timestamp)),
        expires_at: expires_at.map(wire::timestamp),
        source_snapshot_id: status.and_then(|s| s.source_snapshot.clone()).or_else(|| {
            spec.source
                .as_ref()
                .map(|s| sandbox.metadata.sibling(&s.snapshot))
        }),
    }
}

/// A snapshot as `/v1` shows it.
pub fn snapshot_info(snapshot: &Snapshot) -> SnapshotInfo {
    let status = snapshot.status.as_ref();
    SnapshotInfo {
        id: snapshot.metadata.key(),
        sandbox_id: snapshot.metadata.sibling(&snapshot.spec.sandbox),
        name: snapshot.spec.display_name.clone(),
        image: status
            .and_then(|s| {
                s.image
                    .clone()
                    .or_else(|| s.sandbox_spec.as_ref().and_then(|sp| sp.image.clone()))
            })
            .unwrap_or_default(),
        size_bytes: status.and_then(|s| s.size_bytes).unwrap_or(0),
        created_at: wire::timestamp(creation(snapshot.metadata.creation_timestamp)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{SandboxSpec, SandboxStatus};
    use std::path::PathBuf;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    #[test]
    fn ids_look_like_the_reference() {
        let id = new_id("sb_");
        assert_eq!(id.len(), 19);
        assert!(id[3..]
            .chars()
            .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)));
        assert_ne!(new_id("snap_"), new_id("snap_"));
    }

    #[test]
    fn sandbox_info_computes_expiry_from_the_spec_until_observed() {
        let settings = Settings::for_tests(PathBuf::from("/tmp/x"));
        let mut sb = Sandbox::new(
            "sb_1f584efa7b40a08f",
            SandboxSpec {
                ttl_seconds: Some(900),
                ..SandboxSpec::default()
            },
        );
        sb.metadata.creation_timestamp = Some(at("2026-11-29T21:13:35.542302Z"));
        sb.metadata.generation = Some(2);
        let info = sandbox_info(&sb, &settings);
        assert_eq!(info.status, "stopped");
        assert_eq!(
            info.expires_at.as_deref(),
            Some("2026-11-29T21:28:35.542302Z")
        );
        assert_eq!(info.image, settings.default_image);
        assert_eq!(info.cpus, 1.0);
        sb.spec.shutdown_time = Some(at("2026-11-29T21:20:00Z"));
        assert_eq!(
            sandbox_info(&sb, &settings).expires_at.as_deref(),
            Some("2026-11-29T21:20:00Z")
        );
        sb.status = Some(SandboxStatus {
            phase: SandboxPhase::Running,
            observed_generation: Some(1),
            expires_at: Some(at("2030-01-01T00:00:00Z")),
            ..SandboxStatus::default()
        });
        let info = sandbox_info(&sb, &settings);
        assert_eq!(info.status, "running");
        // Stale observation (generation 1 < 2): the spec wins.
        assert_eq!(info.expires_at.as_deref(), Some("2026-11-29T21:20:00Z"));
        sb.status.as_mut().unwrap().observed_generation = Some(2);
        assert_eq!(
            sandbox_info(&sb, &settings).expires_at.as_deref(),
            Some("2030-01-01T00:00:00Z")
        );
    }
}
