//! Claims recorded before their rename: a new sandbox's claim of a pool member
//! ([`ClaimName::Own`](super::claims::ClaimName)) is written into the sandbox's status while the
//! member still carries its member name, and the member takes the sandbox's container name only
//! then, on a task of its own, so that neither the sandbox nor the reconcile worker waits for
//! Docker, which renames one container at a time. This module owns that last step: the claims
//! that await it, the rename, and, after a server stopped in between, finding the recorded
//! member under its old name ([`Naming::adopt`]). Which member to claim is `claims.rs`'s.
//!
//! Every reconcile of a sandbox first calls [`Naming::name_claimed`], which waits for a rename
//! in progress and carries out one that failed: whatever the reconcile does next finds the
//! container under the sandbox's name.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::container::Containers;
use super::error::ReconcileError;
use super::names::{self, container_name};
use super::queue::{Key, WorkQueue};
use crate::docker::LABEL_ID;
use crate::resource::{Kind, SandboxStatus};

/// A claimed member awaiting its rename: container ID and workspace volume. `None` once renamed
/// (or discarded); the lock is held while that happens.
type Slot = Arc<tokio::sync::Mutex<Option<(String, String)>>>;

/// How soon a sandbox whose member could not be renamed in the background is reconciled again
/// (which tries once more).
const RETRY: Duration = Duration::from_secs(1);

/// The claims awaiting their rename, by sandbox.
pub(super) struct Naming {
    containers: Arc<Containers>,
    queue: Arc<WorkQueue<Key>>,
    awaiting: Mutex<HashMap<String, Slot>>,
    /// Renames started in the background and not finished.
    in_background: AtomicUsize,
}

impl Naming {
    pub(super) fn new(containers: Arc<Containers>, queue: Arc<WorkQueue<Key>>) -> Naming {
        Naming {
            containers,
            queue,
            awaiting: Mutex::new(HashMap::new()),
            in_background: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Slot>> {
        self.awaiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records that sandbox `name` claimed container `id` (workspace `volume`), which keeps its
    /// member name until [`Naming::name_claimed`] or [`Naming::name_in_background`].
    pub(super) fn await_name(&self, name: &str, id: String, volume: String) {
        let slot = Arc::new(tokio::sync::Mutex::new(Some((id, volume))));
        self.lock().insert(name.to_string(), slot);
    }

    /// Gives the member sandbox `name` claimed the sandbox's container name, once `recorded`
    /// (the container its written status names) is that member; a claim the status never
    /// recorded is discarded instead. Waits for a rename in progress. Nothing to do, and no
    /// Docker call, when no claim of `name` awaits its name. A failed rename stays awaited.
    pub(super) async fn name_claimed(
        &self,
        name: &str,
        recorded: Option<&str>,
    ) -> Result<(), ReconcileError> {
        let Some(slot) = self.lock().get(name).cloned() else {
            return Ok(());
        };
        self.name(name, &slot, recorded).await
    }

    /// [`Naming::name_claimed`] on a task of its own, for a status just written: a failure is
    /// logged and the sandbox reconciled again soon.
    pub(super) fn name_in_background(self: &Arc<Self>, name: &str, recorded: Option<&str>) {
        let Some(slot) = self.lock().get(name).cloned() else {
            return;
        };
        let naming = Arc::clone(self);
        let name = name.to_string();
        let recorded = recorded.map(str::to_string);
        self.in_background.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(async move {
            if let Err(error) = naming.name(&name, &slot, recorded.as_deref()).await {
                tracing::warn!(sandbox = %name, %error, "cannot give the claimed container its name yet");
                naming.queue.add_soon((Kind::Sandbox, name), RETRY);
            }
            naming.in_background.fetch_sub(1, Ordering::SeqCst);
        });
    }

    async fn name(
        &self,
        name: &str,
        slot: &Slot,
        recorded: Option<&str>,
    ) -> Result<(), ReconcileError> {
        let mut claim = slot.lock().await;
        let Some((id, volume)) = claim.take() else {
            return Ok(());
        };
        if recorded != Some(id.as_str()) {
            tracing::info!(sandbox = name, container = %id, "discarding a claim its sandbox never recorded");
            self.containers.discard(&id, &volume).await;
        } else if let Err(error) = self.containers.take_name(&id, &container_name(name)).await {
            *claim = Some((id, volume));
            return Err(error.into());
        }
        let mut awaiting = self.lock();
        if awaiting.get(name).is_some_and(|s| Arc::ptr_eq(s, slot)) {
            awaiting.remove(name);
        }
        Ok(())
    }

    /// Gives the container sandbox `name`'s `status` records the sandbox's container name when
    /// the status says it was claimed from a pool and it still carries its member name: a claim
    /// recorded by a server that stopped before renaming it. Whether it did so; nothing to do,
    /// and no Docker call, for a sandbox that claimed nothing.
    pub(super) async fn adopt(
        &self,
        name: &str,
        status: &SandboxStatus,
    ) -> Result<bool, ReconcileError> {
        let (Some(_), Some(recorded)) = (&status.claimed_from, status.container_id.as_deref())
        else {
            return Ok(false);
        };
        let engine = &self.containers.engine;
        let Some(details) = engine.inspect_container(recorded).await? else {
            return Ok(false);
        };
        let member_name = details
            .labels
            .get(LABEL_ID)
            .filter(|id| names::is_member(id))
            .map(|id| container_name(id));
        if !self.containers.is_ours(&details.labels) || member_name.as_ref() != Some(&details.name)
        {
            return Ok(false);
        }
        tracing::info!(
            sandbox = name,
            container = recorded,
            "naming a claim recorded before a restart"
        );
        self.containers
            .take_name(recorded, &container_name(name))
            .await?;
        Ok(true)
    }

    /// Waits until every rename started in the background has finished.
    #[cfg(test)]
    pub(super) async fn settled(&self) {
        while self.in_background.load(Ordering::SeqCst) > 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
}
