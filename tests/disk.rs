//! `spec.diskMB` against a real server and Docker (runc, or runsc with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): a `dd` past the limit fails inside the sandbox with "no
//! space" and the next command still runs; the writes stay in the sandbox's own file system
//! (the host and another sandbox are unaffected); raising the limit applies to the running
//! container; a rollback keeps the limit; a kill -9 and restart keep it, and a deletion leaves
//! no mount, loop device or image behind; a quota's `workspaceMB` refuses a sandbox that would
//! pass it, with the numbers, and one without a limit, naming the field.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

use common::{docker_exec, unique, Server, API, TEST_IMAGE};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(90);

fn put_sandbox(server: &Server, method: &str, name: &str, spec: Value) -> (u16, Value) {
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": spec,
    });
    let path = match method {
        "POST" => format!("{API}/sandboxes"),
        _ => format!("{API}/sandboxes/{name}"),
    };
    server.request(method, &path, Some(&body))
}

fn create(server: &Server, name: &str, spec: Value) {
    let (status, answer) = put_sandbox(server, "POST", name, spec);
    assert_eq!(status, 201, "{answer}");
}

/// Runs `script` in the sandbox as its user; exit code and output (stderr included).
fn run(name: &str, script: &str) -> (i32, String) {
    docker_exec(name, &format!("{{ {script} ; }} 2>&1"))
}

/// The space left at `/workspace` in MiB, as the sandbox sees it.
fn available_mb(name: &str) -> u64 {
    let (code, out) = run(name, "df -m /workspace | tail -n 1");
    assert_eq!(code, 0, "{out}");
    out.split_whitespace()
        .nth(3)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("df: {out}"))
}

/// Mounts and loop devices of this data directory, as the host shows them.
fn host_leftovers(data_dir: &Path) -> Vec<String> {
    let data = data_dir.to_string_lossy().to_string();
    let mut found: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(&data))
        .map(str::to_string)
        .collect();
    let loops = std::process::Command::new("losetup")
        .arg("-a")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
        .unwrap_or_default();
    found.extend(
        loops
            .lines()
            .filter(|l| l.contains(&data))
            .map(str::to_string),
    );
    found
}

fn disk_files(data_dir: &Path) -> Vec<String> {
    std::fs::read_dir(data_dir.join("disks"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn writes_past_disk_mb_fail_with_no_space_and_raising_it_applies_live() {
    let server = Server::start();
    let (limited, other) = (unique("disk"), unique("disk-other"));
    create(
        &server,
        &limited,
        json!({"image": TEST_IMAGE, "diskMB": 40}),
    );
    create(&server, &other, json!({"image": TEST_IMAGE, "diskMB": 200}));
    let running = server.wait_running(&limited);
    server.wait_running(&other);
    let container = running["status"]["containerID"].clone();
    let size = available_mb(&limited);
    assert!((36..=40).contains(&size), "40 MiB to write: {size}");

    let (code, out) = run(
        &limited,
        "dd if=/dev/zero of=/workspace/big bs=1M count=64 && sync /workspace/big",
    );
    assert_ne!(code, 0, "dd past diskMB must fail: {out}");
    assert!(out.contains("No space left on device"), "{out}");
    let (code, out) = run(&limited, "echo still-here");
    assert_eq!((code, out.trim()), (0, "still-here"));

    // The other sandbox and the host are unaffected: the other writes what its limit allows,
    // and the full sandbox's bytes are all inside its own image.
    let (code, out) = run(
        &other,
        "dd if=/dev/zero of=/workspace/f bs=1M count=64 && echo written",
    );
    assert_eq!(code, 0, "{out}");
    let images: Vec<_> = disk_files(&server.data_dir)
        .into_iter()
        .filter(|f| f.ends_with(".img"))
        .collect();
    assert_eq!(images.len(), 2, "{images:?}");
    for image in &images {
        let meta = std::fs::metadata(server.data_dir.join("disks").join(image)).unwrap();
        assert!(
            meta.blocks() * 512 <= 200 << 20,
            "{image} holds {} bytes",
            meta.blocks() * 512
        );
    }

    // Raising the limit grows the file system under the running container.
    let (status, answer) = put_sandbox(
        &server,
        "PUT",
        &limited,
        json!({"image": TEST_IMAGE, "diskMB": 120}),
    );
    assert_eq!(status, 200, "{answer}");
    // 40 MiB are written: 80 more.
    common::wait_until("the limit raised", LONG, || available_mb(&limited) > 60);
    let (code, out) = run(
        &limited,
        "rm /workspace/big && dd if=/dev/zero of=/workspace/big bs=1M count=64 && echo ok",
    );
    assert_eq!(code, 0, "{out}");
    let now = server.get("sandboxes", &limited).unwrap();
    assert_eq!(
        now["status"]["containerID"], container,
        "the same container: {now}"
    );
    let (code, out) = run(
        &limited,
        "dd if=/dev/zero of=/workspace/more bs=1M count=100",
    );
    assert_ne!(code, 0, "the new limit holds too: {out}");
    assert!(out.contains("No space left on device"), "{out}");
}

#[test]
fn a_rollback_keeps_the_limit_and_nothing_outlives_a_crash_and_a_deletion() {
    let mut server = Server::start();
    let name = unique("disk-rb");
    create(&server, &name, json!({"image": TEST_IMAGE, "diskMB": 32}));
    server.wait_running(&name);
    let (code, out) = run(&name, "echo kept > /workspace/file");
    assert_eq!(code, 0, "{out}");
    let snap = unique("disk-snap");
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Snapshot",
        "metadata": {"name": snap},
        "spec": {"sandbox": name},
    });
    let (status, answer) = server.request("POST", &format!("{API}/snapshots"), Some(&body));
    assert_eq!(status, 201, "{answer}");
    let done = server
        .wait_for("snapshots", &snap, "Ready", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Ready" || r["status"]["phase"] == "Failed")
        })
        .unwrap();
    assert_eq!(done["status"]["phase"], "Ready", "{done}");

    // A kill -9 and a restart: the same workspace, still limited.
    server.restart();
    server.wait_running(&name);
    let (status, answer) = put_sandbox(
        &server,
        "PUT",
        &name,
        json!({"image": TEST_IMAGE, "diskMB": 32,
               "rollback": {"snapshot": snap, "requestId": "r-1"}}),
    );
    assert_eq!(status, 200, "{answer}");
    server.wait_for("sandboxes", &name, "rolled back", LONG, |r| {
        r.is_some_and(|r| {
            r["status"]["lastRollback"]["requestId"] == "r-1" && r["status"]["phase"] == "Running"
        })
    });
    assert_eq!(run(&name, "cat /workspace/file").1.trim(), "kept");
    let (code, out) = run(&name, "dd if=/dev/zero of=/workspace/big bs=1M count=64");
    assert_ne!(code, 0, "the rolled-back workspace is limited too: {out}");
    assert!(out.contains("No space left on device"), "{out}");

    let (status, answer) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert!(status == 200 || status == 202, "{status} {answer}");
    server.wait_gone("sandboxes", &name);
    common::wait_until("no disk left", LONG, || {
        disk_files(&server.data_dir).is_empty() && host_leftovers(&server.data_dir).is_empty()
    });
}

#[test]
fn a_quota_with_workspace_mb_refuses_what_would_pass_it() {
    let server = Server::start();
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "disk"},
        "spec": {"workspaceMB": 100},
    });
    let (status, answer) = server.request("POST", &format!("{API}/resourcequotas"), Some(&body));
    assert_eq!(status, 201, "{answer}");
    let (a, b) = (unique("wq-a"), unique("wq-b"));
    create(&server, &a, json!({"image": TEST_IMAGE, "diskMB": 60}));
    let (code, out) = put_sandbox(
        &server,
        "POST",
        &b,
        json!({"image": TEST_IMAGE, "diskMB": 60}),
    );
    assert_eq!(code, 403, "{out}");
    assert_eq!(out["error"]["code"], "quota_exceeded", "{out}");
    assert_eq!(
        out["error"]["message"],
        "ResourceQuota \"disk\" of namespace \"default\" allows 100 workspaceMB: 60 used, 60 \
         more requested"
    );
    let (code, out) = put_sandbox(&server, "POST", &b, json!({"image": TEST_IMAGE}));
    assert_eq!(code, 403, "{out}");
    assert_eq!(out["error"]["code"], "quota_exceeded", "{out}");
    let message = out["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("spec.diskMB"), "{message}");
    create(&server, &b, json!({"image": TEST_IMAGE, "diskMB": 40}));
    server.wait_for("resourcequotas", "disk", "counted", LONG, |q| {
        q.is_some_and(|q| q["status"]["used"]["workspaceMB"] == 100)
    });
}
