//! `agent-sandbox gc` against the real daemon. The daemon is shared, so every run of the command
//! here is narrowed with `--selector`: to a label only this test's objects carry, or to the
//! identity of the live server this test starts. Objects of a dead identity go, a live server's
//! stay (its sandbox keeps running), the reference server's go only with `--all-servers`, and
//! `--dry-run` removes nothing.

mod common;

use std::process::Command;

use common::*;
use serde_json::json;

const MANAGED: &str = "io.agent-sandbox.managed=true";
const TEST_LABEL: &str = "io.agent-sandbox.test-gc";

/// Removes every object carrying this test's label, whatever happened.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let filter = format!("label={TEST_LABEL}={}", self.0);
        for id in docker(&["ps", "-aq", "--filter", &filter]).split_whitespace() {
            docker(&["rm", "-f", id]);
        }
        for name in docker(&["volume", "ls", "-q", "--filter", &filter]).split_whitespace() {
            docker(&["volume", "rm", "-f", name]);
        }
    }
}

fn gc(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .arg("gc")
        .args(args)
        .output()
        .expect("run agent-sandbox gc");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// A never-started container and a volume with `labels` (and the test's own label).
fn make_objects(name: &str, test: &str, labels: &[String]) {
    let mut args: Vec<String> = vec!["create".into(), "--name".into(), name.into()];
    let mut volume: Vec<String> = vec!["volume".into(), "create".into()];
    for label in labels
        .iter()
        .cloned()
        .chain([format!("{TEST_LABEL}={test}")])
    {
        args.extend(["--label".into(), label.clone()]);
        volume.extend(["--label".into(), label]);
    }
    args.extend([TEST_IMAGE.into(), "true".into()]);
    volume.push(name.into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(docker_status(&args), "docker {args:?}");
    let volume: Vec<&str> = volume.iter().map(String::as_str).collect();
    assert!(docker_status(&volume), "docker {volume:?}");
}

fn exists(name: &str) -> (bool, bool) {
    (
        docker_status(&["container", "inspect", name]),
        docker_status(&["volume", "inspect", name]),
    )
}

#[test]
fn gc_takes_what_no_running_server_claims() {
    let test = unique("gc");
    let _cleanup = Cleanup(test.clone());
    let selector = format!("{TEST_LABEL}={test}");
    let dead_identity = format!("{:016x}", rand::random::<u64>());
    let (dead, reference) = (format!("{test}-dead"), format!("{test}-reference"));
    make_objects(
        &dead,
        &test,
        &[
            MANAGED.into(),
            format!("io.agent-sandbox.server={dead_identity}"),
        ],
    );
    make_objects(&reference, &test, &[MANAGED.into()]);

    // A live server with a real sandbox, and its heartbeat on the daemon.
    let server = Server::start();
    let live_identity = std::fs::read_to_string(server.data_dir.join("server-id"))
        .unwrap()
        .trim()
        .to_string();
    let beat = format!("label=io.agent-sandbox.heartbeat={live_identity}");
    assert!(
        !docker(&["volume", "ls", "-q", "--filter", &beat])
            .trim()
            .is_empty(),
        "no heartbeat of the live server"
    );
    let sandbox = unique("gc-live");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": sandbox}, "spec": {"image": TEST_IMAGE}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&sandbox);

    // A dry run lists the dead identity's and (with --all-servers) the reference's objects and
    // removes nothing.
    let (ok, out) = gc(&["--dry-run", "--all-servers", "--selector", &selector]);
    assert!(ok, "{out}");
    for name in [&dead, &reference] {
        assert!(
            out.contains(&format!("would remove container {name}")),
            "{out}"
        );
        assert!(
            out.contains(&format!("would remove volume {name}")),
            "{out}"
        );
        assert_eq!(exists(name), (true, true), "{name} after a dry run");
    }
    assert!(out.contains(&live_identity), "live servers listed: {out}");

    // Without --all-servers only the dead identity's objects go.
    let (ok, out) = gc(&["--selector", &selector]);
    assert!(ok, "{out}");
    assert_eq!(exists(&dead), (false, false), "{out}");
    assert_eq!(exists(&reference), (true, true), "{out}");

    // With it the reference server's go too.
    let (ok, out) = gc(&["--all-servers", "--selector", &selector]);
    assert!(ok, "{out}");
    assert_eq!(exists(&reference), (false, false), "{out}");

    // Everything of the live server is claimed: nothing is taken, its sandbox keeps running.
    let mine = format!("io.agent-sandbox.server={live_identity}");
    assert!(!containers_of(&sandbox).is_empty());
    let (ok, out) = gc(&["--all-servers", "--selector", &mine]);
    assert!(ok, "{out}");
    assert!(
        out.contains("removed 0 container(s) and 0 volume(s)"),
        "{out}"
    );
    assert!(!containers_of(&sandbox).is_empty());
    assert!(!volumes_of(&sandbox).is_empty());
    let (code, said) = server.exec(&sandbox, "echo alive");
    assert_eq!((code, said.as_str()), (0, "alive\n"));
}
