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

#[test]
fn sandboxes_claim_warm_containers_with_their_own_limits_and_the_pool_refills() {
    let server = Server::start();
    let pool = unique("warm");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxpools"),
        Some(&pool_doc(&pool, 2)),
    );
    assert_eq!(status, 201, "{body}");
    wait_pool_ready(&server, &pool, 2);
    let before: HashSet<String> = members(&pool).into_iter().collect();
    assert_eq!(before.len(), 2);
    let member_ids: HashSet<String> = before
        .iter()
        .map(|n| {
            inspect(&["--type", "container", n]).unwrap()["Id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();

    // runsc cannot change a live container's limits, so there only default-sized sandboxes
    // claim; under runc the claim applies the sandbox's own limits.
    let runsc = test_runtime() == "runsc";
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
    let headroom = if runsc {
        agent_sandbox::docker::RUNSC_PIDS_HEADROOM
    } else {
        0
    };
    assert_eq!(c["HostConfig"]["PidsLimit"], pids + headroom);
    assert_eq!(c["HostConfig"]["ReadonlyRootfs"], true);
    assert_eq!(c["HostConfig"]["CapDrop"], json!(["ALL"]));
    // The sandbox's env reaches its commands even though the container was made before it.
    let (code, out) = server.request(
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(&json!({"command": "echo $FROM; id -u; touch /workspace/x && echo ok"})),
    );
    assert_eq!(code, 200, "{out}");
    assert_eq!(out["stdout"], "pool\n1000\nok\n");

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
    let pool = unique("race");
    let (status, _) = server.request(
        "POST",
        &format!("{API}/sandboxpools"),
        Some(&pool_doc(&pool, 3)),
    );
    assert_eq!(status, 201);
    wait_pool_ready(&server, &pool, 3);
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
