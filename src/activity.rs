//! Which sandboxes are in use: when each was last the subject of an API call, and how many
//! commands started through the API still run in it. The API reports activity ([`Activity::touch`]
//! for a call, [`Activity::busy`] for as long as a command runs); the controller reads it to apply
//! a sandbox's idle policy (`spec.idle`). Kept in memory only: after a restart of the server every
//! sandbox counts as active from the moment the controller first looks at it.
//!
//! A background process started through the API outlives the call that started it, so no guard
//! can mark it: for those the controller asks a [`Probe`] the server installs
//! ([`Activity::set_probe`]), which asks the sandbox's process supervisor.
//!
//! It knows names and times, nothing of HTTP, Docker or documents.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use chrono::{DateTime, Utc};
use futures::future::BoxFuture;

/// What a sandbox's background processes (started through the API) say of its use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessUse {
    /// One of them runs now.
    pub running: bool,
    /// When the last of them ended, if one did.
    pub last_ended: Option<DateTime<Utc>>,
}

/// Asks how sandbox `name`'s background processes use it. It must not wake a paused or stopped
/// sandbox, and answers the default when it cannot tell.
pub type Probe = Arc<dyn Fn(String) -> BoxFuture<'static, ProcessUse> + Send + Sync>;

#[derive(Clone, Copy, Debug)]
struct Record {
    last: DateTime<Utc>,
    running: usize,
}

/// The activity of every sandbox the API has seen used.
#[derive(Default)]
pub struct Activity {
    records: Mutex<HashMap<String, Record>>,
    probe: OnceLock<Probe>,
}

impl std::fmt::Debug for Activity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Activity")
            .field("records", &self.records)
            .field("probe", &self.probe.get().is_some())
            .finish()
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

    /// Installs the probe of background processes (once; a second one is ignored).
    pub fn set_probe(&self, probe: Probe) {
        let _ = self.probe.set(probe);
    }

    /// How sandbox `name`'s background processes use it, as the probe says (none installed:
    /// nothing runs).
    pub async fn processes(&self, name: &str) -> ProcessUse {
        match self.probe.get() {
            Some(probe) => probe(name.to_string()).await,
            None => ProcessUse::default(),
        }
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

    #[tokio::test]
    async fn background_processes_are_what_the_probe_says() {
        let activity = Activity::default();
        assert_eq!(activity.processes("a").await, ProcessUse::default());
        let ended = Utc::now();
        let probe: Probe = Arc::new(move |name: String| {
            Box::pin(async move {
                ProcessUse {
                    running: name == "busy",
                    last_ended: Some(ended),
                }
            })
        });
        activity.set_probe(probe);
        assert!(activity.processes("busy").await.running);
        let quiet = activity.processes("quiet").await;
        assert_eq!((quiet.running, quiet.last_ended), (false, Some(ended)));
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
