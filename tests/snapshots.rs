//! Snapshots, rollback, sources and forks against the real Docker daemon and the busybox test
//! image, through the resource API of a real server: what a snapshot stores, what a restore
//! brings back (contents, empty directories, symlinks, hard links, modes, mtimes), consistency
//! under a concurrent writer, limits, idempotent rollback, forks scaling and deletion, and a
//! tampered data directory.

mod common;

use std::io::Read;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const LONG: Duration = Duration::from_secs(90);

fn replace(server: &Server, plural: &str, kind: &str, name: &str, spec: Value) {
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    });
    let (status, answer) = server.request("PUT", &format!("{API}/{plural}/{name}"), Some(&body));
    assert_eq!(status, 200, "{answer}");
}

fn delete(server: &Server, plural: &str, name: &str) {
    let (status, answer) = server.request("DELETE", &format!("{API}/{plural}/{name}"), None);
    assert!(status == 200 || status == 202, "{status} {answer}");
}

fn sandbox(server: &Server, name: &str, extra: Value) -> Value {
    let mut spec = json!({"image": TEST_IMAGE});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
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
        .wait_for("snapshots", name, "settled", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Ready" || r["status"]["phase"] == "Failed")
        })
        .unwrap()
}

fn exec(name: &str, script: &str) -> String {
    let (code, out) = docker_exec(name, script);
    assert_eq!(code, 0, "{script}: {out}");
    out
}

/// A tree with everything a restore must keep.
const TREE: &str = r#"
set -e
cd /workspace
mkdir -p src/pkg empty private
chmod 700 private
printf 'print("hi")\n' > src/main.py
chmod 755 src/main.py
printf 'secret' > private/key
chmod 600 private/key
head -c 300000 /dev/urandom > src/pkg/blob.bin
ln -s main.py src/link
ln -s /etc/hostname abs-link
ln -s missing dangling
ln src/main.py hard
printf 'x' > "name with spaces"
mkdir -p "$(printf 'd%.0s' $(seq 1 120))"
printf 'long' > "$(printf 'd%.0s' $(seq 1 120))/$(printf 'f%.0s' $(seq 1 120))"
touch -d '2021-02-03 04:05:06' src/main.py private
touch -h -d '2020-01-01 00:00:00' src/link
"#;

/// Everything a restore must reproduce, one line per path: type+mode, owner, size, mtime, link
/// target, and the content digest for files.
const LISTING: &str = r#"cd /workspace && find . -mindepth 1 | sort | while read -r p; do
  s=$(stat -c '%F %a %u:%g %s %Y' "$p")
  if [ -L "$p" ]; then echo "$p $s -> $(readlink "$p")";
  elif [ -f "$p" ]; then echo "$p $s $(md5sum < "$p" | cut -c1-32) links=$(stat -c %h "$p")";
  else echo "$p ${s% *}"; fi
done"#;

fn listing(name: &str) -> String {
    exec(name, LISTING)
}

fn sha256_file(path: &std::path::Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    format!("sha256:{}", hex::encode(Sha256::digest(&bytes)))
}

/// Volumes named after the sandbox's workspace, by name (a label filter makes Docker inspect every
/// volume, which fails when another test removes one at the same moment).
fn workspace_volumes(name: &str) -> Vec<String> {
    let filter = format!("name=agent-sandbox-{name}-workspace");
    let output = std::process::Command::new("docker")
        .args(["volume", "ls", "-q", "--filter", &filter])
        .output()
        .expect("docker CLI");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut names: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .map(str::to_string)
        .collect();
    names.sort();
    names
}

fn condition(resource: &Value, type_: &str) -> Value {
    resource["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

#[test]
fn snapshot_rollback_and_fork_restore_the_workspace_faithfully() {
    let server = Server::start();
    let name = unique("snap");
    sandbox(
        &server,
        &name,
        json!({"memoryMB": 128, "env": {"MODE": "one"}}),
    );
    exec(&name, TREE);
    let before = listing(&name);
    assert!(before.contains("./empty directory"), "{before}");
    assert!(before.contains("-> /etc/hostname"), "{before}");

    // Taken once, Ready, with the size and digest of what is stored.
    let snap = unique("s");
    let taken = snapshot(&server, &snap, &name);
    assert_eq!(taken["status"]["phase"], "Ready", "{taken:#}");
    let data = server
        .data_dir
        .join("snapshots")
        .join(format!("{snap}.tar"));
    let size = std::fs::metadata(&data).unwrap().len();
    assert_eq!(taken["status"]["sizeBytes"], size);
    assert_eq!(taken["status"]["digest"], sha256_file(&data));
    assert_eq!(taken["status"]["image"], TEST_IMAGE);
    let captured = &taken["status"]["sandboxSpec"];
    assert_eq!(captured["memoryMB"], 128);
    assert_eq!(captured["env"]["MODE"], "one");
    assert_eq!(captured["readOnlyRootfs"], true);
    assert!(captured["cpus"].is_number() && captured["pidsLimit"].is_number());
    assert!(captured.get("ttlSeconds").is_none() && captured.get("rollback").is_none());
    // The container runs again, unpaused.
    let c = container(&name).unwrap();
    assert_eq!(c["State"]["Paused"], false);
    assert_eq!(c["State"]["Running"], true);

    // Change everything, leave a process and /tmp state behind, then roll back.
    exec(&name, "rm -rf /workspace/src /workspace/empty && echo new > /workspace/new && chmod 777 /workspace/private && echo t > /tmp/marker");
    let volume_before =
        server.get("sandboxes", &name).unwrap()["status"]["workspaceVolume"].clone();
    let rollback = |request: &str| {
        replace(
            &server,
            "sandboxes",
            "Sandbox",
            &name,
            json!({"image": TEST_IMAGE, "memoryMB": 128, "env": {"MODE": "one"},
                   "rollback": {"snapshot": snap, "requestId": request}}),
        );
        server
            .wait_for("sandboxes", &name, "rolled back", LONG, |r| {
                r.is_some_and(|r| {
                    r["status"]["lastRollback"]["requestId"] == request
                        && r["status"]["phase"] == "Running"
                        && condition(r, "Ready")["status"] == "True"
                })
            })
            .unwrap()
    };
    let rolled = rollback("r-1");
    assert_eq!(
        listing(&name),
        before,
        "rollback restores the workspace exactly"
    );
    assert_eq!(rolled["status"]["sourceSnapshot"], snap.as_str());
    assert_ne!(rolled["status"]["workspaceVolume"], volume_before);
    let (code, _) = docker_exec(&name, "test -e /tmp/marker");
    assert_ne!(code, 0, "/tmp starts empty after a rollback");
    assert_eq!(server.exec(&name, "echo $MODE"), (0, "one\n".into()));
    wait_until("old workspace removed", LONG, || {
        volumes_of(&name).len() == 1
    });

    // The same request is never repeated, not even by a restarted server.
    exec(&name, "echo after > /workspace/after");
    let completed = rolled["status"]["lastRollback"]["completedAt"].clone();
    let mut server = server;
    server.restart();
    server.wait_running(&name);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(exec(&name, "cat /workspace/after"), "after\n");
    let again = server.get("sandboxes", &name).unwrap();
    assert_eq!(again["status"]["lastRollback"]["completedAt"], completed);

    // The snapshot outlives its sandbox.
    delete(&server, "sandboxes", &name);
    server.wait_gone("sandboxes", &name);
    let kept = server.get("snapshots", &snap).expect("snapshot survives");
    assert_eq!(kept["status"]["phase"], "Ready");
    assert!(data.exists());

    // A fork of three, each with the snapshot's workspace and captured spec.
    let fork = unique("f");
    create(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": snap, "replicas": 3, "overrides": {"cpus": 0.5}}),
    );
    let ready = server
        .wait_for("forks", &fork, "3 ready", LONG, |r| {
            r.is_some_and(|r| r["status"]["readyReplicas"] == 3 && r["status"]["phase"] == "Ready")
        })
        .unwrap();
    let children: Vec<String> = (0..3).map(|i| format!("{fork}-{i}")).collect();
    assert_eq!(ready["status"]["children"], json!(children));
    for child in &children {
        let sb = server.get("sandboxes", child).unwrap();
        assert_eq!(sb["metadata"]["ownerReferences"][0]["kind"], "Fork");
        assert_eq!(sb["metadata"]["ownerReferences"][0]["name"], fork.as_str());
        assert_eq!(sb["spec"]["source"]["snapshot"], snap.as_str());
        assert_eq!(sb["spec"]["cpus"], 0.5);
        assert_eq!(sb["spec"]["memoryMB"], 128);
        assert_eq!(sb["status"]["sourceSnapshot"], snap.as_str());
        assert_eq!(
            listing(child),
            before,
            "fork {child} has the snapshot's workspace"
        );
        assert_eq!(server.exec(child, "echo $MODE"), (0, "one\n".into()));
    }
    // Children are independent.
    exec(&children[0], "echo mine > /workspace/own");
    assert_ne!(docker_exec(&children[1], "test -e /workspace/own").0, 0);

    // Scale down: the highest indices go.
    replace(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": snap, "replicas": 1, "overrides": {"cpus": 0.5}}),
    );
    server.wait_gone("sandboxes", &children[2]);
    server.wait_gone("sandboxes", &children[1]);
    server.wait_for("forks", &fork, "1 ready", LONG, |r| {
        r.is_some_and(|r| {
            r["status"]["readyReplicas"] == 1 && r["status"]["children"] == json!([children[0]])
        })
    });
    wait_until("scaled-down containers removed", LONG, || {
        containers_of(&children[1]).is_empty() && containers_of(&children[2]).is_empty()
    });
    assert!(server.get("sandboxes", &children[0]).is_some());

    // Deleting the fork deletes its children first.
    delete(&server, "forks", &fork);
    server.wait_gone("forks", &fork);
    assert!(server.get("sandboxes", &children[0]).is_none());
    wait_until("child objects removed", LONG, || {
        containers_of(&children[0]).is_empty() && volumes_of(&children[0]).is_empty()
    });

    // Deleting the snapshot frees its data.
    delete(&server, "snapshots", &snap);
    server.wait_gone("snapshots", &snap);
    assert!(!data.exists());
    assert!(
        snapshot_files(&server).is_empty(),
        "{:?}",
        snapshot_files(&server)
    );
}

#[test]
fn a_sandbox_started_from_a_source_gets_the_snapshot_and_refuses_later_source_changes() {
    let server = Server::start();
    let (origin, copy) = (unique("orig"), unique("copy"));
    sandbox(&server, &origin, json!({}));
    exec(&origin, TREE);
    let before = listing(&origin);
    let snap = unique("s");
    assert_eq!(
        snapshot(&server, &snap, &origin)["status"]["phase"],
        "Ready"
    );
    exec(&origin, "echo other > /workspace/other");
    let other = unique("s2");
    assert_eq!(
        snapshot(&server, &other, &origin)["status"]["phase"],
        "Ready"
    );

    let started = sandbox(&server, &copy, json!({"source": {"snapshot": snap}}));
    assert_eq!(started["status"]["sourceSnapshot"], snap.as_str());
    assert_eq!(listing(&copy), before);
    exec(&copy, "echo mine > /workspace/mine");

    // A changed source is refused (the field is immutable), and the workspace is not rebuilt.
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": copy},
        "spec": {"image": TEST_IMAGE, "source": {"snapshot": other}},
    });
    let (status, answer) = server.request("PUT", &format!("{API}/sandboxes/{copy}"), Some(&body));
    assert_eq!(status, 422, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("spec.source: field is immutable"),
        "{answer}"
    );
    let reported = server.wait_running(&copy);
    assert_eq!(reported["status"]["sourceSnapshot"], snap.as_str());
    assert_eq!(exec(&copy, "cat /workspace/mine"), "mine\n");
    assert_ne!(docker_exec(&copy, "test -e /workspace/other").0, 0);
}

#[test]
fn an_over_limit_snapshot_fails_cleanly_and_leaves_nothing() {
    let server = Server::start_with(&[("AGENT_SANDBOX_MAX_SNAPSHOT_BYTES", "1048576")]);
    let name = unique("big");
    sandbox(&server, &name, json!({}));
    exec(&name, "head -c 3000000 /dev/urandom > /workspace/big");
    let snap = unique("s");
    let failed = snapshot(&server, &snap, &name);
    assert_eq!(failed["status"]["phase"], "Failed", "{failed:#}");
    let ready = condition(&failed, "Ready");
    assert_eq!(ready["reason"], "TooLarge");
    assert!(
        ready["message"].as_str().unwrap().contains("1048576"),
        "{ready}"
    );
    assert!(failed["status"].get("digest").is_none());
    assert!(
        snapshot_files(&server).is_empty(),
        "{:?}",
        snapshot_files(&server)
    );
    let c = container(&name).unwrap();
    assert_eq!(c["State"]["Paused"], false);
    assert_eq!(exec(&name, "wc -c < /workspace/big").trim(), "3000000");

    // Missing and stopped sandboxes fail with their own reasons.
    let lost = unique("lost");
    create(
        &server,
        "snapshots",
        "Snapshot",
        &lost,
        json!({"sandbox": "no-such-sandbox"}),
    );
    let lost = server
        .wait_for("snapshots", &lost, "failed", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Failed")
        })
        .unwrap();
    assert_eq!(condition(&lost, "Ready")["reason"], "SandboxNotFound");
}

/// Reads one regular file out of a stored snapshot.
fn file_in_tar(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    let file = std::fs::File::open(path).unwrap();
    let mut archive = tar::Archive::new(file);
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.path_bytes().as_ref() == name.as_bytes() {
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            return Some(data);
        }
    }
    None
}

/// With the container paused during the export, a file replaced by rename is always whole, and a
/// file rewritten in place is captured as it was at one instant: never a torn read that breaks the
/// archive. (A file caught mid-rewrite is legitimately shorter; it is still one writer's bytes.)
#[test]
fn a_file_written_during_a_snapshot_is_wholly_in_or_out() {
    let server = Server::start();
    let name = unique("writer");
    sandbox(&server, &name, json!({}));
    let writer = "cd /workspace; i=0; while :; do i=$(( (i + 1) % 10 )); \
         head -c 1048576 /dev/zero | tr '\\0' \"$i\" > .next && mv .next renamed; \
         head -c 1048576 /dev/zero | tr '\\0' \"$i\" > inplace; done";
    let container_name = format!("agent-sandbox-{name}");
    assert!(docker_status(&[
        "exec",
        "-d",
        "-u",
        "1000:1000",
        &container_name,
        "sh",
        "-c",
        writer
    ]));
    wait_until("the writer produced a file", LONG, || {
        docker_exec(&name, "test -s /workspace/renamed").0 == 0
    });
    for round in 0..4 {
        let snap = unique(&format!("w{round}"));
        let taken = snapshot(&server, &snap, &name);
        assert_eq!(taken["status"]["phase"], "Ready", "{taken:#}");
        let data = server
            .data_dir
            .join("snapshots")
            .join(format!("{snap}.tar"));
        let renamed = file_in_tar(&data, "renamed").expect("renamed file present");
        assert_eq!(renamed.len(), 1_048_576, "a renamed file is whole");
        assert!(
            renamed.iter().all(|b| *b == renamed[0]),
            "one writer pass only"
        );
        if let Some(inplace) = file_in_tar(&data, "inplace") {
            assert!(inplace.len() <= 1_048_576);
            assert!(
                inplace.iter().all(|b| *b == inplace[0]),
                "one writer pass only"
            );
        }
        assert_eq!(container(&name).unwrap()["State"]["Paused"], false);
    }
    // The writer kept running through all of it.
    assert_eq!(docker_exec(&name, "ps -o args | grep -q '[w]hile :'").0, 0);
}

#[test]
fn a_container_paused_by_no_snapshot_is_thawed() {
    let server = Server::start();
    let name = unique("thaw");
    sandbox(&server, &name, json!({}));
    assert!(docker_status(&["pause", &format!("agent-sandbox-{name}")]));
    wait_until("unpaused by the reconcile", LONG, || {
        container(&name)
            .is_some_and(|c| c["State"]["Paused"] == false && c["State"]["Running"] == true)
    });
    drop(server);
}

/// A hostile tar written over a Ready snapshot's data (a tampered data directory) is refused on
/// rollback with a clear error, and the sandbox keeps its workspace and container.
#[test]
fn a_tampered_snapshot_is_refused_on_rollback_and_restores_nothing() {
    let server = Server::start();
    let name = unique("tamper");
    sandbox(&server, &name, json!({}));
    exec(&name, "echo keep > /workspace/keep");
    let snap = unique("s");
    assert_eq!(snapshot(&server, &snap, &name)["status"]["phase"], "Ready");

    let hostile = benign_then_setuid_tar();
    let data = server
        .data_dir
        .join("snapshots")
        .join(format!("{snap}.tar"));
    std::fs::write(&data, &hostile).unwrap();

    let before = container(&name).unwrap()["Id"].clone();
    replace(
        &server,
        "sandboxes",
        "Sandbox",
        &name,
        json!({"image": TEST_IMAGE, "rollback": {"snapshot": snap, "requestId": "evil-1"}}),
    );
    let refused = server
        .wait_for("sandboxes", &name, "reporting the refusal", LONG, |r| {
            r.is_some_and(|r| condition(r, "Ready")["reason"] == "RollbackFailed")
        })
        .unwrap();
    let message = condition(&refused, "Ready")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("refused") && message.contains("suid-tool") && message.contains("setuid"),
        "{message}"
    );
    assert_eq!(refused["status"]["phase"], "Running");
    assert!(refused["status"].get("lastRollback").is_none());
    assert_eq!(
        container(&name).unwrap()["Id"],
        before,
        "the container was not touched"
    );
    assert_eq!(exec(&name, "cat /workspace/keep"), "keep\n");
    assert_ne!(docker_exec(&name, "test -e /workspace/benign").0, 0);
    assert_eq!(
        workspace_volumes(&name),
        [format!("agent-sandbox-{name}-workspace")],
        "no half-built workspace left"
    );
}

/// A snapshot read from the volume's directory on this host stores exactly the tar that Docker's
/// archive API, put through the same export policy, gives: same bytes, same adjustments. Both
/// sources are also compared directly, so the test holds whichever one the server used.
#[test]
fn reading_the_workspace_on_the_host_gives_the_same_tar_as_docker() {
    use agent_sandbox::archive::{self, HostTar, Limits, Policy};

    let server = Server::start();
    let name = unique("hostread");
    sandbox(&server, &name, json!({}));
    exec(&name, TREE);
    // Entries the export policy drops or changes, and a hard link to a file seen later.
    exec(
        &name,
        "cd /workspace && mkfifo pipe && printf s > setuid && chmod 4755 setuid \
         && mkdir -p z && ln src/pkg/blob.bin z/again",
    );
    let taken = snapshot(&server, &unique("hr"), &name);
    assert_eq!(taken["status"]["phase"], "Ready", "{taken:#}");
    let stored = server.data_dir.join("snapshots").join(format!(
        "{}.tar",
        taken["metadata"]["name"].as_str().unwrap()
    ));
    assert_eq!(taken["status"]["digest"], sha256_file(&stored));

    let policy = Policy::export("workspace", (1000, 1000), Limits::with_max_bytes(1 << 30));
    let output = std::process::Command::new("docker")
        .args(["cp", &format!("agent-sandbox-{name}:/workspace"), "-"])
        .output()
        .expect("docker CLI");
    assert!(output.status.success());
    let (from_docker_summary, from_docker) =
        archive::transform(&output.stdout[..], Vec::new(), &policy).unwrap();

    let volume = format!("agent-sandbox-{name}-workspace");
    let mount = std::process::Command::new("docker")
        .args(["volume", "inspect", "-f", "{{.Mountpoint}}", &volume])
        .output()
        .expect("docker CLI");
    let mount = String::from_utf8_lossy(&mount.stdout).trim().to_string();
    let root = archive::open_root(std::path::Path::new(&mount)).unwrap();
    let (from_host_summary, from_host) =
        archive::transform(HostTar::new(root, "workspace"), Vec::new(), &policy).unwrap();

    assert_eq!(from_host_summary, from_docker_summary);
    // gVisor keeps a FIFO made inside the sandbox to itself: the volume never holds it.
    let dropped_or_changed = if gvisor() { 1 } else { 2 };
    assert!(
        from_host_summary.adjusted_count >= dropped_or_changed,
        "the FIFO and the setuid bit are reported: {from_host_summary:?}"
    );
    assert!(
        from_host == from_docker,
        "the two sources give different tars"
    );
    assert_eq!(std::fs::read(&stored).unwrap(), from_host);
    delete(&server, "sandboxes", &name);
}

/// Docker's actions on the container `id` since `since` (Unix seconds), as `docker events`
/// recorded them.
fn container_actions(id: &str, since: f64) -> Vec<String> {
    std::thread::sleep(Duration::from_millis(200));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    docker(&[
        "events",
        "--since",
        &format!("{since:.3}"),
        "--until",
        &format!("{now:.3}"),
        "--filter",
        &format!("container={id}"),
        "--format",
        "{{.Action}}",
    ])
    .lines()
    .map(str::to_string)
    .collect()
}

/// With a server that may use this host's copy of the volumes and one that may not: new,
/// restored and rolled-back workspaces are alike (owner, contents, modes, mtimes, links), and
/// Docker's archive API is used exactly when neither the host path nor a copy-on-write view is.
#[test]
fn workspaces_are_made_on_the_host_when_verifiable_and_match_the_archive_api() {
    // The host path needs a process of the container to prove the directory is its /workspace;
    // gVisor's sandbox process shows no container files, so under runsc a new workspace goes
    // through Docker. Restores are views of the snapshot wherever the server may use this host
    // (gVisor included), so they copy nothing.
    let host_possible = !gvisor();
    let on_host = Server::start();
    let through_docker = Server::start_with(&[("AGENT_SANDBOX_HOST_WORKSPACE_ACCESS", "false")]);
    for (server, host_expected, views_expected) in [
        (&on_host, host_possible, true),
        (&through_docker, false, false),
    ] {
        let origin = unique("origin");
        // The first container of a server shows it whether the host path works.
        sandbox(server, &origin, json!({}));
        exec(&origin, TREE);
        let before = listing(&origin);
        let snap = unique("s");
        let taken = snapshot(server, &snap, &origin);
        assert_eq!(taken["status"]["phase"], "Ready", "{taken:#}");
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();

        // A new workspace, one restored from the snapshot, and a rollback.
        let fresh = unique("fresh");
        sandbox(server, &fresh, json!({}));
        let copy = unique("copy");
        sandbox(server, &copy, json!({"source": {"snapshot": snap}}));
        exec(
            &origin,
            "rm -rf /workspace/src && echo changed > /workspace/new",
        );
        replace(
            server,
            "sandboxes",
            "Sandbox",
            &origin,
            json!({"image": TEST_IMAGE, "rollback": {"snapshot": snap, "requestId": "r-1"}}),
        );
        let rolled = server
            .wait_for("sandboxes", &origin, "rolled back", LONG, |r| {
                r.is_some_and(|r| {
                    r["status"]["lastRollback"]["requestId"] == "r-1"
                        && r["status"]["phase"] == "Running"
                })
            })
            .unwrap();

        for (name, restored) in [(&fresh, false), (&copy, true), (&origin, true)] {
            let id = server.get("sandboxes", name).unwrap()["status"]["containerID"]
                .as_str()
                .unwrap()
                .to_string();
            let actions = container_actions(&id, since);
            assert!(
                actions.contains(&"start".to_string()),
                "{name}: {actions:?}"
            );
            let made_on_host = host_expected || (restored && views_expected);
            let archive_expected = !made_on_host;
            assert_eq!(
                actions.contains(&"extract-to-dir".to_string()),
                archive_expected,
                "{name}: the archive API is used exactly when neither the host path nor a view \
                 is: {actions:?}"
            );
        }
        assert_eq!(
            exec(
                &fresh,
                "stat -c '%u:%g %a' /workspace && touch /workspace/mine && echo ok"
            ),
            "1000:1000 755\nok\n",
            "a new workspace belongs to the sandbox user"
        );
        assert_eq!(
            listing(&copy),
            before,
            "a restored workspace is the snapshot"
        );
        assert_eq!(
            listing(&origin),
            before,
            "a rolled-back workspace is the snapshot"
        );
        assert_eq!(rolled["status"]["sourceSnapshot"], snap.as_str());
        for name in [&fresh, &copy, &origin] {
            delete(server, "sandboxes", name);
        }
    }
}
