//! Hostile and well-formed archives, built here byte by byte where the tar crate would refuse to
//! write them.

use std::io::Read;

use tar::{Builder, EntryType, Header};

use super::*;

const OWNER: (u32, u32) = (1000, 1000);

fn strict() -> Policy {
    Policy::restore(OWNER, Limits::with_max_bytes(1 << 20))
}

/// A header whose name (and link name) bytes are written verbatim, bypassing the tar crate's
/// own checks.
fn raw(name: &[u8], kind: EntryType, mode: u32, size: u64, link: &[u8]) -> Header {
    let mut header = Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(1_700_000_000);
    header.set_size(size);
    let gnu = header.as_gnu_mut().unwrap();
    gnu.name[..name.len()].copy_from_slice(name);
    gnu.linkname[..link.len()].copy_from_slice(link);
    header.set_cksum();
    header
}

struct Tar(Builder<Vec<u8>>);

impl Tar {
    fn new() -> Tar {
        Tar(Builder::new(Vec::new()))
    }

    fn dir(mut self, name: &str, mode: u32) -> Tar {
        if name.len() > 100 {
            let mut h = raw(b"", EntryType::Directory, mode, 0, b"");
            self.0.append_data(&mut h, name, std::io::empty()).unwrap();
            return self;
        }
        let h = raw(name.as_bytes(), EntryType::Directory, mode, 0, b"");
        self.0.append(&h, std::io::empty()).unwrap();
        self
    }

    fn file(mut self, name: &str, mode: u32, data: &[u8]) -> Tar {
        let h = raw(
            name.as_bytes(),
            EntryType::Regular,
            mode,
            data.len() as u64,
            b"",
        );
        self.0.append(&h, data).unwrap();
        self
    }

    fn link(mut self, kind: EntryType, name: &str, target: &str) -> Tar {
        let h = raw(name.as_bytes(), kind, 0o777, 0, target.as_bytes());
        self.0.append(&h, std::io::empty()).unwrap();
        self
    }

    fn special(mut self, name: &str, kind: EntryType) -> Tar {
        let h = raw(name.as_bytes(), kind, 0o644, 0, b"");
        self.0.append(&h, std::io::empty()).unwrap();
        self
    }

    fn bytes(self) -> Vec<u8> {
        self.0.into_inner().unwrap()
    }
}

fn refuse(tar: &[u8]) -> ArchiveError {
    match validate(tar, &strict()) {
        Ok(summary) => panic!("accepted a hostile archive: {summary:?}"),
        Err(e) => e,
    }
}

/// (name, type, mode, uid, gid, mtime, link target, content) of every entry.
type Listed = (
    String,
    EntryType,
    u32,
    u64,
    u64,
    u64,
    Option<String>,
    Vec<u8>,
);

fn list(tar: &[u8]) -> Vec<Listed> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let h = entry.header().clone();
        let name = String::from_utf8(entry.path_bytes().into_owned()).unwrap();
        let link = entry
            .link_name_bytes()
            .map(|l| String::from_utf8(l.into_owned()).unwrap());
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        out.push((
            name,
            h.entry_type(),
            h.mode().unwrap(),
            h.uid().unwrap(),
            h.gid().unwrap(),
            h.mtime().unwrap(),
            link,
            data,
        ));
    }
    out
}

#[test]
fn a_clean_tree_is_rewritten_faithfully_with_the_sandbox_owner() {
    let long_dir = "d".repeat(120);
    let long_file = format!("{long_dir}/{}", "f".repeat(200));
    let long_target = format!("/elsewhere/{}", "t".repeat(150));
    let mut tar = Tar::new()
        .dir("src/", 0o750)
        .file("src/main.py", 0o755, b"print('hi')\n")
        .dir("empty/", 0o700)
        .link(EntryType::Symlink, "abs", "/etc/passwd")
        .link(EntryType::Symlink, "up", "../../outside")
        .link(EntryType::Link, "src/hard", "src/main.py")
        .dir(&format!("{long_dir}/"), 0o755)
        .0;
    // Long names through the tar crate's GNU records, and a long symlink target.
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o1644);
    h.set_size(3);
    h.set_mtime(1_600_000_000);
    tar.append_data(&mut h, &long_file, &b"abc"[..]).unwrap();
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Symlink);
    h.set_size(0);
    h.set_mode(0o777);
    h.set_mtime(1_600_000_000);
    tar.append_link(&mut h, "longlink", &long_target).unwrap();
    let tar = tar.into_inner().unwrap();

    let (summary, out) = transform(&tar[..], Vec::new(), &strict()).unwrap();
    assert_eq!(summary.entries, 9);
    assert_eq!(summary.content_bytes, 12 + 3);
    assert!(summary.adjusted.is_empty());
    let listed = list(&out);
    let names: Vec<&str> = listed.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(
        names,
        [
            "src/",
            "src/main.py",
            "empty/",
            "abs",
            "up",
            "src/hard",
            &format!("{long_dir}/"),
            long_file.as_str(),
            "longlink"
        ]
    );
    for entry in &listed {
        assert_eq!((entry.3, entry.4), (1000, 1000), "{}", entry.0);
    }
    assert_eq!(listed[0].2, 0o750);
    assert_eq!(listed[1].2, 0o755);
    assert_eq!(listed[1].5, 1_700_000_000);
    assert_eq!(listed[1].7, b"print('hi')\n");
    assert_eq!(listed[3].6.as_deref(), Some("/etc/passwd"));
    assert_eq!(listed[4].6.as_deref(), Some("../../outside"));
    assert_eq!(listed[5].1, EntryType::Link);
    assert_eq!(listed[5].6.as_deref(), Some("src/main.py"));
    assert_eq!(listed[7].2, 0o1644, "the sticky bit is kept");
    assert_eq!(listed[7].7, b"abc");
    assert_eq!(listed[8].6.as_deref(), Some(long_target.as_str()));
    // The result passes its own rules again.
    assert_eq!(validate(&out[..], &strict()).unwrap(), summary);
}

#[test]
fn pax_long_names_are_read() {
    let name = format!("{}/x", "p".repeat(150));
    let mut tar = Tar::new().dir(&format!("{}/", "p".repeat(150)), 0o755).0;
    let mut h = Header::new_ustar();
    h.set_entry_type(EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(1);
    h.set_path("placeholder").unwrap();
    h.set_cksum();
    tar.append_pax_extensions([("path", name.as_bytes())])
        .unwrap();
    tar.append(&h, &b"z"[..]).unwrap();
    let tar = tar.into_inner().unwrap();
    let (_, out) = transform(&tar[..], Vec::new(), &strict()).unwrap();
    assert_eq!(list(&out)[1].0, name);
}

#[test]
fn parent_components_are_refused() {
    let tar = Tar::new().file("../evil", 0o644, b"x").bytes();
    assert!(matches!(refuse(&tar), ArchiveError::ParentComponent(p) if p == "../evil"));
    let tar = Tar::new()
        .dir("a/", 0o755)
        .file("a/../../b", 0o644, b"x")
        .bytes();
    assert!(matches!(refuse(&tar), ArchiveError::ParentComponent(_)));
}

#[test]
fn absolute_paths_are_refused() {
    let tar = Tar::new().file("/etc/passwd", 0o644, b"x").bytes();
    let error = refuse(&tar);
    assert!(matches!(error, ArchiveError::AbsolutePath(ref p) if p == "/etc/passwd"));
    assert!(error.to_string().contains("absolute path"));
}

#[test]
fn hard_links_out_of_the_tree_are_refused() {
    for target in ["/etc/shadow", "../outside", "never-written", "dir"] {
        let tar = Tar::new()
            .dir("dir/", 0o755)
            .link(EntryType::Link, "h", target)
            .bytes();
        let error = refuse(&tar);
        assert!(
            matches!(error, ArchiveError::HardLinkOutside { target: ref t, .. } if t == target),
            "{target}: {error}"
        );
    }
    // A link to a file that comes later is refused too: Docker would link to whatever is there.
    let tar = Tar::new()
        .link(EntryType::Link, "h", "f")
        .file("f", 0o644, b"x")
        .bytes();
    assert!(matches!(refuse(&tar), ArchiveError::HardLinkOutside { .. }));
}

#[test]
fn devices_and_fifos_are_refused() {
    for (kind, word) in [
        (EntryType::Char, "character device"),
        (EntryType::Block, "block device"),
        (EntryType::Fifo, "FIFO"),
        (EntryType::XGlobalHeader, "global extended header"),
    ] {
        let tar = Tar::new().special("node", kind).bytes();
        let error = refuse(&tar);
        assert!(
            matches!(error, ArchiveError::UnsupportedType { ref kind, .. } if kind == word),
            "{error}"
        );
        assert!(error.to_string().contains("only regular files"));
    }
}

#[test]
fn setuid_and_setgid_are_refused() {
    for mode in [0o4755, 0o2755, 0o6755] {
        let tar = Tar::new().file("tool", mode, b"x").bytes();
        assert!(matches!(refuse(&tar), ArchiveError::SetId(p) if p == "tool"));
    }
    let tar = Tar::new().dir("shared/", 0o2775).bytes();
    assert!(matches!(refuse(&tar), ArchiveError::SetId(_)));
}

#[test]
fn a_symlink_may_point_anywhere_but_nothing_may_be_written_through_it() {
    let tar = Tar::new().link(EntryType::Symlink, "etc", "/etc").bytes();
    assert!(validate(&tar[..], &strict()).is_ok());
    let tar = Tar::new()
        .link(EntryType::Symlink, "etc", "/etc")
        .file("etc/passwd", 0o644, b"root::0:0::/:/bin/sh\n")
        .bytes();
    assert!(matches!(refuse(&tar), ArchiveError::MissingParent(p) if p == "etc/passwd"));
    // A directory that was never declared would be created by Docker as root.
    let tar = Tar::new().file("deep/file", 0o644, b"x").bytes();
    assert!(matches!(refuse(&tar), ArchiveError::MissingParent(_)));
}

#[test]
fn duplicates_and_nul_bytes_are_refused() {
    let tar = Tar::new()
        .dir("a/", 0o755)
        .link(EntryType::Symlink, "a", "/etc")
        .bytes();
    assert!(matches!(refuse(&tar), ArchiveError::Duplicate(p) if p == "a"));
    let mut tar = Builder::new(Vec::new());
    let mut h = Header::new_ustar();
    h.set_entry_type(EntryType::Regular);
    h.set_size(0);
    h.set_path("x").unwrap();
    h.set_cksum();
    tar.append_pax_extensions([("path", &b"ok\0/../../etc"[..])])
        .unwrap();
    tar.append(&h, std::io::empty()).unwrap();
    let tar = tar.into_inner().unwrap();
    assert!(matches!(refuse(&tar), ArchiveError::Nul(_)));
}

#[test]
fn truncated_archives_are_refused() {
    let whole = Tar::new()
        .dir("d/", 0o755)
        .file("d/f", 0o644, &[7u8; 2000])
        .bytes();
    assert!(validate(&whole[..], &strict()).is_ok());
    // Cut inside the file's data.
    let error = refuse(&whole[..512 * 3]);
    assert!(matches!(error, ArchiveError::Truncated(_)), "{error}");
    // Cut exactly at an entry boundary: no end-of-archive marker.
    let error = refuse(&whole[..512]);
    assert!(matches!(error, ArchiveError::Truncated(_)), "{error}");
    // Cut inside a header.
    let error = refuse(&whole[..700]);
    assert!(
        matches!(
            error,
            ArchiveError::Malformed(_) | ArchiveError::Truncated(_)
        ),
        "{error}"
    );
}

#[test]
fn garbage_and_empty_input_are_refused() {
    let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect();
    assert!(matches!(refuse(&garbage), ArchiveError::Malformed(_)));
    assert!(matches!(refuse(b""), ArchiveError::Truncated(_)));
    // An empty but complete archive is fine: an empty workspace.
    let empty = Tar::new().bytes();
    assert_eq!(validate(&empty[..], &strict()).unwrap().entries, 0);
}

#[test]
fn limits_are_enforced() {
    let mut policy = strict();
    policy.limits.max_entries = 2;
    let tar = Tar::new()
        .file("a", 0o644, b"")
        .file("b", 0o644, b"")
        .file("c", 0o644, b"")
        .bytes();
    assert!(matches!(
        validate(&tar[..], &policy),
        Err(ArchiveError::TooManyEntries(2))
    ));
    let mut policy = strict();
    policy.limits.max_content_bytes = 10;
    let tar = Tar::new().file("a", 0o644, &[0u8; 11]).bytes();
    assert!(matches!(
        validate(&tar[..], &policy),
        Err(ArchiveError::TooLarge { limit: 10 })
    ));
    let long = format!("{}/x", "n".repeat(300));
    let mut tar = Builder::new(Vec::new());
    let mut h = Header::new_gnu();
    h.set_entry_type(EntryType::Regular);
    h.set_size(0);
    tar.append_data(&mut h, &long, std::io::empty()).unwrap();
    let tar = tar.into_inner().unwrap();
    assert!(matches!(refuse(&tar), ArchiveError::NameTooLong(_)));
}

#[test]
fn export_strips_the_root_and_reports_what_it_drops() {
    let docker = Tar::new()
        .dir("workspace/", 0o755)
        .dir("workspace/d/", 0o755)
        .file("workspace/d/f", 0o4755, b"x")
        .special("workspace/pipe", EntryType::Fifo)
        .link(EntryType::Link, "workspace/h", "workspace/d/f")
        .bytes();
    let policy = Policy::export("workspace", OWNER, Limits::with_max_bytes(1 << 20));
    let (summary, out) = transform(&docker[..], Vec::new(), &policy).unwrap();
    assert_eq!(summary.entries, 3);
    assert_eq!(summary.adjusted_count, 2);
    assert!(summary.adjusted.iter().any(|a| a.contains("pipe")));
    assert!(summary.adjusted.iter().any(|a| a.contains("setuid")));
    let listed = list(&out);
    let names: Vec<&str> = listed.iter().map(|e| e.0.as_str()).collect();
    assert_eq!(names, ["d/", "d/f", "h"]);
    assert_eq!(listed[1].2, 0o755);
    assert_eq!(listed[2].6.as_deref(), Some("d/f"));
    // What export writes, a restore accepts.
    assert!(validate(&out[..], &strict()).is_ok());

    let stray = Tar::new().file("other/f", 0o644, b"x").bytes();
    assert!(matches!(
        validate(&stray[..], &policy),
        Err(ArchiveError::OutsideRoot(_))
    ));
}

#[test]
fn the_capped_writer_stops_at_its_limit_and_nothing_looks_complete() {
    let tar = Tar::new().file("big", 0o644, &[1u8; 10_000]).bytes();
    let capped = Capped::new(Vec::new(), 4096);
    match transform(&tar[..], capped, &strict()) {
        Err(ArchiveError::TooLarge { limit: 4096 }) => {}
        other => panic!("expected TooLarge, got {:?}", other.map(|r| r.0)),
    }
    let mut capped = Capped::new(Vec::new(), 1 << 20);
    std::io::Write::write_all(&mut capped, b"abc").unwrap();
    let (digest, inner) = capped.finish();
    assert_eq!(inner, b"abc");
    assert_eq!(digest, super::digest(&b"abc"[..]).unwrap());
    assert!(digest.starts_with("sha256:ba7816bf"));
}

#[test]
fn the_hashed_writer_matches_the_capped_one_and_stops_at_its_limit() {
    // Several pieces and a partial one, written in odd sizes.
    let data: Vec<u8> = (0..3_500_000u32).map(|i| (i % 251) as u8).collect();
    let mut hashed = HashedWriter::new(Vec::new(), 1 << 30).unwrap();
    for chunk in data.chunks(77_777) {
        std::io::Write::write_all(&mut hashed, chunk).unwrap();
    }
    assert_eq!(hashed.written(), data.len() as u64);
    let (digest, inner) = hashed.finish().unwrap();
    assert!(inner == data, "the inner writer got the data in order");
    assert_eq!(digest, super::digest(&data[..]).unwrap());

    let tar = Tar::new().file("big", 0o644, &[1u8; 10_000]).bytes();
    let hashed = HashedWriter::new(Vec::new(), 4096).unwrap();
    match transform(&tar[..], hashed, &strict()) {
        Err(ArchiveError::TooLarge { limit: 4096 }) => {}
        other => panic!("expected TooLarge, got {:?}", other.map(|r| r.0.entries)),
    }
}

/// The entries of a tar: name, type, mode, size, link target and data.
fn listing(tar: &[u8]) -> Vec<(String, EntryType, u32, u64, String, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let header = entry.header();
        let (kind, mode, size) = (
            header.entry_type(),
            header.mode().unwrap(),
            header.size().unwrap(),
        );
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let link = entry
            .link_name_bytes()
            .map(|l| String::from_utf8_lossy(&l).into_owned())
            .unwrap_or_default();
        let mut data = Vec::new();
        entry.read_to_end(&mut data).unwrap();
        out.push((name, kind, mode, size, link, data));
    }
    out
}

#[test]
fn a_host_directory_is_read_like_dockers_archive_without_following_symlinks() {
    use std::os::unix::fs::{symlink, PermissionsExt};

    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), b"do not read").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("b/empty")).unwrap();
    std::fs::write(root.join("b/file"), b"hello").unwrap();
    std::fs::set_permissions(root.join("b/file"), std::fs::Permissions::from_mode(0o4750)).unwrap();
    std::fs::write(root.join("a"), vec![7u8; 1000]).unwrap();
    std::fs::hard_link(root.join("a"), root.join("c-hard")).unwrap();
    // Symlinks out of the tree, to a directory and to a file: stored as links, never entered.
    symlink(outside.path(), root.join("b/out-dir")).unwrap();
    symlink(outside.path().join("secret"), root.join("out-file")).unwrap();
    let long = "n".repeat(150);
    std::fs::write(root.join(&long), b"long").unwrap();
    let fifo = std::ffi::CString::new(root.join("pipe").as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let _socket = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();

    let raw = {
        let mut bytes = Vec::new();
        HostTar::new(open_root(root).unwrap(), "workspace")
            .read_to_end(&mut bytes)
            .unwrap();
        bytes
    };
    let names: Vec<String> = listing(&raw).into_iter().map(|e| e.0).collect();
    assert_eq!(
        names,
        vec![
            "workspace/".to_string(),
            "workspace/a".into(),
            "workspace/b/".into(),
            "workspace/b/empty/".into(),
            "workspace/b/file".into(),
            "workspace/b/out-dir".into(),
            "workspace/c-hard".into(),
            format!("workspace/{long}"),
            "workspace/out-file".into(),
            "workspace/pipe".into(),
        ],
        "byte order, directories before their contents, no socket"
    );

    let policy = Policy::export("workspace", OWNER, Limits::with_max_bytes(1 << 20));
    let (summary, out) = transform(&raw[..], Vec::new(), &policy).unwrap();
    assert_eq!(summary.adjusted_count, 2, "{summary:?}");
    let entries = listing(&out);
    let find = |name: &str| entries.iter().find(|e| e.0 == name).unwrap().clone();
    assert_eq!(find("a").5, vec![7u8; 1000]);
    assert_eq!(find("b/file").2, 0o750, "setuid cleared");
    assert_eq!(find("b/file").5, b"hello");
    assert_eq!(find("b/empty/").1, EntryType::Directory);
    assert_eq!(find("c-hard").1, EntryType::Link);
    assert_eq!(find("c-hard").4, "a");
    assert_eq!(find("b/out-dir").1, EntryType::Symlink);
    assert_eq!(find("b/out-dir").4, outside.path().to_string_lossy());
    assert_eq!(find("out-file").1, EntryType::Symlink);
    assert_eq!(find(&long).5, b"long");
    assert!(entries.iter().all(|e| e.0 != "pipe"));
    assert!(
        out.windows(11).all(|w| w != b"do not read"),
        "nothing behind a symlink was read"
    );

    // A root that is a symlink is refused.
    let link = dir.path().join("b/out-dir");
    assert!(open_root(&link).is_err());
}
