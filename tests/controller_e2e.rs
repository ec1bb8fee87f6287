//! End-to-end tests of the declarative core against the real Docker daemon: manifests in folders,
//! the resource API, the reconcile loop, expiry, crash recovery and garbage collection.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn container_id(name: &str) -> String {
    container(name).expect("container exists")["Id"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn manifests_in_a_watched_folder_become_hardened_running_containers() {
    let server = Server::start();
    let (a, b) = (unique("fold-a"), unique("fold-b"));
    let text = format!(
        "{}\n---\n{}",
        sandbox_manifest(
            &a,
            "  memoryMB: 128\n  pidsLimit: 64\n  cpus: 0.5\n  env:\n    GREETING: hi\n"
        ),
        sandbox_manifest(&b, "")
    );
    write_manifest(&server.watch_dir, "team/two.yaml", &text);
    let sandbox = server.wait_running(&a);
    server.wait_running(&b);
    assert_eq!(sandbox["metadata"]["generation"], 1);
    assert_eq!(sandbox["status"]["conditions"][0]["type"], "Ready");
    assert_eq!(sandbox["status"]["conditions"][0]["status"], "True");

    let c = container(&a).expect("container");
    assert_eq!(c["State"]["Running"], true);
    assert_eq!(c["Id"], sandbox["status"]["containerID"]);
    let host = &c["HostConfig"];
    assert_eq!(c["Config"]["User"], "1000:1000");
    assert_eq!(c["Config"]["Hostname"], "sandbox");
    assert!(c["Config"]["Env"]
        .as_array()
        .unwrap()
        .contains(&json!("HOME=/workspace")));
    // The sandbox's env is given to each command, never stored in the container.
    assert!(!c["Config"]["Env"]
        .as_array()
        .unwrap()
        .contains(&json!("GREETING=hi")));
    assert_eq!(server.exec(&a, "echo $GREETING").1, "hi\n");
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert!(host["SecurityOpt"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o.as_str().unwrap().starts_with("no-new-privileges")));
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["Memory"], 128 * 1024 * 1024);
    assert_eq!(host["MemorySwap"], 128 * 1024 * 1024);
    assert_eq!(host["NanoCpus"], 500_000_000);
    // Under runsc the pids cgroup counts gVisor's own host threads, hence the larger bound.
    let host_pids = if gvisor() {
        agent_sandbox::docker::gvisor_pids_limit(64)
    } else {
        64
    };
    assert_eq!(host["PidsLimit"], host_pids);
    assert_eq!(host["IpcMode"], "private");
    assert_eq!(host["Init"], true);
    assert_eq!(host["Privileged"], false);
    let tmpfs = host["Tmpfs"]["/tmp"].as_str().unwrap();
    assert!(
        tmpfs.contains("nosuid") && tmpfs.contains("nodev") && tmpfs.contains("size="),
        "{tmpfs}"
    );
    assert_eq!(c["Config"]["Labels"]["io.agent-sandbox.managed"], "true");
    assert_eq!(c["Config"]["Labels"]["io.agent-sandbox.id"], a.as_str());
    assert!(c["Config"]["Labels"]["io.agent-sandbox.spec-hash"].is_string());
    assert_eq!(
        c["Config"]["Labels"]["io.agent-sandbox.uid"],
        sandbox["metadata"]["uid"]
    );

    // And from inside.
    let (code, out) = docker_exec(&a, "id -u; id -g; echo $HOME; hostname; touch /x 2>/dev/null && echo rootfs-writable; touch /workspace/ok && echo ws-ok");
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines, ["1000", "1000", "/workspace", "sandbox", "ws-ok"]);
    // The workspace volume belongs to the sandbox and is owned by the sandbox user.
    assert_eq!(volumes_of(&a).len(), 1);
    let (_, owner) = docker_exec(&a, "stat -c %u:%g /workspace");
    assert_eq!(owner.trim(), "1000:1000");
}

#[test]
fn editing_a_manifest_applies_the_change_and_keeps_the_workspace() {
    let server = Server::start();
    let name = unique("edit");
    write_manifest(
        &server.watch_dir,
        "s.yaml",
        &sandbox_manifest(&name, "  cpus: 0.5\n"),
    );
    server.wait_running(&name);
    let first = container_id(&name);
    assert_eq!(docker_exec(&name, "echo kept > /workspace/file").0, 0);

    // A limit changes in place: same container, new limit.
    write_manifest(
        &server.watch_dir,
        "s.yaml",
        &sandbox_manifest(&name, "  cpus: 1.5\n"),
    );
    let s = server.wait_running_at(&name, 2, Duration::from_secs(30));
    assert_eq!(s["metadata"]["generation"], 2);
    if gvisor() {
        // runsc cannot change a live container's limits: the container is replaced instead,
        // and the workspace survives (checked below).
        assert_ne!(container_id(&name), first);
        assert_eq!(docker_exec(&name, "cat /workspace/file").1, "kept\n");
    } else {
        assert_eq!(
            container_id(&name),
            first,
            "a limit change must not replace the container"
        );
    }
    assert_eq!(
        container(&name).unwrap()["HostConfig"]["NanoCpus"],
        1_500_000_000i64
    );

    // The env applies in place: the next command sees it, in the same container.
    let before_env = container_id(&name);
    write_manifest(
        &server.watch_dir,
        "s.yaml",
        &sandbox_manifest(&name, "  cpus: 1.5\n  env:\n    MODE: two\n"),
    );
    server.wait_running_at(&name, 3, Duration::from_secs(30));
    assert_eq!(
        container_id(&name),
        before_env,
        "an env change keeps the container"
    );
    assert_eq!(
        server.exec(&name, "cat /workspace/file; echo $MODE").1,
        "kept\ntwo\n"
    );

    // The root filesystem mode shapes the container: a new one, same workspace.
    write_manifest(
        &server.watch_dir,
        "s.yaml",
        &sandbox_manifest(
            &name,
            "  cpus: 1.5\n  readOnlyRootfs: false\n  env:\n    MODE: two\n",
        ),
    );
    server.wait_running_at(&name, 4, Duration::from_secs(30));
    let second = container_id(&name);
    assert_ne!(second, before_env);
    assert_eq!(
        container(&name).unwrap()["HostConfig"]["ReadonlyRootfs"],
        false
    );
    let (_, out) = docker_exec(&name, "cat /workspace/file");
    assert_eq!(out, "kept\n");
    // The replaced container served until its successor took the name; it goes right after.
    wait_until(
        "the replaced container is removed",
        Duration::from_secs(10),
        || {
            let left = containers_of(&name);
            left.len() == 1 && second.starts_with(&left[0])
        },
    );

    // Labels are not spec: no generation bump, no new container.
    let labeled = sandbox_manifest(
        &name,
        "  cpus: 1.5\n  readOnlyRootfs: false\n  env:\n    MODE: two\n",
    )
    .replace("metadata:\n", "metadata:\n  labels:\n    team: blue\n");
    write_manifest(&server.watch_dir, "s.yaml", &labeled);
    let s = server
        .wait_for(
            "sandboxes",
            &name,
            "labeled",
            Duration::from_secs(30),
            |r| r.is_some_and(|r| r["metadata"]["labels"]["team"] == "blue"),
        )
        .unwrap();
    assert_eq!(s["metadata"]["generation"], 4);
    assert_eq!(container_id(&name), second);
}

#[test]
fn an_invalid_document_is_isolated_and_its_last_good_version_kept() {
    let server = Server::start();
    let (good, bad) = (unique("good"), unique("bad"));
    let both = |good_extra: &str, bad_extra: &str| {
        format!(
            "{}---\n{}",
            sandbox_manifest(&good, good_extra),
            sandbox_manifest(&bad, bad_extra)
        )
    };
    write_manifest(
        &server.watch_dir,
        "pair.yaml",
        &both("  cpus: 0.5\n", "  cpus: 0.5\n"),
    );
    server.wait_running(&good);
    server.wait_running(&bad);
    let bad_container = container_id(&bad);

    write_manifest(
        &server.watch_dir,
        "pair.yaml",
        &both("  cpus: 1.0\n", "  cpus: -4\n  privileged: true\n"),
    );
    server.wait_for(
        "sandboxes",
        &good,
        "updated",
        Duration::from_secs(30),
        |r| r.is_some_and(|r| r["spec"]["cpus"] == 1.0 && r["status"]["observedGeneration"] == 2),
    );
    let (status, errors) = server.request("GET", &format!("{API}/errors"), None);
    assert_eq!(status, 200);
    let text = errors.to_string();
    assert!(text.contains("pair.yaml"), "{text}");
    assert!(
        text.contains("cpus") || text.contains("privileged"),
        "{text}"
    );
    // The bad one keeps its last good spec and container.
    let b = server.get("sandboxes", &bad).expect("last good kept");
    assert_eq!(b["spec"]["cpus"], 0.5);
    assert_eq!(container_id(&bad), bad_container);
    assert!(server.log().contains("pair.yaml"), "the log names the file");
}

#[test]
fn removing_a_manifest_removes_container_and_volume() {
    let server = Server::start();
    let (keep, drop_) = (unique("keep"), unique("drop"));
    write_manifest(&server.watch_dir, "keep.yaml", &sandbox_manifest(&keep, ""));
    write_manifest(
        &server.watch_dir,
        "drop.yaml",
        &sandbox_manifest(&drop_, ""),
    );
    server.wait_running(&keep);
    server.wait_running(&drop_);
    std::fs::remove_file(server.watch_dir.join("drop.yaml")).unwrap();
    server.wait_gone("sandboxes", &drop_);
    wait_until(
        "container and volume removed",
        Duration::from_secs(30),
        || containers_of(&drop_).is_empty() && volumes_of(&drop_).is_empty(),
    );
    assert_eq!(containers_of(&keep).len(), 1);
}

#[test]
fn containers_removed_or_stopped_by_hand_come_back_with_their_workspace() {
    let server = Server::start();
    let name = unique("heal");
    write_manifest(&server.watch_dir, "s.yaml", &sandbox_manifest(&name, ""));
    server.wait_running(&name);
    assert_eq!(docker_exec(&name, "echo data > /workspace/f").0, 0);
    let first = container_id(&name);

    assert!(docker_status(&[
        "rm",
        "-f",
        &format!("agent-sandbox-{name}")
    ]));
    wait_until("container recreated", Duration::from_secs(30), || {
        container(&name).is_some_and(|c| c["State"]["Running"] == true && c["Id"] != first.as_str())
    });
    assert_eq!(docker_exec(&name, "cat /workspace/f").1, "data\n");

    assert!(docker_status(&[
        "stop",
        "-t",
        "1",
        &format!("agent-sandbox-{name}")
    ]));
    wait_until("container restarted", Duration::from_secs(30), || {
        container(&name).is_some_and(|c| c["State"]["Running"] == true)
    });
    assert_eq!(docker_exec(&name, "cat /workspace/f").1, "data\n");
    assert_eq!(containers_of(&name).len(), 1);
}

#[test]
fn kill_9_and_restart_adopts_containers_and_collects_orphans() {
    let mut server = Server::start();
    let name = unique("adopt");
    write_manifest(&server.watch_dir, "s.yaml", &sandbox_manifest(&name, ""));
    server.wait_running(&name);
    let before = container_id(&name);
    server.kill9();

    // An orphan of this server: labeled as ours, but no resource declares it.
    let server_id = std::fs::read_to_string(server.data_dir.join("server-id")).unwrap();
    let orphan = unique("orphan");
    let labels = [
        "io.agent-sandbox.managed=true".to_string(),
        format!("io.agent-sandbox.id={orphan}"),
        format!("io.agent-sandbox.server={}", server_id.trim()),
    ];
    let mut args = vec![
        "create".to_string(),
        "--name".into(),
        format!("agent-sandbox-{orphan}"),
    ];
    for l in &labels {
        args.push("--label".into());
        args.push(l.clone());
    }
    args.push(TEST_IMAGE.into());
    args.push("true".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert!(docker_status(&args), "create orphan");
    let mut vol_args = vec!["volume", "create"];
    let vol_labels: Vec<String> = labels.iter().map(|l| format!("--label={l}")).collect();
    vol_args.extend(vol_labels.iter().map(String::as_str));
    let orphan_volume = format!("agent-sandbox-{orphan}-workspace");
    vol_args.push(&orphan_volume);
    assert!(docker_status(&vol_args), "create orphan volume");
    // Leftovers of a rollback interrupted by the kill: the container it replaced (renamed, still
    // labeled for the live sandbox) and a staging container of a rollback no longer pending.
    let uid = container(&name).unwrap()["Config"]["Labels"]["io.agent-sandbox.uid"]
        .as_str()
        .unwrap()
        .to_string();
    let retired = format!("agent-sandbox-{name}.retired-0000beef");
    let staging = format!("agent-sandbox-{name}.restore");
    for (container_name, id) in [(&retired, name.clone()), (&staging, "pool.p.1".to_string())] {
        assert!(
            docker_status(&[
                "create",
                "--name",
                container_name,
                "--label",
                "io.agent-sandbox.managed=true",
                "--label",
                &format!("io.agent-sandbox.id={id}"),
                "--label",
                &format!("io.agent-sandbox.uid={uid}"),
                "--label",
                &format!("io.agent-sandbox.server={}", server_id.trim()),
                TEST_IMAGE,
                "true",
            ]),
            "create {container_name}"
        );
    }

    server.restart();
    server.wait_running(&name);
    wait_until("orphans collected", Duration::from_secs(30), || {
        containers_of(&orphan).is_empty() && volumes_of(&orphan).is_empty()
    });
    wait_until(
        "rollback leftovers collected",
        Duration::from_secs(30),
        || {
            inspect(&["--type", "container", &retired]).is_none()
                && inspect(&["--type", "container", &staging]).is_none()
        },
    );
    assert_eq!(
        container_id(&name),
        before,
        "the running container is adopted, not recreated"
    );
    assert_eq!(containers_of(&name).len(), 1);
    cleanup_sandbox_objects(&orphan);
}

#[test]
fn resource_api_create_conflict_dry_run_watch_and_delete() {
    let server = Server::start();
    let name = unique("api");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": {"image": TEST_IMAGE, "cpus": 0.5}});

    // dryRun writes nothing.
    let (status, body) = server.request("POST", &format!("{API}/sandboxes?dryRun=All"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    assert!(!server
        .data_dir
        .join(format!("manifests/sandboxes/{name}.yaml"))
        .exists());
    assert!(server.get("sandboxes", &name).is_none());

    let (status, created) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{created}");
    assert!(server
        .data_dir
        .join(format!("manifests/sandboxes/{name}.yaml"))
        .exists());
    let running = server.wait_running(&name);
    assert!(!containers_of(&name).is_empty());

    // A PUT with a stale resourceVersion is refused.
    let mut stale = created.clone();
    stale["spec"]["cpus"] = json!(1.0);
    let (status, body) = server.request("PUT", &format!("{API}/sandboxes/{name}"), Some(&stale));
    assert_eq!(status, 409, "{body}");
    let mut fresh = running.clone();
    fresh["spec"]["cpus"] = json!(1.0);
    let (status, body) = server.request("PUT", &format!("{API}/sandboxes/{name}"), Some(&fresh));
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["metadata"]["generation"], 2);

    let (status, body) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert!(status == 200 || status == 202, "{status} {body}");
    server.wait_gone("sandboxes", &name);
    wait_until("docker objects removed", Duration::from_secs(30), || {
        containers_of(&name).is_empty() && volumes_of(&name).is_empty()
    });
    assert!(!server
        .data_dir
        .join(format!("manifests/sandboxes/{name}.yaml"))
        .exists());
    assert!(!server
        .data_dir
        .join(format!("state/sandboxes/{name}.json"))
        .exists());
}

#[test]
fn watch_streams_added_modified_and_deleted() {
    use std::io::{BufRead, BufReader, Write};
    let server = Server::start();
    let name = unique("watch");
    let host = server.url.trim_start_matches("http://").to_string();
    let mut stream = std::net::TcpStream::connect(&host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(stream, "GET {API}/sandboxes?watch=true HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {}\r\n\r\n", server.key).unwrap();
    let reader = std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if let Ok(event) = serde_json::from_str::<Value>(line.trim()) {
                if let Some(t) = event["type"].as_str() {
                    seen.push((
                        t.to_string(),
                        event["object"]["metadata"]["name"]
                            .as_str()
                            .unwrap_or("")
                            .to_string(),
                    ));
                    if t == "DELETED" {
                        break;
                    }
                }
            }
        }
        seen
    });
    std::thread::sleep(Duration::from_millis(300));
    write_manifest(
        &server.data_dir.join("manifests/sandboxes"),
        &format!("{name}.yaml"),
        &sandbox_manifest(&name, ""),
    );
    server.wait_running(&name);
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert!(status < 300);
    let seen = reader.join().unwrap();
    let ours: Vec<&str> = seen
        .iter()
        .filter(|(_, n)| n == &name)
        .map(|(t, _)| t.as_str())
        .collect();
    assert_eq!(ours.first(), Some(&"ADDED"), "{seen:?}");
    assert!(ours.contains(&"MODIFIED"), "{seen:?}");
    assert_eq!(ours.last(), Some(&"DELETED"), "{seen:?}");
}

#[test]
fn a_folder_owned_sandbox_cannot_be_changed_or_deleted_through_the_api() {
    let server = Server::start();
    let name = unique("owned");
    write_manifest(&server.watch_dir, "s.yaml", &sandbox_manifest(&name, ""));
    let current = server.wait_running(&name);
    let (status, body) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert_eq!(status, 403, "{body}");
    assert!(
        body.to_string()
            .contains(server.watch_dir.to_str().unwrap()),
        "names the folder: {body}"
    );
    let (status, _) = server.request("PUT", &format!("{API}/sandboxes/{name}"), Some(&current));
    assert_eq!(status, 403);
    assert!(server.get("sandboxes", &name).is_some());
    assert_eq!(containers_of(&name).len(), 1);
}

#[test]
fn expiry_deletes_api_sandboxes_and_parks_folder_sandboxes_until_their_document_changes() {
    let server = Server::start();
    let (api, folder) = (unique("ttl-api"), unique("ttl-dir"));
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": api}, "spec": {"image": TEST_IMAGE, "ttlSeconds": 10}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    write_manifest(
        &server.watch_dir,
        "ttl.yaml",
        &sandbox_manifest(&folder, "  ttlSeconds: 10\n"),
    );
    server.wait_running(&api);
    let running = server.wait_running(&folder);
    assert!(running["status"]["expiresAt"].is_string());

    server.wait_gone("sandboxes", &api);
    let expired = server
        .wait_for(
            "sandboxes",
            &folder,
            "Expired",
            Duration::from_secs(30),
            |r| r.is_some_and(|r| r["status"]["phase"] == "Expired"),
        )
        .unwrap();
    assert_eq!(expired["status"]["conditions"][0]["status"], "False");
    wait_until(
        "expired containers removed",
        Duration::from_secs(30),
        || containers_of(&api).is_empty() && containers_of(&folder).is_empty(),
    );

    // It stays expired...
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        server.get("sandboxes", &folder).unwrap()["status"]["phase"],
        "Expired"
    );
    assert!(containers_of(&folder).is_empty());
    // ...until its document changes.
    write_manifest(
        &server.watch_dir,
        "ttl.yaml",
        &sandbox_manifest(&folder, "  ttlSeconds: 600\n"),
    );
    server.wait_running(&folder);
    assert_eq!(containers_of(&folder).len(), 1);
}

#[test]
fn sigterm_shuts_down_gracefully_and_leaves_sandboxes_running() {
    let mut server = Server::start();
    let name = unique("term");
    write_manifest(&server.watch_dir, "s.yaml", &sandbox_manifest(&name, ""));
    server.wait_running(&name);
    let status = server.terminate();
    assert!(status.success(), "exit status {status}");
    assert_eq!(container(&name).unwrap()["State"]["Running"], true);
}

#[test]
fn an_invalid_setting_stops_the_server_with_a_message_naming_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .arg("serve")
        .env("AGENT_SANDBOX_ALLOW_NETWORK", "maybe")
        .env(
            "AGENT_SANDBOX_DATA_DIR",
            std::env::temp_dir().join("never-used"),
        )
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ALLOW_NETWORK") || err.contains("allow-network"),
        "{err}"
    );

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .arg("serve")
        .env("AGENT_SANDBOX_SANDBOX_USER", "0:0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("AGENT_SANDBOX_SANDBOX_USER"));
}

#[test]
fn an_idle_resync_makes_no_docker_writes() {
    let server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let names = [unique("idle-a"), unique("idle-b")];
    for name in &names {
        write_manifest(
            &server.watch_dir,
            &format!("{name}.yaml"),
            &sandbox_manifest(name, ""),
        );
    }
    for name in &names {
        server.wait_running(name);
    }
    // Let the first resyncs after convergence pass, then watch three more.
    std::thread::sleep(Duration::from_secs(2));
    // Absolute times: Docker reads relative ones as "that long ago".
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let (since, until) = (now.to_string(), (now + 4).to_string());
    let out = std::process::Command::new("docker")
        .args([
            "events",
            "--since",
            &since,
            "--until",
            &until,
            "--format",
            "{{.Type}} {{.Action}} {{.Actor.ID}} {{.Actor.Attributes.name}}",
        ])
        .output()
        .unwrap();
    let events = String::from_utf8_lossy(&out.stdout);
    let ours: Vec<&str> = events
        .lines()
        .filter(|l| names.iter().any(|n| l.contains(n.as_str())))
        .filter(|l| !l.contains("exec_") && !l.starts_with("container top"))
        .collect();
    assert!(ours.is_empty(), "idle resyncs wrote to Docker: {ours:?}");
}

/// Containers of ours whose Docker name starts with the sandbox's container name and a dot (its
/// staging, replaced and deleted names), as (name, running).
fn other_named_containers(name: &str) -> Vec<(String, bool)> {
    let filter = format!("name=agent-sandbox-{name}.");
    docker(&["ps", "-aq", "--filter", &filter])
        .split_whitespace()
        .filter_map(|id| {
            let c = inspect(&["--type", "container", id])?;
            Some((
                c["Name"].as_str()?.to_string(),
                c["State"]["Running"].as_bool()?,
            ))
        })
        .collect()
}

fn workspace_of(sandbox: &Value) -> String {
    sandbox["status"]["workspaceVolume"]
        .as_str()
        .expect("workspace volume")
        .to_string()
}

#[test]
fn delete_answers_once_killed_and_the_name_is_reusable_at_once() {
    let server = Server::start();
    let name = unique("fastdel");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    let first = server.wait_running(&name);
    let old_container = container_id(&name);
    let old_volume = workspace_of(&first);
    // Enough files that removing the workspace takes a moment.
    let (code, _) = docker_exec(
        &name,
        "echo secret > /workspace/old && mkdir /workspace/many && cd /workspace/many && \
         i=0; while [ $i -lt 2000 ]; do echo $i > f$i; i=$((i+1)); done",
    );
    assert_eq!(code, 0);

    let (status, body) = server.request("DELETE", &format!("/v1/sandboxes/{name}"), None);
    assert_eq!(status, 204, "{body}");
    // At the answer: the document is gone and the sandbox's own container name is free. Its
    // processes are dead (tests/deletion.rs checks them one by one); Docker, when the kill went
    // through the container's PID 1, says so a moment later.
    assert!(server.get("sandboxes", &name).is_none());
    assert!(container(&name).is_none(), "the name is still taken");
    wait_until(
        "Docker reports the deleted containers stopped",
        Duration::from_secs(5),
        || {
            let old_state = inspect(&["--type", "container", &old_container]);
            other_named_containers(&name)
                .iter()
                .all(|(_, running)| !running)
                && old_state.is_none_or(|c| c["State"]["Running"] == false)
        },
    );

    // The same name again, at once: its own container and an empty workspace.
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    let second = server.wait_running(&name);
    let new_container = container_id(&name);
    assert_ne!(new_container, old_container);
    assert_ne!(second["metadata"]["uid"], first["metadata"]["uid"]);
    let (code, listing) = docker_exec(&name, "ls -A /workspace");
    assert_eq!(code, 0);
    assert_eq!(listing, "", "the old workspace shows in the new sandbox");
    let new_volume = workspace_of(&second);
    let mounted = container(&name).unwrap()["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["Destination"] == "/workspace")
        .map(|m| m["Name"].as_str().unwrap_or_default().to_string());
    assert_eq!(mounted.as_deref(), Some(new_volume.as_str()));

    // The background removal leaves exactly the new sandbox's objects.
    wait_until(
        "the deleted sandbox's objects are removed",
        Duration::from_secs(30),
        || {
            containers_of(&name).len() == 1
                && volumes_of(&name) == vec![new_volume.clone()]
                && other_named_containers(&name).is_empty()
        },
    );
    assert!(inspect(&["--type", "volume", &old_volume]).is_none() || old_volume == new_volume);
    assert!(inspect(&["--type", "container", &old_container]).is_none());

    // And deleting the second leaves nothing at all.
    let (status, body) = server.request("DELETE", &format!("/v1/sandboxes/{name}"), None);
    assert_eq!(status, 204, "{body}");
    wait_until("everything removed", Duration::from_secs(30), || {
        containers_of(&name).is_empty()
            && volumes_of(&name).is_empty()
            && other_named_containers(&name).is_empty()
    });
}

#[test]
fn kill_9_during_the_background_removal_of_a_deletion_converges_after_restart() {
    // Garbage collection runs every second, so the restarted server finishes what the killed one
    // left.
    let mut server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let name = unique("deldie");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);
    let (code, _) = docker_exec(
        &name,
        "mkdir /workspace/many && cd /workspace/many && \
         i=0; while [ $i -lt 3000 ]; do echo $i > f$i; i=$((i+1)); done",
    );
    assert_eq!(code, 0);
    let (status, body) = server.request("DELETE", &format!("/v1/sandboxes/{name}"), None);
    assert_eq!(status, 204, "{body}");
    server.kill9();
    let interrupted = !containers_of(&name).is_empty() || !volumes_of(&name).is_empty();
    eprintln!("objects left by the killed server: {interrupted}");

    server.restart();
    wait_until(
        "the restarted server removes what the deletion left",
        Duration::from_secs(30),
        || {
            containers_of(&name).is_empty()
                && volumes_of(&name).is_empty()
                && other_named_containers(&name).is_empty()
        },
    );
    // The name is free and gets a fresh, empty workspace.
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);
    let (code, listing) = docker_exec(&name, "ls -A /workspace");
    assert_eq!(code, 0);
    assert_eq!(listing, "");
}

#[test]
fn a_volume_of_the_workspace_name_that_is_not_the_sandboxes_is_never_mounted() {
    let server = Server::start();
    let name = unique("squat");
    // Someone else's volume under the name the sandbox's workspace would get, with a file in it.
    let plain = format!("agent-sandbox-{name}-workspace");
    docker(&["volume", "create", &plain]);
    docker(&[
        "run",
        "--rm",
        "-v",
        &format!("{plain}:/v"),
        TEST_IMAGE,
        "sh",
        "-c",
        "echo theirs > /v/file",
    ]);
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    let sandbox = server.wait_running(&name);
    assert_ne!(workspace_of(&sandbox), plain);
    let (code, listing) = docker_exec(&name, "ls -A /workspace");
    assert_eq!(code, 0);
    assert_eq!(listing, "", "another volume's files show in the sandbox");

    let (status, body) = server.request("DELETE", &format!("/v1/sandboxes/{name}"), None);
    assert_eq!(status, 204, "{body}");
    wait_until(
        "the sandbox's objects are removed",
        Duration::from_secs(30),
        || containers_of(&name).is_empty() && volumes_of(&name).is_empty(),
    );
    // The volume that was not ours is left alone.
    assert!(inspect(&["--type", "volume", &plain]).is_some());
    docker(&["volume", "rm", &plain]);
}
