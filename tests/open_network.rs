//! The open network (`network: true` without `egress`) refuses link-local destinations and the
//! host's own addresses, proved against the real daemon under runc and runsc, and only with
//! addresses the test owns: a listener of the test on all of the host's addresses, and a network
//! namespace the test makes, holding a link-local address routed from the host. A plain container
//! of the test (not a sandbox) reaches that namespace, so the path is real; a sandbox is refused
//! at once. The rules are checked from `iptables` too.

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::time::Duration;

use common::routed::{run, RoutedPeer};
use common::*;
use serde_json::{json, Value};

const LINK_LOCAL: &str = "169.254.77.77";

fn inside(server: &Server, name: &str, script: &str) -> String {
    let body = json!({"command": script, "timeout_seconds": 30});
    let (status, out) = server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
    if status != 200 {
        // What the container and the server went through, to tell a sandbox that died from a
        // helper that did.
        let filter = format!("label=io.agent-sandbox.id={name}");
        let state = docker(&[
            "ps",
            "-a",
            "--filter",
            &filter,
            "--format",
            "{{.ID}} {{.Status}}",
        ]);
        let log = server.log();
        let from = log.len().saturating_sub(16 * 1024);
        let from = (from..log.len())
            .find(|&i| log.is_char_boundary(i))
            .unwrap_or(log.len());
        let tail = &log[from..];
        panic!("{status} {out}\ncontainer: {state}\nserver log (tail):\n{tail}");
    }
    out["stdout"].as_str().unwrap_or_default().to_string()
}

/// A running sandbox of `server` on its open network; its name.
fn open_sandbox(server: &Server, prefix: &str) -> String {
    let sb = unique(prefix);
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                     "metadata": {"name": sb}, "spec": {"image": TEST_IMAGE, "network": true}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&sb);
    sb
}

fn network(name: &str) -> Value {
    inspect(&["--type", "network", name]).expect("the open network exists")
}

#[test]
fn an_open_sandbox_reaches_neither_link_local_nor_the_host() {
    let server = Server::start();
    let sb = open_sandbox(&server, "open-guard");

    // What was asked of the host: the rules name the open network's bridge.
    let net = network("agent-sandbox-net");
    let id = net["Id"].as_str().unwrap();
    let bridge = format!("br-{}", &id[..12]);
    let (_, input) = run(&["iptables", "-S", "INPUT"]);
    let (_, user) = run(&["iptables", "-S", "DOCKER-USER"]);
    for (rules, wanted) in [(&input, "--ctstate NEW"), (&user, "-d 169.254.0.0/16")] {
        assert!(
            rules.lines().any(|l| l.contains(&bridge)
                && l.contains(wanted)
                && l.contains("agent-sandbox open network guard")
                && l.contains("REJECT")),
            "no guard rule for {bridge}: {rules}"
        );
    }

    // The host's own address on the bridge, where a listener of the test accepts on all of the
    // host's addresses.
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let gateway = net["IPAM"]["Config"][0]["Gateway"]
        .as_str()
        .unwrap()
        .to_string();
    let out = inside(
        &server,
        &sb,
        &format!("nc -w 3 {gateway} {port} </dev/null; echo rc=$?"),
    );
    assert!(
        out.contains("rc=1"),
        "the sandbox connected to the host: {out}"
    );
    assert!(
        listener.accept().is_err(),
        "the host's listener was reached from the sandbox"
    );

    // A link-local address, in a namespace of the test's own.
    let ll_port = free_port();
    let _peer = RoutedPeer::start(LINK_LOCAL, "169.254.77.1", ll_port, "reached-link-local");
    // A plain container of the test, on Docker's default bridge, reaches it: the path is real.
    wait_until(
        "a plain container reaches the link-local peer",
        Duration::from_secs(20),
        || {
            let (_, out) = run(&[
                "docker",
                "run",
                "--rm",
                "--network",
                "bridge",
                TEST_IMAGE,
                "sh",
                "-c",
                &format!("nc -w 2 {LINK_LOCAL} {ll_port} </dev/null"),
            ]);
            out.contains("reached-link-local")
        },
    );
    let out = inside(
        &server,
        &sb,
        &format!("nc -w 3 {LINK_LOCAL} {ll_port} </dev/null; echo rc=$?"),
    );
    assert!(
        !out.contains("reached-link-local"),
        "the sandbox reached link-local: {out}"
    );
    assert!(out.contains("rc=1"), "{out}");

    // The sandbox's own loopback still works.
    let out = inside(
        &server,
        &sb,
        "nc -ll -p 9000 -e echo reached-self >/dev/null 2>&1 & sleep 0.5; nc -w 2 127.0.0.1 9000 </dev/null; kill $! 2>/dev/null; true",
    );
    assert!(out.contains("reached-self"), "{out}");

    // A listener the test owns on the host, connected from the host, proves it listens.
    let mut own = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    own.write_all(b"x").unwrap();
    let (mut accepted, _) = loop {
        match listener.accept() {
            Ok(pair) => break pair,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let mut byte = [0u8; 1];
    accepted.set_nonblocking(false).unwrap();
    accepted.read_exact(&mut byte).unwrap();
    assert_eq!(&byte, b"x");
}

/// The guard rules of every chain that name `bridge`.
fn rules_naming(bridge: &str) -> Vec<String> {
    [
        ("filter", "INPUT"),
        ("filter", "DOCKER-USER"),
        ("nat", "PREROUTING"),
    ]
    .iter()
    .flat_map(|(table, chain)| {
        let (_, out) = run(&["iptables", "-t", table, "-S", chain]);
        out.lines()
            .filter(|l| l.contains(&format!("-i {bridge} ")) && l.contains("agent-sandbox"))
            .map(String::from)
            .collect::<Vec<_>>()
    })
    .collect()
}

#[test]
fn the_rules_of_a_removed_network_are_taken_out_and_others_kept() {
    // A network of this test's own, which it removes behind the server's back.
    let own = unique("guard-net");
    let server = Server::start_with(&[
        ("AGENT_SANDBOX_NETWORK_NAME", &own),
        ("AGENT_SANDBOX_RESYNC_SECONDS", "1"),
    ]);
    let sb = open_sandbox(&server, "guard-gone");
    let id = network(&own)["Id"].as_str().unwrap().to_string();
    let bridge = format!("br-{}", &id[..12]);
    assert_eq!(
        rules_naming(&bridge).len(),
        4,
        "{:?}",
        rules_naming(&bridge)
    );
    // The shared network's rules, of a bridge that stays, are there too (another server's).
    let shared = Server::start();
    open_sandbox(&shared, "guard-kept");
    let shared_id = network("agent-sandbox-net")["Id"]
        .as_str()
        .unwrap()
        .to_string();
    let shared_bridge = format!("br-{}", &shared_id[..12]);
    assert_eq!(rules_naming(&shared_bridge).len(), 4);

    let (status, body) = server.request("DELETE", &format!("/v1/sandboxes/{sb}"), None);
    assert!(status == 200 || status == 204, "{status} {body}");
    wait_until("the network is removed", Duration::from_secs(30), || {
        docker_status(&["network", "rm", &own])
    });
    wait_until(
        "the server takes the removed bridge's rules out",
        Duration::from_secs(30),
        || rules_naming(&bridge).is_empty(),
    );
    assert_eq!(
        rules_naming(&shared_bridge).len(),
        4,
        "the rules of a bridge that exists were touched"
    );
}
