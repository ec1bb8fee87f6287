//! Snapshot trees and copy-on-write view directories: `<data>/trees/<key>/` holds a snapshot's
//! content unpacked once (whole, or as a delta over other trees with `<key>.layers` naming them,
//! see `layers.rs`), and `<data>/views/<volume>/{upper,work}` holds what one workspace built on
//! such a tree has written (the upper and work directories of an overlay mount whose lower
//! directories are the tree and those below it).
//!
//! A tree is made by [`crate::archive::unpack`] under the restore rules (so content the rules
//! refuse never lands here), into a temp directory that is synced and renamed into place: a tree
//! under its final name is complete, and it is never written again (overlay never writes its
//! lower directory; nothing else here opens it for writing). Temp directories left by a crash,
//! trees that no snapshot, no volume, no view (each view's directory names its tree) and no
//! kept delta refers to any more, and view directories
//! whose volume is gone are removed by [`Store::collect_views_and_trees`], which the
//! controller's garbage collection calls with what Docker holds; what was made or used after
//! Docker was listed is left for the next pass. Which tree a view uses, and when, is the
//! controller's business.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::BufReader;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use super::layers::{self, DeltaError, ViewChanges, LAYERS_SUFFIX, MAX_LAYERS};
use super::{write_atomic, Store, StoreError, StoreResult};
use crate::archive::{self, ArchiveError, Policy};

/// Prefix of a tree being unpacked, in the trees directory.
const TEMP_PREFIX: &str = ".tmp-";
/// The file in a view's directory that names the tree it stacks.
const VIEW_TREE_FILE: &str = "tree";

/// The directories of one copy-on-write view, as an overlay mount takes them.
#[derive(Clone, Debug)]
pub struct ViewDirs {
    pub lower: PathBuf,
    pub upper: PathBuf,
    pub work: PathBuf,
}

/// Why a snapshot's tree could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// The content breaks the restore rules (or changed since it was validated).
    #[error(transparent)]
    Refused(ArchiveError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// When this process last made or used each tree and view, so collection spares what it has
/// not seen Docker refer to yet.
#[derive(Default)]
pub(super) struct Touched {
    trees: Mutex<HashMap<String, Instant>>,
    views: Mutex<HashMap<String, Instant>>,
    /// Views whose directories are made and whose volume may not be yet (see
    /// [`Store::view_volume_made`]): a listing of Docker taken between the two shows no volume
    /// for them, and they are spared whatever it says.
    pending_views: Mutex<HashSet<String>>,
    /// Trees are unpacked one at a time: ten forks of one snapshot unpack it once.
    unpacking: tokio::sync::Mutex<()>,
    /// What the trees of new snapshots of views are to be deltas over (see
    /// [`Store::expect_delta`]), until one unpack of each takes it.
    deltas: Mutex<HashMap<String, ViewChanges>>,
}

fn touch(map: &Mutex<HashMap<String, Instant>>, key: &str) {
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.to_string(), Instant::now());
}

fn touched_since(map: &Mutex<HashMap<String, Instant>>, key: &str, since: Instant) -> bool {
    map.lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(key)
        .is_some_and(|at| *at >= since)
}

/// Whether `name` can be one directory name here (keys and volume names are plain).
fn plain(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> TreeError + '_ {
    move |source| TreeError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl Store {
    fn trees_dir(&self) -> PathBuf {
        self.data_dir().join("trees")
    }

    fn views_dir(&self) -> PathBuf {
        self.data_dir().join("views")
    }

    /// The directories of the view volume `volume` is (or will be), over tree `key`.
    pub fn view_dirs(&self, volume: &str, key: &str) -> ViewDirs {
        let root = self.views_dir().join(volume);
        ViewDirs {
            lower: self.trees_dir().join(key),
            upper: root.join("upper"),
            work: root.join("work"),
        }
    }

    /// The tree view `volume` was made over, as [`Store::create_view`] recorded it.
    pub async fn view_tree(&self, volume: &str) -> Option<String> {
        if !plain(volume) {
            return None;
        }
        let record = self.views_dir().join(volume).join(VIEW_TREE_FILE);
        let text = self
            .offload(move || std::fs::read_to_string(record).ok())
            .await
            .ok()??;
        plain(text.trim()).then(|| text.trim().to_string())
    }

    /// The paths of the layers a view of tree `key` stacks, top first; `None` when the tree or
    /// a layer it needs is gone.
    pub async fn tree_layers(&self, key: &str) -> Option<Vec<PathBuf>> {
        if !plain(key) {
            return None;
        }
        let dir = self.trees_dir();
        let key = key.to_string();
        self.offload(move || {
            let keys = chain(&dir, &key)?;
            Some(keys.iter().map(|k| dir.join(k)).collect())
        })
        .await
        .ok()?
    }

    /// The tree named `key`, made from the snapshot tar at `tar` under `policy` unless it is
    /// there already, and the trees a view of it stacks: itself first, then those it is a delta
    /// over (see `layers.rs`). `key` must name this content and owner for good (the controller
    /// derives it from the snapshot's uid and the owner the policy forces). With `over` (what a
    /// copy-on-write workspace had changed when the snapshot was taken), the tree is made as a
    /// delta over that workspace's trees if the chain stays within [`MAX_LAYERS`]; otherwise, or
    /// should the delta fail, as a full tree. A tree whose layers are gone is made again, full.
    /// Without `over`, what [`Store::expect_delta`] left for `key` is used.
    pub async fn ensure_tree(
        &self,
        key: &str,
        tar: &Path,
        policy: Policy,
        over: Option<ViewChanges>,
    ) -> Result<Vec<PathBuf>, TreeError> {
        if !plain(key) {
            return Err(StoreError::Invalid(format!("tree key {key:?}")).into());
        }
        let touch_all = |over: &Option<ViewChanges>| {
            touch(&self.cow_touched.trees, key);
            for below in over.iter().flat_map(|o| &o.layers) {
                touch(&self.cow_touched.trees, below);
            }
        };
        touch_all(&over);
        let _one_at_a_time = self.cow_touched.unpacking.lock().await;
        // Taken only now: the unpack whose turn comes first is the one that makes the tree, so
        // it is the one that needs the expectation.
        let expected = self.expected_delta(key);
        let over = over.or(expected);
        // Again once it is this unpack's turn: a collection listed meanwhile spares them.
        touch_all(&over);
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let temp = self.trees_dir().join(format!(
            "{TEMP_PREFIX}{key}-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let tar = tar.to_path_buf();
        let dir = self.trees_dir();
        let key_made = key.to_string();
        let keys = self
            .offload(move || make_tree(&dir, &key_made, &tar, &temp, &policy, over))
            .await??;
        for key in &keys {
            touch(&self.cow_touched.trees, key);
        }
        let dir = self.trees_dir();
        Ok(keys.iter().map(|k| dir.join(k)).collect())
    }

    /// Says that tree `key`, not made yet, is to be a delta with `changes`, whichever unpack of
    /// it comes first: the snapshot's own preparation or a restore that got there before it.
    /// Said before the snapshot is Ready, so that no restore of it can miss it.
    pub fn expect_delta(&self, key: &str, changes: ViewChanges) {
        self.cow_touched
            .deltas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_string(), changes);
    }

    fn expected_delta(&self, key: &str) -> Option<ViewChanges> {
        self.cow_touched
            .deltas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key)
    }

    /// What the copy-on-write workspace whose overlay stacks `lowers` (top first) under `upper`
    /// has written (see [`ViewChanges`]); to be read while its sandbox is frozen, so a snapshot
    /// taken then can be a delta. `None` when these are not this store's trees and view
    /// directory, or the view holds too much to remember.
    pub async fn view_changes(&self, lowers: &[PathBuf], upper: &Path) -> Option<ViewChanges> {
        let trees = self.trees_dir();
        let keys: Vec<String> = lowers
            .iter()
            .map(|path| {
                let key = path.file_name()?.to_str()?;
                (path.parent() == Some(trees.as_path()) && plain(key)).then(|| key.to_string())
            })
            .collect::<Option<_>>()?;
        let view = upper.parent()?;
        let ours = upper.file_name()? == "upper"
            && view.parent() == Some(self.views_dir().as_path())
            && view.file_name()?.to_str().is_some_and(plain);
        if !ours || keys.is_empty() {
            return None;
        }
        let upper = upper.to_path_buf();
        self.offload(move || layers::read_changes(&upper, keys))
            .await
            .ok()
            .flatten()
    }

    /// Makes the upper and work directories of the view that volume `volume` will be, over tree
    /// `key`: empty, the upper one's root owned by `owner` (mode 0755, like every workspace
    /// root). Whatever an interrupted attempt left under that name is removed first. The view
    /// is pending until [`Store::view_volume_made`].
    pub async fn create_view(
        &self,
        volume: &str,
        key: &str,
        owner: (u32, u32),
    ) -> StoreResult<ViewDirs> {
        if !plain(volume) || !plain(key) {
            return Err(StoreError::Invalid(format!("view {volume:?} of {key:?}")));
        }
        touch(&self.cow_touched.views, volume);
        touch(&self.cow_touched.trees, key);
        self.pending_views(|pending| pending.insert(volume.to_string()));
        let made = self.make_view_dirs(volume, key, owner).await;
        if made.is_err() {
            // No volume follows: what was made of the directories is a leftover.
            self.pending_views(|pending| pending.remove(volume));
        }
        made
    }

    async fn make_view_dirs(
        &self,
        volume: &str,
        key: &str,
        owner: (u32, u32),
    ) -> StoreResult<ViewDirs> {
        let root = self.views_dir().join(volume);
        let dirs = self.view_dirs(volume, key);
        let made = dirs.clone();
        let record = (root.join(VIEW_TREE_FILE), key.to_string());
        self.offload(move || {
            let io = |path: &Path| {
                let path = path.to_path_buf();
                move |source| StoreError::Io { path, source }
            };
            match std::fs::remove_dir_all(&root) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io(&root)(e)),
                _ => {}
            }
            let mut builder = std::fs::DirBuilder::new();
            builder.recursive(true).mode(0o700);
            builder.create(&made.work).map_err(io(&made.work))?;
            builder.create(&made.upper).map_err(io(&made.upper))?;
            let upper = File::open(&made.upper).map_err(io(&made.upper))?;
            let fd = upper.as_raw_fd();
            // SAFETY: plain system calls on a descriptor owned here.
            if unsafe { libc::fchown(fd, owner.0, owner.1) } != 0
                || unsafe { libc::fchmod(fd, 0o755) } != 0
            {
                return Err(io(&made.upper)(std::io::Error::last_os_error()));
            }
            // Which tree the view stacks: garbage collection keeps it while the view is there,
            // and a view whose mount is gone (after a reboot) can be mounted again.
            std::fs::write(&record.0, &record.1).map_err(io(&record.0))?;
            Ok(made)
        })
        .await?
    }

    /// Says that view `volume`'s volume exists now: from here on collection spares the view
    /// while a listing of Docker shows the volume (or was taken after this call).
    pub fn view_volume_made(&self, volume: &str) {
        touch(&self.cow_touched.views, volume);
        self.pending_views(|pending| pending.remove(volume));
    }

    fn pending_views<T>(&self, change: impl FnOnce(&mut HashSet<String>) -> T) -> T {
        change(
            &mut self
                .cow_touched
                .pending_views
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        )
    }

    /// Removes the directories of view `volume` (whose volume is gone); missing ones are no error.
    pub async fn remove_view(&self, volume: &str) {
        self.pending_views(|pending| pending.remove(volume));
        if !plain(volume) {
            return;
        }
        let root = self.views_dir().join(volume);
        let _ = self
            .offload(move || match std::fs::remove_dir_all(&root) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    tracing::warn!(path = %root.display(), error = %e, "cannot remove a view");
                }
                _ => {}
            })
            .await;
    }

    /// Removes view directories whose volume is not in `volumes`, trees `keep_tree` does not
    /// keep, and temp
    /// trees no unpack of this process is writing; `listed` is when Docker was listed (what this
    /// process made or used since is kept). Returns how many were removed. Waits for a complete
    /// load of desired state, like every collection.
    pub async fn collect_views_and_trees(
        self: &std::sync::Arc<Self>,
        listed: Instant,
        volumes: HashSet<String>,
        keep_tree: impl Fn(&str) -> bool + Send + 'static,
    ) -> usize {
        let store = std::sync::Arc::clone(self);
        self.offload(move || {
            if !store.is_fully_loaded() {
                return 0;
            }
            let mut removed = 0;
            let touched = &store.cow_touched;
            let mut viewed_trees = HashSet::new();
            for (name, path) in listing(&store.views_dir()) {
                if volumes.contains(&name)
                    || store.pending_views(|pending| pending.contains(&name))
                    || touched_since(&touched.views, &name, listed)
                {
                    if let Ok(key) = std::fs::read_to_string(path.join(VIEW_TREE_FILE)) {
                        viewed_trees.insert(key.trim().to_string());
                    }
                    continue;
                }
                tracing::info!(
                    view = name,
                    "removing the directories of a view whose volume is gone"
                );
                if remove_tree(&path) {
                    removed += 1;
                }
            }
            // An unpack holds the lock: a temp tree seen without it is a crash's leftover.
            let unpacking = touched.unpacking.try_lock().is_err();
            let trees_dir = store.trees_dir();
            let trees = listing(&trees_dir);
            // Kept: what the caller keeps, what was used since the listing, and every layer
            // a kept delta stands on.
            let mut kept: HashSet<String> = trees
                .iter()
                .map(|(name, _)| name)
                .filter(|name| !name.starts_with(TEMP_PREFIX))
                .filter(|name| {
                    keep_tree(name)
                        || viewed_trees.contains(*name)
                        || touched_since(&touched.trees, name, listed)
                })
                .cloned()
                .collect();
            let below: Vec<String> = kept
                .iter()
                .filter_map(|key| std::fs::read_to_string(layers_file(&trees_dir, key)).ok())
                .flat_map(|text| text.lines().map(str::to_string).collect::<Vec<_>>())
                .collect();
            kept.extend(below);
            for (name, path) in trees {
                let orphan = if name.starts_with(TEMP_PREFIX) {
                    !unpacking
                } else {
                    !kept.contains(&name)
                };
                if orphan {
                    tracing::info!(tree = name, "removing a snapshot tree nothing uses");
                    if remove_tree(&path) {
                        removed += 1;
                    }
                }
            }
            // Layers files go with their tree (one without a tree is a crash's leftover).
            for (key, path) in layers_files(&trees_dir) {
                if !unpacking && !trees_dir.join(&key).is_dir() {
                    let _ = std::fs::remove_file(path);
                }
            }
            removed
        })
        .await
        .unwrap_or(0)
    }
}

/// The keys of the trees a view of tree `key` in `dir` stacks, top first: `key` alone for a full
/// tree, with those its layers file names for a delta. `None` when it is not there, or a layer
/// it needs is missing.
fn chain(dir: &Path, key: &str) -> Option<Vec<String>> {
    if !dir.join(key).is_dir() {
        return None;
    }
    let mut keys = vec![key.to_string()];
    match std::fs::read_to_string(layers_file(dir, key)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Some(keys),
        Err(_) => return None,
        Ok(text) => keys.extend(layers::parse_layers(&text, plain)?),
    }
    keys.iter().all(|k| dir.join(k).is_dir()).then_some(keys)
}

fn layers_file(dir: &Path, key: &str) -> PathBuf {
    dir.join(format!("{key}{LAYERS_SUFFIX}"))
}

/// Makes tree `key` in `dir` unless it is whole there (see [`Store::ensure_tree`]); returns the
/// keys of its chain.
fn make_tree(
    dir: &Path,
    key: &str,
    tar: &Path,
    temp: &Path,
    policy: &Policy,
    over: Option<ViewChanges>,
) -> Result<Vec<String>, TreeError> {
    let target = dir.join(key);
    if target.is_dir() {
        if let Some(keys) = chain(dir, key) {
            return Ok(keys);
        }
        tracing::warn!(
            tree = key,
            "a tree's layers are gone; making it again, whole"
        );
        std::fs::remove_dir_all(&target).map_err(io_at(&target))?;
    }
    std::fs::create_dir_all(dir).map_err(io_at(dir))?;
    if let Some(changes) = over {
        // The view's layers must still be the chain they were (GC keeps them while the view's
        // volume names their top), and one more must fit.
        let below = chain(dir, changes.layers.first().map_or("", String::as_str));
        if below.as_ref() == Some(&changes.layers) && changes.layers.len() < MAX_LAYERS {
            let paths: Vec<PathBuf> = changes.layers.iter().map(|k| dir.join(k)).collect();
            match layers::unpack_delta(tar, temp, policy, &paths, &changes).map_err(|e| match e {
                DeltaError::Archive(ArchiveError::Write(message)) => {
                    DeltaError::Io(std::io::Error::other(message))
                }
                other => other,
            }) {
                Ok(()) => {
                    seal(temp, &target, Some(&changes.layers))?;
                    let mut keys = vec![key.to_string()];
                    keys.extend(changes.layers);
                    return Ok(keys);
                }
                Err(DeltaError::Archive(refused)) => {
                    let _ = std::fs::remove_dir_all(temp);
                    return Err(TreeError::Refused(refused));
                }
                Err(DeltaError::Io(error)) => {
                    let _ = std::fs::remove_dir_all(temp);
                    tracing::warn!(tree = key, %error, "a delta tree failed; making it whole");
                }
            }
        }
    }
    let result = unpack_tree(tar, temp, policy).and_then(|()| seal(temp, &target, None));
    if result.is_err() {
        let _ = std::fs::remove_dir_all(temp);
    }
    result.map(|()| vec![key.to_string()])
}

/// Unpacks `tar` into the new directory `temp`.
fn unpack_tree(tar: &Path, temp: &Path, policy: &Policy) -> Result<(), TreeError> {
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(temp)
        .map_err(io_at(temp))?;
    let root = archive::open_root(temp).map_err(io_at(temp))?;
    let file = File::open(tar).map_err(io_at(tar))?;
    archive::unpack(BufReader::with_capacity(64 * 1024, file), root, policy).map_err(
        |e| match e {
            ArchiveError::Write(message) => TreeError::Io {
                path: temp.to_path_buf(),
                source: std::io::Error::other(message),
            },
            refused => TreeError::Refused(refused),
        },
    )?;
    Ok(())
}

/// Syncs the unpacked tree `temp`, records the layers it is a delta over (`below`; none for a
/// full tree, whose stale layers file a crash may have left is removed) and renames it to
/// `target`: the layers file is in place before the tree is.
fn seal(temp: &Path, target: &Path, below: Option<&[String]>) -> Result<(), TreeError> {
    // The root's own mode is the view's upper root's; the tree's root is only ever read.
    std::fs::set_permissions(temp, std::fs::Permissions::from_mode(0o755)).map_err(io_at(temp))?;
    let sync = File::open(temp).map_err(io_at(temp))?;
    // SAFETY: a plain system call on a descriptor owned here.
    if unsafe { libc::syncfs(sync.as_raw_fd()) } != 0 {
        return Err(io_at(temp)(std::io::Error::last_os_error()));
    }
    let dir = target.parent().unwrap_or(Path::new("/"));
    let key = target
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let layers = layers_file(dir, key);
    match below {
        Some(below) => {
            write_atomic(&layers, layers::layers_text(below).as_bytes()).map_err(io_at(&layers))?
        }
        None => match std::fs::remove_file(&layers) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_at(&layers)(e)),
            _ => {}
        },
    }
    match std::fs::rename(temp, target) {
        Ok(()) => {}
        // Made meanwhile by another process sharing the data directory: theirs is as good.
        Err(_) if target.is_dir() => {
            let _ = std::fs::remove_dir_all(temp);
        }
        Err(e) => return Err(io_at(target)(e)),
    }
    let _ = File::open(dir).and_then(|d| d.sync_all());
    Ok(())
}

fn listing(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| Some((e.file_name().to_str()?.to_string(), e.path())))
        .collect()
}

/// The layers files in `dir`, by the key of their tree.
fn layers_files(dir: &Path) -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            Some((name.strip_suffix(LAYERS_SUFFIX)?.to_string(), e.path()))
        })
        .collect()
}

fn remove_tree(path: &Path) -> bool {
    match std::fs::remove_dir_all(path) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "cannot remove");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::Limits;

    fn tar_of(entries: &[(&str, u32, &[u8])]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, mode, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(*mode);
            header.set_size(data.len() as u64);
            builder.append_data(&mut header, name, *data).unwrap();
        }
        builder.into_inner().unwrap()
    }

    fn policy() -> Policy {
        let owner = (unsafe { libc::geteuid() }, unsafe { libc::getegid() });
        Policy::restore(owner, Limits::with_max_bytes(1 << 20))
    }

    #[tokio::test]
    async fn a_tree_is_made_once_and_hostile_content_never_becomes_one() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("data"), &[]).unwrap();
        let good = dir.path().join("good.tar");
        std::fs::write(&good, tar_of(&[("a", 0o640, b"one")])).unwrap();
        let tree = store
            .ensure_tree("k1.0.0", &good, policy(), None)
            .await
            .unwrap()
            .remove(0);
        assert_eq!(std::fs::read(tree.join("a")).unwrap(), b"one");
        // Made once: another tar under the same key changes nothing.
        std::fs::write(&good, tar_of(&[("b", 0o640, b"two")])).unwrap();
        store
            .ensure_tree("k1.0.0", &good, policy(), None)
            .await
            .unwrap();
        assert!(!tree.join("b").exists());

        let evil = dir.path().join("evil.tar");
        std::fs::write(
            &evil,
            tar_of(&[("ok", 0o644, b"ok"), ("suid", 0o4755, b"x")]),
        )
        .unwrap();
        let refused = store.ensure_tree("k2.0.0", &evil, policy(), None).await;
        assert!(matches!(refused, Err(TreeError::Refused(_))), "{refused:?}");
        let trees = dir.path().join("data/trees");
        let mut left: Vec<_> = std::fs::read_dir(&trees)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().to_string())
            .collect();
        left.sort();
        assert_eq!(left, ["k1.0.0"], "nothing of the refused tar is left");
        assert!(store
            .ensure_tree("../x", &good, policy(), None)
            .await
            .is_err());
    }
}
