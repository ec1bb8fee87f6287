//! Snapshot archives against the real daemon: a snapshot exported from one server and imported
//! into another (a fresh data directory on the same daemon) forks into identical content with
//! the same digest, through the HTTP API and the command line; hostile archives (corrupted,
//! truncated, oversized, path tricks, digest mismatch, another format version) are refused with
//! a clear message and leave nothing behind: no snapshot resource, no data file, no temp file.
//! Runs under runc and, with `AGENT_SANDBOX_TEST_RUNTIME=runsc`, under gVisor.

mod common;

use std::time::Duration;

use common::archive::{archive_with, entries, import, sha256};
use common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(90);
/// The importing server's cap on a snapshot's workspace, so that an oversized archive is cheap.
const SMALL_CAP: u64 = 1024 * 1024;

fn create(server: &Server, plural: &str, kind: &str, name: &str, spec: Value) {
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": {"team": "archive"}},
        "spec": spec,
    });
    let (status, answer) = server.request("POST", &format!("{API}/{plural}"), Some(&body));
    assert_eq!(status, 201, "{answer}");
}

fn sandbox(server: &Server, name: &str, spec: Value) -> Value {
    create(server, "sandboxes", "Sandbox", name, spec);
    server.wait_running(name)
}

fn snapshot(server: &Server, name: &str, of: &str) -> Value {
    create(
        server,
        "snapshots",
        "Snapshot",
        name,
        json!({"sandbox": of}),
    );
    server
        .wait_for("snapshots", name, "Ready", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Ready")
        })
        .unwrap()
}

fn exec(name: &str, script: &str) -> String {
    let (code, out) = docker_exec(name, script);
    assert_eq!(code, 0, "{script}: {out}");
    out
}

const TREE: &str = r#"
set -e
cd /workspace
mkdir -p src/pkg private
chmod 700 private
printf 'print("hi")\n' > src/main.py
printf 'secret' > private/key
chmod 600 private/key
head -c 200000 /dev/urandom > src/pkg/blob.bin
ln -s main.py src/link
ln src/main.py hard
touch -d '2021-02-03 04:05:06' src/main.py private
"#;

/// Every path with type, mode, owner, size, mtime, link target and content digest.
const LISTING: &str = r#"cd /workspace && find . -mindepth 1 | sort | while read -r p; do
  s=$(stat -c '%F %a %u:%g %s %Y' "$p")
  if [ -L "$p" ]; then echo "$p $s -> $(readlink "$p")";
  elif [ -f "$p" ]; then echo "$p $s $(md5sum < "$p" | cut -c1-32) links=$(stat -c %h "$p")";
  else echo "$p ${s% *}"; fi
done"#;

fn export(server: &Server, name: &str) -> (u16, Vec<u8>) {
    http_bytes(
        server,
        "GET",
        &format!("{API}/snapshots/{name}/export"),
        &[],
    )
}

/// A snapshot archive of `manifest` and `workspace`, as a well-behaved writer makes it.
fn archive_of(manifest: &Value, workspace: &[u8]) -> Vec<u8> {
    archive_with(manifest, &[("workspace.tar", workspace)])
}

/// `manifest` made to describe `workspace` truthfully (size and digest), so that only what is
/// inside the workspace tar can be refused.
fn describing(manifest: &Value, workspace: &[u8]) -> Value {
    let mut manifest = manifest.clone();
    let digest = sha256(workspace);
    manifest["entries"][0]["sizeBytes"] = json!(workspace.len());
    manifest["entries"][0]["digest"] = json!(digest);
    manifest["snapshot"]["status"]["sizeBytes"] = json!(workspace.len());
    manifest["snapshot"]["status"]["digest"] = json!(digest);
    manifest
}

/// One raw tar entry whose name (and link target) are written as given, even where a tar
/// library would refuse them.
fn raw_entry(name: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>) -> Vec<u8> {
    let mut header = tar::Header::new_ustar();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    if let Some(link) = link {
        header.as_old_mut().linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    header.set_entry_type(kind);
    header.set_size(data.len() as u64);
    header.set_mode(if kind == tar::EntryType::Directory {
        0o755
    } else {
        0o644
    });
    header.set_uid(1000);
    header.set_gid(1000);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out
}

fn raw_tar(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn snapshot_names(server: &Server) -> Vec<String> {
    let (status, list) = server.request("GET", &format!("{API}/snapshots"), None);
    assert_eq!(status, 200, "{list}");
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

/// `archive` imported as `name` is refused with `status`, in words containing `says`, and leaves
/// the server as it was.
fn refused(server: &Server, name: &str, archive: &[u8], status: u16, says: &str) {
    let files = snapshot_files(server);
    let names = snapshot_names(server);
    let existing = server.get("snapshots", name);
    let (got, answer) = import(server, name, archive);
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(got, status, "{says}: {answer}");
    assert!(message.contains(says), "expected {says:?} in {message:?}");
    assert_eq!(snapshot_names(server), names, "{says}: a resource appeared");
    assert_eq!(
        server.get("snapshots", name),
        existing,
        "{says}: the name changed"
    );
    // The temp file goes as the import fails (removed off the request's thread).
    wait_until(
        "the import's temp file to go",
        Duration::from_secs(10),
        || snapshot_files(server) == files,
    );
}

#[test]
fn an_exported_snapshot_imports_on_another_server_and_forks_identically() {
    let source = Server::start();
    let target =
        Server::start_with(&[("AGENT_SANDBOX_MAX_SNAPSHOT_BYTES", &SMALL_CAP.to_string())]);
    let sb = unique("xsrc");
    sandbox(&source, &sb, json!({"image": TEST_IMAGE}));
    exec(&sb, TREE);
    let before = exec(&sb, LISTING);
    let snap = unique("xsnap");
    let taken = snapshot(&source, &snap, &sb);
    let digest = taken["status"]["digest"].as_str().unwrap().to_string();

    // The archive: manifest.json first, then the stored tar byte for byte.
    let (status, archive) = export(&source, &snap);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&archive));
    let parts = entries(&archive);
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["manifest.json", "workspace.tar"]);
    let manifest: Value = serde_json::from_slice(&parts[0].1).unwrap();
    assert_eq!(manifest["formatVersion"], 1);
    assert_eq!(manifest["baseImage"], TEST_IMAGE);
    assert_eq!(manifest["snapshot"]["spec"]["sandbox"], sb.as_str());
    assert_eq!(manifest["entries"][0]["digest"], digest.as_str());
    let stored = std::fs::read(source.data_dir.join(format!("snapshots/{snap}.tar"))).unwrap();
    assert_eq!(parts[1].1, stored);
    assert_eq!(sha256(&parts[1].1), digest);

    // Imported on a server with a fresh data directory: Ready at once, same digest and bytes.
    let imported = unique("ximp");
    let (status, answer) = import(&target, &imported, &archive);
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["status"]["phase"], "Ready", "{answer}");
    assert_eq!(answer["status"]["digest"], digest.as_str());
    assert_eq!(answer["metadata"]["labels"]["team"], "archive");
    let copy = std::fs::read(target.data_dir.join(format!("snapshots/{imported}.tar"))).unwrap();
    assert_eq!(sha256(&copy), digest);
    // The controller leaves it Ready (it has no sandbox to take it from, and needs none).
    std::thread::sleep(Duration::from_secs(2));
    let settled = target.get("snapshots", &imported).unwrap();
    assert_eq!(settled["status"]["phase"], "Ready", "{settled}");

    // A fork on the second server shows the same workspace.
    let child = unique("xchild");
    sandbox(
        &target,
        &child,
        json!({"image": TEST_IMAGE, "source": {"snapshot": imported}}),
    );
    assert_eq!(exec(&child, LISTING), before);
    // And a snapshot of the fork is the same tar again.
    let again = unique("xagain");
    let retaken = snapshot(&target, &again, &child);
    assert_eq!(retaken["status"]["digest"], digest.as_str(), "{retaken}");

    // The same name again is a conflict, and changes nothing.
    refused(&target, &imported, &archive, 409, "already exists");

    // The command line: export to a file, import it under another name.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("snap.tar");
    let file_text = file.to_str().unwrap();
    let (code, out, err) = source.cli(&["snapshot", "export", &snap, "-o", file_text]);
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(std::fs::read(&file).unwrap().len(), archive.len());
    assert!(!dir.path().join("snap.tar.partial").exists());
    let by_cli = unique("xcli");
    let (code, out, err) = target.cli(&["snapshot", "import", file_text, "--name", &by_cli]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("snapshot/{by_cli} imported")),
        "{out}"
    );
    let cli_copy = target.get("snapshots", &by_cli).unwrap();
    assert_eq!(cli_copy["status"]["digest"], digest.as_str());
    // Without --name, the name the manifest gives.
    let (code, out, err) = target.cli(&["snapshot", "import", file_text]);
    assert_eq!(code, 0, "{out}{err}");
    let by_manifest = target.get("snapshots", &snap).unwrap();
    assert_eq!(by_manifest["status"]["digest"], digest.as_str());
    // A refused import says why, on stderr, and fails.
    let (code, _, err) = target.cli(&["snapshot", "import", file_text]);
    assert_ne!(code, 0);
    assert!(err.contains("already exists"), "{err}");

    // Rollback of a sandbox on the second server to the imported snapshot.
    exec(
        &child,
        "rm -rf /workspace/src && echo changed > /workspace/new",
    );
    let (status, answer) = target.request(
        "POST",
        &format!("/v1/sandboxes/{child}/rollback"),
        Some(&json!({"snapshot_id": imported})),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(exec(&child, LISTING), before);

    // A snapshot that is not Ready is not exported.
    let failed = unique("xfail");
    create(
        &source,
        "snapshots",
        "Snapshot",
        &failed,
        json!({"sandbox": "no-such-sandbox"}),
    );
    source
        .wait_for("snapshots", &failed, "Failed", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Failed")
        })
        .unwrap();
    let (status, body) = export(&source, &failed);
    assert_eq!(status, 409);
    assert!(String::from_utf8_lossy(&body).contains("only a Ready snapshot"));
    let (status, _) = export(&source, "no-such-snapshot");
    assert_eq!(status, 404);

    hostile_archives_are_refused(&source, &target, &sb, &archive, &manifest);
}

fn hostile_archives_are_refused(
    source: &Server,
    target: &Server,
    sb: &str,
    archive: &[u8],
    manifest: &Value,
) {
    let name = unique("xbad");
    let workspace = &entries(archive)[1].1;

    // Corrupted: a flipped byte in the workspace entry's header (its checksum fails).
    let mut corrupted = archive.to_vec();
    let header_at = archive.len() - workspace.len().div_ceil(512) * 512 - 1024 - 512;
    corrupted[header_at + 100] ^= 0x55;
    refused(
        target,
        &name,
        &corrupted,
        422,
        "not a valid snapshot archive",
    );
    // Corrupted content: one byte of the workspace changed; its digest no longer matches.
    let mut flipped = archive.to_vec();
    flipped[header_at + 512 + 600] ^= 0x01;
    refused(target, &name, &flipped, 422, "");

    // Truncated: in the middle of the workspace, and right before the end marker.
    refused(
        target,
        &name,
        &archive[..archive.len() / 2],
        422,
        "truncated",
    );
    refused(
        target,
        &name,
        &archive[..archive.len() - 1024],
        422,
        "end-of-archive marker",
    );
    refused(target, &name, &[], 422, "empty");

    // Oversized: a workspace over the importing server's cap, named by its setting.
    exec(sb, "head -c 1500000 /dev/urandom > /workspace/big.bin");
    let big = unique("xbig");
    snapshot(source, &big, sb);
    let (status, big_archive) = export(source, &big);
    assert_eq!(status, 200);
    refused(
        target,
        &name,
        &big_archive,
        413,
        "AGENT_SANDBOX_MAX_SNAPSHOT_BYTES",
    );
    // The same archive with a manifest that lies about the size: the entry's own size says so.
    let big_parts = entries(&big_archive);
    let mut lying: Value = serde_json::from_slice(&big_parts[0].1).unwrap();
    lying["entries"][0]["sizeBytes"] = json!(1000);
    lying["snapshot"]["status"]["sizeBytes"] = json!(1000);
    refused(
        target,
        &name,
        &archive_of(&lying, &big_parts[1].1),
        422,
        "manifest says 1000",
    );
    // A manifest over its own cap.
    let mut huge = manifest.clone();
    huge["snapshot"]["annotations"] = json!({"pad": "x".repeat(1_100_000)});
    refused(
        target,
        &name,
        &archive_of(&huge, workspace),
        413,
        "manifest.json is",
    );

    // Path tricks inside the workspace tar, each with a truthful manifest.
    let dot_dot = raw_tar(&[raw_entry("../x", tar::EntryType::Regular, b"out", None)]);
    refused(
        target,
        &name,
        &archive_of(&describing(manifest, &dot_dot), &dot_dot),
        422,
        "`..`",
    );
    let absolute = raw_tar(&[raw_entry("/etc/x", tar::EntryType::Regular, b"out", None)]);
    refused(
        target,
        &name,
        &archive_of(&describing(manifest, &absolute), &absolute),
        422,
        "absolute path",
    );
    let through_link = raw_tar(&[
        raw_entry("link", tar::EntryType::Symlink, b"", Some("/etc")),
        raw_entry(
            "link/passwd",
            tar::EntryType::Regular,
            b"root::0:0::/:/bin/sh\n",
            None,
        ),
    ]);
    refused(
        target,
        &name,
        &archive_of(&describing(manifest, &through_link), &through_link),
        422,
        "does not appear earlier",
    );
    let hard_out = raw_tar(&[raw_entry(
        "h",
        tar::EntryType::Link,
        b"",
        Some("/etc/shadow"),
    )]);
    refused(
        target,
        &name,
        &archive_of(&describing(manifest, &hard_out), &hard_out),
        422,
        "hard link",
    );

    // Digest mismatch: a valid workspace tar the manifest does not describe.
    let other = raw_tar(&[raw_entry("a", tar::EntryType::Regular, b"other", None)]);
    let mut wrong = describing(manifest, &other);
    let elsewhere = sha256(b"something else");
    wrong["entries"][0]["digest"] = json!(elsewhere);
    wrong["snapshot"]["status"]["digest"] = json!(elsewhere);
    refused(
        target,
        &name,
        &archive_of(&wrong, &other),
        422,
        "does not match its digest",
    );

    // Another format version, a missing one, and an archive that is not one at all.
    let mut newer = manifest.clone();
    newer["formatVersion"] = json!(3);
    refused(
        target,
        &name,
        &archive_of(&newer, workspace),
        422,
        "formatVersion 3 is not supported",
    );
    // Version 2 is a Full snapshot's: a Workspace snapshot's manifest under it lacks rootfs.tar.
    let mut full = manifest.clone();
    full["formatVersion"] = json!(2);
    refused(
        target,
        &name,
        &archive_of(&full, workspace),
        422,
        "entries must be",
    );
    let mut unversioned = manifest.clone();
    unversioned.as_object_mut().unwrap().remove("formatVersion");
    refused(
        target,
        &name,
        &archive_of(&unversioned, workspace),
        422,
        "formatVersion is missing",
    );
    refused(target, &name, b"hello, not a tar at all", 422, "");
    // Entries in another order, or one too many.
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_ustar();
    header.set_size(workspace.len() as u64);
    header.set_mode(0o644);
    builder
        .append_data(&mut header, "workspace.tar", workspace.as_slice())
        .unwrap();
    refused(
        target,
        &name,
        &builder.into_inner().unwrap(),
        422,
        "must be the file manifest.json",
    );
    let mut extra = archive[..archive.len() - 1024].to_vec();
    extra.extend_from_slice(&raw_tar(&[raw_entry(
        "rootfs.tar",
        tar::EntryType::Regular,
        b"x",
        None,
    )]));
    refused(target, &name, &extra, 422, "unexpected entry");

    // A bad name is refused before the body is read.
    refused(target, "Bad/Name", archive, 400, "");
    let (status, _) = http_bytes(target, "POST", &format!("{API}/snapshots/import"), archive);
    assert_eq!(status, 400);
}
