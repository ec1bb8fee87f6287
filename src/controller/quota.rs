//! Quotas in the controller: a `ResourceQuota`'s `status.used`, recomputed from what exists at
//! every change in its namespace, and the sandboxes no quota admits — those declared in a folder
//! (the API refuses the others before they are written) — held with a `QuotaExceeded` condition
//! and nothing started until room is made. What counts is decided in [`crate::quota`].

use super::context::ForkContext;
use super::error::ReconcileError;
use super::policy::Outcome;
use super::status::write_status;
use crate::authz::namespace_of;
use crate::quota::{self, QuotaExceeded};
use crate::resource::{
    AnyResource, ConditionStatus, Kind, ResourceQuotaStatus, Sandbox, SandboxDefaults, SandboxPhase,
};
use crate::store::Store;

/// The condition a held sandbox carries.
pub(super) const QUOTA_EXCEEDED: &str = "QuotaExceeded";

pub(super) async fn reconcile(
    ctl: &ForkContext<'_>,
    defaults: &SandboxDefaults,
    name: &str,
) -> Result<Outcome, ReconcileError> {
    let Some(entry) = ctl.store.get(Kind::ResourceQuota, name) else {
        return Ok(Outcome::done());
    };
    let Some(quota) = entry.resource.as_quota().cloned() else {
        return Ok(Outcome::done());
    };
    if quota.metadata.deletion_timestamp.is_some() {
        let name = name.to_string();
        ctl.store
            .write(move |store| store.finalize(Kind::ResourceQuota, &name))
            .await?;
        return Ok(Outcome::done());
    }
    let documents = counted(ctl.store);
    let status = ResourceQuotaStatus {
        used: quota::usage(
            documents.iter().filter(|d| !is_held(d)),
            namespace_of(&quota.metadata),
            defaults,
        ),
    };
    write_status(ctl.store, ctl.events, &quota, &status).await?;
    Ok(Outcome::done())
}

/// Everything that counts against quotas, and the quotas.
fn counted(store: &Store) -> Vec<AnyResource> {
    quota::COUNTED_KINDS
        .into_iter()
        .flat_map(|kind| store.list(kind))
        .map(|entry| entry.resource)
        .collect()
}

/// Whether a sandbox is held by a quota (and so uses nothing).
fn is_held(resource: &AnyResource) -> bool {
    resource.as_sandbox().is_some_and(|s| {
        s.status.as_ref().is_some_and(|st| {
            st.conditions
                .iter()
                .any(|c| c.type_ == QUOTA_EXCEEDED && c.status == ConditionStatus::True)
        })
    })
}

/// Whether a sandbox has started (or failed starting): from then on no quota takes it back.
fn started(sandbox: &Sandbox) -> bool {
    sandbox
        .status
        .as_ref()
        .is_some_and(|s| s.phase != SandboxPhase::Pending || s.container_id.is_some())
}

/// The quota that keeps `sandbox` from starting, if any. Counted against it: what is running,
/// and what waits to start but was declared before it, so that of two sandboxes that do not both
/// fit, the older one starts, whichever is looked at first.
pub(super) fn holding(
    store: &Store,
    defaults: &SandboxDefaults,
    sandbox: &Sandbox,
) -> Option<Box<QuotaExceeded>> {
    if started(sandbox) || store.list(Kind::ResourceQuota).is_empty() {
        return None;
    }
    let key = |s: &Sandbox| (s.metadata.creation_timestamp, s.metadata.key());
    let mine = key(sandbox);
    let documents: Vec<AnyResource> = counted(store)
        .into_iter()
        .filter(|d| match d.as_sandbox() {
            Some(other) => {
                other.metadata.key() != sandbox.metadata.key()
                    && !is_held(d)
                    && (started(other) || key(other) < mine)
            }
            None => true,
        })
        .collect();
    quota::admit(&documents, &sandbox.clone().into(), None, defaults).err()
}

/// What to look at again after `changed` changed: the quotas of its namespace, and the
/// sandboxes they hold (room may have been made, or taken).
pub(super) fn affected_by(store: &Store, changed: &AnyResource) -> Vec<(Kind, String)> {
    let namespace = namespace_of(changed.metadata());
    let mut keys: Vec<(Kind, String)> = store
        .list(Kind::ResourceQuota)
        .into_iter()
        .filter(|e| namespace_of(e.resource.metadata()) == namespace)
        .map(|e| (Kind::ResourceQuota, e.resource.key()))
        .collect();
    if keys.is_empty() {
        return keys;
    }
    keys.extend(
        store
            .list(Kind::Sandbox)
            .into_iter()
            .filter(|e| is_held(&e.resource) && e.resource.key() != changed.key())
            .map(|e| (Kind::Sandbox, e.resource.key())),
    );
    keys
}

/// The quota a taken snapshot of `size` bytes would pass, if any (its bytes are known only now;
/// the API admitted it while there was room).
pub(super) fn snapshot_over(
    store: &Store,
    defaults: &SandboxDefaults,
    snapshot: &crate::resource::Snapshot,
    size: u64,
) -> Option<Box<QuotaExceeded>> {
    if store.list(Kind::ResourceQuota).is_empty() {
        return None;
    }
    let documents: Vec<AnyResource> = counted(store).into_iter().filter(|d| !is_held(d)).collect();
    let old: AnyResource = snapshot.clone().into();
    let mut taken = snapshot.clone();
    let status = taken.status.get_or_insert_with(Default::default);
    status.size_bytes = Some(size);
    quota::admit(&documents, &taken.into(), Some(&old), defaults).err()
}
