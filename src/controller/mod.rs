//! The reconcile loop: drives Docker to match the store and writes observed status back.
//!
//! Triggers — store changes, Docker events, expiry deadlines, a periodic resync — only ever add a
//! `(kind, name)` key to one [`queue::WorkQueue`]; a bounded set of workers takes keys and runs the
//! reconcile function of their kind. Reconciles are level-triggered and idempotent: each one reads
//! the desired document and the labeled Docker objects as they are now, so running one twice, or
//! after a crash at any point, converges to the same result. This module never parses documents
//! and never serves HTTP; it talks to Docker only through [`Engine`].
//!
//! Each kind reconciles against a narrow context (`context.rs`) holding only what it needs, and
//! returns a typed failure; the one error policy (`policy.rs`) reports it in the resource's status
//! and decides when to try again.
//!
//! Where things are. The reconcilers, one per kind:
//!
//! - `sandbox.rs`: a `Sandbox`: expiry, deletion (waited for only until its containers are renamed
//!   away and killed; their removal and the workspaces' finish in the background), its container
//!   kept running as the spec says.
//! - `restore.rs`: a sandbox's first workspace from `spec.source`, and rollbacks
//!   (`spec.rollback`: `ensure_rollback`).
//! - `replace.rs`: replacing a sandbox's container without taking it down.
//! - `power.rs`: a sandbox held paused or stopped (`spec.state`), resumes, the idle policy.
//! - `pulls.rs`: image pulls, one per image, for sandboxes and pools alike.
//! - `snapshot/`: a `Snapshot`: taking it (`mod.rs`) and exporting the workspace (`export.rs`).
//! - `fork.rs`: a `Fork`'s children. `pool.rs`: a `SandboxPool`'s warm members.
//! - `services.rs`: a running sandbox's declared services and listening ports in its status.
//! - `template.rs`: a sandbox's `spec.template` resolved once into its status, and a
//!   `SandboxTemplate`'s own status. `template_pool.rs`: a template's warm members (`spec.pool`).
//! - `quota.rs`: a `ResourceQuota`'s `status.used`, and holding a sandbox no quota admits.
//! - `secret.rs`: whether a `Secret` has a value, and the deletion of Secrets and Webhooks.
//! - `gc.rs`: garbage collection of Docker objects that belong to no resource.
//!
//! The vocabulary they share, which uses none of them:
//!
//! - `names.rs`: every Docker name a container, volume or pool member gets.
//! - `container.rs`: container plans, the swap of a container into a sandbox's name, removals.
//! - `claims.rs`: claiming a warm pool member for a sandbox. `naming.rs`: the claimed member taking
//!   the sandbox's name once its status records the claim.
//! - `workspace.rs`: making a `/workspace` ready, on this host or through Docker. `views.rs`:
//!   copy-on-write views of a snapshot; `member_views.rs`: a running pool member taking one.
//! - `content.rs`: validated snapshot content, the input of every restore.
//! - `status.rs`: status and conditions, and the one status write.
//! - `events.rs`: what a status change means as events, recorded by that write.
//! - `tracker.rs`: which sandboxes snapshots hold locked or paused.
//! - `error.rs`, `policy.rs`, `context.rs`, `queue.rs`: failures, what becomes of them, what each
//!   kind sees, and the work queue.

// The vocabulary every reconciler speaks; none of these uses a reconciler.
mod claims;
mod container;
mod content;
mod context;
mod error;
mod events;
mod member_views;
mod names;
mod naming;
mod policy;
mod status;
mod termination;
mod tracker;
mod views;
mod workspace;
mod workspace_disk;

// The reconcilers, one per kind, and what only they use.
mod fork;
mod gc;
mod pool;
mod power;
mod pulls;
pub mod queue;
mod quota;
mod replace;
mod restore;
mod sandbox;
mod sandbox_secrets;
mod secret;
mod services;
mod snapshot;
mod template;
mod template_pool;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use futures::StreamExt;
use tokio::task::JoinSet;

use crate::config::Settings;
use crate::docker::Engine;
use crate::resource::{Kind, SandboxPhase};
use crate::store::{Recorder, Store};
use claims::Pools;
use container::Containers;
use context::{ForkContext, GcContext, PoolContext, SandboxContext, SnapshotContext};
pub use error::ReconcileError;
use names::container_name;
pub use policy::Outcome;
pub use queue::Key;
use queue::{Backoff, WorkQueue};
use workspace::Workspaces;

pub struct Controller {
    store: Arc<Store>,
    /// Where what happened to resources is recorded (see `events.rs`).
    events: Recorder,
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    queue: Arc<WorkQueue<Key>>,
    /// Plans, swaps and removals of the sandboxes' Docker objects.
    containers: Arc<Containers>,
    /// Making workspaces ready, and what this host has shown about doing it directly.
    workspaces: Workspaces,
    /// The warm pools, and the members handed out lately (see `claims.rs`).
    pools: Pools,
    /// Snapshots in progress: which containers they hold paused, which files they write.
    snapshots: Arc<tracker::Tracker>,
    /// Snapshot files validated lately (see `content.rs`).
    validated_files: content::ValidatedFiles,
    /// When progressing forks last wrote their progress (see `fork.rs`).
    fork_progress: status::ProgressWrites,
    /// Which sandboxes are in use, for their idle policies (see `power.rs`).
    activity: Arc<crate::activity::Activity>,
    /// The sandboxes' long-lived processes: one still running keeps its sandbox in use.
    processes: Arc<crate::processes::Processes>,
    /// Commands and files of the sandboxes; owned here so that pool members' helper channels
    /// are opened before a claim, shared with the API.
    dataplane: Arc<crate::dataplane::DataPlane>,
    /// Turns for readying new pool members (see `context::WARM_AT_ONCE`).
    warming: Arc<tokio::sync::Semaphore>,
    making: Arc<tokio::sync::Semaphore>,
    /// The sandboxes' declared services, kept running in their containers.
    services: Arc<crate::services::Services>,
    /// What Docker's events said lately about containers dying (see `termination.rs`).
    terminations: termination::Terminations,
    /// Where reconciles are counted and timed.
    metrics: crate::metrics::Metrics,
}

impl Controller {
    pub fn new(
        store: Arc<Store>,
        events: Recorder,
        engine: Arc<dyn Engine>,
        settings: Arc<Settings>,
        server_id: String,
        helper_binary: Option<&'static [u8]>,
        metrics: crate::metrics::Metrics,
    ) -> Arc<Controller> {
        let queue = WorkQueue::new(Backoff::default());
        let containers = Arc::new(Containers::new(
            Arc::clone(&engine),
            Arc::clone(&settings),
            server_id,
            helper_binary,
            Arc::new(crate::disk::Disks::new(
                store.disks_dir(),
                settings.disk_image_mb,
            )),
        ));
        let processes = Arc::new(
            crate::processes::Processes::new(Arc::clone(&engine), Arc::clone(&settings))
                .with_metrics(metrics.clone()),
        );
        let dataplane = Arc::new(
            crate::dataplane::DataPlane::new(Arc::clone(&engine), Arc::clone(&settings))
                .with_metrics(metrics.clone()),
        );
        let services = {
            // A service that changed is reported by the sandbox's next reconcile.
            let queue = Arc::clone(&queue);
            let changed: crate::services::Changed =
                Arc::new(move |name: &str| queue.add((Kind::Sandbox, name.to_string())));
            Arc::new(crate::services::Services::new(
                Arc::clone(&processes),
                Arc::clone(&engine),
                Arc::clone(&settings),
                changed,
            ))
        };
        Arc::new(Controller {
            services,
            workspaces: Workspaces::new(Arc::clone(&engine), Arc::clone(&settings)),
            pools: Pools::new(
                Arc::clone(&store),
                Arc::clone(&containers),
                Arc::clone(&queue),
            ),
            queue,
            containers,
            snapshots: Arc::default(),
            validated_files: Default::default(),
            fork_progress: Default::default(),
            activity: Arc::default(),
            processes,
            dataplane,
            warming: Arc::new(tokio::sync::Semaphore::new(context::WARM_AT_ONCE)),
            making: Arc::new(tokio::sync::Semaphore::new(context::MAKE_AT_ONCE)),
            terminations: Default::default(),
            metrics,
            store,
            events,
            engine,
            settings,
        })
    }

    /// Sends policed sandboxes through `gateway` from now on: their containers get its name
    /// server and proxy, and it gets their lists.
    pub fn attach_egress(&self, gateway: Arc<crate::egress::Gateway>) {
        let _ = self.containers.gateway.set(gateway);
    }

    /// Where the API reports sandbox activity (calls, running commands) for idle policies.
    pub fn activity(&self) -> &Arc<crate::activity::Activity> {
        &self.activity
    }

    /// The sandboxes' long-lived processes, shared with the API.
    pub fn processes(&self) -> &Arc<crate::processes::Processes> {
        &self.processes
    }

    /// Commands and files of the sandboxes, shared with the API.
    pub fn dataplane(&self) -> &Arc<crate::dataplane::DataPlane> {
        &self.dataplane
    }

    /// The sandboxes' declared services and listening ports, shared with the API.
    pub fn services(&self) -> &Arc<crate::services::Services> {
        &self.services
    }

    pub fn queue(&self) -> &Arc<WorkQueue<Key>> {
        &self.queue
    }

    /// Queues every resource the store knows.
    pub fn enqueue_all(&self) {
        for kind in Kind::ALL {
            for entry in self.store.list(kind) {
                self.queue.add((kind, entry.resource.key()));
            }
        }
    }

    /// The periodic resync: every resource except the sandboxes that are visibly as their status
    /// says (phase Running, Paused or Stopped as the spec asks, at the current generation, not
    /// expiring, on a container of their own name with the recorded ID in that state), judged from one container listing. An idle server
    /// with many sandboxes thus costs one Docker call per resync, not one per sandbox. A lost
    /// Docker event is still caught here; a failed listing falls back to queueing everything.
    async fn enqueue_drifted(&self) {
        let containers = match self.engine.list_containers().await {
            Ok(containers) => containers,
            Err(error) => {
                tracing::debug!(%error, "cannot list containers; resyncing everything");
                self.enqueue_all();
                return;
            }
        };
        let present: HashMap<&str, (&str, &str)> = containers
            .iter()
            .map(|c| (c.id.as_str(), (c.name.as_str(), c.state.as_str())))
            .collect();
        let now = Utc::now();
        let mut skipped = 0usize;
        for kind in Kind::ALL {
            for entry in self.store.list(kind) {
                let name = entry.resource.key();
                let settled = entry.resource.as_sandbox().is_some_and(|sandbox| {
                    let Some(status) = &sandbox.status else {
                        return false;
                    };
                    // A container frozen through its cgroup is `running` to Docker.
                    let states: &[&str] = match status.phase {
                        SandboxPhase::Running => &["running"],
                        SandboxPhase::Paused => &["paused", "running"],
                        SandboxPhase::Stopped => &["exited", "created"],
                        _ => &[],
                    };
                    sandbox.metadata.deletion_timestamp.is_none()
                        && sandbox.spec.desired_state().phase() == status.phase
                        && status.observed_generation == sandbox.metadata.generation
                        && status.expires_at.is_none_or(|at| at > now)
                        && status.container_id.as_deref().is_some_and(|id| {
                            present.get(id).is_some_and(|(name_now, state)| {
                                *name_now == container_name(&name) && states.contains(state)
                            })
                        })
                });
                if settled {
                    skipped += 1;
                } else {
                    self.queue.add((kind, name));
                }
            }
        }
        tracing::debug!(
            skipped,
            "resync: sandboxes running as recorded were not queued"
        );
    }

    /// Starts the workers and every trigger. The tasks stop when the returned set is dropped.
    pub fn spawn(self: &Arc<Self>) -> JoinSet<()> {
        let mut tasks = JoinSet::new();
        for _ in 0..self.settings.reconcile_workers {
            let this = Arc::clone(self);
            tasks.spawn(async move { this.worker().await });
        }
        let this = Arc::clone(self);
        tasks.spawn(async move { this.follow_store().await });
        let this = Arc::clone(self);
        tasks.spawn(async move { this.follow_docker().await });
        let this = Arc::clone(self);
        tasks.spawn(async move { this.resync_and_collect().await });
        let this = Arc::clone(self);
        tasks.spawn(async move { this.reap().await });
        self.enqueue_all();
        tasks
    }

    async fn worker(self: Arc<Self>) {
        while let Some(key) = self.queue.next().await {
            let began = std::time::Instant::now();
            let result = self.reconcile(&key).await;
            self.metrics
                .reconciled(key.0.as_str(), result.is_err(), began.elapsed());
            match result {
                Ok(outcome) => {
                    self.queue.done(&key);
                    if let Some(delay) = outcome.requeue_after {
                        self.queue.add_after(key, delay);
                    }
                }
                Err(error) => {
                    let delay = self.queue.failed(&key);
                    tracing::warn!(kind = %key.0, name = %key.1, %error, retry_in = ?delay, "reconcile failed");
                }
            }
        }
    }

    /// Runs the reconcile function of the key's kind once, against that kind's context; a
    /// failure goes through the error policy.
    pub async fn reconcile(&self, key: &Key) -> Result<Outcome, ReconcileError> {
        let name = key.1.as_str();
        let containers = self.containers.as_ref();
        match key.0 {
            Kind::Sandbox => match sandbox::reconcile(&self.sandbox_context(), name).await {
                Ok(outcome) => Ok(outcome),
                Err(failure) => {
                    policy::handle(&self.store, &self.events, containers, failure).await
                }
            },
            Kind::Snapshot => match snapshot::reconcile(&self.snapshot_context(), name).await {
                Ok(outcome) => Ok(outcome),
                Err(failure) => {
                    policy::handle(&self.store, &self.events, containers, failure).await
                }
            },
            Kind::Fork => fork::reconcile(&self.fork_context(), name).await,
            Kind::Secret => secret::reconcile_secret(&self.fork_context(), name).await,
            Kind::Webhook => secret::reconcile_webhook(&self.fork_context(), name).await,
            Kind::ResourceQuota => {
                quota::reconcile(&self.fork_context(), &self.containers.defaults(), name).await
            }
            Kind::SandboxTemplate => {
                // Its implicit pool (if any) follows every change of it, and its removal.
                self.queue
                    .add((Kind::SandboxPool, template_pool::pool_name(name)));
                template::reconcile(&self.fork_context(), name).await
            }
            Kind::SandboxPool => match pool::reconcile(&self.pool_context(), name).await {
                Ok(outcome) => Ok(outcome),
                Err(failure) => {
                    policy::handle(&self.store, &self.events, containers, failure).await
                }
            },
        }
    }

    fn sandbox_context(&self) -> SandboxContext<'_> {
        SandboxContext {
            store: &self.store,
            events: &self.events,
            engine: &self.engine,
            settings: &self.settings,
            containers: &self.containers,
            workspaces: &self.workspaces,
            pools: &self.pools,
            snapshots: &self.snapshots,
            validated_files: &self.validated_files,
            activity: &self.activity,
            processes: &self.processes,
            services: &self.services,
            terminations: &self.terminations,
        }
    }

    fn snapshot_context(&self) -> SnapshotContext<'_> {
        SnapshotContext {
            store: &self.store,
            events: &self.events,
            engine: &self.engine,
            settings: &self.settings,
            containers: &self.containers,
            snapshots: &self.snapshots,
            queue: &self.queue,
        }
    }

    fn fork_context(&self) -> ForkContext<'_> {
        ForkContext {
            store: &self.store,
            events: &self.events,
            fork_progress: &self.fork_progress,
        }
    }

    fn pool_context(&self) -> PoolContext<'_> {
        PoolContext {
            store: &self.store,
            events: &self.events,
            engine: &self.engine,
            containers: &self.containers,
            workspaces: &self.workspaces,
            pools: &self.pools,
            validated_files: &self.validated_files,
            processes: &self.processes,
            dataplane: &self.dataplane,
            warming: &self.warming,
            making: &self.making,
        }
    }

    fn gc_context(&self) -> GcContext<'_> {
        GcContext {
            store: &self.store,
            engine: &self.engine,
            containers: &self.containers,
        }
    }

    async fn follow_store(self: Arc<Self>) {
        let mut events = self.store.subscribe();
        loop {
            match events.recv().await {
                Ok(event) => {
                    let resource = &event.resource;
                    self.queue.add((resource.kind(), resource.key()));
                    // A pool counts the sandboxes running on its containers.
                    if let Some(pool) = resource
                        .as_sandbox()
                        .and_then(|s| s.status.as_ref()?.claimed_from.clone())
                    {
                        self.pools.recount(pool);
                    }
                    // What a namespace uses changed: its quotas' status, and the sandboxes they
                    // hold, are looked at again.
                    if matches!(
                        resource.kind(),
                        Kind::Sandbox | Kind::Snapshot | Kind::ResourceQuota
                    ) {
                        for key in quota::affected_by(&self.store, resource) {
                            self.queue.add(key);
                        }
                    }
                    // Sandboxes say in their status whether the Secrets they name are usable.
                    if resource.kind() == Kind::Secret {
                        for sandbox in sandbox_secrets::users_of(&self.store, &resource.key()) {
                            self.queue.add((Kind::Sandbox, sandbox));
                        }
                    }
                    // A template's pool members hold its snapshot: a new one under the same
                    // name makes them stale.
                    if resource.kind() == Kind::Snapshot {
                        for pool in template_pool::pools_holding(&self.store, &resource.key()) {
                            self.queue.add((Kind::SandboxPool, pool));
                        }
                    }
                    // Sandboxes may be waiting for the template.
                    if resource.kind() == Kind::SandboxTemplate {
                        for sandbox in template::waiting_for(&self.store, &resource.key()) {
                            self.queue.add((Kind::Sandbox, sandbox));
                        }
                    }
                    // A snapshot or fork may be waiting for the sandbox it names.
                    if let Some(owner) = resource.metadata().owner_references.first() {
                        if let Ok(kind) = owner.kind.parse::<Kind>() {
                            self.queue.add((kind, owner.name.clone()));
                        }
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "controller fell behind store events; resyncing");
                    self.enqueue_all();
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    }

    /// Turns Docker events about managed objects into reconciles; re-subscribes (and resyncs, since
    /// events may have been missed) whenever the stream ends, e.g. when the daemon restarts.
    async fn follow_docker(self: Arc<Self>) {
        loop {
            let mut events = self.engine.events();
            while let Some(event) = events.next().await {
                match event {
                    Ok(event) => {
                        // Another server's object is not ours to reconcile (volume events carry
                        // no labels, so they name no server and are looked at).
                        if event
                            .server
                            .as_ref()
                            .is_some_and(|s| *s != self.containers.server_id)
                        {
                            continue;
                        }
                        self.terminations.observe(&event);
                        if let Some(sandbox) = event.sandbox {
                            self.queue.add((Kind::Sandbox, sandbox));
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "docker event stream failed");
                        break;
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            if self.engine.ping().await.is_ok() {
                self.enqueue_all();
            }
        }
    }

    async fn resync_and_collect(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.settings.resync_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.enqueue_drifted().await;
            if let Err(error) = gc::collect_garbage(&self.gc_context()).await {
                tracing::warn!(%error, "garbage collection failed");
            }
            self.store.collect_snapshot_data().await;
            // Open and policed networks alike leave rules behind when they are removed.
            match crate::firewall::forget_gone_bridges().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(n, "removed the firewall rules of removed networks"),
                Err(error) => tracing::debug!(%error, "cannot tidy the firewall rules"),
            }
        }
    }

    /// Queues sandboxes whose deadline has passed (a safety net besides the per-key timers).
    async fn reap(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.settings.reap_interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let now = Utc::now();
            for entry in self.store.list(Kind::Sandbox) {
                let Some(sandbox) = entry.resource.as_sandbox() else {
                    continue;
                };
                let expired = sandbox
                    .status
                    .as_ref()
                    .and_then(|s| s.expires_at)
                    .is_some_and(|at| at <= now);
                let already = sandbox
                    .status
                    .as_ref()
                    .is_some_and(|s| s.phase == crate::resource::SandboxPhase::Expired);
                if expired && !already {
                    self.queue.add((Kind::Sandbox, sandbox.metadata.key()));
                }
            }
        }
    }
}
