//! A sandbox's deletion against the real Docker daemon, through both routes (`DELETE` of the
//! resource API and of `/v1`): it answers once the sandbox is gone from the API and its
//! processes are dead, the name can be used again at once (a new container and an empty
//! workspace, under names that never collide with the old ones), and the removal that finishes
//! in the background survives a kill -9 of the server without leaking or touching the new
//! sandbox of the same name.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const API: &str = "/apis/agent-sandbox.io/v1";

/// Which of the two DELETE routes a test goes through.
#[derive(Clone, Copy)]
enum Route {
    Resource,
    V1,
}

impl Route {
    /// Deletes sandbox `name`, checking the answer the route gives once the deletion is done.
    fn delete(self, server: &Server, name: &str) {
        match self {
            Route::Resource => {
                let (status, body) =
                    server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
                assert_eq!(status, 200, "{body}");
                assert_eq!(body["metadata"]["name"], name, "{body}");
            }
            Route::V1 => {
                let (status, body) =
                    server.request("DELETE", &format!("/v1/sandboxes/{name}"), None);
                assert_eq!(status, 204, "{body}");
            }
        }
    }
}

fn sandbox_doc(name: &str) -> Value {
    json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}})
}

fn create(server: &Server, name: &str) -> Value {
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(&sandbox_doc(name)),
    );
    assert_eq!(status, 201, "{body}");
    server.wait_running(name)
}

fn workspace_of(sandbox: &Value) -> String {
    sandbox["status"]["workspaceVolume"]
        .as_str()
        .expect("workspace volume")
        .to_string()
}

fn container_id(name: &str) -> String {
    container(name).expect("container exists")["Id"]
        .as_str()
        .expect("container ID")
        .to_string()
}

/// Starts a long sleep in the sandbox beside its own processes, and returns what will show that
/// they are dead: under runc the host PIDs of everything in the container (`docker top` lists
/// them, the sleep included); under gVisor, whose processes are its own kernel's, the host PID of
/// that kernel (runsc's sandbox process, the container's PID as Docker reports it).
fn start_a_process(name: &str) -> Vec<u32> {
    let container = format!("agent-sandbox-{name}");
    docker(&["exec", "-d", &container, "sleep", "300"]);
    if gvisor() {
        // `docker top` does not see into gVisor's kernel; its own `ps` does.
        wait_until("the sleep runs", Duration::from_secs(10), || {
            docker_exec(name, "ps").1.contains("sleep 300")
        });
        let kernel = common::container(name).expect("container exists")["State"]["Pid"]
            .as_u64()
            .expect("a PID");
        return vec![u32::try_from(kernel).expect("a host PID")];
    }
    let mut top = String::new();
    wait_until("the sleep runs", Duration::from_secs(10), || {
        top = docker(&["top", &container, "-eo", "pid,args"]);
        top.contains("sleep 300")
    });
    let pids: Vec<u32> = top
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(pids.len() >= 2, "{top}");
    pids
}

/// What the answer to a DELETE promises: the sandbox is gone from the API (not found, not
/// listed), nothing it ran is alive, and its container name is free.
fn assert_deleted(server: &Server, name: &str, pids: &[u32], old_container: &str) {
    let (status, body) = server.request("GET", &format!("{API}/sandboxes/{name}"), None);
    assert_eq!(status, 404, "{body}");
    let (status, list) = server.request("GET", &format!("{API}/sandboxes"), None);
    assert_eq!(status, 200, "{list}");
    let listed = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .any(|s| s["metadata"]["name"] == name);
    assert!(!listed, "the deleted sandbox is still listed");
    let alive: Vec<u32> = pids.iter().copied().filter(|p| !dead(*p)).collect();
    assert!(
        alive.is_empty(),
        "processes of the sandbox still run: {alive:?}"
    );
    assert!(
        container(name).is_none(),
        "the sandbox's container name is still taken"
    );
    // Docker notices a kill made through the container's PID 1 a moment later.
    wait_until(
        "Docker reports the old container stopped",
        Duration::from_secs(5),
        || {
            inspect(&["--type", "container", old_container])
                .is_none_or(|c| c["State"]["Running"] == false)
        },
    );
}

fn deletion_answers_once_gone_and_killed_and_the_name_is_reusable(route: Route, prefix: &str) {
    let server = Server::start();
    let name = unique(prefix);
    let first = create(&server, &name);
    let old_container = container_id(&name);
    let old_volume = workspace_of(&first);
    let (code, _) = docker_exec(
        &name,
        "echo old > /workspace/old && mkdir /workspace/many && cd /workspace/many && \
         i=0; while [ $i -lt 2000 ]; do echo $i > f$i; i=$((i+1)); done",
    );
    assert_eq!(code, 0);
    let pids = start_a_process(&name);

    route.delete(&server, &name);
    assert_deleted(&server, &name, &pids, &old_container);

    // The same name at once: a container and a workspace of its own, empty.
    let second = create(&server, &name);
    assert_ne!(second["metadata"]["uid"], first["metadata"]["uid"]);
    let new_container = container_id(&name);
    assert_ne!(new_container, old_container);
    let new_volume = workspace_of(&second);
    let (code, listing) = docker_exec(&name, "ls -A /workspace");
    assert_eq!(code, 0);
    assert_eq!(listing, "", "the old workspace shows in the new sandbox");

    // The background removal leaves exactly the new sandbox's objects.
    wait_until(
        "the deleted sandbox's objects are removed",
        Duration::from_secs(30),
        || {
            containers_of(&name) == vec![new_container[..12].to_string()]
                && volumes_of(&name) == vec![new_volume.clone()]
        },
    );
    assert!(inspect(&["--type", "container", &old_container]).is_none());
    assert!(old_volume == new_volume || inspect(&["--type", "volume", &old_volume]).is_none());

    route.delete(&server, &name);
    wait_until("everything removed", Duration::from_secs(30), || {
        containers_of(&name).is_empty() && volumes_of(&name).is_empty()
    });
}

#[test]
fn resource_api_delete_answers_once_gone_and_killed_and_the_name_is_reusable() {
    deletion_answers_once_gone_and_killed_and_the_name_is_reusable(Route::Resource, "rdel");
}

#[test]
fn v1_delete_answers_once_gone_and_killed_and_the_name_is_reusable() {
    deletion_answers_once_gone_and_killed_and_the_name_is_reusable(Route::V1, "vdel");
}

#[test]
fn wait_false_answers_at_once_and_the_deletion_goes_on() {
    let server = Server::start();
    let name = unique("nowait");
    create(&server, &name);
    let (status, body) = server.request(
        "DELETE",
        &format!("{API}/sandboxes/{name}?wait=false"),
        None,
    );
    assert_eq!(status, 202, "{body}");
    assert!(body["metadata"]["deletionTimestamp"].is_string(), "{body}");
    server.wait_gone("sandboxes", &name);
    wait_until("its objects are removed", Duration::from_secs(30), || {
        containers_of(&name).is_empty() && volumes_of(&name).is_empty()
    });
    let (status, body) = server.request(
        "DELETE",
        &format!("{API}/sandboxes/{name}?wait=maybe"),
        None,
    );
    assert_eq!(status, 400, "{body}");
}

/// kill -9 right after the DELETE answered and the name was taken again: the restarted server
/// removes the old container and workspace, leaks nothing, and leaves the new sandbox as it was.
#[test]
fn kill_9_after_delete_and_recreate_removes_the_old_and_keeps_the_new() {
    // Garbage collection every second, so the restarted server finishes what the killed one left.
    let mut server = Server::start_with(&[("AGENT_SANDBOX_RESYNC_SECONDS", "1")]);
    let name = unique("delre");
    let first = create(&server, &name);
    let old_container = container_id(&name);
    let old_volume = workspace_of(&first);
    let (code, _) = docker_exec(
        &name,
        "mkdir /workspace/many && cd /workspace/many && \
         i=0; while [ $i -lt 3000 ]; do echo $i > f$i; i=$((i+1)); done",
    );
    assert_eq!(code, 0);
    let pids = start_a_process(&name);

    Route::Resource.delete(&server, &name);
    assert_deleted(&server, &name, &pids, &old_container);
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(&sandbox_doc(&name)),
    );
    assert_eq!(status, 201, "{body}");
    let new_uid = body["metadata"]["uid"].clone();
    server.kill9();
    eprintln!(
        "left by the killed server: containers {:?}, volumes {:?}",
        containers_of(&name),
        volumes_of(&name)
    );

    server.restart();
    let second = server.wait_running(&name);
    assert_eq!(second["metadata"]["uid"], new_uid);
    let new_container = container_id(&name);
    assert_ne!(new_container, old_container);
    let new_volume = workspace_of(&second);
    assert!(docker_exec(&name, "echo new > /workspace/mine").0 == 0);
    wait_until(
        "the restarted server removes what the deletion left",
        Duration::from_secs(30),
        || {
            inspect(&["--type", "container", &old_container]).is_none()
                && (old_volume == new_volume
                    || inspect(&["--type", "volume", &old_volume]).is_none())
                && containers_of(&name).len() == 1
                && volumes_of(&name) == vec![new_volume.clone()]
        },
    );
    // No duplicate, and the new sandbox untouched: the same container, running, its file there.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(containers_of(&name).len(), 1);
    assert_eq!(volumes_of(&name), vec![new_volume.clone()]);
    assert_eq!(container_id(&name), new_container);
    assert_eq!(
        container(&name).expect("container")["State"]["Running"],
        true
    );
    let (code, out) = docker_exec(&name, "cat /workspace/mine; ls /workspace");
    assert_eq!(code, 0);
    assert_eq!(out, "new\nmine\n");

    Route::V1.delete(&server, &name);
    wait_until("everything removed", Duration::from_secs(30), || {
        containers_of(&name).is_empty() && volumes_of(&name).is_empty()
    });
}
