//! Delta trees against real directories and a real overlay mount (as root, as views are).

use std::collections::HashSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::{ViewChanges, MAX_LAYERS};
use crate::archive::{Limits, Policy};
use crate::store::Store;

enum Entry<'a> {
    Dir(&'a str),
    File(&'a str, &'a [u8]),
    Link(&'a str, &'a str),
    Hard(&'a str, &'a str),
}

/// A tar of `entries`, every one with mtime `mtime` and mode 0644 (0755 for directories).
fn tar_of(entries: &[Entry], mtime: u64) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for entry in entries {
        let mut header = tar::Header::new_gnu();
        header.set_mtime(mtime);
        let (name, data): (&str, &[u8]) = match entry {
            Entry::Dir(name) => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                (name, b"")
            }
            Entry::File(name, data) => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(0o644);
                (name, data)
            }
            Entry::Link(name, target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_link_name(target).unwrap();
                (name, b"")
            }
            Entry::Hard(name, target) => {
                header.set_entry_type(tar::EntryType::Link);
                header.set_mode(0o644);
                header.set_link_name(target).unwrap();
                (name, b"")
            }
        };
        header.set_size(data.len() as u64);
        builder.append_data(&mut header, name, data).unwrap();
    }
    builder.into_inner().unwrap()
}

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn policy() -> Policy {
    Policy::restore((1000, 1000), Limits::with_max_bytes(1 << 20))
}

/// Each name below `dir` with its type, mode, owner, size, mtime, content or target and links.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let name = rel.join(entry.file_name());
            let meta = std::fs::symlink_metadata(dir.join(&name)).unwrap();
            let what = if meta.is_dir() {
                stack.push(name.clone());
                "dir".to_string()
            } else if meta.file_type().is_symlink() {
                format!(
                    "-> {}",
                    std::fs::read_link(dir.join(&name)).unwrap().display()
                )
            } else {
                let data = std::fs::read(dir.join(&name)).unwrap();
                format!(
                    "{:?} links={}",
                    String::from_utf8_lossy(&data),
                    meta.nlink()
                )
            };
            out.push(format!(
                "{} {:o} {}:{} {} {}",
                name.display(),
                meta.permissions().mode() & 0o7777,
                meta.uid(),
                meta.gid(),
                meta.mtime(),
                what
            ));
        }
    }
    out.sort();
    out
}

/// The names below `dir`, whiteouts marked.
fn names(dir: &Path) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        for entry in std::fs::read_dir(dir.join(&rel)).unwrap() {
            let entry = entry.unwrap();
            let name = rel.join(entry.file_name());
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                stack.push(name.clone());
            }
            let mark = if kind.is_char_device() {
                " (whiteout)"
            } else {
                ""
            };
            out.insert(format!("{}{mark}", name.display()));
        }
    }
    out
}

/// Mounts a read-only overlay of `lowers` (top first) at `at` for as long as it lives.
struct Overlay(PathBuf);

impl Overlay {
    fn mount(lowers: &[PathBuf], at: &Path) -> Overlay {
        std::fs::create_dir_all(at).unwrap();
        let joined: Vec<String> = lowers.iter().map(|p| p.display().to_string()).collect();
        let options = std::ffi::CString::new(format!("lowerdir={}", joined.join(":"))).unwrap();
        let target = std::ffi::CString::new(at.as_os_str().as_encoded_bytes()).unwrap();
        let kind = std::ffi::CString::new("overlay").unwrap();
        // SAFETY: plain system call with valid strings.
        let mounted = unsafe {
            libc::mount(
                kind.as_ptr(),
                target.as_ptr(),
                kind.as_ptr(),
                libc::MS_RDONLY,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(mounted, 0, "{}", std::io::Error::last_os_error());
        Overlay(at.to_path_buf())
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.0.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: plain system call with a valid string.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

fn whiteout(path: &Path) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain system call with a valid string.
    assert_eq!(unsafe { libc::mknod(name.as_ptr(), libc::S_IFCHR, 0) }, 0);
}

const BASE: &[Entry] = &[
    Entry::Dir("dir"),
    Entry::Dir("dir/sub"),
    Entry::File("dir/sub/kept", b"kept"),
    Entry::Dir("dir/gone"),
    Entry::File("dir/gone/x", b"x"),
    Entry::File("same", b"same"),
    Entry::File("rewritten", b"aaaa"),
    Entry::File("removed", b"removed"),
    Entry::Link("link", "same"),
    Entry::File("hard", b"hard"),
    Entry::Hard("hard2", "hard"),
    Entry::Dir("empty"),
];

/// [`BASE`] as a workspace changed it: `rewritten` has new bytes of the same size (and, since
/// tar keeps whole seconds, the same mtime), `removed` and `dir/gone` are gone, `new` is new.
const CHANGED: &[Entry] = &[
    Entry::Dir("dir"),
    Entry::Dir("dir/sub"),
    Entry::File("dir/sub/kept", b"kept"),
    Entry::File("same", b"same"),
    Entry::File("rewritten", b"bbbb"),
    Entry::Link("link", "same"),
    Entry::File("hard", b"hard"),
    Entry::Hard("hard2", "hard"),
    Entry::Dir("empty"),
    Entry::File("new", b"new"),
];

/// A store on a new data directory, the tars of [`BASE`] and [`CHANGED`], and the whole tree
/// of the first (`None` when not root: deltas are made as root, as views are).
async fn setup() -> Option<(
    tempfile::TempDir,
    PathBuf,
    Arc<Store>,
    PathBuf,
    Vec<PathBuf>,
)> {
    if !root() {
        eprintln!("skipped: deltas are made as root, as views are");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let store = Store::open(&data, &[]).unwrap();
    let (base_tar, changed_tar) = (dir.path().join("base.tar"), dir.path().join("changed.tar"));
    std::fs::write(&base_tar, tar_of(BASE, 1_600_000_000)).unwrap();
    std::fs::write(&changed_tar, tar_of(CHANGED, 1_600_000_000)).unwrap();
    let base = store
        .ensure_tree("base.1000.1000", &base_tar, policy(), None)
        .await
        .unwrap();
    Some((dir, data, store, changed_tar, base))
}

/// What a view of `base` wrote when its workspace went from [`BASE`] to [`CHANGED`]: its upper
/// directory as overlay leaves it after those changes.
async fn changed_view(data: &Path, store: &Store, base: &[PathBuf]) -> ViewChanges {
    let upper = data.join("views/v1/upper");
    std::fs::create_dir_all(upper.join("dir")).unwrap();
    std::fs::write(upper.join("rewritten"), b"bbbb").unwrap();
    std::fs::write(upper.join("new"), b"new").unwrap();
    whiteout(&upper.join("removed"));
    whiteout(&upper.join("dir/gone"));
    store.view_changes(base, &upper).await.unwrap()
}

#[tokio::test]
async fn a_delta_holds_only_the_changes_and_stacks_to_the_whole_tar() {
    let Some((dir, data, store, changed_tar, base)) = setup().await else {
        return;
    };
    assert_eq!(base.len(), 1, "a tree of a plain workspace is whole");

    let changes = changed_view(&data, &store, &base).await;

    let layers = store
        .ensure_tree("delta.1000.1000", &changed_tar, policy(), Some(changes))
        .await
        .unwrap();
    assert_eq!(
        layers,
        [data.join("trees/delta.1000.1000"), base[0].clone()]
    );
    let held = names(&layers[0]);
    let expected: HashSet<String> = [
        "dir",
        "dir/sub",
        "dir/gone (whiteout)",
        "empty",
        "rewritten",
        "removed (whiteout)",
        "new",
        "hard",
        "hard2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(held, expected, "only what changed, and what shares a link");

    // Stacked, the delta and its base show exactly what the tar holds.
    let whole = store
        .ensure_tree("whole.1000.1000", &changed_tar, policy(), None)
        .await
        .unwrap();
    let merged = Overlay::mount(&layers, &dir.path().join("mnt"));
    assert_eq!(listing(&merged.0), listing(&whole[0]));
    drop(merged);

    // A view of the delta, changed again: its snapshot stacks one more layer, until the chain
    // would pass the bound and is flattened into a whole tree.
    let mut below = layers;
    for round in 0.. {
        let upper = data.join(format!("views/r{round}/upper"));
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::write(upper.join("new"), b"new").unwrap();
        let changes = store.view_changes(&below, &upper).await.unwrap();
        let key = format!("r{round}.1000.1000");
        let made = store
            .ensure_tree(&key, &changed_tar, policy(), Some(changes))
            .await
            .unwrap();
        let layers_file = data.join(format!("trees/{key}.layers"));
        if below.len() == MAX_LAYERS {
            assert_eq!(made.len(), 1, "flattened");
            assert!(!layers_file.exists());
            assert_eq!(listing(&made[0]), listing(&whole[0]));
            break;
        }
        assert_eq!(made.len(), below.len() + 1);
        assert!(layers_file.exists());
        let merged = Overlay::mount(&made, &dir.path().join("mnt"));
        assert_eq!(listing(&merged.0), listing(&whole[0]), "round {round}");
        drop(merged);
        below = made;
    }

    // Collection keeps every layer a kept tree stands on, and nothing else.
    let listed = Instant::now();
    store
        .collect_views_and_trees(listed, HashSet::new(), |key| key == "r0.1000.1000")
        .await;
    let mut left: Vec<String> = std::fs::read_dir(data.join("trees"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "base.1000.1000",
            "delta.1000.1000",
            "delta.1000.1000.layers",
            "r0.1000.1000",
            "r0.1000.1000.layers"
        ]
    );
}

#[tokio::test]
async fn a_view_keeps_the_tree_it_names_until_its_volume_is_gone() {
    let Some((_dir, data, store, _, base)) = setup().await else {
        return;
    };
    let dirs = store
        .create_view("vol", "base.1000.1000", (1000, 1000))
        .await
        .unwrap();
    assert_eq!(dirs.lower, base[0]);
    assert_eq!(
        store.view_tree("vol").await.as_deref(),
        Some("base.1000.1000")
    );
    assert_eq!(
        store.tree_layers("base.1000.1000").await,
        Some(base.clone())
    );
    assert_eq!(store.view_tree("other").await, None);
    store.view_volume_made("vol");
    // Listed after the view was made: only the view's own record keeps the tree (no snapshot,
    // no label does).
    let listed = Instant::now();
    let volumes = HashSet::from(["vol".to_string()]);
    store
        .collect_views_and_trees(listed, volumes, |_| false)
        .await;
    assert!(base[0].is_dir(), "the view's tree stays");
    assert!(data.join("views/vol/upper").is_dir());
    // The volume gone, its view and then the tree nothing names any more go in one pass.
    store
        .collect_views_and_trees(Instant::now(), HashSet::new(), |_| false)
        .await;
    assert!(!data.join("views/vol").exists());
    assert!(!base[0].exists(), "nothing needs the tree");
    assert_eq!(store.tree_layers("base.1000.1000").await, None);
}

#[tokio::test]
async fn a_view_in_the_making_is_spared_by_a_listing_that_shows_no_volume_yet() {
    let Some((_dir, data, store, _, base)) = setup().await else {
        return;
    };
    store
        .create_view("vol", "base.1000.1000", (1000, 1000))
        .await
        .unwrap();
    // Docker listed after the directories were made and before the volume was: no volume.
    store
        .collect_views_and_trees(Instant::now(), HashSet::new(), |_| false)
        .await;
    assert!(
        data.join("views/vol/upper").is_dir(),
        "a view in the making went"
    );
    assert!(base[0].is_dir(), "its tree went");
    // The volume made after a listing that did not show it: still spared by that listing.
    let listed = Instant::now();
    store.view_volume_made("vol");
    store
        .collect_views_and_trees(listed, HashSet::new(), |_| false)
        .await;
    assert!(data.join("views/vol/upper").is_dir());
    // A later listing without the volume: it is gone, and the view with it.
    store
        .collect_views_and_trees(Instant::now(), HashSet::new(), |_| false)
        .await;
    assert!(!data.join("views/vol").exists());
}

#[tokio::test]
async fn a_delta_whose_layers_are_gone_is_made_again_whole() {
    let Some((dir, data, store, changed_tar, base)) = setup().await else {
        return;
    };
    let upper = data.join("views/v1/upper");
    std::fs::create_dir_all(&upper).unwrap();
    std::fs::write(upper.join("new"), b"new").unwrap();
    let changes = store.view_changes(&base, &upper).await.unwrap();
    // Not this store's directories: no changes to build on.
    assert!(store.view_changes(&base, dir.path()).await.is_none());
    assert!(store
        .view_changes(&[dir.path().to_path_buf()], &upper)
        .await
        .is_none());
    let made = store
        .ensure_tree("delta.1000.1000", &changed_tar, policy(), Some(changes))
        .await
        .unwrap();
    assert_eq!(made.len(), 2);
    std::fs::remove_dir_all(&base[0]).unwrap();
    let again = store
        .ensure_tree("delta.1000.1000", &changed_tar, policy(), None)
        .await
        .unwrap();
    assert_eq!(again, [data.join("trees/delta.1000.1000")]);
    assert!(!data.join("trees/delta.1000.1000.layers").exists());
    let whole = store
        .ensure_tree("whole.1000.1000", &changed_tar, policy(), None)
        .await
        .unwrap();
    assert_eq!(listing(&again[0]), listing(&whole[0]));
}

#[tokio::test]
async fn an_unpack_that_comes_before_the_snapshots_own_makes_the_expected_delta() {
    let Some((dir, data, store, changed_tar, base)) = setup().await else {
        return;
    };
    let changes = changed_view(&data, &store, &base).await;
    store.expect_delta("delta.1000.1000", changes);

    // A restore's unpack, which knows nothing of the view the snapshot was taken of.
    let layers = store
        .ensure_tree("delta.1000.1000", &changed_tar, policy(), None)
        .await
        .unwrap();
    assert_eq!(
        layers,
        [data.join("trees/delta.1000.1000"), base[0].clone()]
    );
    let whole = store
        .ensure_tree("whole.1000.1000", &changed_tar, policy(), None)
        .await
        .unwrap();
    assert_eq!(whole.len(), 1, "only the tree said to be a delta is one");
    let merged = Overlay::mount(&layers, &dir.path().join("mnt"));
    assert_eq!(listing(&merged.0), listing(&whole[0]));
    drop(merged);

    // The snapshot's own unpack, after it, finds the tree made.
    let again = store
        .ensure_tree("delta.1000.1000", &changed_tar, policy(), None)
        .await
        .unwrap();
    assert_eq!(again, layers);
}
