//! Watching the sources: notify (inotify on Linux) reports changes, a short quiet period collapses a
//! burst of them into one rescan of the whole folder, and a periodic rescan covers notifications
//! that were lost or never possible (a folder that did not exist yet). Rescans run on the blocking
//! pool; this task only schedules them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::event::{AccessKind, AccessMode, EventKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::{interval, sleep_until, Instant, MissedTickBehavior};

use super::Store;

/// Quiet time after the last notification before a folder is rescanned. Short: it is on the path
/// of every manifest edit, and an edit caught half-written is harmless (the document keeps its
/// last good version, and the write's own later notification brings a rescan).
const DEBOUNCE: Duration = Duration::from_millis(25);
/// A folder that never stops changing is still rescanned this often.
const MAX_DELAY: Duration = Duration::from_secs(1);
/// Rescan everything this often, whatever notify says.
const PERIODIC: Duration = Duration::from_secs(30);

pub(super) fn spawn(store: Arc<Store>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(run(store))
}

async fn run(store: Arc<Store>) {
    let roots: Vec<PathBuf> = store
        .lock()
        .sources
        .iter()
        .map(|s| s.root.clone())
        .collect();
    let (tx, mut rx) = mpsc::unbounded_channel::<usize>();
    let mut watchers: Vec<Option<RecommendedWatcher>> = roots
        .iter()
        .enumerate()
        .map(|(i, root)| watch(i, root, tx.clone()))
        .collect();
    let mut periodic = interval(PERIODIC);
    periodic.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first tick is immediate: it catches whatever changed between open and now.
    loop {
        let dirty: BTreeSet<usize> = tokio::select! {
            Some(first) = rx.recv() => collect_burst(first, &mut rx).await,
            _ = periodic.tick() => (0..roots.len()).collect(),
        };
        for index in dirty {
            let worker = Arc::clone(&store);
            let ok = tokio::task::spawn_blocking(move || worker.rescan(index))
                .await
                .unwrap_or(false);
            if !ok {
                // The watch on a folder that vanished is gone for good; set it up again once
                // the folder is back.
                watchers[index] = None;
            } else if watchers[index].is_none() {
                watchers[index] = watch(index, &roots[index], tx.clone());
                if watchers[index].is_some() {
                    // Changes made before the watch existed were not reported.
                    let _ = tx.send(index);
                }
            }
        }
    }
}

/// Waits until notifications stop for [`DEBOUNCE`] (at most [`MAX_DELAY`]) and returns the
/// sources they named.
async fn collect_burst(first: usize, rx: &mut mpsc::UnboundedReceiver<usize>) -> BTreeSet<usize> {
    let mut dirty = BTreeSet::from([first]);
    let give_up = Instant::now() + MAX_DELAY;
    loop {
        let quiet = (Instant::now() + DEBOUNCE).min(give_up);
        tokio::select! {
            next = rx.recv() => match next {
                Some(index) => { dirty.insert(index); }
                None => break,
            },
            _ = sleep_until(quiet) => break,
        }
    }
    dirty
}

fn watch(
    index: usize,
    root: &Path,
    tx: mpsc::UnboundedSender<usize>,
) -> Option<RecommendedWatcher> {
    let base = root.to_path_buf();
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(event) if !matters(&base, &event) => {}
        // An error may mean lost events: rescanning is always safe.
        _ => {
            let _ = tx.send(index);
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(folder = %root.display(), "cannot watch: {e}; rescanning periodically");
            return None;
        }
    };
    match watcher.watch(root, RecursiveMode::Recursive) {
        Ok(()) => Some(watcher),
        Err(e) => {
            tracing::debug!(folder = %root.display(), "cannot watch yet: {e}");
            None
        }
    }
}

/// Whether an event can change what the folder declares. Our own scans open files (and
/// inotify reports that), and atomic writes go through hidden temp files: neither matters.
fn matters(root: &Path, event: &notify::Event) -> bool {
    if let EventKind::Access(kind) = event.kind {
        if kind != AccessKind::Close(AccessMode::Write) {
            return false;
        }
    }
    if event.paths.is_empty() {
        return true;
    }
    event.paths.iter().any(|path| {
        let relative = path.strip_prefix(root).unwrap_or(path);
        !relative
            .components()
            .any(|c| c.as_os_str().to_string_lossy().starts_with('.'))
    })
}
