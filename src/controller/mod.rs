//! The reconcile loop: drives Docker to match the store and writes observed status back.
//!
//! Triggers — store changes, Docker events, expiry deadlines, a periodic resync — only ever add a
//! `(kind, name)` key to one [`queue::WorkQueue`]; a bounded set of workers takes keys and runs the
//! reconcile function of their kind. Reconciles are level-triggered and idempotent: each one reads
//! the desired document and the labeled Docker objects as they are now, so running one twice, or
//! after a crash at any point, converges to the same result. This module never parses documents
//! and never serves HTTP; it talks to Docker only through [`Engine`].

mod fork;
mod gc;
mod pool;
pub mod queue;
pub mod restore;
mod sandbox;
mod snapshot;
#[cfg(test)]
mod tests;
mod workspace;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use tokio::task::JoinSet;

use crate::config::Settings;
use crate::docker::{container_name, Engine, EngineError};
use crate::resource::{Kind, SandboxDefaults};
use crate::store::{Store, StoreError};
use queue::{Backoff, WorkQueue};

/// What the queue holds: one resource.
pub type Key = (Kind, String);

#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error("docker: {0}")]
    Engine(#[from] EngineError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Other(String),
}

impl From<restore::RestoreError> for ReconcileError {
    fn from(error: restore::RestoreError) -> ReconcileError {
        match error {
            restore::RestoreError::Engine(e) => ReconcileError::Engine(e),
            other => ReconcileError::Other(other.to_string()),
        }
    }
}

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

/// Writes `new` as the status of `kind`/`name` unless it equals `old`, so that a reconcile that
/// observed nothing new writes nothing (an idle resync costs no writes). A resource deleted
/// meanwhile is not an error: the next reconcile sees that.
///
/// The write waits for its fsyncs on a blocking thread: the async workers are few (one per core)
/// and a burst of reconciles (a Fork's children) would otherwise queue behind each other's disk
/// flushes.
async fn write_status_if_changed<S: serde::Serialize + PartialEq>(
    store: &Arc<Store>,
    kind: Kind,
    name: &str,
    old: Option<&S>,
    new: &S,
) -> Result<(), ReconcileError> {
    if old == Some(new) {
        return Ok(());
    }
    let value = serde_json::to_value(new).map_err(|e| ReconcileError::Other(e.to_string()))?;
    let store = Arc::clone(store);
    let name = name.to_string();
    let written = tokio::task::spawn_blocking(move || store.update_status(kind, &name, value))
        .await
        .map_err(|e| ReconcileError::Other(format!("status write failed: {e}")))?;
    match written {
        Ok(_) | Err(StoreError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

pub struct Controller {
    store: Arc<Store>,
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    queue: Arc<WorkQueue<Key>>,
    /// This server's identity, labeled on every object it creates; garbage collection only
    /// touches objects carrying it.
    server_id: String,
    /// The helper binary to install in the shared helper volume, when this build carries one.
    helper_binary: Option<&'static [u8]>,
    /// Name of the helper volume once it is known to be ready.
    helper_volume: tokio::sync::Mutex<Option<String>>,
    /// Snapshots in progress: which containers they hold paused, which files they write.
    snapshots: Arc<snapshot::Tracker>,
    /// Pool members handed out lately, so that no member is handed out twice (see `pool.rs`).
    pool_claims: pool::HandedOut,
    /// Whether workspaces can be used on this host, as learned so far.
    host_access: workspace::HostAccess,
    /// Snapshot files validated lately (see `restore.rs`).
    validated_files: restore::ValidatedFiles,
    /// When progressing forks last wrote their progress (see `fork.rs`).
    fork_progress: fork::ProgressWrites,
}

impl Controller {
    pub fn new(
        store: Arc<Store>,
        engine: Arc<dyn Engine>,
        settings: Arc<Settings>,
        server_id: String,
        helper_binary: Option<&'static [u8]>,
    ) -> Arc<Controller> {
        Arc::new(Controller {
            server_id,
            store,
            engine,
            settings,
            queue: WorkQueue::new(Backoff::default()),
            helper_binary,
            helper_volume: tokio::sync::Mutex::new(None),
            snapshots: Arc::default(),
            pool_claims: pool::HandedOut::default(),
            host_access: workspace::HostAccess::default(),
            validated_files: Default::default(),
            fork_progress: Default::default(),
        })
    }

    pub fn queue(&self) -> &Arc<WorkQueue<Key>> {
        &self.queue
    }

    fn defaults(&self) -> SandboxDefaults {
        SandboxDefaults {
            image: self.settings.default_image.clone(),
            cpus: self.settings.default_cpus,
            memory_mb: self.settings.default_memory_mb,
            pids_limit: self.settings.default_pids_limit,
        }
    }

    /// Queues every resource the store knows.
    pub fn enqueue_all(&self) {
        for kind in Kind::ALL {
            for entry in self.store.list(kind) {
                self.queue.add((kind, entry.resource.name().to_string()));
            }
        }
    }

    /// The periodic resync: every resource except the sandboxes that are visibly as their status
    /// says (phase Running at the current generation, not expiring, on a running container of
    /// their own name with the recorded ID), judged from one container listing. An idle server
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
        let running: HashMap<&str, &str> = containers
            .iter()
            .filter(|c| c.is_running())
            .map(|c| (c.id.as_str(), c.name.as_str()))
            .collect();
        let now = Utc::now();
        let mut skipped = 0usize;
        for kind in Kind::ALL {
            for entry in self.store.list(kind) {
                let name = entry.resource.name().to_string();
                let settled = entry.resource.as_sandbox().is_some_and(|sandbox| {
                    let Some(status) = &sandbox.status else {
                        return false;
                    };
                    sandbox.metadata.deletion_timestamp.is_none()
                        && status.phase == crate::resource::SandboxPhase::Running
                        && status.observed_generation == sandbox.metadata.generation
                        && status.expires_at.is_none_or(|at| at > now)
                        && status.container_id.as_deref().is_some_and(|id| {
                            running.get(id).copied() == Some(container_name(&name).as_str())
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
            match self.reconcile(&key).await {
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

    /// Runs the reconcile function of the key's kind once.
    pub async fn reconcile(&self, key: &Key) -> Result<Outcome, ReconcileError> {
        match key.0 {
            Kind::Sandbox => sandbox::reconcile(self, &key.1).await,
            Kind::Snapshot => snapshot::reconcile(self, &key.1).await,
            Kind::Fork => fork::reconcile(self, &key.1).await,
            Kind::SandboxPool => pool::reconcile(self, &key.1).await,
        }
    }

    async fn follow_store(self: Arc<Self>) {
        let mut events = self.store.subscribe();
        loop {
            match events.recv().await {
                Ok(event) => {
                    let resource = &event.resource;
                    self.queue
                        .add((resource.kind(), resource.name().to_string()));
                    // A pool counts the sandboxes running on its containers.
                    if let Some(pool) = resource
                        .as_sandbox()
                        .and_then(|s| s.status.as_ref()?.claimed_from.clone())
                    {
                        self.recount_pool(pool);
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
                        if event.server.as_ref().is_some_and(|s| *s != self.server_id) {
                            continue;
                        }
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
            if let Err(error) = gc::collect_garbage(&self).await {
                tracing::warn!(%error, "garbage collection failed");
            }
            snapshot::collect_data(&self);
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
                    self.queue
                        .add((Kind::Sandbox, sandbox.metadata.name.clone()));
                }
            }
        }
    }
}
