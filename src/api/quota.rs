//! Quota admission of writes through the API: a create or replace of a Sandbox, Snapshot or Fork
//! is checked against its namespace's `ResourceQuota`s (what counts is `crate::quota`'s) while
//! the caller holds the API's create lock across the check and the write, so that concurrent
//! requests never pass a quota together.

use tokio::sync::MutexGuard;

use super::error::ApiError;
use super::AppState;
use crate::quota;
use crate::resource::{AnyResource, Kind};

/// The create lock, for a write that quotas limit; `None` for the other kinds, and while the
/// server has no quota at all, so that creates without quotas keep overlapping their writes.
pub async fn lock_for(state: &AppState, kind: Kind) -> Option<MutexGuard<'_, ()>> {
    if quota::is_limited(kind) && !state.store.list(Kind::ResourceQuota).is_empty() {
        Some(state.create_lock.lock().await)
    } else {
        None
    }
}

/// Whether writing `new` (over the document of its kind and name, if there is one) keeps its
/// namespace within its quotas. The caller holds [`lock_for`]'s guard.
pub fn check(state: &AppState, new: &AnyResource) -> Result<(), ApiError> {
    if !quota::is_limited(new.kind()) || state.store.list(Kind::ResourceQuota).is_empty() {
        return Ok(());
    }
    let old = state
        .store
        .get(new.kind(), new.name())
        .map(|entry| entry.resource);
    // A status in the request is ignored when written, so it counts for nothing here either:
    // the document keeps the status it has (a new one has none).
    let mut new = new.clone();
    let kept = old.as_ref().and_then(AnyResource::status_json);
    if new.set_status_json(kept).is_err() {
        new.clear_status();
    }
    let documents: Vec<AnyResource> = quota::COUNTED_KINDS
        .into_iter()
        .flat_map(|kind| state.store.list(kind))
        .map(|entry| entry.resource)
        .collect();
    quota::admit(
        &documents,
        &new,
        old.as_ref(),
        &state.settings.sandbox_defaults(),
    )
    .map_err(|exceeded| ApiError::QuotaExceeded(exceeded.to_string()))
}
