//! Carrying a tree over by hard links: everything as it was, nothing followed, the source intact.

use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use super::super::{link_tree, open_root};

/// One entry below a directory: relative name, kind, mode, owner, size, mtime (with
/// nanoseconds), inode, and a symlink's target.
type Node = (
    String,
    String,
    u32,
    (u32, u32),
    u64,
    (i64, i64),
    u64,
    String,
);

/// Every entry below `dir`, sorted by name.
fn tree(dir: &Path) -> Vec<Node> {
    let mut out: Vec<Node> = super::super::test_tree::entries(dir)
        .into_iter()
        .map(|(name, path, meta)| {
            let target = if meta.file_type().is_symlink() {
                std::fs::read_link(&path)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            } else {
                String::new()
            };
            (
                name,
                format!("{:?}", meta.file_type()),
                meta.mode(),
                (meta.uid(), meta.gid()),
                if meta.is_dir() { 0 } else { meta.len() },
                (meta.mtime(), meta.mtime_nsec()),
                if meta.is_dir() { 0 } else { meta.ino() },
                target,
            )
        })
        .collect();
    out.sort();
    out
}

fn set_mtime(path: &Path, seconds: i64, nanos: i64) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let at = libc::timespec {
        tv_sec: seconds,
        tv_nsec: nanos,
    };
    // SAFETY: a valid NUL-terminated path and two timespecs.
    let done = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            name.as_ptr(),
            [at, at].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(done, 0, "utimensat {}", path.display());
}

#[test]
fn a_tree_is_carried_over_whole_and_the_source_stays_as_it_was() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"stays outside").unwrap();
    let source = tempfile::tempdir().unwrap();
    let root = source.path();
    super::super::test_tree::plant(root);
    symlink(outside.path(), root.join("out-dir")).unwrap();
    let fifo = std::ffi::CString::new(root.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o640) }, 0);
    std::fs::set_permissions(root.join("src/main.py"), PermissionsExt::from_mode(0o750)).unwrap();
    std::fs::set_permissions(root.join("locked"), PermissionsExt::from_mode(0o555)).unwrap();
    std::fs::set_permissions(root.join("empty"), PermissionsExt::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(root, PermissionsExt::from_mode(0o710)).unwrap();
    for (i, entry) in tree(root).into_iter().enumerate() {
        set_mtime(&root.join(&entry.0), 1_600_000_000 + i as i64, 123_456_789);
    }
    set_mtime(root, 1_500_000_000, 5);
    let before = tree(root);

    let target = tempfile::tempdir().unwrap();
    let carried = link_tree(open_root(root).unwrap(), open_root(target.path()).unwrap()).unwrap();
    assert_eq!(carried, before.len() as u64);
    assert_eq!(
        tree(target.path()),
        before,
        "same names, kinds, modes, owners, times, inodes"
    );
    let (from, to) = (
        std::fs::metadata(root).unwrap(),
        std::fs::metadata(target.path()).unwrap(),
    );
    assert_eq!(to.mode(), from.mode(), "the root's own mode");
    assert_eq!(
        (to.mtime(), to.mtime_nsec()),
        (1_500_000_000, 5),
        "the root's own mtime"
    );
    let linked = tree(root);
    assert_eq!(
        linked.iter().map(|e| (&e.0, e.6)).collect::<Vec<_>>(),
        before.iter().map(|e| (&e.0, e.6)).collect::<Vec<_>>(),
        "the source keeps its inodes"
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        1,
        "nothing was carried through the symlink"
    );
    assert_eq!(
        std::fs::read_link(target.path().join("out-dir")).unwrap(),
        outside.path()
    );
}

#[test]
fn the_target_must_be_empty_and_a_deep_tree_needs_no_deep_stack() {
    let source = tempfile::tempdir().unwrap();
    let mut deep = source.path().to_path_buf();
    for _ in 0..200 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("leaf"), b"bottom").unwrap();

    let occupied = tempfile::tempdir().unwrap();
    std::fs::write(occupied.path().join("x"), b"already here").unwrap();
    let refused = link_tree(
        open_root(source.path()).unwrap(),
        open_root(occupied.path()).unwrap(),
    );
    assert!(refused.is_err(), "a target that is not empty is refused");
    assert_eq!(std::fs::read_dir(occupied.path()).unwrap().count(), 1);

    let target = tempfile::tempdir().unwrap();
    let carried = link_tree(
        open_root(source.path()).unwrap(),
        open_root(target.path()).unwrap(),
    )
    .unwrap();
    assert_eq!(carried, 201);
    let copied = target
        .path()
        .join(deep.strip_prefix(source.path()).unwrap());
    assert_eq!(std::fs::read(copied.join("leaf")).unwrap(), b"bottom");
}
