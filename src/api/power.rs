//! Pausing, stopping and resuming sandboxes from the API: writing `spec.state` and waiting until
//! the controller reports it, and waking a paused or stopped sandbox before a call that needs it
//! running (`spec.autoResume`), reporting every such call as activity for idle policies. The
//! resource API's `pause`/`resume` routes, the process calls and `/v1`'s exec, file and rollback
//! calls use it (a snapshot does not: the controller reads a paused or stopped sandbox's workspace
//! as it is). Like every handler it only writes the store; the controller does the Docker work.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::error::ApiError;
use super::AppState;
use crate::resource::{AnyResource, Kind, Sandbox, SandboxPhase, SandboxSpec, SandboxState};
use crate::store::{Store, StoreError};

/// How long a state change waits for the controller.
pub const STATE_WAIT: Duration = Duration::from_secs(60);

/// Re-read the store at least this often while waiting, events or not.
const POLL: Duration = Duration::from_millis(250);

/// Writes `spec.state` of sandbox `name` and waits until the controller reports the sandbox in
/// that state at the written generation; answers the sandbox as it then is.
pub async fn set_state(
    store: &Arc<Store>,
    name: &str,
    state: SandboxState,
    timeout: Duration,
) -> Result<Sandbox, ApiError> {
    set_state_with(store, name, state, timeout, |_| {}).await
}

/// [`set_state`], with `also` changing the spec in the same write (a resume that also moves the
/// end of the lifetime must not leave a moment where the new lifetime runs with the old end).
async fn set_state_with(
    store: &Arc<Store>,
    name: &str,
    state: SandboxState,
    timeout: Duration,
    also: impl Fn(&mut SandboxSpec) + Send + 'static,
) -> Result<Sandbox, ApiError> {
    // Subscribed before the write, so the controller's answer cannot slip by.
    let mut events = store.subscribe();
    let owned = name.to_string();
    let written = store
        .write(move |store| {
            store.update(Kind::Sandbox, &owned, |resource| match resource {
                AnyResource::Sandbox(sandbox) => {
                    if sandbox.metadata.deletion_timestamp.is_some() {
                        return Err(StoreError::Terminating {
                            kind: Kind::Sandbox,
                            name: sandbox.metadata.key(),
                        });
                    }
                    sandbox.spec.state = Some(state);
                    also(&mut sandbox.spec);
                    Ok(())
                }
                _ => Err(StoreError::Invalid(format!("{owned} is not a sandbox"))),
            })
        })
        .await?;
    let generation = written.metadata().generation.unwrap_or(0);
    let wanted = state.phase();
    let deadline = Instant::now() + timeout;
    loop {
        let current = store
            .get(Kind::Sandbox, name)
            .and_then(|e| e.resource.as_sandbox().cloned())
            .ok_or_else(|| {
                ApiError::NotFound(format!("sandbox {name} was deleted while it changed state"))
            })?;
        if current.metadata.deletion_timestamp.is_some() {
            return Err(ApiError::Conflict(format!(
                "sandbox {name} is being deleted"
            )));
        }
        let status = current.status.clone().unwrap_or_default();
        let observed = status.observed_generation.unwrap_or(0) >= generation;
        if observed && status.phase == wanted {
            return Ok(current);
        }
        if observed && status.phase == SandboxPhase::Failed {
            return Err(ApiError::Backend(format!(
                "sandbox {name} failed instead of becoming {wanted:?}: {}",
                status.message
            )));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ApiError::Unavailable(format!(
                "timed out after {}s waiting for sandbox {name} to be {wanted:?} (it is {:?}); \
                 the controller may be busy, ask again later",
                timeout.as_secs_f64(),
                status.phase
            )));
        }
        wait_for_change(&mut events, name, (deadline - now).min(POLL)).await;
    }
}

/// Waits until the store reports a change to sandbox `name`, or `nap` passes.
async fn wait_for_change(
    events: &mut broadcast::Receiver<crate::store::WatchEvent>,
    name: &str,
    nap: Duration,
) {
    let changed = async {
        loop {
            match events.recv().await {
                Ok(event)
                    if event.resource.kind() == Kind::Sandbox && event.resource.name() == name =>
                {
                    return
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(_)) => return,
                Err(broadcast::error::RecvError::Closed) => std::future::pending::<()>().await,
            }
        }
    };
    let _ = tokio::time::timeout(nap, changed).await;
}

/// Whether a call on `sandbox` must wait for it to run again first.
pub fn needs_resume(sandbox: &Sandbox) -> bool {
    let phase = sandbox.status.as_ref().map(|s| s.phase);
    sandbox.spec.desired_state() != SandboxState::Running
        || matches!(phase, Some(SandboxPhase::Paused | SandboxPhase::Stopped))
}

/// Before a call that needs `sandbox` running: counts the call as activity, and resumes a paused
/// or stopped sandbox first (or refuses with 409 `sandbox_paused` when it does not resume by
/// itself). Answers the sandbox as it is when the call may go ahead.
pub async fn awake(state: &AppState, sandbox: Sandbox) -> Result<Sandbox, ApiError> {
    let name = sandbox.metadata.key();
    if !wake_with_change(state, &sandbox)? {
        return Ok(sandbox);
    }
    let resumed = set_state(&state.store, &name, SandboxState::Running, STATE_WAIT).await?;
    // The resume itself is activity: the idle count starts again from now.
    state.activity.touch(&name);
    Ok(resumed)
}

/// An explicit resume (E2B's `connect`): a paused or stopped sandbox runs again whatever its
/// `spec.autoResume` says, the call counting as activity. With `keep_until`, a lifetime that
/// would end before then is moved to end then, in the same write as the resume: a short
/// lifetime (it starts again at each resume) cannot end between the two. Answers the sandbox as
/// it then is; one that did not need a resume is answered unchanged, for the caller to extend.
pub async fn resume(
    state: &AppState,
    sandbox: Sandbox,
    keep_until: Option<DateTime<Utc>>,
) -> Result<Sandbox, ApiError> {
    let name = sandbox.metadata.key();
    state.activity.touch(&name);
    if !needs_resume(&sandbox) {
        return Ok(sandbox);
    }
    let extend = move |spec: &mut SandboxSpec| {
        if let Some(end) = keep_until {
            // The controller anchors the new lifetime at the resume, which is now.
            keep_alive_until(spec, Utc::now(), end);
        }
    };
    let resumed = set_state_with(
        &state.store,
        &name,
        SandboxState::Running,
        STATE_WAIT,
        extend,
    )
    .await?;
    state.activity.touch(&name);
    Ok(resumed)
}

/// Whether a lifetime that starts at `anchor` ends before `end` (a lifetime without an end
/// counts as ending sooner: a keep-alive gives every sandbox an end).
pub fn ends_before(spec: &SandboxSpec, anchor: DateTime<Utc>, end: DateTime<Utc>) -> bool {
    spec.expires_at(anchor).is_none_or(|at| at < end)
}

/// Moves the end of a lifetime that starts at `anchor` to `end` when it would come sooner: the
/// absolute time then rules (`shutdownTime`), the time to live gives way to it.
fn keep_alive_until(spec: &mut SandboxSpec, anchor: DateTime<Utc>, end: DateTime<Utc>) {
    if ends_before(spec, anchor, end) {
        spec.shutdown_time = Some(end);
        spec.ttl_seconds = None;
    }
}

/// Before a call that needs `sandbox` running and changes its spec anyway (a rollback): counts
/// the call as activity and answers whether the same write must also set `spec.state: Running`
/// (it is paused or stopped and resumes by itself), or refuses with 409 `sandbox_paused`.
pub fn wake_with_change(state: &AppState, sandbox: &Sandbox) -> Result<bool, ApiError> {
    let name = &sandbox.metadata.key();
    state.activity.touch(name);
    if !needs_resume(sandbox) {
        return Ok(false);
    }
    if !sandbox.spec.auto_resumes() {
        return Err(ApiError::SandboxPaused(format!(
            "sandbox {name} is {} and spec.autoResume is false: resume it first",
            match sandbox.spec.desired_state() {
                SandboxState::Stopped => "stopped",
                _ => "paused",
            }
        )));
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resource::{SandboxSpec, SandboxStatus};

    fn sandbox(state: Option<SandboxState>, phase: SandboxPhase) -> Sandbox {
        let mut sb = Sandbox::new(
            "a",
            SandboxSpec {
                state,
                ..SandboxSpec::default()
            },
        );
        sb.status = Some(SandboxStatus {
            phase,
            ..SandboxStatus::default()
        });
        sb
    }

    #[test]
    fn a_resume_with_a_later_end_replaces_a_shorter_lifetime_and_keeps_a_longer_one() {
        let now = Utc::now();
        let end = now + chrono::TimeDelta::seconds(120);
        // Stopped at the end of a 6 s lifetime: resumed, it would live 6 s more; now until `end`.
        let mut short = SandboxSpec {
            ttl_seconds: Some(6),
            expiry_action: Some(crate::resource::ExpiryAction::Stop),
            ..SandboxSpec::default()
        };
        keep_alive_until(&mut short, now, end);
        assert_eq!((short.shutdown_time, short.ttl_seconds), (Some(end), None));
        // A lifetime that already goes past `end` is left alone.
        let mut long = SandboxSpec {
            ttl_seconds: Some(600),
            expiry_action: Some(crate::resource::ExpiryAction::Stop),
            ..SandboxSpec::default()
        };
        keep_alive_until(&mut long, now, end);
        assert_eq!((long.shutdown_time, long.ttl_seconds), (None, Some(600)));
        // No lifetime at all gets one ending at `end`.
        let mut endless = SandboxSpec::default();
        keep_alive_until(&mut endless, now, end);
        assert_eq!(endless.shutdown_time, Some(end));
    }

    #[test]
    fn a_sandbox_needs_a_resume_when_it_is_or_will_be_paused_or_stopped() {
        assert!(!needs_resume(&sandbox(None, SandboxPhase::Running)));
        assert!(!needs_resume(&sandbox(
            Some(SandboxState::Running),
            SandboxPhase::Pending
        )));
        assert!(needs_resume(&sandbox(
            Some(SandboxState::Paused),
            SandboxPhase::Running
        )));
        assert!(needs_resume(&sandbox(
            Some(SandboxState::Running),
            SandboxPhase::Stopped
        )));
        assert!(needs_resume(&sandbox(None, SandboxPhase::Paused)));
    }
}
