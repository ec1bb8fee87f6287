//! What each kind's reconcile works against: a narrow view of the controller with only the parts
//! that kind needs, built by the controller for each reconcile. A reconciler never sees the whole
//! controller (its workers, its triggers, the other kinds' state), so what it can touch is what
//! its context names.

use std::sync::Arc;

use super::claims::Pools;
use super::container::Containers;
use super::content::ValidatedFiles;
use super::queue::{Key, WorkQueue};
use super::status::ProgressWrites;
use super::tracker::Tracker;
use super::views::ViewContext;
use super::workspace::Workspaces;
use crate::config::Settings;
use crate::docker::Engine;
use crate::store::{Recorder, Store};

/// A `Sandbox` needs Docker, its containers and workspace, the pools it may claim from, the
/// snapshots it may be restored from, the snapshots in progress on it, and its activity (for its
/// idle policy).
pub(super) struct SandboxContext<'a> {
    pub(super) store: &'a Arc<Store>,
    pub(super) events: &'a Recorder,
    pub(super) engine: &'a Arc<dyn Engine>,
    pub(super) settings: &'a Arc<Settings>,
    pub(super) containers: &'a Containers,
    pub(super) workspaces: &'a Workspaces,
    pub(super) pools: &'a Pools,
    pub(super) snapshots: &'a Arc<Tracker>,
    pub(super) validated_files: &'a ValidatedFiles,
    pub(super) activity: &'a Arc<crate::activity::Activity>,
    pub(super) processes: &'a Arc<crate::processes::Processes>,
    pub(super) services: &'a Arc<crate::services::Services>,
    pub(super) terminations: &'a super::termination::Terminations,
}

/// A `Snapshot` needs Docker to export a workspace, the snapshots in progress, and the queue to
/// have a sandbox it could not unpause looked at again.
pub(super) struct SnapshotContext<'a> {
    pub(super) store: &'a Arc<Store>,
    pub(super) events: &'a Recorder,
    pub(super) engine: &'a Arc<dyn Engine>,
    pub(super) settings: &'a Arc<Settings>,
    pub(super) containers: &'a Containers,
    pub(super) snapshots: &'a Arc<Tracker>,
    pub(super) queue: &'a Arc<WorkQueue<Key>>,
}

/// A `Fork` only writes desired state: the store, and when it last wrote its progress. A `Secret`
/// and a `Webhook` need no more.
pub(super) struct ForkContext<'a> {
    pub(super) store: &'a Arc<Store>,
    pub(super) events: &'a Recorder,
    pub(super) fork_progress: &'a ProgressWrites,
}

/// A `SandboxPool` makes and removes members: Docker, containers and their workspaces, and the
/// pools' record of what was handed out.
pub(super) struct PoolContext<'a> {
    pub(super) store: &'a Arc<Store>,
    pub(super) events: &'a Recorder,
    pub(super) engine: &'a Arc<dyn Engine>,
    pub(super) containers: &'a Containers,
    pub(super) workspaces: &'a Workspaces,
    pub(super) pools: &'a Pools,
    /// For the snapshot content of a template's pool members.
    pub(super) validated_files: &'a ValidatedFiles,
    /// Opens a member's supervisor connection while it waits to be claimed.
    pub(super) processes: &'a Arc<crate::processes::Processes>,
    /// Opens a member's helper channel while it waits to be claimed.
    pub(super) dataplane: &'a Arc<crate::dataplane::DataPlane>,
    /// Bounds how many members are readied at once (see [`PoolContext::warm`]).
    pub(super) warming: &'a Arc<tokio::sync::Semaphore>,
    /// Bounds how many members are made at once (see [`PoolContext::making_turn`]).
    pub(super) making: &'a Arc<tokio::sync::Semaphore>,
}

/// How many new pool members have their connections opened at once. Each opening is a `docker
/// exec`; a pool filling with dozens of members must not send dozens at once, which would slow
/// the daemon for every other call (a create waited 30 s behind them) and make helpers miss their
/// greeting deadline.
pub(super) const WARM_AT_ONCE: usize = 2;

/// How many pool members, of all pools together, are created and started at once. A pool of
/// dozens made all at once queues dozens of container creates in the daemon, and a sandbox
/// created meanwhile (no member fits it) waits behind all of them: 30 s and more on 2 cores.
/// On such a machine the daemon does not make them faster in parallel anyway.
pub(super) const MAKE_AT_ONCE: usize = 4;

impl PoolContext<'_> {
    /// Waits for a turn to make one member (see [`MAKE_AT_ONCE`]); the turn ends when the
    /// permit is dropped.
    pub(super) async fn making_turn(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        self.making.acquire().await.ok()
    }

    /// Readies a new member for its claim, in the background and [`WARM_AT_ONCE`] at a time: its
    /// supervisor connection and its helper channel are opened, so the claiming sandbox's first
    /// call starts at once.
    pub(super) fn warm(&self, container_id: &str) {
        let (processes, dataplane) = (Arc::clone(self.processes), Arc::clone(self.dataplane));
        let warming = Arc::clone(self.warming);
        let container_id = container_id.to_string();
        tokio::spawn(async move {
            let Ok(_turn) = warming.acquire_owned().await else {
                return;
            };
            processes.warm(&container_id).await;
            dataplane.warm(&container_id).await;
        });
    }
}

impl SandboxContext<'_> {
    /// What a restore onto a copy-on-write view needs (see `views.rs`).
    pub(super) fn views(&self) -> ViewContext<'_> {
        ViewContext {
            store: self.store,
            engine: self.engine.as_ref(),
            containers: self.containers,
            workspaces: self.workspaces,
        }
    }
}

impl PoolContext<'_> {
    /// What a template's member holding a snapshot as a copy-on-write view needs.
    pub(super) fn views(&self) -> ViewContext<'_> {
        ViewContext {
            store: self.store,
            engine: self.engine.as_ref(),
            containers: self.containers,
            workspaces: self.workspaces,
        }
    }
}

/// Garbage collection compares Docker's objects with the store.
pub(super) struct GcContext<'a> {
    pub(super) store: &'a Arc<Store>,
    pub(super) engine: &'a Arc<dyn Engine>,
    pub(super) containers: &'a Containers,
}
