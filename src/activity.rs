//! Which sandboxes are in use: when each was last the subject of an API call, and how many
//! commands started through the API still run in it. The API reports activity ([`Activity::touch`]
//! for a call, [`Activity::busy`] for as long as a command runs); the controller reads it to apply
//! a sandbox's idle policy (`spec.idle`). Kept in memory only: after a restart of the server every
//! sandbox counts as active from the moment the controller first looks at it.
//!
//! Long streams (a port-forward, a proxied connection, an attach) report their bytes through a
//! [`Toucher`], which passes them on at most once a second, so a busy stream costs next to nothing.
//!
//! It knows names and times, nothing of HTTP, Docker or documents.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, Utc};

#[derive(Clone, Copy, Debug)]
struct Record {
    last: DateTime<Utc>,
    running: usize,
}

/// The activity of every sandbox the API has seen used.
#[derive(Debug, Default)]
pub struct Activity {
    records: Mutex<HashMap<String, Record>>,
}

/// How often, at most, the bytes of one stream count as activity.
const TOUCH_EVERY_MS: i64 = 1000;

/// Counts the bytes of one long stream as activity of one sandbox, at most once a second.
#[derive(Clone, Debug)]
pub struct Toucher {
    activity: Arc<Activity>,
    name: Arc<str>,
    /// When this stream last counted, in milliseconds since the epoch.
    last: Arc<AtomicI64>,
}

impl Toucher {
    /// Bytes passed just now.
    pub fn touch(&self) {
        let now = Utc::now().timestamp_millis();
        let last = self.last.load(Ordering::Relaxed);
        if now - last < TOUCH_EVERY_MS {
            return;
        }
        if self
            .last
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            self.activity.touch(&self.name);
        }
    }
}

/// Marks a sandbox busy while it lives (a running command); dropping it counts as activity.
#[derive(Debug)]
pub struct Busy {
    activity: Arc<Activity>,
    name: String,
}

impl Activity {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Record>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sandbox `name` was used just now.
    pub fn touch(&self, name: &str) {
        let now = Utc::now();
        self.lock()
            .entry(name.to_string())
            .and_modify(|r| r.last = r.last.max(now))
            .or_insert(Record {
                last: now,
                running: 0,
            });
    }

    /// Sandbox `name` is in use until the returned guard is dropped.
    pub fn busy(self: &Arc<Self>, name: &str) -> Busy {
        let now = Utc::now();
        self.lock()
            .entry(name.to_string())
            .and_modify(|r| {
                r.last = r.last.max(now);
                r.running += 1;
            })
            .or_insert(Record {
                last: now,
                running: 1,
            });
        Busy {
            activity: Arc::clone(self),
            name: name.to_string(),
        }
    }

    /// Reports the bytes of a stream into sandbox `name` (see [`Toucher`]).
    pub fn toucher(self: &Arc<Self>, name: &str) -> Toucher {
        Toucher {
            activity: Arc::clone(self),
            name: name.into(),
            last: Arc::new(AtomicI64::new(i64::MIN / 2)),
        }
    }

    /// When `name` was last used, and whether something runs in it now. A sandbox never seen is
    /// recorded as used now (a server that just started knows nothing older).
    pub fn observe(&self, name: &str) -> (DateTime<Utc>, bool) {
        let now = Utc::now();
        let mut records = self.lock();
        let record = records.entry(name.to_string()).or_insert(Record {
            last: now,
            running: 0,
        });
        (record.last, record.running > 0)
    }

    /// Forgets `name` (it was deleted).
    pub fn forget(&self, name: &str) {
        let mut records = self.lock();
        if records.get(name).is_some_and(|r| r.running == 0) {
            records.remove(name);
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let now = Utc::now();
        if let Some(record) = self.activity.lock().get_mut(&self.name) {
            record.last = record.last.max(now);
            record.running = record.running.saturating_sub(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_command_keeps_a_sandbox_busy_and_its_end_counts_as_activity() {
        let activity = Arc::new(Activity::default());
        let (first, busy) = activity.observe("a");
        assert!(!busy);
        let guard = activity.busy("a");
        let guard2 = activity.busy("a");
        assert!(activity.observe("a").1);
        drop(guard);
        assert!(activity.observe("a").1, "one of two commands still runs");
        std::thread::sleep(std::time::Duration::from_millis(5));
        drop(guard2);
        let (last, busy) = activity.observe("a");
        assert!(!busy);
        assert!(last > first);
        activity.forget("a");
        let (again, _) = activity.observe("a");
        assert!(again >= last);
    }

    #[test]
    fn a_stream_counts_at_most_once_a_second() {
        let activity = Arc::new(Activity::default());
        let toucher = activity.toucher("c");
        toucher.touch();
        let (t1, busy) = activity.observe("c");
        assert!(!busy);
        std::thread::sleep(std::time::Duration::from_millis(5));
        toucher.clone().touch();
        assert_eq!(
            activity.observe("c").0,
            t1,
            "a second touch within the second is free"
        );
        std::thread::sleep(std::time::Duration::from_millis(1010));
        toucher.touch();
        assert!(activity.observe("c").0 > t1);
    }

    #[test]
    fn touch_moves_the_last_activity_forward_only() {
        let activity = Activity::default();
        activity.touch("b");
        let (t1, _) = activity.observe("b");
        std::thread::sleep(std::time::Duration::from_millis(5));
        activity.touch("b");
        let (t2, busy) = activity.observe("b");
        assert!(t2 > t1);
        assert!(!busy);
    }
}
