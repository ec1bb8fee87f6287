//! Webhooks against the real Docker daemon and a real HTTP receiver on 127.0.0.1: a receiver
//! that is down while sandboxes start, pause and resume, and while the server is SIGKILLed and
//! restarted, gets every event afterwards, in order per object, each signed with the Secret's
//! value; and that value appears in no answer, log line, status, event or file but its own.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);

/// One request the receiver got: its headers (lower-case names) and body.
#[derive(Clone, Debug)]
struct Received {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A plain HTTP/1.1 receiver on `port` answering 200 to every request, recording each.
fn receive(port: u16, got: Arc<Mutex<Vec<Received>>>) {
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the receiver");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut headers = Vec::new();
            let mut line = String::new();
            let _ = reader.read_line(&mut line); // request line
            loop {
                line.clear();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.trim_end().split_once(':') {
                    headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
                }
            }
            let length: usize = headers
                .iter()
                .find(|(n, _)| n == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            got.lock().unwrap().push(Received { headers, body });
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        }
    });
}

fn hmac_hex(secret: &[u8], body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

fn create(server: &Server, plural: &str, body: Value) -> Value {
    let (status, answer) = server.request("POST", &format!("{API}/{plural}"), Some(&body));
    assert_eq!(status, 201, "{answer}");
    answer
}

fn pause_and_resume(server: &Server, name: &str) {
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes/{name}/pause"),
        Some(&json!({"mode": "Paused"})),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.request("POST", &format!("{API}/sandboxes/{name}/resume"), None);
    assert_eq!(status, 200, "{body}");
}

fn events_about(server: &Server, name: &str) -> Vec<Value> {
    let (status, body) =
        server.request("GET", &format!("{API}/events?involvedObject={name}"), None);
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().cloned().unwrap()
}

/// Every file under `dir`, recursively.
fn files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            out.push(path);
        }
    }
    out
}

#[test]
fn a_receiver_down_for_a_while_gets_every_event_signed_in_order_across_a_sigkill() {
    let mut server = Server::start_with(&[("AGENT_SANDBOX_WEBHOOK_MAX_BACKOFF_SECONDS", "1")]);
    let secret_value = format!("whsec-{:032x}", rand::random::<u128>());
    let secret = unique("hook-key");
    let answer = create(
        &server,
        "secrets",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
               "metadata": {"name": secret}, "spec": {}, "value": secret_value}),
    );
    assert!(answer.get("value").is_none(), "{answer}");
    // Through the API, a Secret cannot read the server's files or environment.
    let (status, body) = server.request(
        "POST",
        &format!("{API}/secrets"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
                     "metadata": {"name": unique("sneaky")},
                     "spec": {"valueFrom": {"file": "/etc/shadow"}}}),
        ),
    );
    assert_eq!(status, 422, "{body}");
    server.wait_for("secrets", &secret, "known to have a value", WAIT, |s| {
        s.is_some_and(|s| s["status"]["hasValue"] == true)
    });

    // The receiver's port is free, and nothing listens there yet.
    let port = free_port();
    let hook = unique("hook");
    create(
        &server,
        "webhooks",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Webhook",
               "metadata": {"name": hook},
               "spec": {"url": format!("http://127.0.0.1:{port}/hook"), "secret": secret}}),
    );
    server.wait_for("webhooks", &hook, "started", WAIT, |w| {
        w.is_some_and(|w| w["status"]["deliveredThrough"].is_u64())
    });

    // Two sandboxes live their lives while the receiver is down.
    let a = unique("wha");
    let b = unique("whb");
    for name in [&a, &b] {
        create(
            &server,
            "sandboxes",
            json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                   "metadata": {"name": name}, "spec": {}}),
        );
    }
    server.wait_running(&a);
    server.wait_running(&b);
    pause_and_resume(&server, &a);
    pause_and_resume(&server, &a);
    server.wait_running(&a);
    server.wait_for("webhooks", &hook, "failing", WAIT, |w| {
        w.is_some_and(|w| {
            w["status"]["failures"].as_u64().unwrap_or(0) >= 2
                && !w["status"]["lastError"]
                    .as_str()
                    .unwrap_or_default()
                    .is_empty()
        })
    });

    // A crash, a restart, and only then the receiver comes up; more happens meanwhile.
    std::thread::sleep(Duration::from_secs(1));
    server.kill9();
    server.restart();
    let got = Arc::new(Mutex::new(Vec::new()));
    receive(port, Arc::clone(&got));
    server.wait_running(&b);
    pause_and_resume(&server, &b);
    server.wait_running(&b);

    // Every occurrence of every event about the two sandboxes arrives: each count from 1 to the
    // event's current count.
    let expected = |server: &Server| -> Vec<(String, u64)> {
        let mut all = Vec::new();
        for name in [&a, &b] {
            for event in events_about(server, name) {
                let id = event["metadata"]["name"].as_str().unwrap().to_string();
                for count in 1..=event["count"].as_u64().unwrap() {
                    all.push((id.clone(), count));
                }
            }
        }
        all
    };
    let parse = |r: &Received| -> Value { serde_json::from_slice(&r.body).unwrap() };
    wait_until("every event delivered", WAIT, || {
        let received: Vec<(String, u64)> = got
            .lock()
            .unwrap()
            .iter()
            .map(|r| {
                let body = parse(r);
                (
                    body["event"]["metadata"]["name"]
                        .as_str()
                        .unwrap()
                        .to_string(),
                    body["event"]["count"].as_u64().unwrap(),
                )
            })
            .collect();
        expected(&server).iter().all(|e| received.contains(e))
    });
    let expected = expected(&server);
    assert!(expected.len() >= 10, "{expected:?}");
    let reasons: Vec<String> = got
        .lock()
        .unwrap()
        .iter()
        .map(|r| parse(r)["reason"].as_str().unwrap().to_string())
        .collect();
    for reason in ["Created", "Started", "Paused", "Resumed"] {
        assert!(reasons.iter().any(|r| r == reason), "{reasons:?}");
    }

    // Each is signed, carries its id, reason and object, and each object's arrive in order.
    let received = got.lock().unwrap().clone();
    let mut first_seen: Vec<Value> = Vec::new();
    for r in &received {
        let signature = r.header("x-agent-sandbox-signature").expect("signed");
        assert_eq!(
            signature,
            format!("sha256={}", hmac_hex(secret_value.as_bytes(), &r.body))
        );
        assert_eq!(r.header("content-type"), Some("application/json"));
        let body = parse(r);
        assert_eq!(r.header("x-agent-sandbox-delivery"), body["id"].as_str());
        assert_eq!(body["reason"], body["event"]["reason"]);
        assert_eq!(body["object"], body["event"]["involvedObject"]);
        if !first_seen.iter().any(|s| s["id"] == body["id"]) {
            first_seen.push(body);
        }
    }
    for name in [&a, &b] {
        let versions: Vec<u64> = first_seen
            .iter()
            .filter(|d| d["object"]["name"] == name.as_str())
            .map(|d| {
                d["event"]["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        let mut sorted = versions.clone();
        sorted.sort();
        assert_eq!(versions, sorted, "in order for {name}");
    }
    let webhook = server
        .wait_for("webhooks", &hook, "caught up", WAIT, |w| {
            w.is_some_and(|w| {
                w["status"]["failures"] == 0
                    && w["status"]["delivered"].as_u64() >= Some(expected.len() as u64)
            })
        })
        .unwrap();
    assert!(webhook["status"].get("lastError").is_none(), "{webhook}");

    // The value is nowhere but its own owner-only file.
    let value_file = server.data_dir.join("secrets").join(&secret);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&value_file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let dir_mode = std::fs::metadata(server.data_dir.join("secrets"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o700);
    let mut answers = String::new();
    for path in ["secrets", "webhooks", "sandboxes", "events"] {
        let (_, body) = server.request("GET", &format!("{API}/{path}"), None);
        answers.push_str(&body.to_string());
    }
    for name in [&secret, &hook] {
        let (_, body) = server.request("GET", &format!("{API}/secrets/{name}"), None);
        answers.push_str(&body.to_string());
    }
    answers.push_str(&server.request("GET", "/openapi.json", None).1.to_string());
    assert!(answers.contains(&secret), "the answers were read");
    assert!(
        !answers.contains(&secret_value),
        "the value is in an answer"
    );
    assert!(
        !server.log().contains(&secret_value),
        "the value is in the log"
    );
    for deliveries in &received {
        assert!(!String::from_utf8_lossy(&deliveries.body).contains(&secret_value));
    }
    for file in files(&server.data_dir) {
        if file == value_file {
            continue;
        }
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(&secret_value),
            "the value is in {}",
            file.display()
        );
    }
    for name in [&a, &b] {
        let inspect = docker(&["inspect", &format!("agent-sandbox-{name}")]);
        assert!(!inspect.contains(&secret_value));
    }
}

fn hook_to(server: &Server, port: u16, secret: &str, events: &[&str]) -> String {
    let hook = unique("hook");
    create(
        server,
        "webhooks",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Webhook",
               "metadata": {"name": hook},
               "spec": {"url": format!("http://127.0.0.1:{port}/hook"), "secret": secret,
                        "events": events}}),
    );
    server.wait_for("webhooks", &hook, "started", WAIT, |w| {
        w.is_some_and(|w| w["status"]["deliveredThrough"].is_u64())
    });
    hook
}

/// `(reason, involvedObject.kind)` of each delivery a receiver got.
fn delivered(got: &Arc<Mutex<Vec<Received>>>) -> Vec<(String, String)> {
    got.lock()
        .unwrap()
        .iter()
        .map(|r| {
            let body: Value = serde_json::from_slice(&r.body).unwrap();
            (
                body["reason"].as_str().unwrap_or_default().to_string(),
                body["object"]["kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[test]
fn a_delivery_past_its_retry_window_is_given_up_with_an_event_and_spec_events_filters() {
    // A retry window of a few seconds instead of a day.
    let server = Server::start_with(&[
        ("AGENT_SANDBOX_WEBHOOK_MAX_BACKOFF_SECONDS", "1"),
        ("AGENT_SANDBOX_WEBHOOK_RETRY_SECONDS", "3"),
    ]);
    let secret_value = format!("whsec-{:032x}", rand::random::<u128>());
    let secret = unique("hook-key");
    create(
        &server,
        "secrets",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Secret",
               "metadata": {"name": secret}, "spec": {}, "value": secret_value}),
    );
    server.wait_for("secrets", &secret, "known to have a value", WAIT, |s| {
        s.is_some_and(|s| s["status"]["hasValue"] == true)
    });
    // One receiver that never comes up, one that wants two reasons, one that wants one kind.
    let dead = hook_to(&server, free_port(), &secret, &[]);
    let by_reason = Arc::new(Mutex::new(Vec::new()));
    let reason_port = free_port();
    receive(reason_port, Arc::clone(&by_reason));
    let reasons_hook = hook_to(&server, reason_port, &secret, &["Paused", "Resumed"]);
    let by_kind = Arc::new(Mutex::new(Vec::new()));
    let kind_port = free_port();
    receive(kind_port, Arc::clone(&by_kind));
    let kinds_hook = hook_to(&server, kind_port, &secret, &["Snapshot"]);

    let name = unique("whf");
    create(
        &server,
        "sandboxes",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
               "metadata": {"name": name}, "spec": {}}),
    );
    server.wait_running(&name);
    pause_and_resume(&server, &name);
    server.wait_running(&name);
    let snap = unique("whs");
    create(
        &server,
        "snapshots",
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
               "metadata": {"name": snap}, "spec": {"sandbox": name}}),
    );
    server.wait_for("snapshots", &snap, "ready", WAIT, |s| {
        s.is_some_and(|s| s["status"]["phase"] == "Ready")
    });

    // The filtered receivers get what they asked for, and only that: the sandbox's Created and
    // Started came before its Paused, in the same outbox, and were passed over.
    wait_until("Paused and Resumed delivered", WAIT, || {
        let got = delivered(&by_reason);
        ["Paused", "Resumed"]
            .iter()
            .all(|r| got.iter().any(|(reason, _)| reason == r))
    });
    wait_until("the snapshot's events delivered", WAIT, || {
        delivered(&by_kind)
            .iter()
            .any(|(reason, _)| reason == "SnapshotReady")
    });
    let reasons = delivered(&by_reason);
    assert!(
        reasons.iter().all(|(r, _)| r == "Paused" || r == "Resumed"),
        "{reasons:?}"
    );
    let kinds = delivered(&by_kind);
    assert!(kinds.iter().all(|(_, k)| k == "Snapshot"), "{kinds:?}");
    let kinds_events = events_about(&server, &snap);
    assert!(
        kinds_events.iter().any(|e| e["reason"] == "SnapshotReady"),
        "{kinds_events:?}"
    );
    for hook in [&reasons_hook, &kinds_hook] {
        let (_, w) = server.request("GET", &format!("{API}/webhooks/{hook}"), None);
        assert_eq!(w["status"]["givenUp"], 0, "{w}");
    }

    // The receiver that never came up: each delivery is given up once the window has passed,
    // with a Warning about the webhook saying so, and the webhook moves on.
    let webhook = server
        .wait_for("webhooks", &dead, "given up", WAIT, |w| {
            w.is_some_and(|w| w["status"]["givenUp"].as_u64().unwrap_or(0) >= 2)
        })
        .unwrap();
    assert_eq!(webhook["status"]["delivered"], 0, "{webhook}");
    let given_up: Vec<Value> = events_about(&server, &dead)
        .into_iter()
        .filter(|e| e["reason"] == "DeliveryGivenUp")
        .collect();
    assert!(!given_up.is_empty());
    for event in &given_up {
        assert_eq!(event["type"], "Warning", "{event}");
        assert_eq!(event["involvedObject"]["kind"], "Webhook", "{event}");
        let message = event["message"].as_str().unwrap();
        assert!(message.starts_with("gave up delivering"), "{message}");
        assert!(!message.contains(&secret_value), "{message}");
    }
    let mentioned = given_up
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .any(|m| m.contains(&format!("sandbox/{name}")));
    assert!(mentioned, "{given_up:?}");
    assert!(
        !server.log().contains(&secret_value),
        "the value is in the log"
    );
}
