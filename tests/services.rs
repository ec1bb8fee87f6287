//! Declared services (`spec.services`) and `status.listeningPorts` against the real daemon: a
//! service that exits is started again with growing delays and shows `BackOff`, restart
//! policies hold, readiness (httpGet, tcpSocket, exec) gates the sandbox's `Ready` condition, a
//! service comes back after a rollback (a new container) and after a resume from `Stopped` (the
//! same container started again) by being started again, editing one service leaves the others'
//! processes alone, services get the sandbox's env plus their own, and a port a process opened
//! shows in `listeningPorts`. Runs under runc and, with `AGENT_SANDBOX_TEST_RUNTIME=runsc`,
//! under gVisor.

mod common;

use std::time::Duration;

use chrono::{DateTime, Utc};
use common::*;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(120);

fn spec(services: Value) -> Value {
    let mut spec = json!({"image": TEST_IMAGE, "services": services});
    if gvisor() {
        spec["pidsLimit"] = json!(4096);
    }
    spec
}

fn document(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
           "metadata": {"name": name}, "spec": spec})
}

fn create(server: &Server, name: &str, spec: Value) {
    let (status, answer) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(&document(name, spec)),
    );
    assert_eq!(status, 201, "{answer}\n{}", server.log());
}

fn replace(server: &Server, name: &str, spec: Value) {
    let (status, answer) = server.request(
        "PUT",
        &format!("{API}/sandboxes/{name}"),
        Some(&document(name, spec)),
    );
    assert_eq!(status, 200, "{answer}");
}

fn service<'a>(sandbox: &'a Value, name: &str) -> &'a Value {
    sandbox["status"]["services"]
        .as_array()
        .and_then(|all| all.iter().find(|s| s["name"] == name))
        .unwrap_or(&Value::Null)
}

fn condition<'a>(sandbox: &'a Value, type_: &str) -> &'a Value {
    sandbox["status"]["conditions"]
        .as_array()
        .and_then(|all| all.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

fn processes(server: &Server, sb: &str) -> Vec<Value> {
    let (status, body) = server.request("GET", &format!("{API}/sandboxes/{sb}/processes"), None);
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().cloned().unwrap_or_default()
}

fn process(server: &Server, sb: &str, id: &str) -> Value {
    let (status, body) =
        server.request("GET", &format!("{API}/sandboxes/{sb}/processes/{id}"), None);
    assert_eq!(status, 200, "{body}");
    body
}

fn time(v: &Value) -> DateTime<Utc> {
    v.as_str()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .unwrap_or_else(|| panic!("a time: {v}"))
        .to_utc()
}

fn delete(server: &Server, name: &str) {
    server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    cleanup_sandbox_objects(name);
}

#[test]
fn a_crashing_service_backs_off_with_growing_delays_and_policies_hold() {
    let server = Server::start();
    let sb = unique("svc-crash");
    create(
        &server,
        &sb,
        spec(json!([
            {"name": "crash", "command": "echo up; exit 3"},
            {"name": "once", "command": "exit 0", "restartPolicy": "OnFailure"},
            {"name": "never", "argv": ["sh", "-c", "exit 5"], "restartPolicy": "Never"},
        ])),
    );
    server.wait_running(&sb);
    // BackOff shows between restarts, and the count grows.
    let saw_backoff = std::cell::Cell::new(false);
    let last = server
        .wait_for("sandboxes", &sb, "restarted four times", LONG, |r| {
            let Some(r) = r else { return false };
            let crash = service(r, "crash");
            saw_backoff.set(saw_backoff.get() || crash["state"] == "BackOff");
            crash["restarts"].as_u64().unwrap_or(0) >= 4
        })
        .unwrap();
    let crash = service(&last, "crash");
    assert!(saw_backoff.get(), "BackOff never showed: {last:#}");
    assert_eq!(crash["lastExitCode"], 3, "{crash}");
    assert!(crash["lastExitAt"].is_string(), "{crash}");
    assert!(crash["processId"].is_string(), "{crash}");
    // Each run is a process of its own; the waits between them grow: 0, 1 s, 2 s, 4 s.
    let mut runs: Vec<Value> = processes(&server, &sb)
        .into_iter()
        .filter(|p| p["command"] == "echo up; exit 3")
        .collect();
    runs.sort_by_key(|p| time(&p["startedAt"]));
    assert!(runs.len() >= 5, "{runs:#?}");
    let gaps: Vec<f64> = runs
        .windows(2)
        .map(|w| {
            (time(&w[1]["startedAt"]) - time(&w[0]["finishedAt"])).num_milliseconds() as f64
                / 1000.0
        })
        .collect();
    for (i, floor) in [(1, 0.9), (2, 1.9), (3, 3.9)] {
        assert!(gaps[i] >= floor, "restart {i} came after {gaps:?}");
    }
    assert!(gaps[3] > gaps[2] && gaps[2] > gaps[1], "{gaps:?}");
    // Each run's output is there, as for any process. (A finished run's: the latest may have
    // just been started and printed nothing yet, as seen under gVisor.)
    let id = runs[0]["id"].as_str().unwrap();
    let (status, body) = http_bytes(
        &server,
        "GET",
        &format!("{API}/sandboxes/{sb}/processes/{id}/output?follow=false"),
        b"",
    );
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&body).contains("up"), "{body:?}");
    // OnFailure with a clean exit and Never stay down.
    let now = server.get("sandboxes", &sb).unwrap();
    for (name, code) in [("once", 0), ("never", 5)] {
        let s = service(&now, name);
        assert_eq!(s["state"], "Exited", "{name}: {s}");
        assert_eq!(s["restarts"], 0, "{name}: {s}");
        assert_eq!(s["lastExitCode"], code, "{name}: {s}");
    }
    delete(&server, &sb);
}

#[test]
fn readiness_gates_ready_and_names_the_service_not_ready() {
    let server = Server::start();
    let sb = unique("svc-ready");
    create(
        &server,
        &sb,
        spec(json!([
            {"name": "web", "command": "mkdir -p /tmp/www && echo hi > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www",
             "readiness": {"httpGet": {"port": 8080, "path": "/index.html"}}, "periodSeconds": 1},
            {"name": "gate", "command": "exec sleep 100000",
             "readiness": {"exec": {"command": "test -f /workspace/ready"}}, "periodSeconds": 1},
            {"name": "plain", "command": "exec sleep 100000"},
        ])),
    );
    let waiting = server
        .wait_for("sandboxes", &sb, "web ready, gate not", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["phase"] == "Running"
                    && service(r, "web")["ready"] == true
                    && service(r, "gate")["state"] == "Running"
                    && service(r, "plain")["state"] == "Running"
            })
        })
        .unwrap();
    assert_eq!(
        condition(&waiting, "Ready")["status"],
        "False",
        "{waiting:#}"
    );
    let services_ready = condition(&waiting, "ServicesReady");
    assert_eq!(services_ready["status"], "False");
    let message = services_ready["message"].as_str().unwrap();
    assert!(
        message.contains("gate") && !message.contains("web"),
        "{message}"
    );
    assert_eq!(service(&waiting, "plain")["ready"], true);
    assert_eq!(service(&waiting, "gate")["ready"], false);
    let (code, _) = server.exec(&sb, "touch /workspace/ready");
    assert_eq!(code, 0);
    let ready = server
        .wait_for("sandboxes", &sb, "Ready", LONG, |r| {
            r.is_some_and(|r| condition(r, "Ready")["status"] == "True")
        })
        .unwrap();
    assert_eq!(condition(&ready, "ServicesReady")["status"], "True");
    assert_eq!(service(&ready, "gate")["ready"], true);
    // The web server's listening port shows.
    let listening = server
        .wait_for("sandboxes", &sb, "listening on 8080", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["listeningPorts"]
                    .as_array()
                    .is_some_and(|p| p.contains(&json!(8080)))
            })
        })
        .unwrap();
    assert!(
        !listening["status"]["listeningPorts"]
            .as_array()
            .unwrap()
            .contains(&json!(8081)),
        "{listening:#}"
    );
    if !gvisor() {
        // Under runc the ports are asked of the kernel's socket diagnostics in the sandbox's
        // namespace, not read from its /proc/net/tcp (which walks the host's whole table).
        assert!(
            !server.log().contains("no socket diagnostics"),
            "{}",
            server.log()
        );
    }
    delete(&server, &sb);
}

#[test]
fn edits_restart_only_the_edited_service_and_a_rollback_starts_them_again() {
    let server = Server::start();
    let sb = unique("svc-edit");
    let services = |b_word: &str| {
        json!([
            {"name": "a", "command": "echo \"$SHARED $OWN\" > /workspace/a.txt; exec sleep 100000",
             "env": {"OWN": "mine"}},
            {"name": "b", "command": format!("echo {b_word} > /workspace/b.txt; exec sleep 100000")},
        ])
    };
    let with_env = |services: Value| {
        let mut s = spec(services);
        s["env"] = json!({"SHARED": "common", "OWN": "overridden"});
        s
    };
    create(&server, &sb, with_env(services("one")));
    let running = |what: &str| {
        server
            .wait_for("sandboxes", &sb, what, LONG, |r| {
                r.is_some_and(|r| {
                    r["status"]["observedGeneration"] == r["metadata"]["generation"]
                        && ["a", "b"]
                            .iter()
                            .all(|n| service(r, n)["state"] == "Running")
                })
            })
            .unwrap()
    };
    let first = running("both running");
    let a = service(&first, "a")["processId"]
        .as_str()
        .unwrap()
        .to_string();
    let b = service(&first, "b")["processId"]
        .as_str()
        .unwrap()
        .to_string();
    wait_until("the services wrote", LONG, || {
        server.exec(&sb, "cat /workspace/a.txt /workspace/b.txt").1 == "common mine\none\n"
    });

    // Editing b restarts b only, in the same container.
    let container = first["status"]["containerID"].clone();
    replace(&server, &sb, with_env(services("two")));
    let edited = server
        .wait_for("sandboxes", &sb, "b restarted", LONG, |r| {
            r.is_some_and(|r| {
                let s = service(r, "b");
                s["state"] == "Running" && s["processId"] != json!(b)
            })
        })
        .unwrap();
    assert_eq!(edited["status"]["containerID"], container);
    assert_eq!(service(&edited, "a")["processId"], json!(a));
    assert_eq!(process(&server, &sb, &a)["state"], "Running");
    let old_b = process(&server, &sb, &b);
    assert_eq!(old_b["state"], "Exited", "{old_b}");
    wait_until("b wrote again", LONG, || {
        server.exec(&sb, "cat /workspace/b.txt").1 == "two\n"
    });

    // A rollback gives the sandbox a new container: both start again there.
    let snap = unique("svc-snap");
    let (status, answer) = server.request(
        "POST",
        &format!("{API}/snapshots"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
                     "metadata": {"name": snap}, "spec": {"sandbox": sb}}),
        ),
    );
    assert_eq!(status, 201, "{answer}");
    server.wait_for("snapshots", &snap, "Ready", LONG, |r| {
        r.is_some_and(|r| r["status"]["phase"] == "Ready")
    });
    let mut rolled = with_env(services("two"));
    rolled["rollback"] = json!({"snapshot": snap, "requestId": "r-1"});
    replace(&server, &sb, rolled);
    let after = server
        .wait_for("sandboxes", &sb, "rolled back, services back", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["lastRollback"]["requestId"] == "r-1"
                    && r["status"]["containerID"] != container
                    && ["a", "b"].iter().all(|n| {
                        service(r, n)["state"] == "Running"
                            && service(r, n)["processId"] != json!(a)
                            && service(r, n)["processId"] != json!(b)
                    })
            })
        })
        .unwrap();
    for n in ["a", "b"] {
        let id = service(&after, n)["processId"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(process(&server, &sb, &id)["state"], "Running", "{n}");
    }
    // Inside, the service really runs again.
    wait_until("a runs in the new container", LONG, || {
        server
            .exec(&sb, "ps -o args | grep -c '[s]leep 100000'")
            .1
            .trim()
            == "2"
    });
    server.request("DELETE", &format!("{API}/snapshots/{snap}"), None);
    delete(&server, &sb);
}

#[test]
fn a_server_restart_adopts_running_services() {
    let mut server = Server::start();
    let sb = unique("svc-adopt");
    create(
        &server,
        &sb,
        spec(json!([{"name": "a", "command": "exec sleep 100000"}])),
    );
    let first = server
        .wait_for("sandboxes", &sb, "a running", LONG, |r| {
            r.is_some_and(|r| service(r, "a")["state"] == "Running")
        })
        .unwrap();
    let id = service(&first, "a")["processId"].clone();
    server.kill9();
    server.restart();
    // Seen again after the restart, and not started a second time.
    std::thread::sleep(Duration::from_secs(3));
    let again = server.get("sandboxes", &sb).unwrap();
    assert_eq!(service(&again, "a")["processId"], id, "{again:#}");
    let sleeping: Vec<Value> = processes(&server, &sb)
        .into_iter()
        .filter(|p| p["state"] == "Running")
        .collect();
    assert_eq!(sleeping.len(), 1, "{sleeping:#?}");
    delete(&server, &sb);
}

#[test]
fn invalid_services_are_refused_naming_the_field() {
    let server = Server::start();
    let cases = [
        (
            json!([{"name": "a", "command": "x", "restartPolicy": "Sometimes"}]),
            "spec.services[0].restartPolicy",
        ),
        (
            json!([{"name": "a", "command": "x"}, {"name": "a", "command": "y"}]),
            "spec.services[1].name",
        ),
        (json!([{"name": "a"}]), "spec.services[0].command"),
        (
            json!([{"name": "a", "command": "x", "argv": ["y"]}]),
            "spec.services[0].argv",
        ),
        (
            json!([{"name": "a", "command": "x", "readiness": {}}]),
            "spec.services[0].readiness",
        ),
        (
            json!([{"name": "a", "command": "x", "readiness": {"tcpSocket": {"port": 0}}}]),
            "spec.services[0].readiness",
        ),
        (
            json!([{"name": "a", "command": "x", "periodSeconds": 0}]),
            "spec.services[0].periodSeconds",
        ),
        (
            json!([{"name": "A b", "command": "x"}]),
            "spec.services[0].name",
        ),
    ];
    for (services, field) in cases {
        let name = unique("svc-bad");
        let (status, answer) = server.request(
            "POST",
            &format!("{API}/sandboxes"),
            Some(&document(
                &name,
                json!({"image": TEST_IMAGE, "services": services}),
            )),
        );
        assert!(
            status == 422 || status == 400,
            "{services}: {status} {answer}"
        );
        assert!(
            answer.to_string().contains(field),
            "{services}: {field} not in {answer}"
        );
        assert!(server.get("sandboxes", &name).is_none());
    }
}

#[test]
fn a_tcp_socket_readiness_turns_ready_when_the_port_listens() {
    let server = Server::start();
    let sb = unique("svc-tcp");
    // The listener opens only once the test says so: until then the check must fail.
    create(
        &server,
        &sb,
        spec(json!([
            {"name": "tcp",
             "command": "while [ ! -f /workspace/go ]; do sleep 0.2; done; mkdir -p /tmp/www; exec httpd -f -p 9090 -h /tmp/www",
             "readiness": {"tcpSocket": {"port": 9090}}, "periodSeconds": 1},
        ])),
    );
    let waiting = server
        .wait_for("sandboxes", &sb, "tcp running, not ready", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["phase"] == "Running" && service(r, "tcp")["state"] == "Running"
            })
        })
        .unwrap();
    // A few periods pass with nothing listening: still not ready.
    std::thread::sleep(Duration::from_secs(3));
    let still = server.get("sandboxes", &sb).unwrap();
    assert_eq!(service(&still, "tcp")["ready"], false, "{still:#}");
    assert_eq!(condition(&still, "Ready")["status"], "False", "{still:#}");
    let message = condition(&still, "ServicesReady")["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(message.contains("tcp"), "{message}");
    let (code, _) = server.exec(&sb, "touch /workspace/go");
    assert_eq!(code, 0);
    let ready = server
        .wait_for("sandboxes", &sb, "tcp ready", LONG, |r| {
            r.is_some_and(|r| {
                service(r, "tcp")["ready"] == true && condition(r, "Ready")["status"] == "True"
            })
        })
        .unwrap();
    assert_eq!(condition(&ready, "ServicesReady")["status"], "True");
    // The same process became ready: the check followed the port, not a restart.
    assert_eq!(
        service(&ready, "tcp")["processId"],
        service(&waiting, "tcp")["processId"],
        "{ready:#}"
    );
    assert_eq!(service(&ready, "tcp")["restarts"], 0, "{ready:#}");
    delete(&server, &sb);
}

#[test]
fn a_resume_from_stopped_starts_the_services_again() {
    let server = Server::start();
    let sb = unique("svc-resume");
    create(
        &server,
        &sb,
        spec(json!([
            {"name": "web", "command": "mkdir -p /tmp/www && echo hi > /tmp/www/index.html && exec httpd -f -p 8080 -h /tmp/www",
             "readiness": {"httpGet": {"port": 8080, "path": "/index.html"}}, "periodSeconds": 1},
            {"name": "count", "command": "echo run >> /workspace/runs; exec sleep 100000"},
        ])),
    );
    let ready = |what: &str| {
        server
            .wait_for("sandboxes", &sb, what, LONG, |r| {
                r.is_some_and(|r| {
                    r["status"]["phase"] == "Running"
                        && condition(r, "Ready")["status"] == "True"
                        && service(r, "web")["ready"] == true
                        && service(r, "count")["state"] == "Running"
                })
            })
            .unwrap()
    };
    let first = ready("services ready");
    let before: Vec<Value> = ["web", "count"]
        .iter()
        .map(|n| service(&first, n)["processId"].clone())
        .collect();
    wait_until("count ran once", LONG, || {
        server.exec(&sb, "cat /workspace/runs").1 == "run\n"
    });

    // Stopped: the container stops, and with it every process.
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes/{sb}/pause"),
        Some(&json!({"mode": "Stopped"})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"]["phase"], "Stopped", "{body}");
    let container = body["status"]["containerID"].clone();

    let (status, body) = server.request("POST", &format!("{API}/sandboxes/{sb}/resume"), None);
    assert_eq!(status, 200, "{body}");
    let after = server
        .wait_for("sandboxes", &sb, "services started again", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["phase"] == "Running"
                    && condition(r, "Ready")["status"] == "True"
                    && service(r, "web")["ready"] == true
                    && service(r, "count")["state"] == "Running"
                    && ["web", "count"]
                        .iter()
                        .zip(&before)
                        .all(|(n, b)| service(r, n)["processId"] != *b)
            })
        })
        .unwrap();
    // The same container, started again, runs new processes of both services.
    assert_eq!(after["status"]["containerID"], container, "{after:#}");
    for n in ["web", "count"] {
        let id = service(&after, n)["processId"]
            .as_str()
            .unwrap()
            .to_string();
        assert_eq!(process(&server, &sb, &id)["state"], "Running", "{n}");
    }
    wait_until("count ran again", LONG, || {
        server.exec(&sb, "cat /workspace/runs").1 == "run\nrun\n"
    });
    let (code, out) = server.exec(&sb, "wget -q -O - http://127.0.0.1:8080/index.html");
    assert_eq!((code, out.as_str()), (0, "hi\n"));
    delete(&server, &sb);
}
