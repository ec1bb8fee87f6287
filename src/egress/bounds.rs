//! How much one sandbox may ask of the egress gateway at once, so that a flood from one leaves
//! the others served: a cap on its open proxy connections (one beyond it is refused at once), and
//! a rate for its DNS queries (a token bucket; queries beyond it are dropped unanswered, as a
//! busy resolver would). Keyed by the source address the gateway tells sandboxes apart by; it
//! knows nothing of policies.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Proxy connections one sandbox may hold open at once.
pub(super) const MAX_CONNECTIONS_PER_SANDBOX: usize = 128;
/// DNS queries one sandbox may send per second, on average.
pub(super) const QUERIES_PER_SECOND: f64 = 200.0;
/// DNS queries one sandbox may send at once after a quiet while.
pub(super) const QUERY_BURST: f64 = 400.0;

#[derive(Default)]
pub(super) struct Bounds {
    sources: Mutex<HashMap<IpAddr, Source>>,
}

struct Source {
    open: usize,
    tokens: f64,
    refilled: Instant,
}

impl Source {
    fn new(now: Instant) -> Source {
        Source {
            open: 0,
            tokens: QUERY_BURST,
            refilled: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * QUERIES_PER_SECOND).min(QUERY_BURST);
        self.refilled = now;
    }

    /// Whether nothing distinguishes it from a source never seen.
    fn idle(&self) -> bool {
        self.open == 0 && self.tokens >= QUERY_BURST
    }
}

/// One open proxy connection of a sandbox; its place is given back when dropped.
pub(super) struct Slot {
    bounds: Arc<Bounds>,
    source: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Ok(mut sources) = self.bounds.sources.lock() {
            if let Some(entry) = sources.get_mut(&self.source) {
                entry.open = entry.open.saturating_sub(1);
                entry.refill(Instant::now());
                if entry.idle() {
                    sources.remove(&self.source);
                }
            }
        }
    }
}

impl Bounds {
    /// A place for one more proxy connection from `source`, unless it holds the most already.
    pub(super) fn connection(self: &Arc<Self>, source: IpAddr) -> Option<Slot> {
        let mut sources = self.sources.lock().ok()?;
        let entry = sources
            .entry(source)
            .or_insert_with(|| Source::new(Instant::now()));
        if entry.open >= MAX_CONNECTIONS_PER_SANDBOX {
            return None;
        }
        entry.open += 1;
        Some(Slot {
            bounds: Arc::clone(self),
            source,
        })
    }

    /// Whether a DNS query from `source` may be answered now.
    pub(super) fn query(&self, source: IpAddr) -> bool {
        self.query_at(source, Instant::now())
    }

    fn query_at(&self, source: IpAddr, now: Instant) -> bool {
        let Ok(mut sources) = self.sources.lock() else {
            return false;
        };
        let entry = sources.entry(source).or_insert_with(|| Source::new(now));
        entry.refill(now);
        if entry.tokens < 1.0 {
            return false;
        }
        entry.tokens -= 1.0;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([172, 30, 0, last])
    }

    #[test]
    fn one_sandboxs_connections_are_capped_and_others_are_not_touched() {
        let bounds = Arc::new(Bounds::default());
        let held: Vec<Slot> = (0..MAX_CONNECTIONS_PER_SANDBOX)
            .map(|_| bounds.connection(ip(2)).expect("within the cap"))
            .collect();
        assert!(bounds.connection(ip(2)).is_none(), "one past the cap");
        assert!(
            bounds.connection(ip(3)).is_some(),
            "another sandbox is served"
        );
        drop(held);
        assert!(bounds.connection(ip(2)).is_some(), "places come back");
        // A source with nothing open and a full bucket is forgotten.
        assert!(bounds.sources.lock().unwrap().is_empty());
    }

    #[test]
    fn queries_beyond_the_burst_wait_for_the_rate() {
        let bounds = Bounds::default();
        let start = Instant::now();
        let answered = (0..1000).filter(|_| bounds.query_at(ip(2), start)).count();
        assert_eq!(answered, QUERY_BURST as usize);
        assert!(
            bounds.query_at(ip(3), start),
            "another sandbox has its own bucket"
        );
        let later = start + Duration::from_millis(100);
        let refilled = (0..1000).filter(|_| bounds.query_at(ip(2), later)).count();
        assert_eq!(refilled, (QUERIES_PER_SECOND / 10.0) as usize);
    }
}
