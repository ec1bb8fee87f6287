//! Reconciling one `SandboxPool`, and claiming from it.
//!
//! A pool member is an ordinary hardened container and workspace volume whose `io.agent-sandbox.id`
//! is `pool.<pool>.<random>` (a dot never occurs in a sandbox name, so members and sandboxes cannot
//! collide). It is created with the server's default limits and started, its workspace already
//! owned by the sandbox user. A sandbox whose immutable properties match claims a member by
//! renaming it to its own container name, then gets its limits applied live. Claims run in
//! parallel; [`HandedOut`] makes sure no two take the same member. The pool refills in the
//! background, once claims have paused for a moment (at most a second), so that starting new
//! members does not slow down the operations that just claimed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use chrono::Utc;
use futures::future::join_all;

use super::sandbox::ready_condition;
use super::{Controller, Outcome, ReconcileError};
use crate::docker::{
    container_name, ContainerPlan, EngineError, ManagedContainer, LABEL_SERVER, LABEL_SPEC_HASH,
};
use crate::resource::{
    AppliedLimits, ConditionStatus, EffectiveSandbox, Kind, SandboxPool, SandboxPoolStatus,
    SandboxStatus,
};

/// Prefix of a pool member's `io.agent-sandbox.id`.
pub(super) const MEMBER_PREFIX: &str = "pool.";

/// A claimed member, as the sandbox reconcile records it.
pub(super) struct Claimed {
    pub pool: String,
    pub container_id: String,
    pub volume: String,
    pub limits: AppliedLimits,
}

impl Claimed {
    /// Makes `status` describe this claimed, running member as the sandbox's container.
    pub(super) fn record(self, status: &mut SandboxStatus, effective: &EffectiveSandbox) {
        status.container_id = Some(self.container_id);
        status.workspace_volume = Some(self.volume);
        status.applied_limits = Some(self.limits);
        status.claimed_from = Some(self.pool);
        status.container_hash = Some(effective.container_hash());
        status.started_at = Some(Utc::now());
    }
}

/// How long a handed-out member is remembered: far longer than any listing taken before its
/// claim can still be in use.
const HANDED_OUT_MEMORY: Duration = Duration::from_secs(600);
/// How long a pool waits to recount its members after a claim or a change of a sandbox it
/// lent a container to: a burst (a Fork's children) makes one recount, after the burst, instead
/// of two Docker listings and a status write each while the claims still compete for the daemon.
/// Refills wait longer anyway ([`REFILL_QUIET`]).
const RECOUNT_DELAY: Duration = Duration::from_millis(100);
/// Refilling waits until no claim has happened for this long: starting containers takes the
/// machine for a while, and the operations that just claimed (a fill, a swap) come first.
const REFILL_QUIET: Duration = Duration::from_millis(300);
/// ... but a steady stream of claims never holds a refill back longer than this.
const REFILL_MAX_WAIT: Duration = Duration::from_secs(1);

/// The members claims have taken lately, by container ID. Claims run in parallel; each picks a
/// member from a listing and marks it here in one step under the lock, so two claims never get
/// the same member, even from listings taken before either renamed it. The Docker calls of a
/// claim happen outside the lock. It also keeps the ready members each pool's reconcile last
/// saw, so that a claim needs no listing of its own, and when the last claim was, for
/// [`refill_wait`].
///
/// [`refill_wait`]: HandedOut::refill_wait
#[derive(Default)]
pub(super) struct HandedOut {
    state: Mutex<Handed>,
}

#[derive(Default)]
struct Handed {
    taken: HashMap<String, Instant>,
    last_claim: Option<Instant>,
    /// Pools whose refill is being held back, since when.
    waiting: HashMap<String, Instant>,
    /// The ready members each pool's last reconcile saw.
    published: HashMap<String, Vec<ManagedContainer>>,
}

impl HandedOut {
    fn lock(&self) -> std::sync::MutexGuard<'_, Handed> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the ready members `pool`'s reconcile saw (an empty list for a pool that is gone).
    fn publish(&self, pool: &str, members: Vec<ManagedContainer>) {
        let mut state = self.lock();
        if members.is_empty() {
            state.published.remove(pool);
        } else {
            state.published.insert(pool.to_string(), members);
        }
    }

    /// The ready members `pool`'s last reconcile saw, if it has seen any.
    fn published(&self, pool: &str) -> Option<Vec<ManagedContainer>> {
        self.lock().published.get(pool).cloned()
    }

    /// The first running member of `candidates` no claim has taken, now marked as taken.
    fn take(&self, candidates: Vec<ManagedContainer>) -> Option<ManagedContainer> {
        let mut state = self.lock();
        state.taken.retain(|_, at| at.elapsed() < HANDED_OUT_MEMORY);
        let member = candidates
            .into_iter()
            .find(|c| c.is_running() && !state.taken.contains_key(&c.id))?;
        let now = Instant::now();
        state.taken.insert(member.id.clone(), now);
        state.last_claim = Some(now);
        Some(member)
    }

    /// Forgets that the member `id` was taken (its claim failed before renaming it).
    fn release(&self, id: &str) {
        self.lock().taken.remove(id);
    }

    /// How long `pool` should wait before starting new members, if at all.
    fn refill_wait(&self, pool: &str) -> Option<Duration> {
        let mut state = self.lock();
        let quiet_left = state
            .last_claim
            .map(|at| REFILL_QUIET.saturating_sub(at.elapsed()))
            .filter(|left| !left.is_zero());
        let waited = *state
            .waiting
            .entry(pool.to_string())
            .or_insert_with(Instant::now);
        match quiet_left {
            Some(left) if waited.elapsed() < REFILL_MAX_WAIT => {
                Some(left.min(REFILL_MAX_WAIT.saturating_sub(waited.elapsed())))
            }
            _ => {
                state.waiting.remove(pool);
                None
            }
        }
    }
}

/// The pool a member id (`pool.<pool>.<random>`) belongs to.
pub(super) fn pool_of_member(id: &str) -> Option<&str> {
    id.strip_prefix(MEMBER_PREFIX)?
        .rsplit_once('.')
        .map(|(pool, _)| pool)
}

fn member_volume(member: &str) -> String {
    format!("agent-sandbox-{member}-workspace")
}

/// Hash of what makes members interchangeable: image, root filesystem mode, network, runtime.
fn pool_key(image: &str, read_only_rootfs: bool, network: bool, runtime: &str) -> String {
    use sha2::{Digest, Sha256};
    let key = serde_json::json!({"image": image, "readOnlyRootfs": read_only_rootfs,
        "network": network, "runtime": runtime});
    let digest = Sha256::digest(key.to_string().as_bytes());
    format!("pool-{}", hex::encode(&digest[..8]))
}

impl Controller {
    fn pool_runtime(&self, pool: &SandboxPool) -> String {
        pool.spec
            .runtime
            .clone()
            .unwrap_or_else(|| self.settings.docker_runtime.clone())
    }

    fn pool_key_of(&self, pool: &SandboxPool) -> String {
        pool_key(
            &pool.spec.image,
            pool.spec.read_only_rootfs.unwrap_or(true),
            pool.spec.network.unwrap_or(false),
            &self.pool_runtime(pool),
        )
    }

    /// Unclaimed members of `pool` (still under their pool name), running or not.
    async fn members(&self, pool: &str) -> Result<Vec<ManagedContainer>, ReconcileError> {
        let prefix = format!("{MEMBER_PREFIX}{pool}.");
        Ok(self
            .engine
            .list_containers()
            .await?
            .into_iter()
            .filter(|c| c.labels.get(LABEL_SERVER) == Some(&self.server_id))
            .filter(|c| c.sandbox().is_some_and(|id| id.starts_with(&prefix)))
            .filter(|c| c.sandbox().is_some_and(|id| c.name == container_name(id)))
            .collect())
    }

    /// Claims a running member of a pool matching `effective` for sandbox `name`, if there is one,
    /// renaming it to the sandbox's container name.
    pub(super) async fn claim_from_pool(
        &self,
        name: &str,
        effective: &EffectiveSandbox,
    ) -> Result<Option<Claimed>, ReconcileError> {
        self.claim_as(name, effective, &container_name(name)).await
    }

    /// Claims a running member for sandbox `name` under the container name `as_name`. Whatever
    /// held that name before is removed: the caller found nothing there worth keeping.
    pub(super) async fn claim_as(
        &self,
        name: &str,
        effective: &EffectiveSandbox,
        as_name: &str,
    ) -> Result<Option<Claimed>, ReconcileError> {
        // A claim is a rename: an engine that cannot rename has nothing to claim from.
        if !self.engine.capabilities().rename {
            return Ok(None);
        }
        let runtime = self.settings.docker_runtime.clone();
        let wanted = pool_key(
            &effective.image,
            effective.read_only_rootfs,
            effective.network,
            &runtime,
        );
        let Some(pool) = self
            .store
            .list(Kind::SandboxPool)
            .into_iter()
            .find_map(|e| {
                let pool = e.resource.as_pool()?.clone();
                (pool.metadata.deletion_timestamp.is_none() && self.pool_key_of(&pool) == wanted)
                    .then_some(pool)
            })
        else {
            return Ok(None);
        };
        let limits = AppliedLimits {
            cpus: effective.cpus,
            memory_mb: effective.memory_mb,
            pids_limit: effective.pids_limit,
        };
        let defaults = self.defaults();
        let default_limits = limits.cpus == defaults.cpus
            && limits.memory_mb == defaults.memory_mb
            && limits.pids_limit == defaults.pids_limit;
        // gVisor cannot change limits of a live container; only default-sized sandboxes fit.
        if runtime == "runsc" && !default_limits {
            return Ok(None);
        }
        let pool_name = pool.metadata.name.clone();
        // The members the pool's last reconcile saw, when it has seen any, spare each claim a
        // listing; a member gone since fails its rename, and the claim then asks Docker.
        let mut listed = false;
        let mut attempts = 0;
        let member = loop {
            attempts += 1;
            let candidates = match self.pool_claims.published(&pool_name) {
                Some(members) if !listed => members,
                _ => {
                    listed = true;
                    self.members(&pool_name).await?
                }
            };
            let Some(member) = self.pool_claims.take(candidates) else {
                if !listed {
                    listed = true;
                    continue;
                }
                self.queue.add((Kind::SandboxPool, pool_name));
                return Ok(None);
            };
            match self.take_name(&member.id, as_name).await {
                Ok(()) => break member,
                Err(error) if error.is_not_found() && attempts < 3 => listed = true,
                Err(error) => {
                    // Still under its pool name, as far as anyone knows: a later claim may try.
                    self.pool_claims.release(&member.id);
                    return Err(error.into());
                }
            }
        };
        let member_id = member.sandbox().unwrap_or_default().to_string();
        self.recount_pool(pool_name.clone());
        if !default_limits {
            let updated = if self.engine.capabilities().live_limits {
                self.engine
                    .update_limits(&member.id, limits.cpus, limits.memory_mb, limits.pids_limit)
                    .await
            } else {
                Err(EngineError::Unsupported {
                    operation: "changing the limits of a live container".into(),
                })
            };
            if let Err(error) = updated {
                tracing::warn!(sandbox = name, %error, "claimed container rejected its limits; creating one instead");
                self.engine.remove_container(&member.id).await?;
                self.engine
                    .remove_volume(&member_volume(&member_id))
                    .await?;
                return Ok(None);
            }
        }
        tracing::info!(sandbox = name, pool = %pool_name, container = %member.id, "claimed a warm container");
        Ok(Some(Claimed {
            pool: pool_name,
            container_id: member.id,
            volume: member_volume(&member_id),
            limits,
        }))
    }
}

impl Controller {
    /// Has pool `name` recount its members and claims soon (see [`RECOUNT_DELAY`]).
    pub(super) fn recount_pool(&self, name: String) {
        self.queue
            .add_soon((Kind::SandboxPool, name), RECOUNT_DELAY);
    }

    /// Renames the container `id` to `as_name`; whatever held that name before is removed (the
    /// caller found nothing there worth keeping).
    async fn take_name(&self, id: &str, as_name: &str) -> Result<(), EngineError> {
        match self.engine.rename_container(id, as_name).await {
            Err(EngineError::Conflict { .. }) => {
                self.engine.remove_container(as_name).await?;
                self.engine.rename_container(id, as_name).await
            }
            other => other,
        }
    }
}

pub(super) async fn reconcile(ctl: &Controller, name: &str) -> Result<Outcome, ReconcileError> {
    let entry = ctl.store.get(Kind::SandboxPool, name);
    let pool = entry.as_ref().and_then(|e| e.resource.as_pool().cloned());
    let members = ctl.members(name).await?;
    let Some(pool) = pool.filter(|p| p.metadata.deletion_timestamp.is_none()) else {
        // Gone or going: drain every unclaimed member, then let the document go.
        ctl.pool_claims.publish(name, Vec::new());
        remove_members(ctl, &members).await?;
        if entry.is_some() {
            ctl.store.finalize(Kind::SandboxPool, name)?;
        }
        return Ok(Outcome::done());
    };
    let key = ctl.pool_key_of(&pool);
    // Members are made (created, started, prepared) within this reconcile, and one reconcile of
    // a pool runs at a time: a member not running now was left half made by a crash, or stopped
    // by a hand. It would hold a place in the pool and never be claimed.
    let (usable, stale): (Vec<_>, Vec<_>) = members
        .into_iter()
        .partition(|c| c.labels.get(LABEL_SPEC_HASH) == Some(&key) && c.is_running());
    remove_members(ctl, &stale).await?;
    let size = pool.spec.size as usize;
    let mut message = String::new();
    let mut deferred = None;
    let mut created = false;
    if usable.len() > size {
        remove_members(ctl, &usable[size..]).await?;
    } else if usable.len() < size {
        if let Some(wait) = ctl.pool_claims.refill_wait(name) {
            deferred = Some(wait);
        } else {
            let missing = size - usable.len();
            let results = join_all((0..missing).map(|_| create_member(ctl, &pool, &key))).await;
            if let Some(Err(error)) = results.into_iter().find(|r| r.is_err()) {
                message = format!("cannot create pool containers: {error}");
            }
            created = true;
        }
    }
    // A second listing only when this reconcile made members: otherwise the first one is current.
    let ready_members: Vec<ManagedContainer> = if created {
        ctl.members(name)
            .await?
            .into_iter()
            .filter(|c| c.is_running() && c.labels.get(LABEL_SPEC_HASH) == Some(&key))
            .collect()
    } else {
        usable.into_iter().take(size).collect()
    };
    let ready = ready_members.len() as u32;
    ctl.pool_claims.publish(name, ready_members);
    let claimed = ctl
        .store
        .list(Kind::Sandbox)
        .iter()
        .filter_map(|e| e.resource.as_sandbox()?.status.as_ref())
        .filter(|s| s.claimed_from.as_deref() == Some(name) && s.container_id.is_some())
        .count() as u32;
    let generation = pool.metadata.generation.unwrap_or(1);
    let mut status = pool.status.clone().unwrap_or_default();
    let full = ready as usize >= size;
    let (verdict, reason) = if full {
        (ConditionStatus::True, "Full")
    } else if message.is_empty() {
        (ConditionStatus::False, "Filling")
    } else {
        (ConditionStatus::False, "CreateFailed")
    };
    let mut conditions = status.conditions.clone();
    crate::resource::set_condition(
        &mut conditions,
        ready_condition(verdict, reason, &message, generation),
    );
    status = SandboxPoolStatus {
        observed_generation: Some(generation),
        conditions,
        ready_replicas: ready,
        claimed,
        message: message.clone(),
    };
    super::write_status_if_changed(
        &ctl.store,
        Kind::SandboxPool,
        name,
        pool.status.as_ref(),
        &status,
    )
    .await?;
    if !message.is_empty() {
        return Err(ReconcileError::Other(message));
    }
    Ok(if full {
        Outcome::done()
    } else {
        Outcome::after(deferred.unwrap_or(Duration::from_millis(500)))
    })
}

async fn create_member(
    ctl: &Controller,
    pool: &SandboxPool,
    key: &str,
) -> Result<(), ReconcileError> {
    if !ctl.engine.image_exists(&pool.spec.image).await? {
        return Err(crate::docker::EngineError::ImageMissing(pool.spec.image.clone()).into());
    }
    let member = format!(
        "{MEMBER_PREFIX}{}.{:08x}",
        pool.metadata.name,
        rand::random::<u32>()
    );
    let uid = pool.metadata.uid.clone().unwrap_or_default();
    // The create makes the member's workspace volume, labeled for the member.
    let volume = member_volume(&member);
    let network = if pool.spec.network.unwrap_or(false) {
        ctl.engine
            .ensure_network(&ctl.settings.network_name)
            .await?;
        Some(ctl.settings.network_name.clone())
    } else {
        None
    };
    let defaults = ctl.defaults();
    let runtime = ctl.pool_runtime(pool);
    let plan = ContainerPlan {
        sandbox: member.clone(),
        name: None,
        uid,
        server: ctl.server_id.clone(),
        image: pool.spec.image.clone(),
        cpus: defaults.cpus,
        memory_mb: defaults.memory_mb,
        pids_limit: defaults.pids_limit,
        network,
        read_only_rootfs: pool.spec.read_only_rootfs.unwrap_or(true),
        env: BTreeMap::new(),
        tmp_size_mb: ctl.settings.tmp_size_mb,
        user: ctl.settings.sandbox_user.clone(),
        runtime: (!runtime.is_empty()).then_some(runtime),
        spec_hash: key.to_string(),
        helper_volume: ctl.helper_volume().await?,
        workspace_volume: volume.clone(),
    };
    let created = async {
        let id = ctl.engine.create_container(&plan).await?;
        let runtime = plan.runtime.clone().unwrap_or_default();
        ctl.start_with_workspace(&id, &runtime, None).await?;
        Ok::<_, ReconcileError>(())
    }
    .await;
    if let Err(error) = created {
        let _ = ctl.engine.remove_container(&container_name(&member)).await;
        let _ = ctl.engine.remove_volume(&volume).await;
        return Err(error);
    }
    tracing::debug!(pool = %pool.metadata.name, member, at = %Utc::now(), "pool container ready");
    Ok(())
}

async fn remove_members(
    ctl: &Controller,
    members: &[ManagedContainer],
) -> Result<(), ReconcileError> {
    for member in members {
        ctl.engine.remove_container(&member.id).await?;
        if let Some(id) = member.sandbox() {
            ctl.engine.remove_volume(&member_volume(id)).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(id: &str, state: &str) -> ManagedContainer {
        ManagedContainer {
            id: id.into(),
            name: format!("agent-sandbox-pool.p.{id}"),
            labels: BTreeMap::new(),
            state: state.into(),
        }
    }

    #[test]
    fn a_member_is_handed_out_once_even_from_a_stale_listing() {
        let handed = HandedOut::default();
        let listing = || {
            vec![
                member("a", "exited"),
                member("b", "running"),
                member("c", "running"),
            ]
        };
        let first = handed.take(listing()).map(|m| m.id);
        let second = handed.take(listing()).map(|m| m.id);
        assert_eq!(first.as_deref(), Some("b"), "the first running member");
        assert_eq!(second.as_deref(), Some("c"), "never the one already taken");
        assert!(
            handed.take(listing()).is_none(),
            "stopped members are not handed out"
        );
    }

    #[test]
    fn a_refill_waits_for_claims_to_pause() {
        let handed = HandedOut::default();
        assert_eq!(
            handed.refill_wait("p"),
            None,
            "no claim yet: refill at once"
        );
        handed.take(vec![member("a", "running")]);
        let wait = handed.refill_wait("p").expect("a claim just happened");
        assert!(wait <= REFILL_QUIET, "{wait:?}");
        std::thread::sleep(REFILL_QUIET + Duration::from_millis(20));
        assert_eq!(handed.refill_wait("p"), None, "claims paused: refill");
    }
}
