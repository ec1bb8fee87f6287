//! The event log: the `Event`s the server recorded, deduplicated like Kubernetes (the same object,
//! type, reason and message again bumps `count` and `lastTimestamp`), bounded in number and age,
//! and kept in `<data>/events.json` across restarts.
//!
//! Recording must cost a reconcile nothing it would notice: [`Recorder::record`] changes memory
//! and wakes a writer thread, which waits a moment to gather what else happens, then replaces the
//! file in one crash-safe write (`atomic.rs`). A crash loses at most the events of that moment;
//! the file itself is always whole. This module does not decide when something happened (the
//! controller does) and knows nothing of HTTP.
//!
//! Every occurrence (a new event, or one counted again) also goes into the outbox,
//! `<data>/outbox.jsonl`: the same writer appends it (fsynced) before it replaces the events
//! file, and it stays there until [`EventLog::acknowledge`] says every webhook is past it. The
//! webhook deliveries read it from here, so an event recorded before a crash is delivered after
//! it. A line torn by a crash is skipped when the outbox is read back; delivered lines that a
//! crash kept are skipped by the deliveries, which remember how far they got.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::{atomic, EventType};
use crate::resource::{Event, EventMeta, EventSeverity, ObjectReference, Occurrence};

/// How many events are kept, and for how long after they last happened.
#[derive(Clone, Copy, Debug)]
pub struct EventLimits {
    pub max_events: usize,
    pub max_age: Duration,
}

impl Default for EventLimits {
    /// A thousand events, each kept a day after it last happened.
    fn default() -> EventLimits {
        EventLimits {
            max_events: 1000,
            max_age: Duration::from_secs(24 * 3600),
        }
    }
}

/// How long the writer waits after a change for more before it writes: changes come in bursts
/// (a fork starts many sandboxes), and one write serves the whole burst.
const GATHER: Duration = Duration::from_millis(100);

/// How often events past their age are dropped when nothing else happens.
const AGE_CHECK: Duration = Duration::from_secs(60);

/// The most occurrences the outbox holds: past it (webhooks down for very long with a very busy
/// server) the oldest are dropped, with a warning.
const MAX_OUTBOX: usize = 100_000;

/// How many acknowledged occurrences may stay in the outbox file before it is rewritten without
/// them.
const COMPACT_AFTER: usize = 256;

/// How many changes a slow watcher may fall behind before it is told to list again.
const CHANGE_CAPACITY: usize = 1024;

/// One change of the log, as a watch streams it.
#[derive(Clone, Debug)]
pub struct EventChange {
    pub event_type: EventType,
    pub event: Event,
}

/// The log, owned by the store. Dropping it writes what is pending and stops its writer.
pub struct EventLog {
    shared: Arc<Shared>,
}

/// The narrow handle through which the controller and the store record events: it can add an
/// occurrence and nothing else.
#[derive(Clone)]
pub struct Recorder {
    shared: Arc<Shared>,
}

struct Shared {
    path: PathBuf,
    outbox_path: PathBuf,
    limits: EventLimits,
    state: Mutex<LogState>,
    /// Signalled when there is something to write, or the log closes.
    wake: Condvar,
    changes: broadcast::Sender<EventChange>,
    /// Held from taking a copy of the log to having written it, so that an older copy is never
    /// written over a newer one.
    writing: Mutex<()>,
}

#[derive(Default)]
struct LogState {
    /// In the order they were last recorded (ascending resourceVersion).
    events: Vec<Event>,
    last_rv: u64,
    dirty: bool,
    closed: bool,
    /// Occurrences not yet acknowledged, oldest first (ascending resourceVersion).
    outbox: std::collections::VecDeque<Event>,
    /// How many at the end of `outbox` are not in the outbox file yet.
    outbox_unwritten: usize,
    /// Acknowledged occurrences the outbox file still holds.
    outbox_stale: usize,
}

/// The file's content.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct EventFile {
    resource_version: u64,
    items: Vec<Event>,
}

impl EventLog {
    /// Loads `path` (a missing or unreadable file starts an empty log; the latter is logged) and
    /// starts the writer thread.
    pub fn open(path: &Path, limits: EventLimits) -> EventLog {
        let mut state = LogState::default();
        match std::fs::read(path) {
            Ok(bytes) => match serde_json::from_slice::<EventFile>(&bytes) {
                Ok(file) => {
                    state.last_rv = file.resource_version;
                    state.events = file.items;
                    state.events.sort_by_key(resource_version);
                }
                Err(e) => tracing::warn!(
                    "{}: cannot read the events, starting anew: {e}",
                    path.display()
                ),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(
                "{}: cannot read the events, starting anew: {e}",
                path.display()
            ),
        }
        let outbox_path = path.with_file_name("outbox.jsonl");
        state.outbox = read_outbox(&outbox_path);
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            outbox_path,
            limits,
            state: Mutex::new(state),
            wake: Condvar::new(),
            changes: broadcast::channel(CHANGE_CAPACITY).0,
            writing: Mutex::new(()),
        });
        shared.prune(&mut shared.lock(), Utc::now());
        let writer = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("event-log".into())
            .spawn(move || writer.write_until_closed());
        if let Err(e) = spawned {
            // Events stay in memory and are written by `flush` (at shutdown) instead.
            tracing::warn!("cannot start the event writer: {e}");
        }
        EventLog { shared }
    }

    pub fn recorder(&self) -> Recorder {
        Recorder {
            shared: Arc::clone(&self.shared),
        }
    }

    /// The events about objects named `involved` (all events without it), oldest first.
    pub fn list(&self, involved: Option<&str>) -> Vec<Event> {
        let state = self.shared.lock();
        state
            .events
            .iter()
            .filter(|e| involved.is_none_or(|name| e.involved_object.name == name))
            .cloned()
            .collect()
    }

    pub fn get(&self, name: &str) -> Option<Event> {
        let state = self.shared.lock();
        state
            .events
            .iter()
            .find(|e| e.metadata.name == name)
            .cloned()
    }

    /// Every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<EventChange> {
        self.shared.changes.subscribe()
    }

    /// The resourceVersion of the latest occurrence.
    pub fn head(&self) -> u64 {
        self.shared.lock().last_rv
    }

    /// Up to `limit` occurrences recorded after resourceVersion `after`, oldest first.
    pub fn outbox_after(&self, after: u64, limit: usize) -> Vec<Event> {
        let state = self.shared.lock();
        state
            .outbox
            .iter()
            .filter(|e| resource_version(e) > after)
            .take(limit)
            .cloned()
            .collect()
    }

    /// Every consumer of the outbox is past resourceVersion `through`: what came up to it may go.
    pub fn acknowledge(&self, through: u64) {
        let mut state = self.shared.lock();
        let mut dropped = 0;
        while state
            .outbox
            .front()
            .is_some_and(|e| resource_version(e) <= through)
        {
            state.outbox.pop_front();
            dropped += 1;
        }
        state.outbox_unwritten = state.outbox_unwritten.min(state.outbox.len());
        state.outbox_stale += dropped;
        if state.outbox_stale >= COMPACT_AFTER || (dropped > 0 && state.outbox.is_empty()) {
            state.dirty = true;
            drop(state);
            self.shared.wake.notify_all();
        }
    }

    /// Writes what is pending now, and waits for it.
    pub fn flush(&self) -> std::io::Result<()> {
        self.shared.write_pending()
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_all();
        if let Err(e) = self.shared.write_pending() {
            tracing::warn!(
                "{}: cannot write the events: {e}",
                self.shared.path.display()
            );
        }
    }
}

impl Recorder {
    /// Records that `occurrence` happened now: a new event, or one more of an existing one.
    pub fn record(&self, occurrence: Occurrence) {
        self.shared.record(occurrence, Utc::now());
    }

    pub fn normal(&self, object: ObjectReference, reason: &str, message: impl Into<String>) {
        self.record(Occurrence {
            involved_object: object,
            type_: EventSeverity::Normal,
            reason: reason.to_string(),
            message: message.into(),
        });
    }

    pub fn warning(&self, object: ObjectReference, reason: &str, message: impl Into<String>) {
        self.record(Occurrence {
            involved_object: object,
            type_: EventSeverity::Warning,
            reason: reason.to_string(),
            message: message.into(),
        });
    }
}

enum OutboxWrite {
    Rewrite(Vec<u8>),
    Append(Vec<u8>),
}

/// Occurrences as outbox lines, one JSON object each.
fn lines<'a>(events: impl Iterator<Item = &'a Event>) -> Vec<u8> {
    let mut out = Vec::new();
    for event in events {
        if serde_json::to_writer(&mut out, event).is_ok() {
            out.push(b'\n');
        }
    }
    out
}

/// The outbox file's occurrences, in order, without duplicates; a line a crash tore is skipped.
fn read_outbox(path: &Path) -> std::collections::VecDeque<Event> {
    let Ok(bytes) = std::fs::read(path) else {
        return Default::default();
    };
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<Event> = bytes
        .split(|b| *b == b'\n')
        .filter_map(|line| serde_json::from_slice::<Event>(line).ok())
        .filter(|e| seen.insert(resource_version(e)))
        .collect();
    out.sort_by_key(resource_version);
    out.into()
}

fn resource_version(event: &Event) -> u64 {
    event.metadata.resource_version.parse().unwrap_or(0)
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, LogState> {
        // The state is consistent after every single step; a panic elsewhere must not stop
        // recording.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, occurrence: Occurrence, now: DateTime<Utc>) {
        let mut state = self.lock();
        state.last_rv += 1;
        let rv = state.last_rv.to_string();
        let (event_type, event) = match state.events.iter().position(|e| e.is_same(&occurrence)) {
            Some(index) => {
                let mut event = state.events.remove(index);
                event.count += 1;
                event.last_timestamp = now;
                event.metadata.resource_version = rv;
                (EventType::Modified, event)
            }
            None => {
                let meta = EventMeta {
                    name: format!("ev_{}", hex::encode(rand::random::<[u8; 8]>())),
                    uid: super::index::new_uid(),
                    resource_version: rv,
                    creation_timestamp: now,
                };
                (EventType::Added, Event::first(occurrence, meta))
            }
        };
        state.events.push(event.clone());
        state.outbox.push_back(event.clone());
        state.outbox_unwritten += 1;
        if state.outbox.len() > MAX_OUTBOX {
            state.outbox.pop_front();
            state.outbox_stale += 1;
            state.outbox_unwritten = state.outbox_unwritten.min(state.outbox.len());
            tracing::warn!(
                "the event outbox is full: its oldest occurrence is dropped undelivered"
            );
        }
        state.dirty = true;
        self.emit(event_type, event);
        self.prune(&mut state, now);
        drop(state);
        self.wake.notify_all();
    }

    /// Drops events past their age, then the least recently recorded beyond the number kept.
    fn prune(&self, state: &mut LogState, now: DateTime<Utc>) {
        let max_age =
            chrono::TimeDelta::from_std(self.limits.max_age).unwrap_or(chrono::TimeDelta::MAX);
        let too_old = |e: &Event| now.signed_duration_since(e.last_timestamp) > max_age;
        let excess = state.events.len().saturating_sub(self.limits.max_events);
        let mut dropped = Vec::new();
        let mut index = 0;
        state.events.retain(|e| {
            let drop = index < excess || too_old(e);
            index += 1;
            if drop {
                dropped.push(e.clone());
            }
            !drop
        });
        if !dropped.is_empty() {
            state.dirty = true;
        }
        for event in dropped {
            self.emit(EventType::Deleted, event);
        }
    }

    fn emit(&self, event_type: EventType, event: Event) {
        // An error only means nobody watches.
        let _ = self.changes.send(EventChange { event_type, event });
    }

    /// The writer thread: gathers changes for a moment, writes them, and drops old events while
    /// idle. Ends once the log is closed.
    fn write_until_closed(&self) {
        loop {
            {
                let mut state = self.lock();
                while !state.dirty && !state.closed {
                    let (next, timeout) = self
                        .wake
                        .wait_timeout(state, AGE_CHECK)
                        .unwrap_or_else(|e| e.into_inner());
                    state = next;
                    if timeout.timed_out() {
                        self.prune(&mut state, Utc::now());
                    }
                }
                if state.closed {
                    return;
                }
            }
            std::thread::sleep(GATHER);
            if let Err(e) = self.write_pending() {
                tracing::warn!("{}: cannot write the events: {e}", self.path.display());
                // Try again later rather than spin on a failing disk.
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }

    /// Writes the log if it changed since the last write.
    fn write_pending(&self) -> std::io::Result<()> {
        let _writing = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let (bytes, outbox) = {
            let mut state = self.lock();
            if !state.dirty {
                return Ok(());
            }
            state.dirty = false;
            let file = EventFile {
                resource_version: state.last_rv,
                items: state.events.clone(),
            };
            let bytes = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
            // Compacting rewrites the outbox whole; otherwise only the new lines are appended.
            let outbox = if state.outbox_stale >= COMPACT_AFTER || state.outbox.is_empty() {
                OutboxWrite::Rewrite(lines(state.outbox.iter()))
            } else {
                let skip = state.outbox.len() - state.outbox_unwritten;
                OutboxWrite::Append(lines(state.outbox.iter().skip(skip)))
            };
            let appended = state.outbox_unwritten;
            state.outbox_unwritten = 0;
            if matches!(outbox, OutboxWrite::Rewrite(_)) {
                state.outbox_stale = 0;
            }
            (bytes, (outbox, appended))
        };
        let (outbox, appended) = outbox;
        let written = self
            .write_outbox(&outbox)
            .and_then(|()| atomic::write_atomic(&self.path, &bytes));
        if written.is_err() {
            let mut state = self.lock();
            state.dirty = true;
            // Written again next time: a line twice is harmless, a line lost is not.
            state.outbox_unwritten = (state.outbox_unwritten + appended).min(state.outbox.len());
        }
        written
    }

    fn write_outbox(&self, write: &OutboxWrite) -> std::io::Result<()> {
        match write {
            OutboxWrite::Rewrite(bytes) => atomic::write_atomic(&self.outbox_path, bytes),
            OutboxWrite::Append(bytes) if bytes.is_empty() => Ok(()),
            OutboxWrite::Append(bytes) => {
                use std::io::Write;
                let mut file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&self.outbox_path)?;
                file.write_all(bytes)?;
                file.sync_data()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sandbox(name: &str) -> ObjectReference {
        ObjectReference {
            kind: "Sandbox".into(),
            name: name.into(),
            namespace: "default".into(),
            uid: format!("uid-{name}"),
        }
    }

    #[test]
    fn the_same_occurrence_is_counted_not_repeated() {
        let dir = tempfile::tempdir().unwrap();
        let log = EventLog::open(&dir.path().join("events.json"), EventLimits::default());
        let recorder = log.recorder();
        let mut changes = log.subscribe();
        recorder.normal(sandbox("a"), "Started", "the sandbox is running");
        recorder.normal(sandbox("a"), "Started", "the sandbox is running");
        recorder.normal(sandbox("a"), "Paused", "paused");
        recorder.warning(sandbox("b"), "Started", "the sandbox is running");
        let events = log.list(None);
        assert_eq!(events.len(), 3, "{events:#?}");
        let started = &events[0];
        assert_eq!((started.reason.as_str(), started.count), ("Started", 2));
        assert!(started.last_timestamp >= started.first_timestamp);
        assert_eq!(log.list(Some("b")).len(), 1);
        assert_eq!(log.list(Some("b"))[0].type_, EventSeverity::Warning);
        let kinds: Vec<EventType> = (0..4)
            .map(|_| changes.try_recv().unwrap().event_type)
            .collect();
        assert_eq!(
            kinds,
            [
                EventType::Added,
                EventType::Modified,
                EventType::Added,
                EventType::Added
            ]
        );
    }

    #[test]
    fn the_log_is_bounded_in_number_and_age() {
        let dir = tempfile::tempdir().unwrap();
        let limits = EventLimits {
            max_events: 3,
            max_age: Duration::from_secs(3600),
        };
        let log = EventLog::open(&dir.path().join("events.json"), limits);
        for i in 0..5 {
            log.recorder()
                .normal(sandbox(&format!("s{i}")), "Created", "created");
        }
        let names: Vec<String> = log
            .list(None)
            .into_iter()
            .map(|e| e.involved_object.name)
            .collect();
        assert_eq!(
            names,
            ["s2", "s3", "s4"],
            "the least recently recorded go first"
        );
        // An event last recorded two hours ago is past its age.
        let later = Utc::now() + chrono::TimeDelta::hours(2);
        log.shared.record(
            Occurrence {
                involved_object: sandbox("new"),
                type_: EventSeverity::Normal,
                reason: "Created".into(),
                message: "created".into(),
            },
            later,
        );
        let names: Vec<String> = log
            .list(None)
            .into_iter()
            .map(|e| e.involved_object.name)
            .collect();
        assert_eq!(names, ["new"]);
    }

    #[test]
    fn events_survive_reopening_and_counting_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.json");
        {
            let log = EventLog::open(&path, EventLimits::default());
            log.recorder().normal(sandbox("a"), "Started", "running");
            log.recorder().normal(sandbox("a"), "Started", "running");
        }
        let log = EventLog::open(&path, EventLimits::default());
        log.recorder().normal(sandbox("a"), "Started", "running");
        let events = log.list(None);
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].count, 3);
        assert_eq!(events[0].metadata.resource_version, "3");
    }

    #[test]
    fn the_writer_writes_without_being_asked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.json");
        let log = EventLog::open(&path, EventLimits::default());
        log.recorder().normal(sandbox("a"), "Started", "running");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !path.exists() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(20));
        }
        let file: EventFile = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(file.items.len(), 1);
        drop(log);
    }
}
