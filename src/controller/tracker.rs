//! In-memory coordination between snapshots and the sandbox reconcile: one lock per sandbox
//! (a snapshot and a rollback or container replacement of one sandbox take turns), which
//! sandboxes a snapshot holds paused (the sandbox reconcile leaves those paused and unpauses any
//! other paused container, e.g. one left by a crash). It holds no Docker object and no file; it
//! only says who is busy with what.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// In-memory coordination between snapshots and the sandbox reconcile.
#[derive(Default)]
pub(super) struct Tracker {
    /// One lock per sandbox: snapshots and rollbacks of one sandbox take turns.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Sandboxes whose container a snapshot paused and will unpause.
    paused: Mutex<HashSet<String>>,
}

impl Tracker {
    /// Waits for, then holds, the sandbox's lock.
    pub(super) async fn lock(self: &Arc<Self>, sandbox: &str) -> SandboxLock {
        let mutex = {
            let mut locks = lock(&self.locks);
            Arc::clone(locks.entry(sandbox.to_string()).or_default())
        };
        let guard = Arc::clone(&mutex).lock_owned().await;
        SandboxLock {
            tracker: Arc::clone(self),
            sandbox: sandbox.to_string(),
            mutex,
            guard: Some(guard),
        }
    }

    /// Whether a snapshot paused this sandbox's container on purpose.
    pub(super) fn holds_paused(&self, sandbox: &str) -> bool {
        lock(&self.paused).contains(sandbox)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

pub(super) struct SandboxLock {
    tracker: Arc<Tracker>,
    sandbox: String,
    mutex: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for SandboxLock {
    fn drop(&mut self) {
        self.guard.take();
        let mut locks = lock(&self.tracker.locks);
        // Only the map and this handle left: nobody waits, forget the sandbox.
        if Arc::strong_count(&self.mutex) == 2 {
            locks.remove(&self.sandbox);
        }
    }
}

/// Removes a name from one of the tracker's sets when dropped.
pub(super) struct Mark<'a> {
    set: &'a Mutex<HashSet<String>>,
    name: String,
}

impl<'a> Mark<'a> {
    fn new(set: &'a Mutex<HashSet<String>>, name: &str) -> Mark<'a> {
        lock(set).insert(name.to_string());
        Mark {
            set,
            name: name.to_string(),
        }
    }
}

impl Drop for Mark<'_> {
    fn drop(&mut self) {
        lock(self.set).remove(&self.name);
    }
}

impl Tracker {
    /// Marks the sandbox's container as held paused by a snapshot, until the mark is dropped.
    pub(super) fn hold_paused(&self, sandbox: &str) -> Mark<'_> {
        Mark::new(&self.paused, sandbox)
    }
}
