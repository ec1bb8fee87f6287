//! Claiming a warm pool member for a sandbox: finding the pool whose members fit, taking one
//! member that no other claim takes ([`HandedOut`]), renaming it to the name the sandbox wants
//! and giving it the sandbox's limits. The pool's own reconcile (`pool.rs`) makes and
//! counts members; this module only hands them out.
//!
//! A new sandbox's claim is recorded before its rename ([`ClaimName::Own`]): Docker renames one
//! container at a time (each rename commits its network store with fsyncs under one lock), so
//! ten children of a `Fork` renamed before they report would wait for each other. Their status
//! names the member first, and the member takes the sandbox's name once that status is written
//! (`naming.rs`). Meanwhile nothing hands the member out again: [`Pools::members`] leaves out
//! every member a claim took or a sandbox's status names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;

use super::container::{limits_for, Containers};
use super::error::ReconcileError;
use super::names::{self, container_name, member_prefix};
use super::naming::Naming;
use super::queue::{Key, WorkQueue};
use crate::docker::{EngineError, ManagedContainer, LABEL_SPEC_HASH};
use crate::resource::{AppliedLimits, EffectiveSandbox, Kind, SandboxPool, SandboxStatus};
use crate::store::Store;

/// The name a claimed member runs under.
#[derive(Clone, Copy, Debug)]
pub(super) enum ClaimName<'a> {
    /// This name, given by the claim itself: a rollback's or a replacement's staging name, or a
    /// member whose workspace is filled before the status records it (whose content is the
    /// sandbox's from then on, so it must not look like a member after a crash).
    Now(&'a str),
    /// The sandbox's own container name, once its status records the claim (see the module's
    /// documentation). A claim that must change the member's limits, or whose sandbox is
    /// policed by the egress gateway (which tells sandboxes apart by container name), renames
    /// at once instead.
    Own,
}

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
        // A member runs the plain image.
        status.rootfs = None;
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
    pub(super) fn publish(&self, pool: &str, members: Vec<ManagedContainer>) {
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

    /// Whether a claim took member `id` lately.
    fn is_taken(&self, id: &str) -> bool {
        self.lock().taken.contains_key(id)
    }

    /// How long `pool` should wait before starting new members, if at all.
    pub(super) fn refill_wait(&self, pool: &str) -> Option<Duration> {
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

/// Hash of what makes members interchangeable: image, root filesystem mode, network (and whether
/// it is the egress gateway's), runtime.
fn pool_key(
    image: &str,
    read_only_rootfs: bool,
    network: bool,
    egress: bool,
    runtime: &str,
) -> String {
    use sha2::{Digest, Sha256};
    let mut key = serde_json::json!({"image": image, "readOnlyRootfs": read_only_rootfs,
        "network": network, "runtime": runtime});
    // Only when set, so that the keys of existing pools stay what they were.
    if egress {
        key["egress"] = serde_json::Value::Bool(true);
    }
    let digest = Sha256::digest(key.to_string().as_bytes());
    format!("pool-{}", hex::encode(&digest[..8]))
}

/// The warm pools as claims and the pool reconcile see them: which members exist, which were
/// handed out, and how to hand one out.
pub(super) struct Pools {
    store: Arc<Store>,
    containers: Arc<Containers>,
    queue: Arc<WorkQueue<Key>>,
    /// Pool members handed out lately, so that no member is handed out twice.
    pub(super) handed_out: HandedOut,
    /// Claims recorded before their rename.
    pub(super) naming: Arc<Naming>,
}

impl Pools {
    pub(super) fn new(
        store: Arc<Store>,
        containers: Arc<Containers>,
        queue: Arc<WorkQueue<Key>>,
    ) -> Pools {
        Pools {
            naming: Arc::new(Naming::new(Arc::clone(&containers), Arc::clone(&queue))),
            store,
            containers,
            queue,
            handed_out: HandedOut::default(),
        }
    }

    pub(super) fn runtime_of(&self, pool: &SandboxPool) -> String {
        pool.spec
            .runtime
            .clone()
            .unwrap_or_else(|| self.containers.settings.docker_runtime.clone())
    }

    pub(super) fn key_of(&self, pool: &SandboxPool) -> String {
        pool_key(
            &pool.spec.image,
            pool.spec.read_only_rootfs.unwrap_or(true),
            pool.spec.network.unwrap_or(false),
            pool.spec.network.unwrap_or(false) && self.containers.settings.egress_by_default(),
            &self.runtime_of(pool),
        )
    }

    /// Unclaimed members of `pool`, running or not: those still under their pool name that no
    /// claim took and no sandbox's status names (a claim recorded before its rename).
    pub(super) async fn members(
        &self,
        pool: &str,
    ) -> Result<Vec<ManagedContainer>, ReconcileError> {
        let prefix = member_prefix(pool);
        let listed = self.containers.engine.list_containers().await?;
        let recorded: std::collections::HashSet<String> = self
            .store
            .list(Kind::Sandbox)
            .into_iter()
            .filter_map(|e| {
                e.resource
                    .as_sandbox()?
                    .status
                    .as_ref()?
                    .container_id
                    .clone()
            })
            .collect();
        Ok(listed
            .into_iter()
            .filter(|c| self.containers.is_ours(&c.labels))
            .filter(|c| c.sandbox().is_some_and(|id| id.starts_with(&prefix)))
            .filter(|c| c.sandbox().is_some_and(|id| c.name == container_name(id)))
            .filter(|c| !recorded.contains(&c.id) && !self.handed_out.is_taken(&c.id))
            .collect())
    }

    /// Claims a running member of a pool matching `effective` for new sandbox `name`, if there is
    /// one, to run under the sandbox's container name ([`ClaimName::Own`]).
    pub(super) async fn claim(
        &self,
        name: &str,
        effective: &EffectiveSandbox,
    ) -> Result<Option<Claimed>, ReconcileError> {
        self.claim_as(name, effective, ClaimName::Own).await
    }

    /// Claims a running member for sandbox `name` under the container name `as_name`. Whatever
    /// held that name before is removed: the caller found nothing there worth keeping.
    pub(super) async fn claim_as(
        &self,
        name: &str,
        effective: &EffectiveSandbox,
        as_name: ClaimName<'_>,
    ) -> Result<Option<Claimed>, ReconcileError> {
        // A claim is a rename: an engine that cannot rename has nothing to claim from.
        if !self.containers.engine.capabilities().rename {
            return Ok(None);
        }
        let runtime = self.containers.settings.docker_runtime.clone();
        let wanted = pool_key(
            &effective.image,
            effective.read_only_rootfs,
            effective.network,
            effective.egress,
            &runtime,
        );
        let Some(pool) = self
            .store
            .list(Kind::SandboxPool)
            .into_iter()
            .find_map(|e| {
                let pool = e.resource.as_pool()?.clone();
                (pool.metadata.deletion_timestamp.is_none() && self.key_of(&pool) == wanted)
                    .then_some(pool)
            })
        else {
            return Ok(None);
        };
        let defaults = self.containers.defaults();
        let member_limits = AppliedLimits {
            cpus: defaults.cpus,
            memory_mb: defaults.memory_mb,
            pids_limit: defaults.pids_limit,
        };
        // Only a member of the pool's current spec: one made before an edit of the pool, not yet
        // replaced, can still be in Docker's listing.
        self.claim_from(
            &pool.metadata.key(),
            member_limits,
            Some(&wanted),
            name,
            effective,
            as_name,
        )
        .await
    }

    /// Claims a running member of pool `pool_name`, whose members run with `member_limits`,
    /// for sandbox `name` under the container name `as_name`, giving it the sandbox's limits.
    /// Given `key`, only a member labeled with that spec hash is taken.
    pub(super) async fn claim_from(
        &self,
        pool_name: &str,
        member_limits: AppliedLimits,
        key: Option<&str>,
        name: &str,
        effective: &EffectiveSandbox,
        as_name: ClaimName<'_>,
    ) -> Result<Option<Claimed>, ReconcileError> {
        if !self.containers.engine.capabilities().rename {
            return Ok(None);
        }
        let runtime = self.containers.settings.docker_runtime.clone();
        let limits = limits_for(effective);
        let default_limits = limits == member_limits;
        // gVisor cannot change limits of a live container; only sandboxes of the members' size
        // fit.
        if crate::docker::is_gvisor(&runtime) && !default_limits {
            return Ok(None);
        }
        let own = container_name(name);
        let rename_now = match as_name {
            ClaimName::Now(as_name) => Some(as_name),
            ClaimName::Own if !default_limits || effective.egress => Some(own.as_str()),
            ClaimName::Own => None,
        };
        let pool_name = pool_name.to_string();
        // The members the pool's last reconcile saw, when it has seen any, spare each claim a
        // listing; a member gone since fails its rename, and the claim then asks Docker.
        let mut listed = false;
        let mut attempts = 0;
        let member = loop {
            attempts += 1;
            let mut candidates = match self.handed_out.published(&pool_name) {
                Some(members) if !listed => members,
                _ => {
                    listed = true;
                    self.members(&pool_name).await?
                }
            };
            if let Some(key) = key {
                candidates
                    .retain(|c| c.labels.get(LABEL_SPEC_HASH).map(String::as_str) == Some(key));
            }
            let Some(member) = self.handed_out.take(candidates) else {
                if !listed {
                    listed = true;
                    continue;
                }
                self.queue.add((Kind::SandboxPool, pool_name));
                return Ok(None);
            };
            // Renamed now, or only seen to run: either way a member gone since the listing
            // sends the claim to Docker's own list.
            let taken = match rename_now {
                Some(as_name) => self.containers.take_name(&member.id, as_name).await,
                None => match self.containers.engine.inspect_container(&member.id).await {
                    Ok(Some(details)) if details.running && !details.paused => Ok(()),
                    Ok(_) => Err(EngineError::NotFound {
                        what: format!("running container {}", member.id),
                    }),
                    Err(error) => Err(error),
                },
            };
            match taken {
                Ok(()) => break member,
                Err(error) if error.is_not_found() && attempts < 3 => {
                    self.handed_out.release(&member.id);
                    listed = true;
                }
                Err(error) => {
                    // Still under its pool name, as far as anyone knows: a later claim may try.
                    self.handed_out.release(&member.id);
                    return Err(error.into());
                }
            }
        };
        let member_id = member.sandbox().unwrap_or_default().to_string();
        self.recount(pool_name.clone());
        if !default_limits {
            let engine = &self.containers.engine;
            let updated = if engine.capabilities().live_limits {
                engine
                    .update_limits(&member.id, limits.cpus, limits.memory_mb, limits.pids_limit)
                    .await
            } else {
                Err(EngineError::Unsupported {
                    operation: "changing the limits of a live container".into(),
                })
            };
            if let Err(error) = updated {
                tracing::warn!(sandbox = name, %error, "claimed container rejected its limits; creating one instead");
                self.containers.engine.remove_container(&member.id).await?;
                self.containers
                    .engine
                    .remove_volume(&names::member_volume(&member_id))
                    .await?;
                return Ok(None);
            }
        }
        let volume = names::member_volume(&member_id);
        if rename_now.is_none() {
            self.naming
                .await_name(name, member.id.clone(), volume.clone());
        }
        tracing::info!(sandbox = name, pool = %pool_name, container = %member.id, "claimed a warm container");
        Ok(Some(Claimed {
            pool: pool_name,
            container_id: member.id,
            volume,
            limits,
        }))
    }

    /// Has pool `name` recount its members and claims soon (see [`RECOUNT_DELAY`]).
    pub(super) fn recount(&self, name: String) {
        self.queue
            .add_soon((Kind::SandboxPool, name), RECOUNT_DELAY);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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
