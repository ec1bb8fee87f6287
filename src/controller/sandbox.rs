//! Reconciling one `Sandbox`: its workspace volume and hardened container, expiry, deletion, and
//! the status that reports all of it.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;

use super::restore::{self, RestoreError};
use super::{Controller, Outcome, ReconcileError};
use crate::docker::{
    container_name, volume_name, ContainerPlan, EngineError, LABEL_SERVER, LABEL_UID,
};
use crate::resource::{
    set_condition, AppliedLimits, Condition, ConditionStatus, EffectiveSandbox, Kind, Sandbox,
    SandboxPhase, SandboxStatus,
};
use crate::store::Entry;

/// How long to wait before looking again at a sandbox that cannot start for a reason outside our
/// control (a missing image, say).
const EXTERNAL_RETRY: Duration = Duration::from_secs(30);
/// How often a sandbox waiting for its source snapshot to become ready looks again.
const SNAPSHOT_WAIT: Duration = Duration::from_secs(1);

pub(super) async fn reconcile(ctl: &Controller, name: &str) -> Result<Outcome, ReconcileError> {
    if name.starts_with(super::pool::MEMBER_PREFIX) {
        // A warm-pool member: its pool looks after it.
        if let Some(pool) = super::pool::pool_of_member(name) {
            ctl.recount_pool(pool.to_string());
        }
        return Ok(Outcome::done());
    }
    let Some(entry) = ctl.store.get(Kind::Sandbox, name) else {
        // No resource: whatever Docker still has under this name is garbage.
        remove_docker_objects(ctl, name).await?;
        return Ok(Outcome::done());
    };
    let Some(sandbox) = entry.resource.as_sandbox().cloned() else {
        return Ok(Outcome::done());
    };
    if sandbox.metadata.deletion_timestamp.is_some() {
        return delete(ctl, &sandbox).await;
    }

    let mut status = sandbox.status.clone().unwrap_or_default();
    let generation = sandbox.metadata.generation.unwrap_or(1);
    let now = Utc::now();

    // Expiry. A folder-owned sandbox that expired stays down until its document changes.
    if status.phase == SandboxPhase::Expired {
        if status.expired_generation == Some(generation) {
            return Ok(Outcome::done());
        }
        status.active_since = Some(now);
        status.expired_generation = None;
    }
    let anchor = status
        .active_since
        .or(sandbox.metadata.creation_timestamp)
        .unwrap_or(now);
    status.active_since = Some(anchor);
    let expires_at = sandbox.spec.expires_at(anchor);
    status.expires_at = expires_at;
    if expires_at.is_some_and(|at| at <= now) {
        return expire(ctl, &entry, &sandbox, status).await;
    }

    let effective = sandbox.spec.effective(&ctl.defaults());

    // A sandbox started from a snapshot gets its first workspace from it before anything runs.
    let built = match restore::ensure_source(ctl, &sandbox, &effective, &mut status).await {
        Ok(built) => built,
        Err(error) => return source_failed(ctl, &sandbox, status, error).await,
    };

    // A new rollback request. Its status write is the commit point, so it happens at once; a
    // failure leaves the old workspace, which ensure_running brings back up below.
    // What it replaced is removed only after the sandbox is reported running again, so that
    // nobody waits for the removal.
    let mut replaced = None;
    let rollback_error =
        match restore::ensure_rollback(ctl, &sandbox, &effective, &mut status).await {
            Ok(Some(leftovers)) => {
                write_status(ctl, &sandbox, status.clone()).await?;
                replaced = Some(leftovers);
                None
            }
            Ok(None) => None,
            Err(error) => Some(error),
        };

    // What a replacement retired goes once the status names its successor. A container the
    // source built just now runs as `effective` says: looking at it again would only cost time.
    let ensured = if built && replaced.is_none() && rollback_error.is_none() {
        Ok(restore::Replaced::default())
    } else {
        ensure_running(ctl, &sandbox, &effective, &mut status).await
    };
    let retired = match ensured {
        Ok(retired) => retired,
        Err(ReconcileError::Engine(EngineError::ImageMissing(image))) => {
            status.phase = SandboxPhase::Failed;
            let message = format!("image {image} is not present on the docker host");
            ready(
                &mut status,
                ConditionStatus::False,
                "ImageMissing",
                &message,
                generation,
            );
            status.message = message;
            status.observed_generation = Some(generation);
            write_status(ctl, &sandbox, status).await?;
            return Ok(Outcome::after(EXTERNAL_RETRY));
        }
        Err(error) => {
            status.phase = SandboxPhase::Failed;
            status.message = error.to_string();
            ready(
                &mut status,
                ConditionStatus::False,
                "ReconcileError",
                &error.to_string(),
                generation,
            );
            write_status(ctl, &sandbox, status).await?;
            return Err(error);
        }
    };
    status.phase = SandboxPhase::Running;
    status.message.clear();
    status.observed_generation = Some(generation);
    let rolled_back = sandbox.spec.rollback.is_some() || status.last_rollback.is_some();
    let current_volume = status.workspace_volume.clone();
    if let Some(error) = rollback_error {
        // The sandbox runs as it was; the request stays pending and is retried with backoff.
        let request = sandbox
            .spec
            .rollback
            .as_ref()
            .map(|r| r.request_id.as_str())
            .unwrap_or_default();
        let message = format!("rollback {request:?} failed: {error}");
        let reason = match error {
            RestoreError::SnapshotNotReady(_) => "WaitingForSnapshot",
            _ => "RollbackFailed",
        };
        ready(
            &mut status,
            ConditionStatus::False,
            reason,
            &message,
            generation,
        );
        status.message = message.clone();
        write_status(ctl, &sandbox, status).await?;
        retired.remove(ctl).await;
        // An attempt interrupted earlier (a crash mid-restore) may have left a staging container
        // and volume; a request that now fails (its snapshot deleted since) would keep them.
        if let Some(current) = &current_volume {
            if let Err(error) = restore::discard_attempts(ctl, name, current).await {
                tracing::warn!(sandbox = name, %error, "removing an interrupted rollback failed");
            }
        }
        return Err(ReconcileError::Other(message));
    }
    ready(
        &mut status,
        ConditionStatus::True,
        "Running",
        "",
        generation,
    );
    write_status(ctl, &sandbox, status).await?;
    retired.remove(ctl).await;
    if let Some(leftovers) = replaced {
        leftovers.remove(ctl).await;
    }
    if let (true, Some(current)) = (rolled_back, current_volume) {
        if let Err(error) = restore::remove_stray_volumes(ctl, name, &current).await {
            tracing::warn!(sandbox = name, %error, "removing replaced workspaces failed");
        }
    }
    Ok(Outcome::at(expires_at))
}

/// Reports a `spec.source` that could not be built: waiting for its snapshot, or failed (then
/// whatever an interrupted attempt left goes).
async fn source_failed(
    ctl: &Controller,
    sandbox: &Sandbox,
    mut status: SandboxStatus,
    error: RestoreError,
) -> Result<Outcome, ReconcileError> {
    let name = sandbox.metadata.name.as_str();
    let generation = sandbox.metadata.generation.unwrap_or(1);
    let waiting = matches!(error, RestoreError::SnapshotNotReady(_));
    status.phase = if waiting {
        SandboxPhase::Pending
    } else {
        SandboxPhase::Failed
    };
    let message = error.to_string();
    ready(
        &mut status,
        ConditionStatus::False,
        error.reason(),
        &message,
        generation,
    );
    status.message = message.clone();
    status.observed_generation = Some(generation);
    let unbuilt = status.workspace_volume.is_none();
    write_status(ctl, sandbox, status).await?;
    if waiting {
        return Ok(Outcome::after(SNAPSHOT_WAIT));
    }
    if unbuilt {
        // Whatever an attempt interrupted by a crash left (a container, a volume) belongs to
        // a workspace that was never recorded and now cannot be built.
        remove_docker_objects(ctl, name).await?;
    }
    Err(ReconcileError::Other(message))
}

/// Makes the volume and a running container that matches `effective` exist. Returns what a
/// replacement retired, to remove once the status names its successor.
async fn ensure_running(
    ctl: &Controller,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    status: &mut SandboxStatus,
) -> Result<restore::Replaced, ReconcileError> {
    let mut retired = restore::Replaced::default();
    let name = sandbox.metadata.name.as_str();
    let uid = sandbox.metadata.uid.clone().unwrap_or_default();
    let hash = effective.container_hash();
    if status.container_id.is_none() && status.workspace_volume.is_none() {
        // A brand-new sandbox: a warm container, when a pool has one, beats creating one.
        if let Some(claimed) = ctl.claim_from_pool(name, effective).await? {
            claimed.record(status, effective);
            return Ok(retired);
        }
    }
    let volume = status
        .workspace_volume
        .clone()
        .unwrap_or_else(|| volume_name(name));
    status.workspace_volume = Some(volume.clone());

    let limits = AppliedLimits {
        cpus: effective.cpus,
        memory_mb: effective.memory_mb,
        pids_limit: effective.pids_limit,
    };
    let current = container_name(name);
    let existing = ctl.engine.inspect_container(&current).await?;
    let occupant = existing.clone();
    let claimed_id = status
        .container_hash
        .as_deref()
        .filter(|h| *h == hash)
        .and(status.container_id.clone());
    let reusable = existing.filter(|c| {
        let built_for_us = c.labels.get(LABEL_UID) == Some(&uid)
            && c.labels.get(crate::docker::LABEL_SPEC_HASH) == Some(&hash)
            && status.container_id.as_deref().is_none_or(|id| id == c.id);
        built_for_us || claimed_id.as_deref() == Some(c.id.as_str())
    });
    let details = match reusable {
        Some(details) => details,
        None => {
            // Either nothing is there, or it was built from another spec or resource: replace it,
            // keeping the workspace. A snapshot of the old container in progress finishes first.
            let _snapshots_wait = match &occupant {
                Some(_) => Some(ctl.snapshots.lock(name).await),
                None => None,
            };
            if let Some(old) = &occupant {
                if let Some(replaced) = ctl.replace_from_pool(name, effective, old, status).await? {
                    return Ok(replaced);
                }
            }
            // The create makes the workspace volume, labeled, if it does not exist (a new
            // sandbox, or a volume removed by hand).
            let mut plan = plan_for(ctl, sandbox, effective, &volume).await?;
            let id = match &occupant {
                Some(old) => {
                    let (id, old) = replace_container(ctl, name, &mut plan, &old.id).await?;
                    retired.container = old;
                    id
                }
                None => {
                    let id = ctl.engine.create_container(&plan).await?;
                    let runtime = plan.runtime.clone().unwrap_or_default();
                    ctl.start_with_workspace(&id, &runtime, None).await?;
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
        ctl.engine.start_container(&details.id).await?;
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
            return Err(ReconcileError::Other(format!(
                "replacing the container to apply new limits ({error})"
            )));
        }
        status.applied_limits = Some(limits);
    }
    if status.container_id.as_deref() != Some(details.id.as_str()) || !details.running {
        status.started_at = Some(Utc::now());
    }
    status.container_id = Some(details.id);
    Ok(retired)
}

/// Builds and starts the container of `plan` in place of the container `old` that holds the
/// sandbox's name, without taking the sandbox down: the new one is made ready under the staging
/// name while the old one keeps serving (on the same workspace), then the names are swapped.
/// Returns the new container and the old one, to remove once the status names the new one.
async fn replace_container(
    ctl: &Controller,
    name: &str,
    plan: &mut ContainerPlan,
    old: &str,
) -> Result<(String, Option<String>), ReconcileError> {
    let staging = restore::staging_container_name(name);
    plan.name = Some(staging.clone());
    // Left by an interrupted replacement or rollback: never trusted.
    ctl.engine.remove_container(&staging).await?;
    let id = ctl.engine.create_container(plan).await?;
    let runtime = plan.runtime.clone().unwrap_or_default();
    let swapped = async {
        ctl.start_with_workspace(&id, &runtime, None).await?;
        Ok::<_, ReconcileError>(restore::swap_in(ctl, name, &id).await?)
    };
    match swapped.await {
        Ok(replaced) => Ok((id, replaced.or_else(|| Some(old.to_string())))),
        Err(error) => {
            let _ = ctl.engine.remove_container(&id).await;
            Err(error)
        }
    }
}

/// The container `sandbox` should have, with its workspace on `volume`. Checks that the image is
/// present and makes sure the network and helper volume it needs exist.
pub(super) async fn plan_for(
    ctl: &Controller,
    sandbox: &Sandbox,
    effective: &EffectiveSandbox,
    volume: &str,
) -> Result<ContainerPlan, ReconcileError> {
    if !ctl.engine.image_exists(&effective.image).await? {
        return Err(EngineError::ImageMissing(effective.image.clone()).into());
    }
    let network = if effective.network {
        ctl.engine
            .ensure_network(&ctl.settings.network_name)
            .await?;
        Some(ctl.settings.network_name.clone())
    } else {
        None
    };
    Ok(ContainerPlan {
        sandbox: sandbox.metadata.name.clone(),
        name: None,
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        server: ctl.server_id.clone(),
        image: effective.image.clone(),
        cpus: effective.cpus,
        memory_mb: effective.memory_mb,
        pids_limit: effective.pids_limit,
        network,
        read_only_rootfs: effective.read_only_rootfs,
        // Commands get the env from the spec when they start (see `container_hash`); a copy in
        // the container would only go stale.
        env: BTreeMap::new(),
        tmp_size_mb: ctl.settings.tmp_size_mb,
        user: ctl.settings.sandbox_user.clone(),
        runtime: non_empty(&ctl.settings.docker_runtime),
        spec_hash: effective.container_hash(),
        helper_volume: ctl.helper_volume().await?,
        workspace_volume: volume.to_string(),
    })
}

async fn expire(
    ctl: &Controller,
    entry: &Entry,
    sandbox: &Sandbox,
    mut status: SandboxStatus,
) -> Result<Outcome, ReconcileError> {
    let name = sandbox.metadata.name.as_str();
    if entry.origin.is_writable() {
        tracing::info!(sandbox = name, "sandbox expired; deleting it");
        ctl.store.delete(Kind::Sandbox, name, Default::default())?;
        return Ok(Outcome::done());
    }
    tracing::info!(
        sandbox = name,
        "folder-owned sandbox expired; removing its container until its document changes"
    );
    remove_docker_objects(ctl, name).await?;
    let generation = sandbox.metadata.generation.unwrap_or(1);
    status.phase = SandboxPhase::Expired;
    status.expired_generation = Some(generation);
    status.container_id = None;
    status.workspace_volume = None;
    status.applied_limits = None;
    status.observed_generation = Some(generation);
    let message = "expired; change the document to start it again";
    ready(
        &mut status,
        ConditionStatus::False,
        "Expired",
        message,
        generation,
    );
    status.message = message.into();
    write_status(ctl, sandbox, status).await?;
    Ok(Outcome::done())
}

async fn delete(ctl: &Controller, sandbox: &Sandbox) -> Result<Outcome, ReconcileError> {
    let name = sandbox.metadata.name.as_str();
    let mut status = sandbox.status.clone().unwrap_or_default();
    if status.phase != SandboxPhase::Terminating {
        status.phase = SandboxPhase::Terminating;
        let generation = sandbox.metadata.generation.unwrap_or(1);
        ready(
            &mut status,
            ConditionStatus::False,
            "Terminating",
            "",
            generation,
        );
        write_status(ctl, sandbox, status).await?;
    }
    // The resource is ours, so its container names are too: remove by name, no lookups (a
    // container being built or retired may still mount the workspace). Volumes are removed by
    // the names the status knows (a claimed pool workspace carries the pool member's name); a
    // sandbox that was rolled back may have stray ones, so only then list.
    let removals = restore::container_names(name)
        .map(|container| async move { ctl.engine.remove_container(&container).await });
    for removed in futures::future::join_all(removals).await {
        removed?;
    }
    let recorded = sandbox
        .status
        .as_ref()
        .and_then(|s| s.workspace_volume.clone());
    for volume in recorded.into_iter().chain([volume_name(name)]) {
        ctl.engine.remove_volume(&volume).await?;
    }
    let rolled_back = sandbox.spec.rollback.is_some()
        || sandbox
            .status
            .as_ref()
            .is_some_and(|s| s.last_rollback.is_some());
    if rolled_back {
        remove_docker_objects(ctl, name).await?;
    }
    ctl.store.finalize(Kind::Sandbox, name)?;
    Ok(Outcome::done())
}

/// Removes the sandbox's containers (under any of its names) and every workspace volume labeled
/// with its name — only those this server created: another server sharing the daemon may use
/// the same name.
pub(super) async fn remove_docker_objects(
    ctl: &Controller,
    name: &str,
) -> Result<(), ReconcileError> {
    let ours = |labels: &BTreeMap<String, String>| labels.get(LABEL_SERVER) == Some(&ctl.server_id);
    for container in restore::container_names(name) {
        if let Some(container) = ctl.engine.inspect_container(&container).await? {
            if ours(&container.labels) {
                ctl.engine.remove_container(&container.id).await?;
            }
        }
    }
    for volume in ctl.engine.list_volumes().await? {
        if volume.sandbox() == Some(name) && ours(&volume.labels) {
            ctl.engine.remove_volume(&volume.name).await?;
        }
    }
    Ok(())
}

fn ready(
    status: &mut SandboxStatus,
    verdict: ConditionStatus,
    reason: &str,
    message: &str,
    generation: u64,
) {
    set_condition(
        &mut status.conditions,
        ready_condition(verdict, reason, message, generation),
    );
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

/// Writes status only when it changed, so that an idle resync writes nothing.
async fn write_status(
    ctl: &Controller,
    sandbox: &Sandbox,
    status: SandboxStatus,
) -> Result<(), ReconcileError> {
    let name = &sandbox.metadata.name;
    super::write_status_if_changed(
        &ctl.store,
        Kind::Sandbox,
        name,
        sandbox.status.as_ref(),
        &status,
    )
    .await
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

impl Controller {
    /// The shared read-only volume holding the in-sandbox helper, created on first use.
    pub(super) async fn helper_volume(&self) -> Result<Option<String>, ReconcileError> {
        let Some(binary) = self.helper_binary else {
            return Ok(None);
        };
        let mut ready = self.helper_volume.lock().await;
        if let Some(name) = ready.as_ref() {
            return Ok(Some(name.clone()));
        }
        let name = crate::docker::helper_volume_name(binary);
        self.engine.ensure_helper_volume(&name, binary).await?;
        *ready = Some(name.clone());
        Ok(Some(name))
    }
}
