//! The store's async face. Every write of the store waits for its fsyncs, which on a busy disk
//! take milliseconds; the async workers are few (one per core) and serve every request and
//! reconcile, so they must not wait for a disk. [`Store::write`] runs a store operation on a
//! blocking thread and awaits it: callers on the async workers (the API, the controller) use it
//! for every write, and never need to wrap the store themselves. Reads ([`Store::get`],
//! [`Store::list`]) come from memory and stay synchronous.

use std::sync::Arc;

use super::{Store, StoreError, StoreResult};

impl Store {
    /// Runs `operation` against the store off the async workers and awaits its result.
    pub async fn write<T, F>(self: &Arc<Self>, operation: F) -> StoreResult<T>
    where
        F: FnOnce(&Store) -> StoreResult<T> + Send + 'static,
        T: Send + 'static,
    {
        let store = Arc::clone(self);
        self.offload(move || operation(&store)).await?
    }

    /// Runs the blocking `work` (file I/O in the data directory) off the async workers.
    pub(super) async fn offload<T, F>(&self, work: F) -> StoreResult<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        tokio::task::spawn_blocking(work)
            .await
            .map_err(|e| StoreError::Interrupted(e.to_string()))
    }
}
