//! The last hour of each running sandbox's CPU and memory, so that a chart has a past from the
//! moment it is opened. One task samples every running or paused sandbox's cgroup every
//! [`INTERVAL`] (a few small file reads each, no Docker call) and keeps [`KEPT`] points per
//! sandbox; the points of sandboxes that are gone are dropped at the next sample. Memory only:
//! a restarted server starts its history again.
//!
//! This module keeps and hands out points; reading cgroups and the store is the exporter's.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

/// How often each sandbox is sampled.
pub const INTERVAL: Duration = Duration::from_secs(15);
/// Points kept per sandbox: one hour at [`INTERVAL`].
pub const KEPT: usize = 240;

/// One sample of a sandbox's usage.
#[derive(Clone, Debug, PartialEq)]
pub struct UsagePoint {
    pub at: DateTime<Utc>,
    /// CPU seconds its container had used by then (a new container starts again from 0).
    pub cpu_seconds: f64,
    pub memory_bytes: u64,
    pub memory_limit_bytes: Option<u64>,
}

/// The kept points, by sandbox name.
#[derive(Debug, Default)]
pub struct UsageHistory {
    points: Mutex<HashMap<String, VecDeque<UsagePoint>>>,
}

impl UsageHistory {
    /// Adds `point` to `sandbox`'s history, dropping its oldest beyond [`KEPT`].
    pub fn record(&self, sandbox: &str, point: UsagePoint) {
        let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        let kept = points.entry(sandbox.to_string()).or_default();
        if kept.len() == KEPT {
            kept.pop_front();
        }
        kept.push_back(point);
    }

    /// `sandbox`'s points, oldest first (none when it was never sampled).
    pub fn of(&self, sandbox: &str) -> Vec<UsagePoint> {
        let points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        points
            .get(sandbox)
            .map(|kept| kept.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets every sandbox not in `live`.
    pub fn retain(&self, live: &HashSet<String>) {
        let mut points = self.points.lock().unwrap_or_else(|e| e.into_inner());
        points.retain(|name, _| live.contains(name));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(n: u64) -> UsagePoint {
        UsagePoint {
            at: Utc::now(),
            cpu_seconds: n as f64,
            memory_bytes: n,
            memory_limit_bytes: None,
        }
    }

    #[test]
    fn an_hour_is_kept_oldest_first_and_gone_sandboxes_are_forgotten() {
        let history = UsageHistory::default();
        for n in 0..(KEPT as u64 + 10) {
            history.record("a", point(n));
        }
        history.record("b", point(1));
        let a = history.of("a");
        assert_eq!(a.len(), KEPT);
        assert_eq!(a[0].memory_bytes, 10);
        assert_eq!(a[KEPT - 1].memory_bytes, KEPT as u64 + 9);
        history.retain(&HashSet::from(["b".to_string()]));
        assert!(history.of("a").is_empty());
        assert_eq!(history.of("b").len(), 1);
        assert!(history.of("never").is_empty());
    }
}
