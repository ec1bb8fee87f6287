//! Full snapshots against the real Docker daemon (runc, or runsc with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): a sandbox with a writable root filesystem installs a
//! file under `/usr/local/bin`, changes `/etc/motd`, deletes a file of the image and writes to
//! `/workspace`; a Full snapshot of it forked three times shows all four changes in every child
//! and a rollback brings them back, a Workspace snapshot of the same sandbox shows only the
//! workspace, a read-only-root sandbox is refused, and deleting the snapshot removes its image
//! (at once, or once the last container made from it is gone). Its archive (format version 2)
//! imports on a second server (a fresh data directory on the same daemon) as a Full snapshot
//! whose forks show the same four changes; hostile root filesystem parts (bad digest, truncated,
//! oversized, path traversal) are refused leaving no snapshot, no file and no image; deleting
//! the imported snapshot removes its image.

mod common;

use std::time::Duration;

use common::archive::{archive_with, entries, import, sha256};
use common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(120);

fn delete(server: &Server, plural: &str, name: &str) {
    let (status, answer) = server.request("DELETE", &format!("{API}/{plural}/{name}"), None);
    assert!(status == 200 || status == 202, "{status} {answer}");
}

fn snapshot(server: &Server, name: &str, of: &str, scope: &str) -> Value {
    create(
        server,
        "snapshots",
        "Snapshot",
        name,
        json!({"sandbox": of, "scope": scope}),
    );
    server
        .wait_for("snapshots", name, "settled", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Ready" || r["status"]["phase"] == "Failed")
        })
        .unwrap()
}

/// The four changes: a tool installed (with a symlink to it), motd written, an image file
/// deleted, a workspace file.
const CHANGES: &str = r#"
set -e
printf '#!/bin/sh\necho tool-ran\n' > /usr/local/bin/tool
chmod 750 /usr/local/bin/tool
ln -s tool /usr/local/bin/tool-link
echo 'welcome, agent' > /etc/motd
chmod 600 /etc/motd
rm /bin/vi
"#;

/// What a machine shows of the four changes, one line each.
const LOOK: &str = r#"
stat -c '%n %a %u:%g' /usr/local/bin/tool 2>&1
readlink /usr/local/bin/tool-link 2>&1 || echo no-link
cat /etc/motd 2>&1; stat -c '%a' /etc/motd 2>&1
test -e /bin/vi && echo vi-present || echo vi-absent
cat /workspace/note 2>&1
true
"#;

fn look(name: &str) -> String {
    as_root(name, LOOK)
}

fn image_present(reference: &str) -> bool {
    docker_status(&["image", "inspect", reference])
}

#[test]
fn a_full_snapshot_carries_the_root_filesystem_into_forks_and_rollbacks() {
    let server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let name = unique("full");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE, "readOnlyRootfs": false}),
    );
    server.wait_running(&name);
    let pristine = look(&name);
    assert!(pristine.contains("vi-present"), "{pristine}");
    as_root(&name, CHANGES);
    let (code, _) = docker_exec(&name, "echo 'from the workspace' > /workspace/note");
    assert_eq!(code, 0);
    let changed = look(&name);
    for expected in [
        "/usr/local/bin/tool 750 0:0",
        "tool\n",
        "welcome, agent\n600",
        "vi-absent",
        "from the workspace",
    ] {
        assert!(changed.contains(expected), "{expected:?} in {changed}");
    }

    // Full: workspace and root filesystem, sized and digested.
    let full = unique("sf");
    let taken = snapshot(&server, &full, &name, "Full");
    assert_eq!(
        taken["status"]["phase"],
        "Ready",
        "{taken:#}\n{}",
        server.log()
    );
    let status = &taken["status"];
    assert_eq!(status["scope"], "Full");
    assert_eq!(status["workspaceBytes"], status["sizeBytes"]);
    assert!(status["rootfsBytes"].as_u64().unwrap() > 0, "{status:#}");
    let rootfs_digest = status["rootfsDigest"].as_str().unwrap();
    assert!(rootfs_digest.starts_with("sha256:") && rootfs_digest.len() == 71);
    let image = status["rootfsImage"].as_str().unwrap().to_string();
    assert!(image_present(&image), "{image}");
    // The layer Docker holds is the one the status names.
    let layers = inspect(&["--type", "image", &image]).unwrap()["RootFS"]["Layers"].clone();
    assert_eq!(layers.as_array().unwrap().last().unwrap(), rootfs_digest);
    // Nothing the server put into the container's environment is in the image.
    let env = inspect(&["--type", "image", &image]).unwrap()["Config"]["Env"].clone();
    assert!(
        !env.to_string().contains("/workspace"),
        "the image has no HOME of the sandbox: {env}"
    );
    // The sandbox runs on, unpaused.
    let c = container(&name).unwrap();
    assert_eq!(c["State"]["Running"], true);
    assert_eq!(c["State"]["Paused"], false);

    // Workspace only: the root filesystem is not part of it.
    let ws = unique("sw");
    let taken = snapshot(&server, &ws, &name, "Workspace");
    assert_eq!(taken["status"]["phase"], "Ready", "{taken:#}");
    assert_eq!(taken["status"]["scope"], "Workspace");
    assert!(taken["status"].get("rootfsImage").is_none());
    assert!(taken["status"].get("rootfsBytes").is_none());

    // Three forks of the Full snapshot, each with all four changes.
    let fork = unique("ff");
    create(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": full, "replicas": 3}),
    );
    server
        .wait_for("forks", &fork, "3 ready", LONG, |r| {
            r.is_some_and(|r| r["status"]["readyReplicas"] == 3)
        })
        .unwrap();
    for i in 0..3 {
        let child = format!("{fork}-{i}");
        assert_eq!(look(&child), changed, "fork child {child}");
        assert_eq!(as_root(&child, "/usr/local/bin/tool-link"), "tool-ran\n");
        let sb = server.get("sandboxes", &child).unwrap();
        assert_eq!(sb["status"]["rootfs"]["image"], image.as_str(), "{sb:#}");
        assert_eq!(sb["status"]["rootfs"]["snapshot"], full.as_str());
    }
    // Children are independent machines.
    as_root(&format!("{fork}-0"), "rm /usr/local/bin/tool");
    assert!(look(&format!("{fork}-1")).contains("/usr/local/bin/tool 750"));

    // A sandbox from the Workspace snapshot has the workspace and the plain image.
    let plain = unique("fromws");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &plain,
        json!({"image": TEST_IMAGE, "readOnlyRootfs": false, "source": {"snapshot": ws}}),
    );
    server.wait_running(&plain);
    let shown = look(&plain);
    assert!(shown.contains("from the workspace"), "{shown}");
    assert!(shown.contains("vi-present"), "{shown}");
    assert!(!shown.contains("welcome, agent"), "{shown}");
    assert!(!shown.contains("/usr/local/bin/tool 750"), "{shown}");

    // A rollback to the Full snapshot brings the root filesystem back too.
    as_root(&name, "rm /usr/local/bin/tool /etc/motd && touch /bin/vi");
    let (code, _) = docker_exec(&name, "rm /workspace/note");
    assert_eq!(code, 0);
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": TEST_IMAGE, "readOnlyRootfs": false,
                 "rollback": {"snapshot": full, "requestId": "r1"}},
    });
    let (code, answer) = server.request("PUT", &format!("{API}/sandboxes/{name}"), Some(&body));
    assert_eq!(code, 200, "{answer}");
    server
        .wait_for("sandboxes", &name, "rolled back", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["lastRollback"]["requestId"] == "r1"
                    && r["status"]["phase"] == "Running"
            })
        })
        .unwrap();
    assert_eq!(look(&name), changed, "the rollback restores both");

    // Its archive carries the root filesystem layer after the workspace.
    let (code, bytes) = http_bytes(
        &server,
        "GET",
        &format!("{API}/snapshots/{full}/export"),
        b"",
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&bytes));
    let parts = entries(&bytes);
    assert_eq!(parts[2].0, "rootfs.tar");
    assert_eq!(sha256(&parts[2].1), rootfs_digest);

    // Deleting the snapshot while containers run on its image keeps the image for them; it goes
    // once the last of them is gone.
    delete(&server, "snapshots", &full);
    server.wait_gone("snapshots", &full);
    assert!(image_present(&image), "still used by the fork's children");
    assert_eq!(look(&format!("{fork}-2")), changed);
    delete(&server, "forks", &fork);
    server.wait_gone("forks", &fork);
    delete(&server, "sandboxes", &name);
    server.wait_gone("sandboxes", &name);
    wait_until("the snapshot's image removed", LONG, || {
        !image_present(&image)
    });

    // A Full snapshot nothing uses is removed with it at once.
    let other = unique("o");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &other,
        json!({"image": TEST_IMAGE, "readOnlyRootfs": false}),
    );
    server.wait_running(&other);
    as_root(&other, "echo x > /etc/x");
    let plain_image = inspect(&["--type", "image", TEST_IMAGE]).unwrap()["Id"].clone();
    assert_eq!(
        container(&other).unwrap()["Image"],
        plain_image,
        "a sandbox of no snapshot runs the plain image"
    );
    // Through /v1 this time, as the CLI's `snapshot --full` does.
    let (code, answer) = server.request(
        "POST",
        &format!("/v1/sandboxes/{other}/snapshots"),
        Some(&json!({"scope": "Full"})),
    );
    assert_eq!(code, 201, "{answer}\n{}", server.log());
    let lone = answer["id"].as_str().unwrap().to_string();
    let taken = server.get("snapshots", &lone).unwrap();
    assert_eq!(taken["spec"]["scope"], "Full");
    let lone_image = taken["status"]["rootfsImage"].as_str().unwrap().to_string();
    assert!(image_present(&lone_image));
    delete(&server, "snapshots", &lone);
    server.wait_gone("snapshots", &lone);
    assert!(!image_present(&lone_image), "removed with its snapshot");
    for sb in [plain, other] {
        delete(&server, "sandboxes", &sb);
    }
    delete(&server, "snapshots", &ws);
}

#[test]
fn a_full_snapshot_of_a_read_only_root_is_refused_with_its_reason() {
    let server = Server::start();
    let name = unique("ro");
    create(
        &server,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE}),
    );
    server.wait_running(&name);
    let snap = unique("s");
    let taken = snapshot(&server, &snap, &name, "Full");
    assert_eq!(taken["status"]["phase"], "Failed", "{taken:#}");
    let message = taken["status"]["message"].as_str().unwrap();
    assert!(message.contains("read-only root filesystem"), "{message}");
    assert!(message.contains("Workspace snapshot"), "{message}");
    let ready = taken["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["reason"], "ReadOnlyRootfs");
    // Nothing was made: no data file, no image.
    assert!(!server
        .data_dir
        .join("snapshots")
        .join(format!("{snap}.tar"))
        .exists());
    // /v1 says why, as a bad request.
    let (code, answer) = server.request(
        "POST",
        &format!("/v1/sandboxes/{name}/snapshots"),
        Some(&json!({"scope": "Full"})),
    );
    assert_eq!(code, 400, "{answer}");
    assert!(
        answer.to_string().contains("read-only root filesystem"),
        "{answer}"
    );
    let (code, answer) = server.request(
        "POST",
        &format!("/v1/sandboxes/{name}/snapshots"),
        Some(&json!({"scope": "Everything"})),
    );
    assert!(code == 400 || code == 422, "{code} {answer}");
    assert!(answer.to_string().contains("body.scope"), "{answer}");
    let uid = taken["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    assert!(!docker_status(&[
        "image",
        "inspect",
        &format!("agent-sandbox-snapshot:{uid}")
    ]));
    delete(&server, "sandboxes", &name);
}

/// A snapshot archive of `manifest` and its entries, as a well-behaved writer makes it.
fn archive_of(manifest: &Value, workspace: &[u8], rootfs: &[u8]) -> Vec<u8> {
    archive_with(
        manifest,
        &[("workspace.tar", workspace), ("rootfs.tar", rootfs)],
    )
}

/// `manifest` made to describe `rootfs` truthfully, so that only its content can be refused.
fn describing(manifest: &Value, rootfs: &[u8]) -> Value {
    let mut manifest = manifest.clone();
    let digest = sha256(rootfs);
    manifest["entries"][1]["sizeBytes"] = json!(rootfs.len());
    manifest["entries"][1]["digest"] = json!(digest);
    manifest["snapshot"]["status"]["rootfsDigest"] = json!(digest);
    manifest
}

/// One raw tar entry named as given, even where a tar library would refuse the name.
fn raw_entry(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = tar::Header::new_ustar();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut out = header.as_bytes().to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
    out.extend_from_slice(&[0u8; 1024]);
    out
}

/// The images labeled as this server's snapshots.
fn snapshot_images(server: &Server) -> Vec<String> {
    let id = std::fs::read_to_string(server.data_dir.join("server-id")).unwrap();
    let out = std::process::Command::new("docker")
        .args([
            "images",
            "-q",
            "--filter",
            &format!("label=io.agent-sandbox.server={}", id.trim()),
            "--filter",
            "label=io.agent-sandbox.snapshot",
        ])
        .output()
        .unwrap();
    let mut ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    ids.sort();
    ids
}

/// `archive` imported as `name` is refused with `status`, in words containing `says`, leaving
/// no snapshot, no data or temp file and no image.
fn refused(server: &Server, name: &str, archive: &[u8], status: u16, says: &str) {
    let files = snapshot_files(server);
    let images = snapshot_images(server);
    let (got, answer) = import(server, name, archive);
    let message = answer["error"]["message"].as_str().unwrap_or_default();
    assert_eq!(got, status, "{says}: {answer}");
    assert!(message.contains(says), "expected {says:?} in {message:?}");
    assert!(server.get("snapshots", name).is_none(), "{says}");
    wait_until(
        "the import's temp files to go",
        Duration::from_secs(10),
        || snapshot_files(server) == files,
    );
    assert_eq!(snapshot_images(server), images, "{says}: an image was left");
}

#[test]
fn a_full_snapshot_archive_imports_with_its_root_filesystem_on_another_server() {
    let source = Server::start();
    let cap = 1024 * 1024;
    let target = Server::start_with(&[
        ("AGENT_SANDBOX_MAX_SNAPSHOT_BYTES", &cap.to_string()),
        ("AGENT_SANDBOX_RESYNC_SECONDS", "1"),
    ]);
    let name = unique("fxsrc");
    create(
        &source,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE, "readOnlyRootfs": false}),
    );
    source.wait_running(&name);
    as_root(&name, CHANGES);
    let (code, _) = docker_exec(&name, "echo 'from the workspace' > /workspace/note");
    assert_eq!(code, 0);
    let changed = look(&name);
    let snap = unique("fxsnap");
    let taken = snapshot(&source, &snap, &name, "Full");
    assert_eq!(taken["status"]["phase"], "Ready", "{taken:#}");
    let digest = taken["status"]["digest"].as_str().unwrap().to_string();
    let rootfs_digest = taken["status"]["rootfsDigest"]
        .as_str()
        .unwrap()
        .to_string();

    // manifest.json (format 2), the workspace, then the layer of the snapshot's image.
    let (code, archive) = http_bytes(
        &source,
        "GET",
        &format!("{API}/snapshots/{snap}/export"),
        b"",
    );
    assert_eq!(code, 200, "{}", String::from_utf8_lossy(&archive));
    let parts = entries(&archive);
    let names: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["manifest.json", "workspace.tar", "rootfs.tar"]);
    let manifest: Value = serde_json::from_slice(&parts[0].1).unwrap();
    assert_eq!(manifest["formatVersion"], 2);
    assert_eq!(manifest["baseImage"], TEST_IMAGE);
    assert_eq!(manifest["entries"][1]["digest"], rootfs_digest.as_str());
    assert_eq!(sha256(&parts[1].1), digest);
    assert_eq!(sha256(&parts[2].1), rootfs_digest);
    let (workspace, layer) = (&parts[1].1, &parts[2].1);
    let layer_names: Vec<String> = entries(layer).into_iter().map(|(n, _)| n).collect();
    assert!(
        layer_names.iter().any(|n| n == "bin/.wh.vi"),
        "the deletion travels as a whiteout: {layer_names:?}"
    );

    // Hostile root filesystem parts, refused before anything is stored or loaded.
    let bad = unique("fxbad");
    let mut wrong = manifest.clone();
    let other = format!("sha256:{}", "ab".repeat(32));
    wrong["entries"][1]["digest"] = json!(other);
    wrong["snapshot"]["status"]["rootfsDigest"] = json!(other);
    refused(
        &target,
        &bad,
        &archive_of(&wrong, workspace, layer),
        422,
        "rootfs.tar does not match its digest",
    );
    let cut = &archive[..archive.len() - 1024 - layer.len() / 2];
    refused(&target, &bad, cut, 422, "truncated");
    let big = {
        let mut builder = tar::Builder::new(Vec::new());
        let data = vec![7u8; cap as usize + 1];
        let mut header = tar::Header::new_ustar();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        builder
            .append_data(&mut header, "big", data.as_slice())
            .unwrap();
        builder.into_inner().unwrap()
    };
    refused(
        &target,
        &bad,
        &archive_of(&describing(&manifest, &big), workspace, &big),
        413,
        "AGENT_SANDBOX_MAX_SNAPSHOT_BYTES",
    );
    let escape = raw_entry("../escape", b"x");
    refused(
        &target,
        &bad,
        &archive_of(&describing(&manifest, &escape), workspace, &escape),
        422,
        "rootfs.tar is refused",
    );

    // A base image this host does not have: pulled first, and when that fails (a registry on a
    // closed loopback port) the import is refused naming the image; with the pull policy Never
    // it is not even tried.
    let missing_base = "127.0.0.1:9/agent-sandbox-test/missing:latest";
    let mut elsewhere = manifest.clone();
    elsewhere["baseImage"] = json!(missing_base);
    elsewhere["snapshot"]["status"]["image"] = json!(missing_base);
    elsewhere["snapshot"]["status"]["sandboxSpec"]["image"] = json!(missing_base);
    refused(
        &target,
        &bad,
        &archive_of(&elsewhere, workspace, layer),
        422,
        &format!("base image {missing_base} is not on this Docker host and pulling it failed"),
    );
    elsewhere["snapshot"]["status"]["sandboxSpec"]["imagePullPolicy"] = json!("Never");
    refused(
        &target,
        &bad,
        &archive_of(&elsewhere, workspace, layer),
        422,
        &format!(
            "base image {missing_base} is not on this Docker host and the pull policy is Never"
        ),
    );

    // The good archive: a Ready Full snapshot with the same digests and an image of its own.
    let imported = unique("fximp");
    let (code, answer) = import(&target, &imported, &archive);
    assert_eq!(code, 201, "{answer}\n{}", target.log());
    let status = &answer["status"];
    assert_eq!(status["phase"], "Ready", "{answer}");
    assert_eq!(status["scope"], "Full");
    assert_eq!(status["digest"], digest.as_str());
    assert_eq!(status["rootfsDigest"], rootfs_digest.as_str());
    let image = status["rootfsImage"].as_str().unwrap().to_string();
    assert_ne!(
        Some(image.as_str()),
        taken["status"]["rootfsImage"].as_str()
    );
    let inspected = inspect(&["--type", "image", &image]).unwrap();
    assert_eq!(
        inspected["Config"]["Labels"]["io.agent-sandbox.snapshot"],
        answer["metadata"]["uid"]
    );
    let layers = inspected["RootFS"]["Layers"].as_array().unwrap().clone();
    assert_eq!(layers.last().unwrap(), rootfs_digest.as_str());
    // Dated now, so that garbage collection spares it until its snapshot is stored.
    let created = inspected["Created"].as_str().unwrap();
    let age = chrono::Utc::now()
        - chrono::DateTime::parse_from_rfc3339(created)
            .unwrap()
            .to_utc();
    assert!(age.num_seconds().abs() < 600, "{created}");

    // A fork on the second server shows all four changes.
    let child = unique("fxchild");
    create(
        &target,
        "sandboxes",
        "Sandbox",
        &child,
        json!({"image": TEST_IMAGE, "readOnlyRootfs": false, "source": {"snapshot": imported}}),
    );
    target.wait_running(&child);
    assert_eq!(look(&child), changed);
    assert_eq!(as_root(&child, "/usr/local/bin/tool-link"), "tool-ran\n");

    // Deleting the imported snapshot removes its image once its fork is gone.
    delete(&target, "sandboxes", &child);
    target.wait_gone("sandboxes", &child);
    delete(&target, "snapshots", &imported);
    target.wait_gone("snapshots", &imported);
    wait_until("the imported snapshot's image removed", LONG, || {
        !image_present(&image)
    });
    delete(&source, "sandboxes", &name);
    delete(&source, "snapshots", &snap);
}
