//! Status and conditions, as every reconciler reports them: the `Ready` condition, the
//! `…Applied: Immutable` note for a change that is ignored, the generation a status observes, and
//! the one write of a status, made only when it changed (an idle resync writes nothing). This
//! module decides no phase and no reason; the reconcilers and the error policy do.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::error::ReconcileError;
use super::events::{Lifecycle, IMAGE_PULLED};
use crate::resource::{
    set_condition, Condition, ConditionStatus, Fork, ForkStatus, Kind, ObjectMeta, ObjectReference,
    Occurrence, Sandbox, SandboxPool, SandboxPoolStatus, SandboxStatus, Snapshot, SnapshotStatus,
};
use crate::store::{Recorder, Store, StoreError};

/// The generation a status observes: the document's, or 1 for one not yet given any.
pub(super) fn generation(meta: &ObjectMeta) -> u64 {
    meta.generation.unwrap_or(1)
}

/// A `Ready` condition observed now.
pub(super) fn ready_condition(
    verdict: ConditionStatus,
    reason: &str,
    message: &str,
    generation: u64,
) -> Condition {
    Condition {
        type_: "Ready".into(),
        status: verdict,
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Utc::now(),
        observed_generation: Some(generation),
    }
}

/// Sets the `Ready` condition among `conditions`.
pub(super) fn set_ready(
    conditions: &mut Vec<Condition>,
    verdict: ConditionStatus,
    reason: &str,
    message: &str,
    generation: u64,
) {
    set_condition(
        conditions,
        ready_condition(verdict, reason, message, generation),
    );
}

/// Notes in condition `type_` that a change of an immutable part of the spec is ignored, and
/// `message` why.
pub(super) fn note_immutable(
    conditions: &mut Vec<Condition>,
    type_: &str,
    message: String,
    generation: Option<u64>,
) {
    set_condition(
        conditions,
        Condition {
            type_: type_.into(),
            status: ConditionStatus::False,
            reason: "Immutable".into(),
            message,
            last_transition_time: Utc::now(),
            observed_generation: generation,
        },
    );
}

/// Sets the `ImagePulled` condition of a sandbox whose image is (being) pulled, keeping its
/// transition time while its verdict and reason stay the same.
pub(super) fn note_pull(
    status: &mut crate::resource::SandboxStatus,
    verdict: ConditionStatus,
    reason: &str,
    message: &str,
    generation: u64,
) {
    let same = status
        .conditions
        .iter()
        .find(|c| c.type_ == IMAGE_PULLED)
        .filter(|c| c.status == verdict && c.reason == reason)
        .map(|c| c.last_transition_time);
    set_condition(
        &mut status.conditions,
        Condition {
            type_: IMAGE_PULLED.into(),
            status: verdict,
            reason: reason.into(),
            message: message.into(),
            last_transition_time: same.unwrap_or_else(Utc::now),
            observed_generation: Some(generation),
        },
    );
}

/// Once a sandbox whose image was pulled runs: its `ImagePulled` condition says so.
pub(super) fn note_pulled(status: &mut crate::resource::SandboxStatus, generation: u64) {
    let pulled = status.conditions.iter().any(|c| c.type_ == IMAGE_PULLED);
    if pulled {
        note_pull(status, ConditionStatus::True, "Pulled", "", generation);
    }
}

/// Drops condition `type_`.
pub(super) fn clear_condition(conditions: &mut Vec<Condition>, type_: &str) {
    conditions.retain(|c| c.type_ != type_);
}

/// A resource whose status a reconciler writes.
pub(super) trait Reported {
    type Status: Serialize + DeserializeOwned + PartialEq + Lifecycle;
    const KIND: Kind;
    fn meta(&self) -> &ObjectMeta;
    fn status(&self) -> Option<&Self::Status>;
}

macro_rules! reported {
    ($resource:ty, $status:ty, $kind:expr) => {
        impl Reported for $resource {
            type Status = $status;
            const KIND: Kind = $kind;
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn status(&self) -> Option<&$status> {
                self.status.as_ref()
            }
        }
    };
}

reported!(Sandbox, SandboxStatus, Kind::Sandbox);
reported!(Snapshot, SnapshotStatus, Kind::Snapshot);
reported!(Fork, ForkStatus, Kind::Fork);
reported!(SandboxPool, SandboxPoolStatus, Kind::SandboxPool);
reported!(
    crate::resource::SandboxTemplate,
    crate::resource::SandboxTemplateStatus,
    Kind::SandboxTemplate
);
reported!(
    crate::resource::ResourceQuota,
    crate::resource::ResourceQuotaStatus,
    Kind::ResourceQuota
);
reported!(
    crate::resource::Secret,
    crate::resource::SecretStatus,
    Kind::Secret
);

/// Writes `status` as the status of `resource` unless it equals the one `resource` carries, so
/// that a reconcile that observed nothing new writes nothing (an idle resync costs no writes), and
/// records through `events` what the change means (`events.rs`). A resource deleted meanwhile is
/// not an error: the next reconcile sees that.
pub(super) async fn write_status<R: Reported>(
    store: &Arc<Store>,
    events: &Recorder,
    resource: &R,
    status: &R::Status,
) -> Result<(), ReconcileError> {
    if resource.status() == Some(status) {
        return Ok(());
    }
    let kind = R::KIND;
    let value = serde_json::to_value(status)?;
    let name = resource.meta().key();
    // The status as stored just before this write, not as this reconcile first read it: a
    // reconcile may write more than once, and each change is one event.
    let written = store
        .write(move |store| {
            let before = store
                .get(kind, &name)
                .and_then(|e| e.resource.status_json());
            let after = store.update_status(kind, &name, value)?;
            Ok((before, after))
        })
        .await;
    match written {
        Ok((before, after)) => {
            let before: Option<R::Status> = before.and_then(|v| serde_json::from_value(v).ok());
            let meta = after.metadata();
            let object = ObjectReference {
                kind: kind.to_string(),
                name: meta.name.clone(),
                namespace: meta.namespace.clone(),
                uid: meta.uid.clone().unwrap_or_default(),
            };
            for note in status.notes(before.as_ref()) {
                events.record(Occurrence {
                    involved_object: object.clone(),
                    type_: note.severity,
                    reason: note.reason.to_string(),
                    message: note.message,
                });
            }
            Ok(())
        }
        Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// How often a fork whose children are still starting writes how many run.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(250);

/// When each progressing fork last wrote its progress. Every child's status change wakes its
/// fork; writing each count would put one more fsync beside the children's own Docker calls and
/// status writes, for a number nobody needs to the millisecond. So a count is written at most
/// every [`PROGRESS_INTERVAL`] (the fork is woken again when it is due); reaching Ready, failing,
/// or any other change is written at once.
#[derive(Default)]
pub(super) struct ProgressWrites {
    written: Mutex<HashMap<String, Instant>>,
}

impl ProgressWrites {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How long fork `name` must wait before writing its progress again, if at all.
    pub(super) fn wait(&self, name: &str) -> Option<Duration> {
        let since = self.lock().get(name)?.elapsed();
        PROGRESS_INTERVAL
            .checked_sub(since)
            .filter(|d| !d.is_zero())
    }

    pub(super) fn wrote(&self, name: &str) {
        self.lock().insert(name.to_string(), Instant::now());
    }

    pub(super) fn forget(&self, name: &str) {
        self.lock().remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_written_at_most_every_interval() {
        let writes = ProgressWrites::default();
        assert_eq!(writes.wait("f"), None, "a first count is written at once");
        writes.wrote("f");
        let wait = writes.wait("f").expect("a second count waits");
        assert!(
            wait <= PROGRESS_INTERVAL && wait > PROGRESS_INTERVAL / 2,
            "{wait:?}"
        );
        assert_eq!(writes.wait("g"), None, "forks do not hold each other back");
        writes.forget("f");
        assert_eq!(writes.wait("f"), None);
    }
}
