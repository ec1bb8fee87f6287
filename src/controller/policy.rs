//! What a reconcile returns and what becomes of it. A reconcile that succeeds says when to run
//! again ([`Outcome`]); one that fails returns a [`Failure`]: the typed error, and, where the
//! failure is to be reported, the resource and the status it had observed so far. The one error
//! policy ([`error_policy`], in the manner of kube-runtime's `error_policy`) maps the error to the
//! `Ready` reason and message that report it and to when to try again; [`handle`] writes that
//! report, removes what the failure left behind ([`Cleanup`]), and hands the requeue to the
//! worker. Reconcilers never write a status for their own failures.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::container::{Containers, Replaced};
use super::error::ReconcileError;
use super::status::{generation, note_pull, set_ready, write_status, Reported};
use crate::docker::EngineError;
use crate::resource::{
    ConditionStatus, ImagePullProgress, Sandbox, SandboxPhase, SandboxPool, SandboxPoolStatus,
    SandboxStatus, Snapshot, SnapshotStatus,
};
use crate::store::{Recorder, Store};

/// How long to wait before looking again at a sandbox that cannot start for a reason outside our
/// control (a missing image, say).
const EXTERNAL_RETRY: Duration = Duration::from_secs(30);
/// How often a sandbox waiting for its image's pull looks again (and reports its progress).
const PULL_POLL: Duration = Duration::from_millis(500);
/// How often a sandbox waiting for its source snapshot to become ready looks again.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(1);

/// What a successful reconcile asks for next.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Run again after this long (an expiry deadline, a wait for something external).
    pub requeue_after: Option<Duration>,
}

impl Outcome {
    pub fn done() -> Outcome {
        Outcome::default()
    }

    pub fn after(delay: Duration) -> Outcome {
        Outcome {
            requeue_after: Some(delay),
        }
    }

    pub fn at(deadline: Option<DateTime<Utc>>) -> Outcome {
        Outcome {
            requeue_after: deadline.map(|at| (at - Utc::now()).to_std().unwrap_or(Duration::ZERO)),
        }
    }
}

/// A failed reconcile of a resource of type `R`.
#[derive(Debug)]
pub(super) struct Failure<R: Reported> {
    pub(super) error: ReconcileError,
    /// The resource as the reconcile read it and the status it observed, when the failure is
    /// reported in that status; `None` for a failure that only waits for its retry.
    report: Option<(R, R::Status)>,
    /// What to remove once the report is written.
    after: Vec<Cleanup>,
}

impl<R: Reported> From<ReconcileError> for Failure<R> {
    fn from(error: ReconcileError) -> Failure<R> {
        Failure {
            error,
            report: None,
            after: Vec::new(),
        }
    }
}

/// The causes `?` turns into an unreported failure, as it turns them into a [`ReconcileError`].
macro_rules! unreported_from {
    ($($cause:ty),*) => {
        $(impl<R: Reported> From<$cause> for Failure<R> {
            fn from(cause: $cause) -> Failure<R> {
                ReconcileError::from(cause).into()
            }
        })*
    };
}

unreported_from!(
    crate::docker::EngineError,
    crate::store::StoreError,
    crate::config::SettingsError
);

impl<R: Reported> Failure<R> {
    /// A failure to report in `status`, the status observed of `resource`.
    pub(super) fn reported(error: ReconcileError, resource: &R, status: R::Status) -> Failure<R>
    where
        R: Clone,
    {
        Failure {
            error,
            report: Some((resource.clone(), status)),
            after: Vec::new(),
        }
    }

    /// Has `cleanup` run once the failure is reported.
    pub(super) fn then(mut self, cleanup: Cleanup) -> Failure<R> {
        self.after.push(cleanup);
        self
    }
}

/// What a failure leaves behind, to remove only once its report is written.
#[derive(Debug)]
pub(super) enum Cleanup {
    /// What a container replacement retired.
    Replaced(Replaced),
    /// What interrupted rollback attempts of a sandbox left (a staging container, workspaces
    /// other than `current`); a failure to remove them is only logged.
    Attempts { sandbox: String, current: String },
    /// Every Docker object of a sandbox whose workspace was never recorded.
    Everything { sandbox: String },
}

impl Cleanup {
    async fn run(self, containers: &Containers) -> Result<(), ReconcileError> {
        match self {
            Cleanup::Replaced(replaced) => {
                replaced
                    .remove(containers.engine.as_ref(), &containers.disks)
                    .await
            }
            Cleanup::Attempts { sandbox, current } => {
                if let Err(error) = containers.discard_attempts(&sandbox, &current).await {
                    tracing::warn!(sandbox, %error, "removing an interrupted rollback failed");
                }
            }
            Cleanup::Everything { sandbox } => containers.remove_all_of(&sandbox).await?,
        }
        Ok(())
    }
}

/// How a failure is reported and retried.
pub(super) struct Verdict {
    /// The reason of the `Ready` condition that reports it.
    pub(super) reason: &'static str,
    /// What the condition and the status message say.
    pub(super) message: String,
    /// When a reported failure is looked at again: after this long, or (`None`) with the work
    /// queue's backoff.
    pub(super) retry_after: Option<Duration>,
}

/// The error policy: every failure's reason, message and retry, in one place.
pub(super) fn error_policy(error: &ReconcileError) -> Verdict {
    let message = error.to_string();
    let (reason, retry_after) = match error {
        ReconcileError::Source(cause) => match **cause {
            ReconcileError::SnapshotNotReady(_) => ("WaitingForSnapshot", Some(SNAPSHOT_WAIT)),
            // The template's creation wakes the sandbox; the retry is only a safety net.
            ReconcileError::TemplateNotFound(_) => ("TemplateNotFound", Some(SNAPSHOT_WAIT)),
            ref cause => (cause.restore_reason(), None),
        },
        ReconcileError::RollbackFailed { error, .. } => match **error {
            ReconcileError::SnapshotNotReady(_) => ("WaitingForSnapshot", None),
            _ => ("RollbackFailed", None),
        },
        ReconcileError::Export(_) => ("ExportFailed", None),
        ReconcileError::MembersNotCreated(_) => ("CreateFailed", None),
        ReconcileError::ImagePulling { .. } => ("PullingImage", Some(PULL_POLL)),
        ReconcileError::ImageNotAllowed(_) => ("ImageNotAllowed", Some(EXTERNAL_RETRY)),
        ReconcileError::EgressRequired => ("EgressRequired", None),
        // The limit is never dropped: the sandbox waits, retried with the queue's backoff.
        ReconcileError::Disk(_) => ("DiskUnavailable", None),
        ReconcileError::EgressGateway { .. }
        | ReconcileError::EgressNoAddress(_)
        | ReconcileError::EgressRedirect { .. } => ("EgressGatewayUnavailable", None),
        // The old container is gone: the new one is made at once, whatever the backoff grew to
        // while the daemon was restarting.
        ReconcileError::Engine(EngineError::StaleRuntimeTask { .. }) => {
            ("ContainerReplaced", Some(Duration::ZERO))
        }
        // The registry's reason is in the message; retried with the queue's backoff.
        ReconcileError::Engine(EngineError::PullFailed { .. }) => ("ImagePullFailed", None),
        ReconcileError::Engine(EngineError::ImageMissing(image)) => {
            return Verdict {
                reason: "ImageMissing",
                message: EngineError::ImageMissing(image.clone()).to_string(),
                retry_after: Some(EXTERNAL_RETRY),
            }
        }
        _ => ("ReconcileError", None),
    };
    Verdict {
        reason,
        message,
        retry_after,
    }
}

/// A resource whose status can report a failure.
pub(super) trait Failable: Reported + Sized {
    /// Makes `status` report `error` as `verdict` says.
    fn report(
        resource: &Self,
        status: &mut Self::Status,
        error: &ReconcileError,
        verdict: &Verdict,
    );
}

impl Failable for Sandbox {
    fn report(
        sandbox: &Sandbox,
        status: &mut SandboxStatus,
        error: &ReconcileError,
        verdict: &Verdict,
    ) {
        let generation = generation(&sandbox.metadata);
        match error {
            // The sandbox runs on as it was.
            ReconcileError::RollbackFailed { .. } => {}
            ReconcileError::ImagePulling { done, total, .. } => {
                status.phase = SandboxPhase::Pending;
                status.observed_generation = Some(generation);
                status.image_pull = Some(ImagePullProgress {
                    bytes_done: *done,
                    bytes_total: *total,
                });
                note_pull(
                    status,
                    ConditionStatus::False,
                    "Pulling",
                    &verdict.message,
                    generation,
                );
            }
            ReconcileError::Engine(EngineError::PullFailed { .. })
            | ReconcileError::ImageNotAllowed(_)
            | ReconcileError::EgressRequired => {
                status.phase = SandboxPhase::Failed;
                status.observed_generation = Some(generation);
                note_pull(
                    status,
                    ConditionStatus::False,
                    verdict.reason,
                    &verdict.message,
                    generation,
                );
            }
            ReconcileError::Source(_) if verdict.retry_after.is_some() => {
                status.phase = SandboxPhase::Pending;
                status.observed_generation = Some(generation);
            }
            ReconcileError::Source(_) | ReconcileError::Engine(EngineError::ImageMissing(_)) => {
                status.phase = SandboxPhase::Failed;
                status.observed_generation = Some(generation);
            }
            _ => status.phase = SandboxPhase::Failed,
        }
        set_ready(
            &mut status.conditions,
            ConditionStatus::False,
            verdict.reason,
            &verdict.message,
            generation,
        );
        status.message.clone_from(&verdict.message);
    }
}

impl Failable for Snapshot {
    /// A snapshot whose export failed stays Pending: Docker may come back.
    fn report(
        snapshot: &Snapshot,
        status: &mut SnapshotStatus,
        _error: &ReconcileError,
        verdict: &Verdict,
    ) {
        set_ready(
            &mut status.conditions,
            ConditionStatus::False,
            verdict.reason,
            &verdict.message,
            generation(&snapshot.metadata),
        );
        status.message.clone_from(&verdict.message);
    }
}

impl Failable for SandboxPool {
    /// A pool that could not make every member still counts the ones it has; full is full.
    fn report(
        pool: &SandboxPool,
        status: &mut SandboxPoolStatus,
        _error: &ReconcileError,
        verdict: &Verdict,
    ) {
        let (verdict_status, reason) = if status.ready_replicas >= pool.spec.size {
            (ConditionStatus::True, "Full")
        } else {
            (ConditionStatus::False, verdict.reason)
        };
        set_ready(
            &mut status.conditions,
            verdict_status,
            reason,
            &verdict.message,
            generation(&pool.metadata),
        );
        status.message.clone_from(&verdict.message);
    }
}

/// Reports `failure` as the error policy says, removes what it left, and returns what the
/// worker does next: requeue after a delay (`Ok`), or retry with backoff (`Err`).
pub(super) async fn handle<R: Failable>(
    store: &Arc<Store>,
    events: &Recorder,
    containers: &Containers,
    failure: Failure<R>,
) -> Result<Outcome, ReconcileError> {
    let Failure {
        error,
        report,
        after,
    } = failure;
    let verdict = error_policy(&error);
    let reported = report.is_some();
    if let Some((resource, mut status)) = report {
        R::report(&resource, &mut status, &error, &verdict);
        write_status(store, events, &resource, &status).await?;
    }
    for cleanup in after {
        cleanup.run(containers).await?;
    }
    match verdict.retry_after {
        Some(delay) if reported => Ok(Outcome::after(delay)),
        _ => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_each_failure_and_its_retry() {
        let waiting =
            ReconcileError::Source(Box::new(ReconcileError::SnapshotNotReady("s".into())));
        let verdict = error_policy(&waiting);
        assert_eq!(verdict.reason, "WaitingForSnapshot");
        assert_eq!(verdict.message, "snapshot \"s\" is not ready yet");
        assert_eq!(verdict.retry_after, Some(SNAPSHOT_WAIT));

        let refused =
            ReconcileError::Source(Box::new(ReconcileError::SnapshotNotFound("s".into())));
        let verdict = error_policy(&refused);
        assert_eq!(
            (verdict.reason, verdict.retry_after),
            ("SnapshotNotFound", None)
        );

        let rollback = ReconcileError::RollbackFailed {
            request: "r1".into(),
            error: Box::new(ReconcileError::SnapshotNotReady("s".into())),
        };
        let verdict = error_policy(&rollback);
        assert_eq!(verdict.reason, "WaitingForSnapshot");
        assert_eq!(
            verdict.message,
            "rollback \"r1\" failed: snapshot \"s\" is not ready yet"
        );
        assert_eq!(verdict.retry_after, None, "a rollback retries with backoff");

        let missing = ReconcileError::Engine(EngineError::ImageMissing("img:1".into()));
        let verdict = error_policy(&missing);
        assert_eq!(verdict.reason, "ImageMissing");
        assert!(
            verdict
                .message
                .starts_with("image img:1 is not present on the docker host"),
            "{}",
            verdict.message
        );
        assert!(verdict.message.contains("AGENT_SANDBOX_DEFAULT_IMAGE"));
        assert_eq!(verdict.retry_after, Some(EXTERNAL_RETRY));

        let other = ReconcileError::Vanished {
            container: "c".into(),
            when: " while starting",
        };
        let verdict = error_policy(&other);
        assert_eq!(verdict.reason, "ReconcileError");
        assert_eq!(verdict.message, "container c vanished while starting");
    }

    #[test]
    fn an_unreported_failure_keeps_the_status_as_it_is() {
        let failure: Failure<Sandbox> = ReconcileError::SnapshotNotReady("s".into()).into();
        assert!(failure.report.is_none() && failure.after.is_empty());
    }
}
