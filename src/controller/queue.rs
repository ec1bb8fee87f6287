//! A work queue with the semantics of client-go's: a key waiting in the queue is queued once however
//! often it is added; a key being processed is never handed to a second worker — adding it meanwhile
//! marks it dirty so it runs again afterwards; failures are retried after a per-key exponential
//! backoff that resets on success; delayed adds wake the key later.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::resource::Kind;

/// What the controller's queue holds: one resource.
pub type Key = (Kind, String);

/// Backoff bounds for failed reconciles.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            base: Duration::from_millis(200),
            max: Duration::from_secs(60),
        }
    }
}

struct Inner<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    dirty: HashSet<K>,
    failures: HashMap<K, u32>,
    /// Keys with an [`WorkQueue::add_soon`] timer running.
    soon: HashSet<K>,
    shut_down: bool,
}

pub struct WorkQueue<K> {
    inner: Mutex<Inner<K>>,
    ready: Notify,
    backoff: Backoff,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new(backoff: Backoff) -> Arc<Self> {
        Arc::new(WorkQueue {
            inner: Mutex::new(Inner {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                failures: HashMap::new(),
                soon: HashSet::new(),
                shut_down: false,
            }),
            ready: Notify::new(),
            backoff,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<K>> {
        // A panic while holding this lock cannot leave the sets inconsistent in a way that matters
        // more than stopping the controller would, so keep going with the data.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` unless it is already waiting; if it is being processed, it runs again after.
    pub fn add(&self, key: K) {
        let mut inner = self.lock();
        if inner.shut_down {
            return;
        }
        if inner.processing.contains(&key) {
            inner.dirty.insert(key);
            return;
        }
        if inner.queued.insert(key.clone()) {
            inner.queue.push_back(key);
            drop(inner);
            self.ready.notify_one();
        }
    }

    /// Queues `key` after `delay`.
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let queue = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(key);
        });
    }

    /// Queues `key` after `delay`, unless an earlier `add_soon` of it is still waiting: a burst of
    /// adds becomes one run. For work that only recounts (a pool after claims), where running
    /// once after the burst is enough.
    pub fn add_soon(self: &Arc<Self>, key: K, delay: Duration) {
        if !self.lock().soon.insert(key.clone()) {
            return;
        }
        let queue = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.lock().soon.remove(&key);
            queue.add(key);
        });
    }

    /// Waits for the next key and marks it as being processed. `None` after shutdown.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.ready.notified();
            {
                let mut inner = self.lock();
                if inner.shut_down {
                    return None;
                }
                if let Some(key) = inner.queue.pop_front() {
                    inner.queued.remove(&key);
                    inner.processing.insert(key.clone());
                    // Another worker may be waiting too; let it look at what is left.
                    if !inner.queue.is_empty() {
                        self.ready.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Marks `key` processed successfully: its backoff resets; if it was added meanwhile, it is
    /// queued again.
    pub fn done(&self, key: &K) {
        let requeue = {
            let mut inner = self.lock();
            inner.failures.remove(key);
            inner.processing.remove(key);
            inner.dirty.remove(key)
        };
        if requeue {
            self.add(key.clone());
        }
    }

    /// Marks `key` failed: it is queued again after its next backoff delay, which is returned.
    pub fn failed(self: &Arc<Self>, key: &K) -> Duration {
        let delay = {
            let mut inner = self.lock();
            inner.processing.remove(key);
            inner.dirty.remove(key);
            let count = inner.failures.entry(key.clone()).or_insert(0);
            let delay = self.backoff_for(*count);
            *count = count.saturating_add(1);
            delay
        };
        self.add_after(key.clone(), delay);
        delay
    }

    fn backoff_for(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.min(20));
        self.backoff
            .base
            .saturating_mul(factor)
            .min(self.backoff.max)
    }

    /// How many consecutive failures `key` has had.
    pub fn failures(&self, key: &K) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Wakes every waiting worker with `None`.
    pub fn shut_down(&self) {
        self.lock().shut_down = true;
        self.ready.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue() -> Arc<WorkQueue<&'static str>> {
        WorkQueue::new(Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(80),
        })
    }

    #[tokio::test]
    async fn duplicate_adds_collapse() {
        let q = queue();
        q.add("a");
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_in_progress_is_not_handed_out_twice_but_runs_again_after() {
        let q = queue();
        q.add("a");
        let first = q.next().await.unwrap();
        q.add("a");
        q.add("a");
        assert!(q.is_empty(), "a key being processed must not be queued");
        let second = tokio::time::timeout(Duration::from_millis(50), q.next()).await;
        assert!(
            second.is_err(),
            "no second worker may get the key while it is processed"
        );
        q.done(&first);
        assert_eq!(
            q.next().await,
            Some("a"),
            "an add during processing runs once more"
        );
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_soon_adds_runs_once_after_the_delay() {
        let q = queue();
        for _ in 0..5 {
            q.add_soon("pool", Duration::from_millis(100));
        }
        tokio::time::sleep(Duration::from_millis(99)).await;
        assert!(q.is_empty(), "nothing before the delay");
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(q.len(), 1);
        let key = q.next().await.unwrap();
        q.done(&key);
        assert!(q.is_empty(), "the burst ran once");
        q.add_soon("pool", Duration::from_millis(100));
        tokio::time::sleep(Duration::from_millis(101)).await;
        assert_eq!(
            q.len(),
            1,
            "a later add after the burst waits and runs again"
        );
    }

    #[tokio::test]
    async fn failures_back_off_exponentially_and_reset_on_success() {
        let q = queue();
        q.add("a");
        let k = q.next().await.unwrap();
        assert_eq!(q.failed(&k), Duration::from_millis(10));
        let k = q.next().await.unwrap();
        assert_eq!(q.failed(&k), Duration::from_millis(20));
        let k = q.next().await.unwrap();
        assert_eq!(q.failed(&k), Duration::from_millis(40));
        let k = q.next().await.unwrap();
        assert_eq!(q.failed(&k), Duration::from_millis(80));
        let k = q.next().await.unwrap();
        assert_eq!(q.failed(&k), Duration::from_millis(80), "capped at max");
        assert_eq!(q.failures(&"a"), 5);
        let k = q.next().await.unwrap();
        q.done(&k);
        assert_eq!(q.failures(&"a"), 0);
    }

    #[tokio::test]
    async fn retries_wait_for_their_delay() {
        let q = queue();
        q.add("a");
        let k = q.next().await.unwrap();
        let started = tokio::time::Instant::now();
        q.failed(&k);
        q.next().await.unwrap();
        assert!(started.elapsed() >= Duration::from_millis(10));
    }

    #[tokio::test]
    async fn shut_down_releases_workers() {
        let q = queue();
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.next().await })
        };
        tokio::time::sleep(Duration::from_millis(10)).await;
        q.shut_down();
        assert_eq!(waiter.await.unwrap(), None);
    }
}
