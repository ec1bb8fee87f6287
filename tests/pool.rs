//! The warm pool against the real daemon: members kept ready, claims instead of creates, limits
//! applied at claim time, no member handed out twice, refills, and cleanup.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn pool_doc(name: &str, size: u32) -> Value {
    json!({"apiVersion": "agent-sandbox.io/v1", "kind": "SandboxPool",
        "metadata": {"name": name}, "spec": {"image": TEST_IMAGE, "size": size}})
}

fn wait_pool_ready(server: &Server, pool: &str, ready: u64) -> Value {
    server
        .wait_for(
            "sandboxpools",
            pool,
            &format!("{ready} ready"),
            Duration::from_secs(60),
            |p| p.is_some_and(|p| p["status"]["readyReplicas"] == ready),
        )
        .unwrap()
}

fn members(pool: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-a",
        "--format",
        "{{.Names}}",
        "--filter",
        "label=io.agent-sandbox.managed=true",
    ])
    .lines()
    .filter(|n| n.starts_with(&format!("agent-sandbox-pool.{pool}.")))
    .map(String::from)
    .collect()
}

/// Docker IDs of the pool's unclaimed members.
fn member_ids(pool: &str) -> HashSet<String> {
    members(pool)
        .iter()
        .map(|n| {
            inspect(&["--type", "container", n]).unwrap()["Id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

/// Creates a pool of `size` members of the test image and waits until it is full.
fn start_pool(server: &Server, prefix: &str, size: u32) -> String {
    let pool = unique(prefix);
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxpools"),
        Some(&pool_doc(&pool, size)),
    );
    assert_eq!(status, 201, "{body}");
    wait_pool_ready(server, &pool, size.into());
    pool
}

#[test]
fn sandboxes_claim_warm_containers_with_their_own_limits_and_the_pool_refills() {
    let server = Server::start();
    let pool = start_pool(&server, "warm", 2);
    let member_ids = member_ids(&pool);
    assert_eq!(member_ids.len(), 2);

    // runsc cannot change a live container's limits, so there only default-sized sandboxes
    // claim; under runc the claim applies the sandbox's own limits.
    let runsc = gvisor();
    let (memory, cpus, pids) = if runsc {
        (512, 1.0, 256)
    } else {
        (192, 0.5, 100)
    };
    let request =
        json!({"memory_mb": memory, "cpus": cpus, "pids_limit": pids, "env": {"FROM": "pool"}});
    let (status, created) = server.request("POST", "/v1/sandboxes", Some(&request));
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let sandbox = server.get("sandboxes", &id).unwrap();
    assert_eq!(sandbox["status"]["claimedFrom"], pool.as_str());
    let container_id = sandbox["status"]["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        member_ids.contains(&container_id),
        "the sandbox runs on a former pool member"
    );
    let c = container(&id).expect("renamed to the sandbox's container name");
    assert_eq!(c["Id"], container_id.as_str());
    assert_eq!(c["HostConfig"]["Memory"], memory * 1024 * 1024);
    assert_eq!(c["HostConfig"]["MemorySwap"], memory * 1024 * 1024);
    assert_eq!(c["HostConfig"]["NanoCpus"], (cpus * 1e9) as i64);
    let host_pids = if runsc {
        agent_sandbox::docker::gvisor_pids_limit(pids)
    } else {
        pids
    };
    assert_eq!(c["HostConfig"]["PidsLimit"], host_pids);
    assert_eq!(c["HostConfig"]["ReadonlyRootfs"], true);
    assert_eq!(c["HostConfig"]["CapDrop"], json!(["ALL"]));
    // The sandbox's env reaches its commands even though the container was made before it.
    let (_, out) = server.exec(&id, "echo $FROM; id -u; touch /workspace/x && echo ok");
    assert_eq!(out, "pool\n1000\nok\n");

    // The pool refills to its size with a fresh member.
    wait_until("pool refilled", Duration::from_secs(60), || {
        members(&pool).len() == 2
    });
    server.wait_for(
        "sandboxpools",
        &pool,
        "refilled with one claimed",
        Duration::from_secs(60),
        |p| p.is_some_and(|p| p["status"]["readyReplicas"] == 2 && p["status"]["claimed"] == 1),
    );

    // Deleting the sandbox removes its claimed container and workspace.
    let volume = sandbox["status"]["workspaceVolume"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, _) = server.request("DELETE", &format!("/v1/sandboxes/{id}"), None);
    assert_eq!(status, 204);
    wait_until("claimed objects removed", Duration::from_secs(30), || {
        container(&id).is_none() && inspect(&["--type", "volume", &volume]).is_none()
    });

    // Deleting the pool drains it.
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxpools/{pool}"), None);
    assert!(status < 300);
    server.wait_gone("sandboxpools", &pool);
    wait_until("members removed", Duration::from_secs(30), || {
        members(&pool).is_empty()
    });
}

#[test]
fn concurrent_claims_never_share_a_container() {
    let server = Server::start();
    let pool = start_pool(&server, "race", 3);
    let url = server.url.clone();
    let key = server.key.clone();
    let handles: Vec<_> = (0..6)
        .map(|_| {
            let (url, key) = (url.clone(), key.clone());
            std::thread::spawn(move || {
                http(
                    "POST",
                    &format!("{url}/v1/sandboxes"),
                    Some(&key),
                    Some("{}".into()),
                    "application/json",
                )
            })
        })
        .collect();
    let mut ids = Vec::new();
    for h in handles {
        let (status, body) = h.join().unwrap();
        assert_eq!(status, 201, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let containers: HashSet<String> = ids
        .iter()
        .map(|id| {
            server.get("sandboxes", id).unwrap()["status"]["containerID"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(containers.len(), 6, "every sandbox has its own container");
    let claimed = ids
        .iter()
        .filter(|id| server.get("sandboxes", id).unwrap()["status"]["claimedFrom"] == pool.as_str())
        .count();
    assert!(
        claimed >= 3,
        "the three warm containers were used ({claimed})"
    );
    for id in &ids {
        let c = container(id).expect("container named after its sandbox");
        assert_eq!(c["State"]["Running"], true);
    }
}

/// What a restore must reproduce, one line per path (mode, owner, size, mtime, link target,
/// content digest for files).
const LISTING: &str = r#"cd /workspace && find . -mindepth 1 | sort | while read -r p; do
  s=$(stat -c '%F %a %u:%g %s %Y' "$p")
  if [ -L "$p" ]; then echo "$p $s -> $(readlink "$p")";
  elif [ -f "$p" ]; then echo "$p $s $(md5sum < "$p" | cut -c1-32)";
  else echo "$p ${s% *}"; fi
done"#;

fn container_id_of(server: &Server, id: &str) -> String {
    server.get("sandboxes", id).unwrap()["status"]["containerID"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn rollback_and_fork_take_warm_containers_and_restore_the_snapshot_faithfully() {
    let server = Server::start();
    let pool = start_pool(&server, "restore", 2);

    let (status, created) = server.request(
        "POST",
        "/v1/sandboxes",
        Some(&json!({"env": {"MODE": "one"}})),
    );
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let tree = "set -e; cd /workspace; mkdir -p src empty private; chmod 700 private; \
        printf 'print(1)\\n' > src/main.py; chmod 751 src/main.py; printf s > private/key; \
        chmod 600 private/key; head -c 200000 /dev/urandom > src/blob; ln -s main.py src/link; \
        ln -s /etc/hostname abs-link; touch -d '2021-02-03 04:05:06' src/main.py private; \
        touch -h -d '2020-01-01 00:00:00' src/link";
    assert_eq!(server.exec(&id, tree).0, 0);
    let before = server.exec(&id, LISTING).1;
    assert!(before.contains("./empty directory"), "{before}");
    let (status, snap) = server.request(
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(&json!({})),
    );
    assert_eq!(status, 201, "{snap}");
    let snap = snap["id"].as_str().unwrap().to_string();

    // Change the workspace, leave a process and /tmp state, then roll back.
    server.exec(
        &id,
        "rm -rf /workspace/src && echo new > /workspace/new && echo t > /tmp/marker",
    );
    let (status, out) = server.request(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&json!({"command": "setsid sleep 1000 > /dev/null 2>&1 &", "timeout_seconds": 5})),
    );
    assert_eq!(status, 200, "{out}");
    wait_pool_ready(&server, &pool, 2);
    let warm = member_ids(&pool);
    let old_container = container_id_of(&server, &id);
    let old_volume = server.get("sandboxes", &id).unwrap()["status"]["workspaceVolume"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, rolled) = server.request(
        "POST",
        &format!("/v1/sandboxes/{id}/rollback"),
        Some(&json!({ "snapshot_id": snap })),
    );
    assert_eq!(status, 200, "{rolled}");
    let now = server.get("sandboxes", &id).unwrap();
    let new_container = container_id_of(&server, &id);
    assert!(
        warm.contains(&new_container),
        "the rollback runs on a former pool member"
    );
    assert_eq!(now["status"]["claimedFrom"], pool.as_str());
    assert_eq!(
        container(&id).expect("the sandbox's name")["Id"],
        new_container.as_str()
    );
    assert_eq!(server.exec(&id, LISTING).1, before);
    let (code, _) = server.exec(&id, "test -e /tmp/marker");
    assert_ne!(code, 0, "/tmp starts empty after a rollback");
    let (_, processes) = server.exec(&id, "ps -o args | grep -c '[s]leep 1000' || true");
    assert_eq!(processes.trim(), "0", "processes do not survive a rollback");
    assert_eq!(server.exec(&id, "echo $MODE; id -u").1, "one\n1000\n");
    let c = container(&id).unwrap();
    assert_eq!(c["HostConfig"]["ReadonlyRootfs"], true);
    assert_eq!(c["HostConfig"]["CapDrop"], json!(["ALL"]));
    wait_until(
        "the replaced container and workspace are removed",
        Duration::from_secs(30),
        || {
            inspect(&["--type", "container", &old_container]).is_none()
                && inspect(&["--type", "volume", &old_volume]).is_none()
        },
    );
    let named = docker(&[
        "ps",
        "-a",
        "--format",
        "{{.Names}}",
        "--filter",
        &format!("name=agent-sandbox-{id}"),
    ]);
    assert_eq!(
        named.trim(),
        format!("agent-sandbox-{id}"),
        "no staging or retired container is left"
    );

    // A fork of the snapshot also starts from a warm container.
    wait_pool_ready(&server, &pool, 2);
    let warm = member_ids(&pool);
    let (status, forked) = server.request(
        "POST",
        &format!("/v1/snapshots/{snap}/fork"),
        Some(&json!({})),
    );
    assert_eq!(status, 201, "{forked}");
    let child = forked["id"].as_str().unwrap().to_string();
    assert!(warm.contains(&container_id_of(&server, &child)));
    assert_eq!(
        server.get("sandboxes", &child).unwrap()["status"]["claimedFrom"],
        pool.as_str()
    );
    assert_eq!(server.exec(&child, LISTING).1, before);
    assert_eq!(server.exec(&child, "echo $MODE").1, "one\n");
    server.exec(&child, "echo mine > /workspace/own");
    assert_ne!(server.exec(&id, "test -e /workspace/own").0, 0);

    for sandbox in [&id, &child] {
        let (status, _) = server.request("DELETE", &format!("/v1/sandboxes/{sandbox}"), None);
        assert_eq!(status, 204);
    }
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxpools/{pool}"), None);
    assert!(status < 300);
    wait_until("everything removed", Duration::from_secs(60), || {
        members(&pool).is_empty() && container(&id).is_none() && container(&child).is_none()
    });
}

/// Everything an edit must keep of a workspace, one line per path. When `carried` (the files
/// themselves came along), also the inode of every non-directory and the mtime of the workspace
/// root; a new container on the same volume gets the root's owner through Docker's archive API,
/// which sets its mtime.
fn workspace_listing(name: &str, carried: bool) -> String {
    let (inode, root) = if carried {
        (
            "[ -d \"$p\" ] || stat -c 'inode %i' \"$p\";",
            "%n %F %a %u:%g %s %Y %h",
        )
    } else {
        ("", "%n %F %a %u:%g %s %h")
    };
    let script = format!(
        "cd /workspace && stat -c '{root}' . && find . -mindepth 1 | sort | \
         while read -r p; do stat -c '%n %F %a %u:%g %s %Y %h' \"$p\"; {inode} \
         [ -f \"$p\" ] && [ ! -L \"$p\" ] && md5sum < \"$p\"; [ -L \"$p\" ] && readlink \"$p\"; \
         done; true"
    );
    let (code, out) = docker_exec(name, &script);
    assert_eq!(code, 0, "{out}");
    out
}

#[test]
fn an_edit_that_needs_a_new_container_carries_the_workspace_into_a_warm_one() {
    let server = Server::start();
    // Members with a writable root filesystem: what the sandbox asks for after its edit.
    let pool = unique("rw");
    let mut doc = pool_doc(&pool, 1);
    doc["spec"]["readOnlyRootfs"] = json!(false);
    let (status, body) = server.request("POST", &format!("{API}/sandboxpools"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    wait_pool_ready(&server, &pool, 1);
    let member = member_ids(&pool).into_iter().next().unwrap();

    // The sandbox starts with a read-only root: no member fits, it gets a container of its own.
    let name = unique("edit");
    let sandbox = |read_only: bool| {
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox", "metadata": {"name": name},
            "spec": {"image": TEST_IMAGE, "readOnlyRootfs": read_only, "env": {"MODE": "kept"}}})
    };
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&sandbox(true)));
    assert_eq!(status, 201, "{body}");
    let first = server.wait_running(&name);
    assert!(first["status"]["claimedFrom"].is_null(), "{first:#}");
    let carried = !gvisor();
    // gVisor keeps a FIFO made in the sandbox to itself: it never reaches the volume.
    let fifo = if carried { "mkfifo pipe;" } else { "" };
    let script = format!(
        "set -e; cd /workspace; mkdir -p src/deep empty locked; \
        printf 'print(1)\\n' > src/main.py; chmod 750 src/main.py; ln src/main.py hard; \
        head -c 200000 /dev/urandom > src/deep/blob; ln -s src/main.py rel; ln -s /etc/hostname abs; \
        {fifo} printf in > locked/f; chmod 555 locked; chmod 1777 empty; \
        touch -d '2021-02-03 04:05:06' src/main.py; touch -h -d '2020-01-01' rel; \
        echo t > /tmp/marker; (sleep 1000 &) ; echo ok"
    );
    assert_eq!(docker_exec(&name, &script), (0, "ok\n".into()));
    let before = workspace_listing(&name, carried);
    let old_container = first["status"]["containerID"].as_str().unwrap().to_string();
    let old_volume = first["status"]["workspaceVolume"]
        .as_str()
        .unwrap()
        .to_string();

    let (status, body) = server.request(
        "PUT",
        &format!("{API}/sandboxes/{name}"),
        Some(&sandbox(false)),
    );
    assert_eq!(status, 200, "{body}");
    let edited = server.wait_running_at(&name, 2, Duration::from_secs(60));
    let new_container = edited["status"]["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(new_container, old_container);
    if carried {
        // The files themselves came along (same inodes): nothing was copied.
        assert_eq!(edited["status"]["claimedFrom"], pool.as_str(), "{edited:#}");
        assert_eq!(new_container, member, "the warm container took over");
    } else {
        // gVisor shows no container files to the host: a new container on the same workspace.
        assert!(edited["status"]["claimedFrom"].is_null(), "{edited:#}");
        assert_eq!(edited["status"]["workspaceVolume"], old_volume.as_str());
    }
    let c = container(&name).unwrap();
    assert_eq!(c["Id"], new_container.as_str());
    assert_eq!(c["HostConfig"]["ReadonlyRootfs"], false);
    assert_eq!(c["HostConfig"]["CapDrop"], json!(["ALL"]));
    let (code, out) = docker_exec(
        &name,
        "awk '$2 == \"/\" {split($4, o, \",\"); print o[1]}' /proc/mounts; \
         test -e /tmp/marker || echo fresh-tmp; ps -o args | grep -c '^sleep 1000' || true",
    );
    assert_eq!((code, out.as_str()), (0, "rw\nfresh-tmp\n0\n"));
    assert_eq!(server.exec(&name, "echo $MODE").1, "kept\n");

    // The old container goes, and with it its workspace when the files moved out of it.
    wait_until(
        "the old container is removed",
        Duration::from_secs(30),
        || inspect(&["--type", "container", &old_container]).is_none(),
    );
    if carried {
        wait_until(
            "the old workspace is removed",
            Duration::from_secs(30),
            || inspect(&["--type", "volume", &old_volume]).is_none(),
        );
    }
    assert!(
        container(&format!("{name}.restore")).is_none(),
        "no staging container is left"
    );
    // Compared once the old workspace is gone: until then its names count as links too.
    assert_eq!(workspace_listing(&name, carried), before);
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert!(status < 300);
    server.wait_gone("sandboxes", &name);
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxpools/{pool}"), None);
    assert!(status < 300);
}

/// The helper's `mode` processes in a container (`agent-sandbox-helper bridge`: connections to
/// its process supervisor; `… serve`: helper channels), as seen from inside it.
fn helper_processes(container: &str, mode: &str) -> usize {
    let wanted = format!("agent-sandbox-helper {mode}");
    docker(&["exec", container, "ps", "-o", "args"])
        .lines()
        .filter(|l| l.contains(&wanted))
        .count()
}

/// Starts a pool of one, waits until its member has one `mode` connection open, claims it with a
/// `/v1` create, and answers the sandbox's ID and its container's.
fn claim_warm_member(server: &Server, prefix: &str, mode: &str) -> (String, String) {
    let pool = start_pool(server, prefix, 1);
    let member = members(&pool).pop().expect("one member");
    wait_until(
        &format!("the member's helper {mode} connection opened"),
        Duration::from_secs(20),
        || helper_processes(&member, mode) == 1,
    );
    let (status, created) = server.request("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let sandbox = server.get("sandboxes", &id).unwrap();
    assert_eq!(sandbox["status"]["claimedFrom"], pool.as_str());
    let container = named_container(&id)["Id"].as_str().unwrap().to_string();
    (id, container)
}

/// A member waiting in its pool already has a connection to its process supervisor open, so the
/// sandbox that claims it starts its first process without a `docker exec` first; the claim
/// keeps the container, and that connection serves it.
#[test]
fn a_waiting_member_has_its_supervisor_connection_open_and_the_claim_uses_it() {
    let server = Server::start();
    let (id, container) = claim_warm_member(&server, "bridge", "bridge");
    assert_eq!(
        helper_processes(&container, "bridge"),
        1,
        "the connection survived the claim"
    );
    let (status, process) = server.request(
        "POST",
        &format!("{API}/sandboxes/{id}/processes"),
        Some(&json!({"command": "echo claimed"})),
    );
    assert_eq!(status, 201, "{process}");
    // The start went over the open connection: none was added.
    assert_eq!(helper_processes(&container, "bridge"), 1);
}

/// A member waiting in its pool also has its helper channel open, so the claiming sandbox's first
/// `/v1` command does not wait for a `docker exec` to start the helper; that channel serves it.
#[test]
fn a_waiting_member_has_its_helper_channel_open_and_the_first_exec_uses_it() {
    let server = Server::start();
    let (id, container) = claim_warm_member(&server, "channel", "serve");
    let (code, out) = server.exec(&id, "echo claimed");
    assert_eq!((code, out.as_str()), (0, "claimed\n"));
    // The command went over the channel opened while the member waited: none was added.
    assert_eq!(helper_processes(&container, "serve"), 1);
}
