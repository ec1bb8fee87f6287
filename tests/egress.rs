//! Egress policies against the real daemon (runc, and gVisor with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): entries are validated with their index, a sandbox with
//! `egress` sits on an internal network with no way out of the host, edits of the list keep the
//! container, and `AGENT_SANDBOX_EGRESS_REQUIRED` / `AGENT_SANDBOX_EGRESS_DEFAULT` hold.
//!
//! The only addresses any probe sends to are those of containers and networks this suite made.

mod common;

use std::time::Duration;

use common::routed::RoutedPeer;
use common::*;
use serde_json::{json, Value};

/// An address beyond the host for the open sandbox to reach (TEST-NET-1, documentation only),
/// held by a namespace of the test's own and routed there alone.
const OUTSIDE: &str = "192.0.2.77";

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
    let egress_gateway = gateway(&format!("{net}-egress"));

    // A service of the test's own, on a network of its own, published only on the host's
    // address on the internal bridge: reaching it means leaving one's own network.
    let upstream_net = unique("eg-upstream-net");
    let _upstream_net = NetworkGuard(vec![upstream_net.clone()]);
    docker(&["network", "create", &upstream_net]);
    let upstream = unique("eg-upstream");
    let _upstream = ContainerGuard(upstream.clone());
    let egress_port = free_port();
    docker(&[
        "run",
        "-d",
        "--name",
        &upstream,
        "--network",
        &upstream_net,
        "-p",
        &format!("{egress_gateway}:{egress_port}:8000"),
        TEST_IMAGE,
        "sh",
        "-c",
        "while true; do echo reached-upstream | nc -l -p 8000; done",
    ]);

    // The open sandbox gets out (the control): to an address beyond the host, in a namespace of
    // the test's own (the host's own addresses are refused to open sandboxes). The policed one
    // reaches neither that nor the upstream published on the host's address on its bridge.
    let outside_port = free_port();
    let _outside = RoutedPeer::start(OUTSIDE, "192.0.2.1", outside_port, "reached-outside");
    let mut out = String::new();
    wait_until(
        "the open sandbox reaches the outside",
        Duration::from_secs(15),
        || {
            out = inside(
                &server,
                &open,
                &format!("nc -w 2 {OUTSIDE} {outside_port} </dev/null"),
            )
            .1;
            out.contains("reached-outside")
        },
    );
    let (_, out) = inside(
        &server,
        &policed,
        &format!("nc -w 3 {OUTSIDE} {outside_port} </dev/null; echo rc=$?"),
    );
    // (The gateway's transparent listener takes every TCP connection of a policed sandbox and
    // decides on its first bytes, so the connect itself may succeed; nothing gets through.)
    assert!(!out.contains("reached-outside"), "{out}");
    let (_, out) = inside(
        &server,
        &policed,
        &format!("nc -w 3 {egress_gateway} {egress_port} </dev/null; echo rc=$?"),
    );
    assert!(!out.contains("reached-upstream"), "{out}");
    wait_until("the refusals are logged", Duration::from_secs(10), || {
        let log = decisions(&server, &policed);
        let refused = |host: &str, port: u16| {
            log.iter().any(|d| {
                d["protocol"] == "tcp"
                    && d["host"] == host
                    && d["port"] == port
                    && d["allowed"] == false
            })
        };
        refused(OUTSIDE, outside_port) && refused(&egress_gateway, egress_port)
    });
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

/// The test's own "internet": an HTTP server in a container on a network of the test's own,
/// reachable from the host (where the gateway runs); its name comes from a hosts file.
struct Internet {
    _containers: Vec<ContainerGuard>,
    _networks: NetworkGuard,
    subnet: String,
    upstream_ip: String,
    private_ip: String,
}

fn internet() -> Internet {
    let (net, other) = (unique("eg-inet"), unique("eg-lan"));
    let networks = NetworkGuard(vec![net.clone(), other.clone()]);
    docker(&["network", "create", &net]);
    docker(&["network", "create", &other]);
    let (up, lan) = (unique("eg-up"), unique("eg-lan-host"));
    let containers = vec![ContainerGuard(up.clone()), ContainerGuard(lan.clone())];
    for (name, network) in [(&up, &net), (&lan, &other)] {
        docker(&[
            "run", "-d", "--name", name, "--network", network, TEST_IMAGE, "sh", "-c",
            "mkdir -p /www && echo hello-from-upstream > /www/index.html && httpd -f -p 8000 -h /www",
        ]);
    }
    let ip = |name: &str, network: &str| {
        inspect(&[name]).expect("container")["NetworkSettings"]["Networks"][network]["IPAddress"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let subnet = inspect(&["--type", "network", &net]).expect("network")["IPAM"]["Config"][0]
        ["Subnet"]
        .as_str()
        .unwrap()
        .to_string();
    Internet {
        upstream_ip: ip(&up, &net),
        private_ip: ip(&lan, &other),
        subnet,
        _containers: containers,
        _networks: networks,
    }
}

/// A server whose policed sandboxes reach the test's "internet" by the names `hosts` (a hosts
/// file's lines) gives them, on networks of its own; dropped server first, then the networks.
struct Policed {
    server: Server,
    net: String,
    _networks: NetworkGuard,
    _hosts: tempfile::NamedTempFile,
}

impl Policed {
    fn start(world: &Internet, prefix: &str, hosts: &str) -> Policed {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), hosts).unwrap();
        let net = unique(prefix);
        let networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
        let hosts_path = file.path().to_str().unwrap().to_string();
        let server = Server::start_with(&[
            ("AGENT_SANDBOX_NETWORK_NAME", &net),
            ("AGENT_SANDBOX_EGRESS_HOSTS", &hosts_path),
            // The test's upstream lives in a private range: this server may reach that one block.
            ("AGENT_SANDBOX_EGRESS_PRIVATE_ALLOW", &world.subnet),
        ]);
        Policed {
            server,
            net,
            _networks: networks,
            _hosts: file,
        }
    }

    /// Creates sandboxes of the given images, each with `network: true` and `egress`.
    fn create(&self, sandboxes: &[(&str, &str)], egress: &Value) {
        for (sandbox, image) in sandboxes {
            let spec = json!({"network": true, "egress": egress, "image": image});
            let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                             "metadata": {"name": sandbox}, "spec": spec});
            let (status, body) =
                self.server
                    .request("POST", &format!("{API}/sandboxes"), Some(&doc));
            assert_eq!(status, 201, "{body}");
        }
    }

    /// The host's address on the internal network: the gateway's.
    fn gateway(&self) -> String {
        inspect(&["--type", "network", &format!("{}-egress", self.net)]).unwrap()["IPAM"]["Config"]
            [0]["Gateway"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn decisions(server: &Server, name: &str) -> Vec<Value> {
    let (status, body) = server.request_raw(
        "GET",
        &format!("{API}/sandboxes/{name}/egress?follow=false"),
        None,
        "application/json",
    );
    assert_eq!(status, 200, "{body}");
    body.lines()
        .map(|l| serde_json::from_str(l).expect("an NDJSON line"))
        .collect()
}

#[test]
fn the_gateway_answers_allowed_names_proxies_allowed_hosts_and_logs_every_decision() {
    if !python_image("the egress gateway test") {
        return;
    }
    let world = internet();
    let policed = Policed::start(
        &world,
        "eg-gw",
        &format!(
            "{up} up.example.test other.example.test\n{lan} lan.example.test\n",
            up = world.upstream_ip,
            lan = world.private_ip
        ),
    );
    let server = &policed.server;
    let allow = json!({"allow": ["up.example.test:8000", "lan.example.test"]});
    // busybox (wget, nslookup) and python (urllib, raw sockets) under the same list.
    let (name, py) = (unique("eg-gw"), unique("eg-gw-py"));
    policed.create(&[(&name, TEST_IMAGE), (&py, PYTHON_IMAGE)], &allow);
    server.wait_running(&py);
    let running = server.wait_running(&name);
    let id = running["status"]["containerID"]
        .as_str()
        .unwrap()
        .to_string();

    // Docker was asked for the gateway's name server; the proxy variables are set.
    let c = container(&name).expect("container");
    let egress_gateway = policed.gateway();
    assert_eq!(c["HostConfig"]["Dns"], json!([egress_gateway]), "{c}");
    let env = c["Config"]["Env"].to_string();
    for var in [
        "HTTP_PROXY=http://",
        "https_proxy=http://",
        "NO_PROXY=localhost,127.0.0.1",
    ] {
        assert!(env.contains(var), "{var} in {env}");
    }

    // Allowed over HTTP through the proxy (busybox wget honours http_proxy).
    let (code, out) = inside(server, &name, "wget -q -O - http://up.example.test:8000/");
    assert_eq!(code, 0, "{out}\n{}", server.log());
    assert!(out.contains("hello-from-upstream"), "{out}");
    // And through python's urllib.
    let (code, out) = inside(
        server,
        &py,
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://up.example.test:8000/', timeout=10).read().decode())\"",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello-from-upstream"), "{out}");
    // Through a CONNECT tunnel: the bytes pass end to end, unread by the gateway.
    let tunnel = "import os,socket; p=os.environ['https_proxy'].split('//')[1].split(':'); \
        s=socket.create_connection((p[0],int(p[1])),10); \
        s.sendall(b'CONNECT up.example.test:8000 HTTP/1.1\\r\\nHost: up.example.test:8000\\r\\n\\r\\n'); \
        h=s.recv(4096); assert h.startswith(b'HTTP/1.1 200'), h; \
        s.sendall(b'GET / HTTP/1.0\\r\\n\\r\\n'); d=b''; \
        exec('while True:\\n c=s.recv(4096)\\n if not c: break\\n d+=c'); print(d.decode())";
    let (code, out) = inside(server, &py, &format!("python3 -c \"{tunnel}\""));
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello-from-upstream"), "{out}");

    // A name the list does not allow: refused at once with the reason, and logged.
    let started = std::time::Instant::now();
    let (code, out) = inside(
        server,
        &name,
        "wget -q -O - http://other.example.test:8000/ 2>&1; echo rc=$?",
    );
    assert!(out.contains("403") || !out.contains("rc=0"), "{out}");
    assert!(!out.contains("hello-from-upstream"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    let _ = code;
    // A port the entry does not name, and a bare address.
    let (_, out) = inside(
        server,
        &name,
        "wget -q -O - http://up.example.test:8001/ 2>&1; echo rc=$?",
    );
    assert!(!out.contains("rc=0"), "{out}");
    let (_, out) = inside(
        server,
        &name,
        &format!(
            "wget -q -O - http://{}:8000/ 2>&1; echo rc=$?",
            world.upstream_ip
        ),
    );
    assert!(
        !out.contains("rc=0") && !out.contains("hello-from-upstream"),
        "{out}"
    );
    // An allowed name that resolves to a private address (not in the server's exception).
    let (_, out) = inside(
        server,
        &name,
        "wget -q -O - http://lan.example.test:8000/ 2>&1; echo rc=$?",
    );
    assert!(
        !out.contains("rc=0") && !out.contains("hello-from-upstream"),
        "{out}"
    );

    // DNS: an allowed name is answered, a denied one gets NXDOMAIN, a private one too.
    let (_, out) = inside(server, &name, "nslookup up.example.test 2>&1");
    assert!(out.contains(&world.upstream_ip), "{out}");
    let (_, out) = inside(
        server,
        &name,
        "nslookup other.example.test 2>&1; echo rc=$?",
    );
    assert!(
        out.contains("NXDOMAIN") && !out.contains(&world.upstream_ip),
        "{out}"
    );
    let (_, out) = inside(server, &name, "nslookup lan.example.test 2>&1");
    assert!(!out.contains(&world.private_ip), "{out}");

    // Every decision is in the log, with its rule.
    let mut log = Vec::new();
    wait_until("the decisions are logged", Duration::from_secs(10), || {
        log = decisions(server, &name);
        log.iter()
            .any(|d| d["protocol"] == "http" && d["host"] == "lan.example.test")
            && log
                .iter()
                .any(|d| d["protocol"] == "dns" && d["host"] == "other.example.test")
    });
    let find = |protocol: &str, host: &str, allowed: bool| {
        log.iter()
            .find(|d| d["protocol"] == protocol && d["host"] == host && d["allowed"] == allowed)
            .unwrap_or_else(|| panic!("{protocol} {host} {allowed} in {log:#?}"))
            .clone()
    };
    let http = find("http", "up.example.test", true);
    assert_eq!(http["rule"], "up.example.test:8000");
    assert_eq!(http["address"], world.upstream_ip.as_str());
    assert_eq!(http["port"], 8000);
    assert!(http["bytesIn"].as_u64().unwrap() > 0 && http["bytesOut"].as_u64().unwrap() > 0);
    let denied = find("http", "other.example.test", false);
    assert!(
        denied["rule"].as_str().unwrap().contains("no entry allows"),
        "{denied}"
    );
    let private = find("http", "lan.example.test", false);
    assert!(
        private["rule"].as_str().unwrap().contains("protected"),
        "{private}"
    );
    find("dns", "up.example.test", true);
    let nx = find("dns", "other.example.test", false);
    assert!(
        nx["rule"].as_str().unwrap().contains("no entry allows"),
        "{nx}"
    );
    // The CLI shows the same log as a table.
    let cli = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args([
            "egress",
            &name,
            "--server",
            &server.url,
            "--api-key",
            &server.key,
        ])
        .output()
        .expect("the CLI runs");
    let table = String::from_utf8_lossy(&cli.stdout);
    assert!(cli.status.success(), "{table}");
    assert!(table.starts_with("TIME "), "{table}");
    let refused_lookup = table
        .lines()
        .find(|l| l.contains(" dns ") && l.contains("other.example.test"))
        .unwrap_or_else(|| panic!("the refused lookup in {table}"));
    assert!(refused_lookup.contains("refused"), "{refused_lookup}");
    assert!(
        table.lines().any(|l| l.contains(" http ")
            && l.contains("up.example.test")
            && l.contains(&format!("{}:8000", world.upstream_ip))
            && l.contains("allowed")),
        "{table}"
    );
    // With -f it goes on printing new decisions as they are made.
    let mut follower = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args([
            "egress",
            &name,
            "-f",
            "--server",
            &server.url,
            "--api-key",
            &server.key,
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the CLI runs");
    let lines = std::io::BufRead::lines(std::io::BufReader::new(follower.stdout.take().unwrap()));
    let (found, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let line = lines
            .map_while(Result::ok)
            .find(|l| l.contains("followed.example.test"));
        let _ = found.send(line);
    });
    inside(server, &name, "nslookup followed.example.test 2>&1");
    let seen = seen.recv_timeout(Duration::from_secs(30)).ok().flatten();
    let _ = follower.kill();
    let _ = follower.wait();
    assert!(seen.is_some_and(|l| l.contains("refused")));

    let tunnels = decisions(server, &py);
    let tls = tunnels
        .iter()
        .find(|d| d["protocol"] == "tls" && d["allowed"] == true)
        .unwrap_or_else(|| panic!("a tunnel in {tunnels:#?}"));
    assert_eq!(tls["rule"], "up.example.test:8000");
    assert!(tls["bytesIn"].as_u64().unwrap() > 0, "{tls}");
    for d in &log {
        for key in [
            "time", "protocol", "host", "address", "port", "allowed", "rule", "bytesOut", "bytesIn",
        ] {
            assert!(d.get(key).is_some(), "{key} in {d}");
        }
    }

    // Every decision is counted in the metrics, by protocol and decision, and the series name
    // neither a host nor a path.
    for sandbox in [&name, &py] {
        let mut last = String::new();
        wait_until(
            "the metrics count every logged decision",
            Duration::from_secs(10),
            || {
                let log = decisions(server, sandbox);
                let (status, text) = common::http(
                    "GET",
                    &format!("{}/metrics", server.url),
                    Some(&server.key),
                    None,
                    "text/plain",
                );
                assert_eq!(status, 200, "{text}");
                last = text
                    .lines()
                    .filter(|l| l.starts_with("agent_sandbox_egress_decisions_total{"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
                    .join("\n");
                let mut all_match = true;
                for protocol in ["dns", "http", "tls"] {
                    for allowed in [true, false] {
                        let logged = log
                            .iter()
                            .filter(|d| d["protocol"] == protocol && d["allowed"] == allowed)
                            .count();
                        let decision = if allowed { "allowed" } else { "refused" };
                        let series = format!(
                            "agent_sandbox_egress_decisions_total{{namespace=\"default\",sandbox=\"{sandbox}\",protocol=\"{protocol}\",decision=\"{decision}\"}} "
                        );
                        let counted = text
                            .lines()
                            .find_map(|l| l.strip_prefix(series.as_str()))
                            .map_or(0, |v| v.trim().parse::<f64>().unwrap_or(-1.0) as usize);
                        all_match &= counted == logged;
                    }
                }
                all_match
            },
        );
        assert!(
            !last.contains("example.test") && !last.contains('/'),
            "{last}"
        );
    }
    let (_, text) = common::http(
        "GET",
        &format!("{}/metrics", server.url),
        Some(&server.key),
        None,
        "text/plain",
    );
    for series in [
        format!("agent_sandbox_egress_decisions_total{{namespace=\"default\",sandbox=\"{name}\",protocol=\"http\",decision=\"allowed\"}}"),
        format!("agent_sandbox_egress_decisions_total{{namespace=\"default\",sandbox=\"{name}\",protocol=\"http\",decision=\"refused\"}}"),
        format!("agent_sandbox_egress_decisions_total{{namespace=\"default\",sandbox=\"{name}\",protocol=\"dns\",decision=\"refused\"}}"),
        format!("agent_sandbox_egress_decisions_total{{namespace=\"default\",sandbox=\"{py}\",protocol=\"tls\",decision=\"allowed\"}}"),
    ] {
        assert!(text.lines().any(|l| l.starts_with(&series)), "{series} in\n{text}");
    }

    // A live edit applies to the next connection, on the same container.
    let mut doc = server.get("sandboxes", &name).unwrap();
    doc["spec"]["egress"]["allow"] = json!(["other.example.test:8000"]);
    let generation = doc["metadata"]["generation"].as_u64().unwrap();
    let (status, body) = server.request("PUT", &format!("{API}/sandboxes/{name}"), Some(&doc));
    assert_eq!(status, 200, "{body}");
    let after = server.wait_running_at(&name, generation + 1, Duration::from_secs(30));
    assert_eq!(after["status"]["containerID"], id.as_str(), "{after}");
    let mut out = String::new();
    wait_until("the edit applies", Duration::from_secs(5), || {
        out = inside(
            server,
            &name,
            "wget -q -O - http://other.example.test:8000/ 2>&1",
        )
        .1;
        out.contains("hello-from-upstream")
    });
    let (_, out) = inside(
        server,
        &name,
        "wget -q -O - http://up.example.test:8000/ 2>&1; echo rc=$?",
    );
    assert!(
        !out.contains("rc=0") && !out.contains("hello-from-upstream"),
        "{out}"
    );

    for sandbox in [&name, &py] {
        server.request("DELETE", &format!("{API}/sandboxes/{sandbox}"), None);
        server.wait_gone("sandboxes", sandbox);
    }
    // A deleted sandbox's decision counts go with it.
    wait_until(
        "the deleted sandboxes' counts go",
        Duration::from_secs(10),
        || {
            let (_, text) = common::http(
                "GET",
                &format!("{}/metrics", server.url),
                Some(&server.key),
                None,
                "text/plain",
            );
            !text.lines().any(|l| {
                l.starts_with("agent_sandbox_egress_decisions_total{")
                    && (l.contains(&name) || l.contains(&py))
            })
        },
    );
}

/// Holds 300 connections to the proxy, reads what each got within two seconds, sends 3,000 DNS
/// queries as fast as it can and counts the answers; writes `held refused answered seconds` to
/// /workspace/flood.txt, then keeps holding for a while.
const FLOOD: &str = r#"
import socket, struct, sys, time
gateway = sys.argv[1]
held = [socket.create_connection((gateway, 3128), timeout=5) for _ in range(300)]
time.sleep(2)
refused = 0
for s in held:
    s.setblocking(False)
    try:
        if b" 429 " in s.recv(200):
            refused += 1
    except BlockingIOError:
        pass
name = b"".join(bytes([len(p)]) + p for p in b"up.example.test".split(b".")) + b"\0"
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
start = time.monotonic()
for i in range(3000):
    udp.sendto(struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + name + b"\0\1\0\1", (gateway, 53))
udp.settimeout(1.0)
answered = 0
try:
    while True:
        udp.recv(512)
        answered += 1
except socket.timeout:
    pass
seconds = time.monotonic() - start
open("/workspace/flood.txt", "w").write(f"{len(held)} {refused} {answered} {seconds:.3f}\n")
time.sleep(15)
"#;

#[test]
fn a_flood_from_one_sandbox_is_bounded_and_leaves_the_others_served() {
    if !python_image("the egress flood test") {
        return;
    }
    let world = internet();
    let policed = Policed::start(
        &world,
        "eg-flood",
        &format!("{} up.example.test\n", world.upstream_ip),
    );
    let server = &policed.server;
    let allow = json!({"allow": ["up.example.test:8000"]});
    let (flooder, neighbour) = (unique("eg-flooder"), unique("eg-neighbour"));
    policed.create(
        &[(&flooder, PYTHON_IMAGE), (&neighbour, TEST_IMAGE)],
        &allow,
    );
    server.wait_running(&flooder);
    server.wait_running(&neighbour);
    let gateway = policed.gateway();

    // The flood runs in the background (its exec ends it); its figures appear in a file.
    let (url, key, name) = (server.url.clone(), server.key.clone(), flooder.clone());
    let script = format!("python3 -c '{}' {gateway}", FLOOD.replace('\'', "'\\''"));
    let flood = std::thread::spawn(move || {
        let body = json!({"command": script, "timeout_seconds": 60}).to_string();
        http(
            "POST",
            &format!("{url}/v1/sandboxes/{name}/exec"),
            Some(&key),
            Some(body),
            "application/json",
        )
    });
    let mut figures = String::new();
    wait_until("the flood's figures", Duration::from_secs(60), || {
        figures = inside(server, &flooder, "cat /workspace/flood.txt 2>/dev/null").1;
        !figures.trim().is_empty()
    });
    // While the flooder still holds its connections, the neighbour is served: proxy and DNS.
    let (code, out) = inside(
        server,
        &neighbour,
        "wget -q -O - http://up.example.test:8000/",
    );
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("hello-from-upstream"), "{out}");
    let (_, out) = inside(server, &neighbour, "nslookup up.example.test 2>&1");
    assert!(out.contains(&world.upstream_ip), "{out}");

    // The flooder got its cap of connections and a refusal for each one past it; its queries
    // were answered no faster than its rate allows.
    let parts: Vec<f64> = figures
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    let [held, refused, answered, seconds] = parts[..] else {
        panic!("figures: {figures:?}");
    };
    assert_eq!((held, refused), (300.0, 172.0), "{figures}");
    assert!(answered >= 1.0, "no query answered at all: {figures}");
    assert!(
        answered <= 400.0 + 200.0 * seconds + 20.0,
        "more answers than the rate allows: {figures}"
    );
    drop(flood);
}
