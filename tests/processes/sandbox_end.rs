//! Expiry and deletion end a sandbox's processes with it: followers and attached clients open
//! at that moment are let go at once without a made-up `exit` (the process did not exit: its
//! sandbox went), nothing hangs, and the processes are gone with their sandbox, or `Lost` in a
//! folder sandbox that is kept `Expired`.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::must_hold::{follow_all, raw_get, Followed};
use super::*;

/// Long enough for a loaded machine to start the sandboxes and their processes before it is up.
const TTL_SECONDS: u64 = 25;

/// A running process, with a follower of its output and an attached WebSocket open on it.
struct Watched {
    sb: String,
    id: String,
    /// The process's host pid, under runc (under gVisor it lives in the sandbox's own kernel).
    host_pid: Option<u32>,
    follower: mpsc::Receiver<Followed>,
    attach: mpsc::Receiver<Option<Value>>,
}

fn watch(server: &Server, sb: &str) -> Watched {
    let p = start(
        server,
        sb,
        json!({"command": "echo started; exec sleep 3000"}),
    );
    let id = p["id"].as_str().unwrap().to_string();
    wait_output(server, sb, &id, "started\n");
    let host_pid = (test_runtime() != "runsc").then(|| {
        let top = docker(&["top", &format!("agent-sandbox-{sb}"), "-eo", "pid,args"]);
        top.lines()
            .find(|l| l.contains("sleep 3000"))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|pid| pid.parse().ok())
            .unwrap_or_else(|| panic!("no sleep 3000 in docker top:\n{top}"))
    });

    let stream = raw_get(server, &format!("{}/{id}/output?follow=true", procs(sb)));
    let (tx, follower) = mpsc::channel();
    std::thread::spawn(move || tx.send(follow_all(stream)));
    let mut ws = websocket(server, &format!("{}/{id}/attach", procs(sb)));
    let (tx, attach) = mpsc::channel();
    std::thread::spawn(move || tx.send(until_status(&mut ws, None).2));
    Watched {
        sb: sb.to_string(),
        id,
        host_pid,
        follower,
        attach,
    }
}

/// The follower and the attached client were let go without an exit, and the process is dead.
fn ended_without_exit(w: &Watched, within: Duration) {
    let seen = w.follower.recv_timeout(within).unwrap_or_else(|e| {
        panic!(
            "{}: the follower: {e:?} (still hanging, or it failed)",
            w.sb
        )
    });
    assert_eq!(seen.skipped, 0);
    assert_eq!(seen.data, "started\n".len() as u64, "{}", w.sb);
    for fake in ["exit", "running"] {
        assert_ne!(
            seen.last["type"], fake,
            "{}: the follower's stream ended with {}",
            w.sb, seen.last
        );
    }
    let status = w
        .attach
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| {
            panic!(
                "{}: the attached client: {e:?} (still hanging, or it failed)",
                w.sb
            )
        });
    if let Some(status) = status {
        assert_eq!(status["reason"], "Lost", "{}: {status}", w.sb);
        assert!(status.get("exitCode").is_none(), "{}: {status}", w.sb);
    }
    if let Some(pid) = w.host_pid {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&cmdline).contains("sleep"),
            "{}: pid {pid} still runs",
            w.sb
        );
    }
}

/// A request about the process answers at once, with `status`.
fn answers(server: &Server, w: &Watched, status: u16) -> Value {
    let asked = Instant::now();
    let (got, body) = server.request("GET", &format!("{}/{}", procs(&w.sb), w.id), None);
    assert!(asked.elapsed() < Duration::from_secs(30), "a GET hung");
    assert_eq!(got, status, "{}: {body}", w.sb);
    body
}

#[test]
fn expiry_and_deletion_end_processes_without_a_fake_exit() {
    let server = Server::start();
    let pids = if test_runtime() == "runsc" {
        "  pidsLimit: 4096\n"
    } else {
        ""
    };
    // Made through the API: deleted when it expires.
    let api = unique("proc-ttl-api");
    let mut spec = json!({"image": TEST_IMAGE, "ttlSeconds": TTL_SECONDS});
    if !pids.is_empty() {
        spec["pidsLimit"] = json!(4096);
    }
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": api}, "spec": spec});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    // Declared in the watched folder: kept, `Expired`, until its document changes.
    let folder = unique("proc-ttl-dir");
    write_manifest(
        &server.watch_dir,
        "ttl.yaml",
        &sandbox_manifest(&folder, &format!("  ttlSeconds: {TTL_SECONDS}\n{pids}")),
    );
    // Deleted by its user.
    let deleted = sandbox(&server);
    server.wait_running(&api);
    server.wait_running(&folder);

    let (api_w, folder_w, deleted_w) = (
        watch(&server, &api),
        watch(&server, &folder),
        watch(&server, &deleted),
    );

    let (status, body) = server.request("DELETE", &format!("/v1/sandboxes/{deleted}"), None);
    assert!(status == 200 || status == 204, "{status} {body}");
    ended_without_exit(&deleted_w, Duration::from_secs(60));
    answers(&server, &deleted_w, 404);
    wait_until(
        "the deleted container removed",
        Duration::from_secs(60),
        || containers_of(&deleted).is_empty(),
    );

    // Expiry: within the time to live and the controller's round after it.
    let within = Duration::from_secs(TTL_SECONDS + 60);
    ended_without_exit(&api_w, within);
    server.wait_gone("sandboxes", &api);
    answers(&server, &api_w, 404);
    wait_until(
        "the expired container removed",
        Duration::from_secs(30),
        || containers_of(&api).is_empty(),
    );

    ended_without_exit(&folder_w, within);
    server.wait_for(
        "sandboxes",
        &folder,
        "Expired",
        Duration::from_secs(30),
        |r| r.is_some_and(|r| r["status"]["phase"] == "Expired"),
    );
    wait_until(
        "the expired container removed",
        Duration::from_secs(30),
        || containers_of(&folder).is_empty(),
    );
    let body = answers(&server, &folder_w, 200);
    assert_eq!(body["state"], "Lost", "{body}");
    assert!(body["exitCode"].is_null(), "{body}");
}
