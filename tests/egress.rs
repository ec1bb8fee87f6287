//! Egress policies against the real daemon (runc, and gVisor with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): entries are validated with their index, a sandbox with
//! `egress` sits on an internal network with no way out of the host, edits of the list keep the
//! container, and `AGENT_SANDBOX_EGRESS_REQUIRED` / `AGENT_SANDBOX_EGRESS_DEFAULT` hold.
//!
//! The only addresses any probe sends to are those of containers and networks this suite made.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Removes a network (and whatever test containers are still attached) when dropped.
struct NetworkGuard(Vec<String>);

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        for name in &self.0 {
            let _ = docker_status(&["network", "rm", name]);
        }
    }
}

struct ContainerGuard(String);

impl Drop for ContainerGuard {
    fn drop(&mut self) {
        let _ = docker_status(&["rm", "-f", &self.0]);
    }
}

fn sandbox_doc(name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["image"] = json!(TEST_IMAGE);
    json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
           "metadata": {"name": name}, "spec": spec})
}

fn create(server: &Server, name: &str, spec: Value) -> Value {
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(&sandbox_doc(name, spec)),
    );
    assert_eq!(status, 201, "{body}");
    server.wait_running(name)
}

fn inside(server: &Server, name: &str, script: &str) -> (i64, String) {
    let body = json!({"command": script, "timeout_seconds": 30});
    let (status, out) = server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
    assert_eq!(status, 200, "exec of {script:?} in {name}: {out}");
    (
        out["exit_code"].as_i64().unwrap_or(-1),
        format!(
            "{}{}",
            out["stdout"].as_str().unwrap_or_default(),
            out["stderr"].as_str().unwrap_or_default()
        ),
    )
}

/// The networks a sandbox's container is attached to.
fn networks_of(name: &str) -> Vec<String> {
    let c = container(name).expect("container");
    c["NetworkSettings"]["Networks"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn allow_entries_are_validated_naming_entry_and_index() {
    let server = Server::start();
    let bad = sandbox_doc(
        &unique("eg-bad"),
        json!({"network": true, "egress": {"allow": ["pypi.org", "*.com", "x.org"]}}),
    );
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&bad));
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("spec.egress.allow[1]") && message.contains("\"*.com\""),
        "{message}"
    );

    for (entry, index) in [("10.0.0.1/8", 0), ("github.com:99999", 0), ("a..b", 0)] {
        let bad = sandbox_doc(
            &unique("eg-bad"),
            json!({"network": true, "egress": {"allow": [entry]}}),
        );
        let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&bad));
        assert_eq!(status, 422, "{entry}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("spec.egress.allow[{index}] {entry:?}")),
            "{message}"
        );
    }

    let no_network = sandbox_doc(
        &unique("eg-bad"),
        json!({"egress": {"allow": ["pypi.org"]}}),
    );
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&no_network));
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("spec.network: true"), "{message}");

    // A folder manifest is held to the same grammar, with its file and line.
    let name = unique("eg-folder");
    write_manifest(
        &server.watch_dir,
        "bad-egress.yaml",
        &sandbox_manifest(
            &name,
            "  network: true\n  egress:\n    allow:\n    - pypi.org\n    - \"py*.org\"\n",
        ),
    );
    wait_until(
        "the server log names the folder's bad entry",
        Duration::from_secs(15),
        || {
            let log = server.log();
            log.contains("spec.egress.allow[1]") && log.contains("py*.org")
        },
    );
    assert!(server.get("sandboxes", &name).is_none());
}

#[test]
fn an_egress_sandbox_has_no_way_out_and_edits_keep_its_container() {
    let net = unique("eg-net");
    let _networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
    let server = Server::start_with(&[("AGENT_SANDBOX_NETWORK_NAME", &net)]);

    let (open, policed) = (unique("eg-open"), unique("eg-policed"));
    create(&server, &open, json!({"network": true}));
    let running = create(
        &server,
        &policed,
        json!({"network": true, "egress": {"allow": ["pypi.org"]}}),
    );

    // What Docker was asked for: the internal network, inter-container traffic off.
    assert_eq!(networks_of(&open), [net.as_str()]);
    assert_eq!(networks_of(&policed), [format!("{net}-egress")]);
    let egress_net = inspect(&["--type", "network", &format!("{net}-egress")]).expect("network");
    assert_eq!(egress_net["Internal"], true, "{egress_net}");
    assert_eq!(
        egress_net["Options"]["com.docker.network.bridge.enable_icc"], "false",
        "{egress_net}"
    );
    assert_eq!(egress_net["Labels"]["io.agent-sandbox.managed"], "true");
    let gateway = |network: &str| -> String {
        inspect(&["--type", "network", network]).expect("network")["IPAM"]["Config"][0]["Gateway"]
            .as_str()
            .expect("gateway")
            .to_string()
    };
    let (open_gateway, egress_gateway) = (gateway(&net), gateway(&format!("{net}-egress")));

    // A service of the test's own, on a network of its own, published only on the host's
    // addresses on the two sandbox bridges: reaching it means leaving one's own network.
    let upstream_net = unique("eg-upstream-net");
    let _upstream_net = NetworkGuard(vec![upstream_net.clone()]);
    docker(&["network", "create", &upstream_net]);
    let upstream = unique("eg-upstream");
    let _upstream = ContainerGuard(upstream.clone());
    let (open_port, egress_port) = (free_port(), free_port());
    docker(&[
        "run",
        "-d",
        "--name",
        &upstream,
        "--network",
        &upstream_net,
        "-p",
        &format!("{open_gateway}:{open_port}:8000"),
        "-p",
        &format!("{egress_gateway}:{egress_port}:8000"),
        TEST_IMAGE,
        "sh",
        "-c",
        "while true; do echo reached-upstream | nc -l -p 8000; done",
    ]);

    // The open sandbox gets out to it (the control); the policed one does not.
    let mut out = String::new();
    wait_until(
        "the open sandbox reaches the upstream",
        Duration::from_secs(15),
        || {
            out = inside(
                &server,
                &open,
                &format!("nc -w 2 {open_gateway} {open_port} </dev/null"),
            )
            .1;
            out.contains("reached-upstream")
        },
    );
    let (_, out) = inside(
        &server,
        &policed,
        &format!("nc -w 3 {egress_gateway} {egress_port} </dev/null; echo rc=$?"),
    );
    assert!(!out.contains("reached-upstream"), "{out}");
    assert!(!out.contains("rc=0"), "{out}");
    let upstream_ip = inspect(&[&upstream]).expect("upstream")["NetworkSettings"]["Networks"]
        [&upstream_net]["IPAddress"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, out) = inside(
        &server,
        &policed,
        &format!("nc -w 3 {upstream_ip} 8000 </dev/null; echo rc=$?"),
    );
    assert!(!out.contains("reached-upstream"), "{out}");
    let allow = format!("{upstream_ip}/32:8000");

    // An edit of the list keeps the container; turning the policy off replaces it.
    let id = running["status"]["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    let mut doc = server.get("sandboxes", &policed).unwrap();
    doc["spec"]["egress"]["allow"] = json!(["pypi.org", allow]);
    let generation = doc["metadata"]["generation"].as_u64().unwrap();
    let (status, body) = server.request("PUT", &format!("{API}/sandboxes/{policed}"), Some(&doc));
    assert_eq!(status, 200, "{body}");
    let after = server.wait_running_at(&policed, generation + 1, Duration::from_secs(30));
    assert_eq!(after["status"]["containerID"], id.as_str(), "{after}");
    assert_eq!(networks_of(&policed), [format!("{net}-egress")]);

    let mut doc = server.get("sandboxes", &policed).unwrap();
    doc["spec"].as_object_mut().unwrap().remove("egress");
    let (status, body) = server.request("PUT", &format!("{API}/sandboxes/{policed}"), Some(&doc));
    assert_eq!(status, 200, "{body}");
    let after = server.wait_running_at(&policed, generation + 2, Duration::from_secs(60));
    assert_ne!(after["status"]["containerID"], id.as_str(), "{after}");
    assert_eq!(networks_of(&policed), [net.as_str()]);

    for name in [&open, &policed] {
        server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
        server.wait_gone("sandboxes", name);
    }
}

#[test]
fn required_refuses_open_networks_and_the_default_list_polices_them() {
    let net = unique("eg-req");
    let _networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
    let server = Server::start_with(&[
        ("AGENT_SANDBOX_NETWORK_NAME", &net),
        ("AGENT_SANDBOX_EGRESS_REQUIRED", "true"),
    ]);
    let (status, body) = server.request(
        "POST",
        "/v1/sandboxes",
        Some(&json!({"image": TEST_IMAGE, "network": true})),
    );
    assert_eq!(status, 403, "{body}");
    assert!(
        body.to_string().contains("AGENT_SANDBOX_EGRESS_REQUIRED"),
        "{body}"
    );

    let open = unique("eg-req-open");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(&sandbox_doc(&open, json!({"network": true}))),
    );
    assert_eq!(status, 201, "{body}");
    let failed = server
        .wait_for("sandboxes", &open, "Failed", Duration::from_secs(30), |s| {
            s.is_some_and(|s| s["status"]["phase"] == "Failed")
        })
        .unwrap();
    assert!(
        failed.to_string().contains("AGENT_SANDBOX_EGRESS_REQUIRED"),
        "{failed}"
    );
    assert!(containers_of(&open).is_empty());
    let policed = unique("eg-req-policed");
    create(
        &server,
        &policed,
        json!({"network": true, "egress": {"allow": ["pypi.org"]}}),
    );
    assert_eq!(networks_of(&policed), [format!("{net}-egress")]);
    let offline = unique("eg-req-offline");
    create(&server, &offline, json!({}));
    drop(server);

    let server = Server::start_with(&[
        ("AGENT_SANDBOX_NETWORK_NAME", &net),
        ("AGENT_SANDBOX_EGRESS_REQUIRED", "true"),
        (
            "AGENT_SANDBOX_EGRESS_DEFAULT",
            "pypi.org,*.pythonhosted.org",
        ),
    ]);
    let by_default = unique("eg-default");
    create(&server, &by_default, json!({"network": true}));
    assert_eq!(networks_of(&by_default), [format!("{net}-egress")]);
    for name in [&open, &policed, &offline, &by_default] {
        server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
        server.wait_gone("sandboxes", name);
    }
}

#[test]
fn bad_egress_settings_stop_the_server_naming_the_variable() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(["serve"])
        .env("AGENT_SANDBOX_EGRESS_DEFAULT", "pypi.org,*")
        .env(
            "AGENT_SANDBOX_DATA_DIR",
            tempfile::tempdir().unwrap().path(),
        )
        .env("AGENT_SANDBOX_PORT", free_port().to_string())
        .output()
        .expect("run serve");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("AGENT_SANDBOX_EGRESS_DEFAULT"), "{text}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(["serve"])
        .env("AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW", "10.0.0.0/33")
        .env(
            "AGENT_SANDBOX_DATA_DIR",
            tempfile::tempdir().unwrap().path(),
        )
        .env("AGENT_SANDBOX_PORT", free_port().to_string())
        .output()
        .expect("run serve");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW"),
        "{text}"
    );
}
