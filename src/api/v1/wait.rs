//! Waiting for the controller. A lifecycle call writes desired state and then answers from the
//! status the controller observes; this module does the waiting, bounded, re-reading the store on
//! every change event (and now and then without one, in case an event was missed).
//!
//! Callers subscribe *before* they write, so the change they cause cannot slip by unseen.

use std::time::Duration;

use tokio::sync::broadcast;
use tokio::time::Instant;

use crate::api::error::ApiError;
use crate::resource::{Condition, ConditionStatus, Kind};
use crate::store::{Entry, Store, WatchEvent};

/// How long a lifecycle call waits for the controller by default.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// Re-read the store at least this often, events or not.
const POLL: Duration = Duration::from_millis(500);

/// Reasons of a `Ready=False` condition that retrying will not cure: waiting longer is pointless.
/// (The controller also marks most of them with phase `Failed`; a failed rollback leaves the
/// sandbox running on its old workspace, so the reason is all there is to go by.)
pub const TERMINAL_REASONS: &[&str] = &[
    "ImageMissing",
    "ImageNotAllowed",
    "EgressRequired",
    "ImagePullFailed",
    "SnapshotNotFound",
    "SnapshotFailed",
    "SnapshotDataMissing",
    "SnapshotRefused",
    "DataMissing",
    "RollbackFailed",
    "SandboxNotFound",
    "SandboxNotRunning",
    "TooLarge",
];

/// What a look at the store found.
pub enum Poll<T> {
    Done(T),
    Fail(ApiError),
    /// Not yet; the text describes the current state for the timeout message.
    Pending(String),
}

/// Waits until `check` (given the current entry, if any) is done or failed, or `timeout` passes.
pub async fn until<T>(
    store: &Store,
    mut events: broadcast::Receiver<WatchEvent>,
    kind: Kind,
    name: &str,
    timeout: Duration,
    what: &str,
    mut check: impl FnMut(Option<&Entry>) -> Poll<T>,
) -> Result<T, ApiError> {
    let deadline = Instant::now() + timeout;
    loop {
        let state = match check(store.get(kind, name).as_ref()) {
            Poll::Done(value) => return Ok(value),
            Poll::Fail(err) => return Err(err),
            Poll::Pending(state) => state,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(ApiError::Unavailable(format!(
                "timed out after {}s waiting for {what} ({state}); the controller may be busy or \
                 stopped, ask again later",
                timeout.as_secs_f64()
            )));
        }
        let nap = (deadline - now).min(POLL);
        let wake = tokio::time::timeout(nap, async {
            loop {
                match events.recv().await {
                    Ok(event) => {
                        if event.resource.kind() == kind && event.resource.name() == name {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => return,
                    Err(broadcast::error::RecvError::Closed) => {
                        // No more events: fall back to polling for the rest of the nap.
                        std::future::pending::<()>().await;
                    }
                }
            }
        });
        let _ = wake.await;
    }
}

/// The `Ready` condition, if it judges the given generation (or says nothing about generations).
pub fn ready_condition(conditions: &[Condition], generation: u64) -> Option<&Condition> {
    conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .filter(|c| c.observed_generation.is_none_or(|g| g >= generation))
}

/// A `Ready=False` condition with a reason that will not go away by waiting.
pub fn terminal_failure(conditions: &[Condition], generation: u64) -> Option<&Condition> {
    ready_condition(conditions, generation).filter(|c| {
        c.status == ConditionStatus::False && TERMINAL_REASONS.contains(&c.reason.as_str())
    })
}

/// The best explanation a status offers.
pub fn explain(message: &str, condition: Option<&Condition>, fallback: &str) -> String {
    if !message.is_empty() {
        return message.to_string();
    }
    match condition {
        Some(c) if !c.message.is_empty() => c.message.clone(),
        Some(c) if !c.reason.is_empty() => format!("{fallback} ({})", c.reason),
        _ => fallback.to_string(),
    }
}
