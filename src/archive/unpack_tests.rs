//! Unpacking below a host directory: faithful, and never through a symlink or over a name that
//! exists.

use std::io::Read;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use super::super::{open_root, transform, unpack, ArchiveError, HostTar, Limits, Policy};

/// The owner restores force: the sandbox user when the tests may give files away, else ourselves.
fn owner() -> (u32, u32) {
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    if uid == 0 {
        (1000, 1000)
    } else {
        (uid, gid)
    }
}

fn restore_policy() -> Policy {
    Policy::restore(owner(), Limits::with_max_bytes(1 << 24))
}

/// The stored form of `dir`: read on the host and passed through the export policy, as a
/// snapshot stores it.
fn stored(dir: &Path) -> Vec<u8> {
    let mut raw = Vec::new();
    HostTar::new(open_root(dir).unwrap(), "workspace")
        .read_to_end(&mut raw)
        .unwrap();
    let policy = Policy::export("workspace", owner(), Limits::with_max_bytes(1 << 24));
    transform(&raw[..], Vec::new(), &policy).unwrap().1
}

/// One entry below a directory: relative name, kind, permission bits, mtime, owner, content or
/// link target.
type Node = (String, &'static str, u32, i64, (u32, u32), Vec<u8>);

/// Every entry below `dir`, sorted by name, so that listing order does not matter.
fn tree(dir: &Path) -> Vec<Node> {
    let mut out: Vec<Node> = super::super::test_tree::entries(dir)
        .into_iter()
        .map(|(name, path, meta)| {
            let kind = meta.file_type();
            let (kind, content) = if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                ("symlink", target.into_os_string().into_encoded_bytes())
            } else if kind.is_dir() {
                ("dir", Vec::new())
            } else {
                ("file", std::fs::read(&path).unwrap())
            };
            let mode = if kind == "symlink" {
                0
            } else {
                meta.mode() & 0o7777
            };
            (
                name,
                kind,
                mode,
                meta.mtime(),
                (meta.uid(), meta.gid()),
                content,
            )
        })
        .collect();
    out.sort();
    out
}

fn set_mtime(path: &Path, seconds: i64) {
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let at = libc::timespec {
        tv_sec: seconds,
        tv_nsec: 0,
    };
    let times = [at, at];
    // SAFETY: a valid NUL-terminated path and two timespecs.
    let done = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            name.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(done, 0, "utimensat {}", path.display());
}

fn chown_tree(dir: &Path, (uid, gid): (u32, u32)) {
    for (name, ..) in tree(dir) {
        std::os::unix::fs::lchown(dir.join(name), Some(uid), Some(gid)).unwrap();
    }
}

#[test]
fn a_stored_tree_unpacks_faithfully_with_the_sandbox_owner() {
    let source = tempfile::tempdir().unwrap();
    let root = source.path();
    super::super::test_tree::plant(root);
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\necho run\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), PermissionsExt::from_mode(0o750)).unwrap();
    std::fs::write(root.join("empty-file"), b"").unwrap();
    symlink("/etc/passwd", root.join("abs-link")).unwrap();
    symlink("missing/target", root.join("dangling")).unwrap();
    let long = "l".repeat(180);
    std::fs::write(root.join(&long), b"a long name").unwrap();
    std::fs::set_permissions(root.join("locked"), PermissionsExt::from_mode(0o555)).unwrap();
    std::fs::set_permissions(root.join("empty"), PermissionsExt::from_mode(0o1777)).unwrap();
    for (i, (name, ..)) in tree(root).into_iter().enumerate() {
        set_mtime(&root.join(name), 1_600_000_000 + i as i64 * 1000);
    }
    chown_tree(root, owner());
    let tar = stored(root);

    let target = tempfile::tempdir().unwrap();
    let summary = unpack(
        &tar[..],
        open_root(target.path()).unwrap(),
        &restore_policy(),
    )
    .unwrap();
    assert_eq!(summary.entries, tree(root).len() as u64);
    assert_eq!(tree(target.path()), tree(root));
    let linked = std::fs::metadata(target.path().join("main-again.py")).unwrap();
    let first = std::fs::metadata(target.path().join("src/main.py")).unwrap();
    assert_eq!(linked.ino(), first.ino(), "a hard link stays one inode");
    // And what is unpacked reads back into the very same stored form.
    assert_eq!(stored(target.path()), tar);
}

#[test]
fn nothing_is_written_through_a_symlink_or_over_an_existing_name() {
    let outside = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    symlink(outside.path(), target.path().join("planted-dir")).unwrap();
    symlink(
        outside.path().join("file"),
        target.path().join("planted-file"),
    )
    .unwrap();
    std::fs::write(target.path().join("kept"), b"keep me").unwrap();

    let cases: [(&str, Vec<u8>); 3] = [
        ("a directory over a planted symlink", {
            let dir = tempfile::tempdir().unwrap();
            std::fs::create_dir(dir.path().join("planted-dir")).unwrap();
            std::fs::write(dir.path().join("planted-dir/x"), b"escaped").unwrap();
            stored(dir.path())
        }),
        ("a file over a planted symlink", {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("planted-file"), b"escaped").unwrap();
            stored(dir.path())
        }),
        ("a file over an existing file", {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("kept"), b"overwritten").unwrap();
            stored(dir.path())
        }),
    ];
    for (case, tar) in cases {
        let root = open_root(target.path()).unwrap();
        match unpack(&tar[..], root, &restore_policy()) {
            Err(ArchiveError::Write(message)) => {
                assert!(message.contains("exists"), "{case}: {message}")
            }
            other => panic!("{case}: unpacked: {other:?}"),
        }
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "nothing reached the symlinks' target"
    );
    assert_eq!(
        std::fs::read(target.path().join("kept")).unwrap(),
        b"keep me"
    );
}

#[test]
fn a_directory_is_never_entered_through_a_symlink() {
    let outside = tempfile::tempdir().unwrap();
    let target = tempfile::tempdir().unwrap();
    std::fs::create_dir(target.path().join("real")).unwrap();
    symlink(outside.path(), target.path().join("real/sub")).unwrap();
    let sink = super::HostSink::new(open_root(target.path()).unwrap());
    assert!(sink.open_dir(b"real").is_ok());
    let error = sink.open_dir(b"real/sub").unwrap_err();
    // Linux answers O_DIRECTORY | O_NOFOLLOW on a symlink with ENOTDIR (ELOOP without
    // O_DIRECTORY): either way, refused.
    assert!(
        matches!(error.raw_os_error(), Some(libc::ENOTDIR | libc::ELOOP)),
        "{error}"
    );
}

#[test]
fn a_cut_off_archive_is_reported_as_truncated() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("big"), vec![1u8; 100_000]).unwrap();
    let tar = stored(dir.path());
    let target = tempfile::tempdir().unwrap();
    let cut = &tar[..50_000];
    match unpack(cut, open_root(target.path()).unwrap(), &restore_policy()) {
        Err(ArchiveError::Truncated(_)) => {}
        other => panic!("expected Truncated, got {other:?}"),
    }
}
