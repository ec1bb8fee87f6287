//! Reconciling one `Sandbox`: its workspace volume and hardened container, expiry, deletion, and
//! the status that reports all of it.

use chrono::{DateTime, Utc};

use super::container::{limits_for, Replaced};
use super::context::SandboxContext;
use super::error::ReconcileError;
use super::names::{self, container_name};
use super::policy::{Cleanup, Failure, Outcome};
use super::status::{generation, note_pulled, set_ready, write_status};
use super::{
    power, quota, replace, restore, sandbox_secrets, services, template, template_pool,
    workspace_disk,
};
use crate::docker::EngineError;
use crate::resource::{
    set_condition, Condition, ConditionStatus, EffectiveSandbox, ImagePullProgress, Kind, Sandbox,
    SandboxPhase, SandboxState, SandboxStatus,
};
use crate::store::Entry;

/// Reconciles sandbox `name`. A failure to report leaves with the status observed so far; the
/// error policy reports it.
pub(super) async fn reconcile(
    ctl: &SandboxContext<'_>,
    name: &str,
) -> Result<Outcome, Failure<Sandbox>> {
    if names::is_member(name) {
        // A warm-pool member: its pool looks after it.
        if let Some(pool) = names::pool_of_member(name) {
            ctl.pools.recount(pool.to_string());
        }
        return Ok(Outcome::done());
    }
    let Some(entry) = ctl.store.get(Kind::Sandbox, name) else {
        // No resource: whatever Docker still has under this name is garbage.
        ctl.containers.remove_leftovers_of(name).await?;
        return Ok(Outcome::done());
    };
    let Some(declared) = entry.resource.as_sandbox().cloned() else {
        return Ok(Outcome::done());
    };
    if declared.metadata.deletion_timestamp.is_some() {
        return Ok(delete(ctl, &declared).await?);
    }

    let mut status = declared.status.clone().unwrap_or_default();
    // A claim an earlier pass recorded but could not rename takes the sandbox's name now (one
    // never recorded goes): everything below looks for the container by that name.
    ctl.pools
        .naming
        .name_claimed(name, status.container_id.as_deref())
        .await?;
    // From here on the sandbox is as it runs: with what its template gave it.
    let sandbox = match template::resolve(ctl.store, &declared, &mut status) {
        Ok(sandbox) => sandbox,
        Err(error) => {
            let error = ReconcileError::Source(Box::new(error));
            return Err(Failure::reported(error, &declared, status));
        }
    };
    let generation = generation(&sandbox.metadata);
    let now = Utc::now();

    // Expiry. A folder-owned sandbox that expired stays down until its document changes.
    if status.phase == SandboxPhase::Expired {
        if status.expired_generation == Some(generation) {
            return Ok(Outcome::done());
        }
        status.active_since = Some(now);
        status.expired_generation = None;
    }
    // A sandbox whose lifetime's end pauses or stops it (`spec.expiryAction`) has a lifetime only
    // while it runs: none while it is paused or stopped, a new one from each resume.
    let desired = sandbox.spec.desired_state();
    let kept_at_expiry = sandbox.spec.expiry_state();
    let resuming = kept_at_expiry.is_some()
        && desired == SandboxState::Running
        && matches!(status.phase, SandboxPhase::Paused | SandboxPhase::Stopped);
    let anchor = if resuming {
        now
    } else {
        status
            .active_since
            .or(sandbox.metadata.creation_timestamp)
            .unwrap_or(now)
    };
    status.active_since = Some(anchor);
    let expires_at = if kept_at_expiry.is_some() && desired != SandboxState::Running {
        None
    } else {
        sandbox.spec.expires_at(anchor)
    };
    status.expires_at = expires_at;
    if let Some(at) = expires_at.filter(|at| *at <= now) {
        return match kept_at_expiry {
            Some(target) if entry.origin.is_writable() => {
                Ok(end_lifetime(ctl, &sandbox, target, at - anchor).await?)
            }
            _ => Ok(expire(ctl, &entry, &sandbox, status).await?),
        };
    }

    let effective = sandbox.spec.effective(&ctl.containers.defaults());

    // A sandbox no quota admits (one declared in a folder: the API refuses the others) waits
    // with nothing started; the quota's changes and its namespace's look at it again.
    let held_by = quota::holding(ctl.store, &ctl.containers.defaults(), &declared);
    let was_held = status
        .conditions
        .iter()
        .any(|c| c.type_ == quota::QUOTA_EXCEEDED);
    if let Some(exceeded) = held_by {
        let message = exceeded.to_string();
        set_condition(
            &mut status.conditions,
            Condition {
                type_: quota::QUOTA_EXCEEDED.into(),
                status: ConditionStatus::True,
                reason: quota::QUOTA_EXCEEDED.into(),
                message: message.clone(),
                last_transition_time: now,
                observed_generation: Some(generation),
            },
        );
        set_ready(
            &mut status.conditions,
            ConditionStatus::False,
            quota::QUOTA_EXCEEDED,
            &message,
            generation,
        );
        status.phase = SandboxPhase::Pending;
        status.message = message;
        write_status(ctl.store, ctl.events, &sandbox, &status)
            .await
            .map_err(|error| Failure::reported(error, &sandbox, status.clone()))?;
        return Ok(Outcome::done());
    }
    if was_held {
        status
            .conditions
            .retain(|c| c.type_ != quota::QUOTA_EXCEEDED);
        status.message.clear();
    }

    // Paused or stopped as the spec asks, on the container it already has: nothing else to do
    // (a pending rollback or a container to rebuild goes the long way below).
    let was = status.phase;
    if desired != SandboxState::Running && sandbox.spec.pending_rollback(Some(&status)).is_none() {
        match power::hold(ctl, &sandbox, &effective, &status, desired).await {
            Ok(true) => return Ok(held(ctl, &sandbox, status, desired, expires_at).await?),
            Ok(false) => {}
            Err(error) => return Err(Failure::reported(error, &sandbox, status)),
        }
    }

    // A sandbox started from a snapshot gets its first workspace from it before anything runs.
    let built = match restore::ensure_source(ctl, &sandbox, &effective, &mut status).await {
        Ok(built) => built,
        Err(error) => return Err(source_failed(&sandbox, status, error)),
    };

    // A new rollback request. Its status write is the commit point, so it happens at once; a
    // failure leaves the old workspace, which ensure_running brings back up below.
    // What it replaced is removed only after the sandbox is reported running again, so that
    // nobody waits for the removal.
    let mut replaced = None;
    let rollback_error =
        match restore::ensure_rollback(ctl, &sandbox, &effective, &mut status).await {
            Ok(Some(leftovers)) => {
                write_status(ctl.store, ctl.events, &sandbox, &status).await?;
                replaced = Some(leftovers);
                None
            }
            Ok(None) => None,
            Err(error) => Some(error),
        };

    // What a replacement retired goes once the status names its successor. A container the
    // source built just now runs as `effective` says: looking at it again would only cost time.
    let ensured = if built && replaced.is_none() && rollback_error.is_none() {
        Ok(Replaced::default())
    } else {
        ensure_running(ctl, &sandbox, &effective, &mut status).await
    };
    let retired = match ensured {
        Ok(retired) => retired,
        Err(error) => return Err(Failure::reported(error, &sandbox, status)),
    };
    if let Some(container) = status.container_id.clone() {
        if let Err(error) = ctl
            .containers
            .police(&sandbox, &effective, &container)
            .await
        {
            return Err(Failure::reported(error, &sandbox, status));
        }
    }
    if desired != SandboxState::Running && rollback_error.is_none() {
        // Made or rebuilt just now: held as the spec asks from the start, under its own name.
        ctl.pools
            .naming
            .name_claimed(name, status.container_id.as_deref())
            .await?;
        match power::hold(ctl, &sandbox, &effective, &status, desired).await {
            Ok(true) => {
                let outcome = held(ctl, &sandbox, status, desired, expires_at).await?;
                retired
                    .remove(ctl.engine.as_ref(), &ctl.containers.disks)
                    .await;
                if let Some(leftovers) = replaced {
                    leftovers
                        .remove(ctl.engine.as_ref(), &ctl.containers.disks)
                        .await;
                }
                return Ok(outcome);
            }
            Ok(false) => {
                let error = ReconcileError::Vanished {
                    container: names::container_name(name),
                    when: " before it could be paused or stopped",
                };
                return Err(Failure::reported(error, &sandbox, status));
            }
            Err(error) => return Err(Failure::reported(error, &sandbox, status)),
        }
    }
    // A command the OOM killer took in the running container.
    if let Some(oom) = status
        .container_id
        .as_deref()
        .and_then(|id| ctl.terminations.command_oom(id))
    {
        status.last_termination = Some(oom);
    }
    if matches!(was, SandboxPhase::Paused | SandboxPhase::Stopped) {
        power::note_resumed(ctl, name, &mut status);
    }
    status.phase = SandboxPhase::Running;
    status.message.clear();
    status.observed_generation = Some(generation);
    if status.image_pull.is_some() {
        // The pull's final count.
        if let Some((done, total)) = ctl.containers.pulls.progress(&effective.image) {
            status.image_pull = Some(ImagePullProgress {
                bytes_done: done,
                bytes_total: total,
            });
        }
    }
    note_pulled(&mut status, generation);
    let rolled_back = sandbox.spec.rollback.is_some() || status.last_rollback.is_some();
    let current_volume = status.workspace_volume.clone();
    if let Some(error) = rollback_error {
        // The sandbox runs as it was; the request stays pending and is retried with backoff.
        let request = sandbox
            .spec
            .rollback
            .as_ref()
            .map(|r| r.request_id.clone())
            .unwrap_or_default();
        let error = ReconcileError::RollbackFailed {
            request,
            error: Box::new(error),
        };
        let mut failure =
            Failure::reported(error, &sandbox, status).then(Cleanup::Replaced(retired));
        // An attempt interrupted earlier (a crash mid-restore) may have left a staging container
        // and volume; a request that now fails (its snapshot deleted since) would keep them.
        if let Some(current) = current_volume {
            failure = failure.then(Cleanup::Attempts {
                sandbox: name.to_string(),
                current,
            });
        }
        return Err(failure);
    }
    let policed = effective.egress && ctl.containers.polices();
    sandbox_secrets::report(ctl.store, &sandbox, &mut status, policed, generation);
    let not_ready = services::report(ctl, &sandbox, &mut status, generation);
    if not_ready.is_empty() {
        set_ready(
            &mut status.conditions,
            ConditionStatus::True,
            "Running",
            "",
            generation,
        );
    } else {
        let message = format!("services not ready: {}", not_ready.join(", "));
        set_ready(
            &mut status.conditions,
            ConditionStatus::False,
            "ServicesNotReady",
            &message,
            generation,
        );
    }
    write_status(ctl.store, ctl.events, &sandbox, &status).await?;
    // A member claimed just now takes the sandbox's name only now that the status records it,
    // without holding this worker (the next reconcile of the sandbox waits for it).
    ctl.pools
        .naming
        .name_in_background(name, status.container_id.as_deref());
    let strays = match current_volume.filter(|_| rolled_back) {
        Some(current) => ctl.containers.stray_volumes(name, &current).await,
        None => Vec::new(),
    };
    let retired: Vec<Replaced> = std::iter::once(retired).chain(replaced).collect();
    ctl.containers.remove_retired(name, retired, strays);
    let idle = match power::idle(ctl, &sandbox) {
        power::Idle::Since(last) => {
            power::confirm_idle(ctl, &sandbox, status.container_id.as_deref(), last).await
        }
        not_yet => not_yet,
    };
    match idle {
        power::Idle::Until(at) => Ok(Outcome::at(earliest(expires_at, at))),
        power::Idle::Since(last) => {
            if power::act_on_idle(ctl, &sandbox).await? {
                status.idle_since = Some(last);
                write_status(ctl.store, ctl.events, &sandbox, &status).await?;
            }
            Ok(Outcome::at(expires_at))
        }
    }
}

fn earliest(a: Option<DateTime<Utc>>, b: Option<DateTime<Utc>>) -> Option<DateTime<Utc>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Reports a sandbox held paused or stopped as its spec asks.
async fn held(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    mut status: SandboxStatus,
    state: SandboxState,
    expires_at: Option<DateTime<Utc>>,
) -> Result<Outcome, ReconcileError> {
    // Frozen or stopped: nothing to supervise until it runs again (a resume adopts the
    // services' processes that still run).
    ctl.services.release(&sandbox.metadata.key());
    let generation = generation(&sandbox.metadata);
    status.phase = state.phase();
    status.message.clear();
    status.observed_generation = Some(generation);
    let word = if state == SandboxState::Paused {
        "paused"
    } else {
        "stopped"
    };
    let (reason, message) = match (status.idle_since, &sandbox.spec.idle) {
        (Some(_), Some(policy)) => (
            "Idle",
            format!("{word} after {} s without activity", policy.after_seconds),
        ),
        _ => (
            if state == SandboxState::Paused {
                "Paused"
            } else {
                "Stopped"
            },
            format!("{word} as spec.state says"),
        ),
    };
    let message = if sandbox.spec.auto_resumes() {
        format!("{message}; the next exec or file call resumes it")
    } else {
        message
    };
    set_ready(
        &mut status.conditions,
        ConditionStatus::True,
        reason,
        &message,
        generation,
    );
    write_status(ctl.store, ctl.events, sandbox, &status).await?;
    Ok(Outcome::at(expires_at))
}

/// A `spec.source` that could not be built: waiting for its snapshot, or failed (then whatever an
/// interrupted attempt left goes once that is reported).
fn source_failed(
    sandbox: &Sandbox,
    status: SandboxStatus,
    error: ReconcileError,
) -> Failure<Sandbox> {
    let waiting = matches!(error, ReconcileError::SnapshotNotReady(_));
    let unbuilt = status.workspace_volume.is_none();
    let failure = Failure::reported(ReconcileError::Source(Box::new(error)), sandbox, status);
    if waiting || !unbuilt {
        return failure;
    }
    // Whatever an attempt interrupted by a crash left (a container, a volume) belongs to a
    // workspace that was never recorded and now cannot be built.
    failure.then(Cleanup::Everything {
        sandbox: sandbox.metadata.key(),
    })
}

/// Makes the volume and a running container that matches `effective` exist. Returns what a
/// replacement retired, to remove once the status names its successor.
async fn ensure_running(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &mut SandboxStatus,
) -> Result<Replaced, ReconcileError> {
    let mut retired = Replaced::default();
    let name = &sandbox.metadata.key();
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let hash = effective.container_hash();
    // Pool members have plain workspaces: a sandbox with a disk limit never takes one.
    if status.container_id.is_none() && status.workspace_volume.is_none() && effective.disk_mb == 0
    {
        // A brand-new sandbox: a warm container, when a pool has one (its template's first),
        // beats creating one.
        let record = status.template.clone();
        if let Some(claimed) =
            template_pool::claim(ctl, sandbox, record.as_ref(), effective).await?
        {
            claimed.record(status, effective);
            return Ok(retired);
        }
        if let Some(claimed) = ctl.pools.claim(name, effective).await? {
            claimed.record(status, effective);
            return Ok(retired);
        }
    }
    let volume = match &status.workspace_volume {
        Some(volume) => volume.clone(),
        None => ctl.containers.fresh_workspace(name, &uid).await?,
    };
    status.workspace_volume = Some(volume.clone());
    // A disk limit's file system is mounted (again, after a reboot) and grown to a raised limit
    // before anything uses the workspace.
    workspace_disk::keep(ctl, &volume, effective).await?;
    // So is a pool member's copy-on-write view (see `member_views.rs`).
    super::member_views::keep(ctl.store, ctl.engine.as_ref(), &volume).await?;

    let limits = limits_for(effective);
    let current = container_name(name);
    let mut existing = ctl.engine.inspect_container(&current).await?;
    // A claim recorded by a server that stopped before it renamed the claimed member.
    if existing.is_none() && ctl.pools.naming.adopt(name, status).await? {
        existing = ctl.engine.inspect_container(&current).await?;
    }
    let occupant = existing.clone();
    let reusable = existing.filter(|c| power::is_current(c, status, &uid, &hash));
    let details = match reusable {
        Some(details) => details,
        None => {
            // Either nothing is there, or it was built from another spec or resource: replace it,
            // keeping the workspace. A snapshot of the old container in progress finishes first.
            let _snapshots_wait = match &occupant {
                Some(_) => Some(ctl.snapshots.lock(name).await),
                None => None,
            };
            // A sandbox restored from a Full snapshot keeps that root filesystem in every new
            // container while its spec.image allows (pool members run the plain image).
            if let Some(rootfs) = &status.rootfs {
                if !rootfs.applies_to(sandbox.spec.image.as_deref()) {
                    status.rootfs = None;
                }
            }
            if let (Some(old), None) = (&occupant, &status.rootfs) {
                if let Some(replaced) =
                    replace::from_pool(ctl, name, effective, old, status).await?
                {
                    return Ok(replaced);
                }
            }
            // The create makes the workspace volume, labeled, if it does not exist (a new
            // sandbox, or a volume removed by hand).
            let mut plan = ctl.containers.plan_for(sandbox, effective, &volume).await?;
            if let Some(rootfs) = &status.rootfs {
                plan.image = rootfs.image.clone();
            }
            workspace_disk::ensure_volume(ctl, &plan).await?;
            let id = match &occupant {
                Some(old) => {
                    let (id, old) = replace::with_new(ctl, name, &mut plan, &old.id).await?;
                    retired.container = old;
                    id
                }
                None => {
                    let id = ctl.engine.create_container(&plan).await?;
                    let runtime = plan.runtime.clone().unwrap_or_default();
                    ctl.workspaces
                        .start_with_workspace(&id, &runtime, None)
                        .await?;
                    id
                }
            };
            // Created with these limits and started: nothing below applies to it.
            status.applied_limits = Some(limits);
            status.container_id = Some(id);
            status.started_at = Some(Utc::now());
            status.claimed_from = None;
            status.container_hash = None;
            return Ok(retired);
        }
    };
    if details.paused {
        if ctl.snapshots.holds_paused(name) {
            // A snapshot froze it and will thaw it.
            status.container_id = Some(details.id.clone());
            return Ok(retired);
        }
        // Nobody holds it paused (a snapshot interrupted by a crash, or a hand): thaw it.
        ctl.engine.unpause(&details.id).await?;
    }
    if !details.running {
        // It ran and stopped while the sandbox was reported running: say why.
        if status.phase == SandboxPhase::Running && details.started_at.is_some() {
            status.last_termination = Some(ctl.terminations.stopped(&details));
        }
        // A snapshot reading the stopped sandbox's workspace finishes first.
        let _snapshots_wait = ctl.snapshots.lock(name).await;
        power::start_existing(ctl, &details.id).await?;
    }
    if status.applied_limits != Some(limits) {
        let updated = if ctl.engine.capabilities().live_limits {
            ctl.engine
                .update_limits(
                    &details.id,
                    limits.cpus,
                    limits.memory_mb,
                    limits.pids_limit,
                )
                .await
        } else {
            Err(EngineError::Unsupported {
                operation: "changing the limits of a live container".into(),
            })
        };
        if let Err(error) = updated {
            // Some runtimes (gVisor's runsc) cannot change limits of a live container: replace
            // it instead. The workspace volume is kept; the next pass creates the new container.
            tracing::info!(sandbox = name, %error, "limits cannot change in place; replacing the container");
            ctl.engine.remove_container(&details.id).await?;
            status.container_id = None;
            status.applied_limits = None;
            return Err(ReconcileError::LimitsNeedNewContainer(error));
        }
        status.applied_limits = Some(limits);
    }
    if status.container_id.as_deref() != Some(details.id.as_str()) || !details.running {
        status.started_at = Some(Utc::now());
    }
    status.container_id = Some(details.id);
    Ok(retired)
}

/// The end of the lifetime of a sandbox whose `spec.expiryAction` keeps it: writes `spec.state`
/// (`target`) the way a person would, and when the lifetime was set by `shutdownTime` alone, its
/// `length` as `ttlSeconds`, so that the next resume gets a lifetime as long. The spec change
/// brings the sandbox back here, to be paused or stopped.
async fn end_lifetime(
    ctl: &SandboxContext<'_>,
    sandbox: &Sandbox,
    target: SandboxState,
    length: chrono::TimeDelta,
) -> Result<Outcome, ReconcileError> {
    let name = sandbox.metadata.key();
    let kept = if target == SandboxState::Paused {
        "paused"
    } else {
        "stopped"
    };
    let seconds = u64::try_from(length.num_seconds()).unwrap_or(0).max(1);
    // Decided on the spec this pass read: a spec written since (a resume that also moved the
    // end, a new timeout) is not ended by it; its own event brings the sandbox back here.
    let decided_on = generation(&sandbox.metadata);
    let written = ctl
        .store
        .write(move |store| {
            store.update(Kind::Sandbox, &name, |resource| match resource {
                crate::resource::AnyResource::Sandbox(sandbox)
                    if sandbox.metadata.deletion_timestamp.is_none()
                        && generation(&sandbox.metadata) == decided_on =>
                {
                    sandbox.spec.state = Some(target);
                    if sandbox.spec.ttl_seconds.is_none() {
                        sandbox.spec.ttl_seconds = Some(seconds);
                    }
                    Ok(())
                }
                _ => Err(crate::store::StoreError::Invalid(
                    "not a live sandbox at the generation read".into(),
                )),
            })
        })
        .await;
    if written.is_ok() {
        tracing::info!(sandbox = %sandbox.metadata.key(), state = ?target, "sandbox lifetime ended; keeping it");
        record_expired(
            ctl,
            sandbox,
            format!("its lifetime ended; {kept} as spec.expiryAction says"),
        );
    }
    match written {
        Ok(_)
        | Err(crate::store::StoreError::Invalid(_))
        | Err(crate::store::StoreError::NotFound { .. }) => Ok(Outcome::done()),
        Err(error) => Err(error.into()),
    }
}

/// Records the sandbox's `Expired` event, whatever its end of life does.
fn record_expired(ctl: &SandboxContext<'_>, sandbox: &Sandbox, message: String) {
    ctl.events.record(crate::resource::Occurrence {
        involved_object: crate::resource::ObjectReference {
            kind: "Sandbox".to_string(),
            name: sandbox.metadata.name.clone(),
            namespace: sandbox.metadata.namespace.clone(),
            uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        },
        type_: crate::resource::EventSeverity::Normal,
        reason: "Expired".to_string(),
        message,
    });
}

async fn expire(
    ctl: &SandboxContext<'_>,
    entry: &Entry,
    sandbox: &Sandbox,
    mut status: SandboxStatus,
) -> Result<Outcome, ReconcileError> {
    let name = &sandbox.metadata.key();
    if entry.origin.is_writable() {
        tracing::info!(sandbox = name, "sandbox expired; deleting it");
        // The document goes, its Expired event stays (as a folder-owned sandbox's does).
        let message = match status.expires_at {
            Some(at) => format!("its lifetime ended at {}", at.to_rfc3339()),
            None => "its lifetime ended".to_string(),
        };
        record_expired(ctl, sandbox, message);
        ctl.services.release(name);
        let name = name.to_string();
        ctl.store
            .write(move |store| store.delete(Kind::Sandbox, &name, Default::default()))
            .await?;
        return Ok(Outcome::done());
    }
    tracing::info!(
        sandbox = name,
        "folder-owned sandbox expired; removing its container until its document changes"
    );
    ctl.services.release(name);
    // A claimed member a stopped server left under its member name goes with the sandbox's
    // containers, not back to its pool.
    ctl.pools.naming.adopt(name, &status).await?;
    ctl.containers.remove_all_of(name).await?;
    let generation = generation(&sandbox.metadata);
    status.phase = SandboxPhase::Expired;
    status.expired_generation = Some(generation);
    status.container_id = None;
    status.workspace_volume = None;
    status.applied_limits = None;
    status.observed_generation = Some(generation);
    let message = "expired; change the document to start it again";
    set_ready(
        &mut status.conditions,
        ConditionStatus::False,
        "Expired",
        message,
        generation,
    );
    status.message = message.into();
    write_status(ctl.store, ctl.events, sandbox, &status).await?;
    Ok(Outcome::done())
}

async fn delete(ctl: &SandboxContext<'_>, sandbox: &Sandbox) -> Result<Outcome, ReconcileError> {
    let name = &sandbox.metadata.key();
    let mut status = sandbox.status.clone().unwrap_or_default();
    if status.phase != SandboxPhase::Terminating {
        status.phase = SandboxPhase::Terminating;
        let generation = generation(&sandbox.metadata);
        set_ready(
            &mut status.conditions,
            ConditionStatus::False,
            "Terminating",
            "",
            generation,
        );
        write_status(ctl.store, ctl.events, sandbox, &status).await?;
    }
    // The resource is ours, so its container names are too. What the deletion waits for is only
    // this: its processes killed and its containers renamed out of its names. Then the document
    // goes (the name is free at once) and the containers and workspaces are removed in the
    // background; a crash before that leaves them to garbage collection, which finds them
    // belonging to no sandbox (their new names are none's, their labels carry this uid).
    ctl.services.release(name);
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    ctl.containers.unpolice(name);
    // A claimed member still under its member name (its rename failed, or a server stopped
    // before it) must not go back to its pool: it takes the sandbox's name to be retired with it.
    ctl.pools
        .naming
        .name_claimed(name, status.container_id.as_deref())
        .await?;
    ctl.pools.naming.adopt(name, &status).await?;
    let retired = ctl.containers.retire_deleted(name, &uid).await?;
    let recorded = sandbox
        .status
        .as_ref()
        .and_then(|s| s.workspace_volume.clone());
    let owned = name.to_string();
    ctl.store
        .write(move |store| store.finalize(Kind::Sandbox, &owned))
        .await?;
    ctl.containers
        .remove_deleted(name, vec![uid], retired, recorded);
    ctl.activity.forget(name);
    Ok(Outcome::done())
}
