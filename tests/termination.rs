//! Why a sandbox died, against the real Docker daemon (runc, and runsc with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`): a command killed by the OOM killer, the in-sandbox helper
//! killed by a process of the sandbox, and the container killed from outside each show their
//! reason in `status.lastTermination` and as a Warning event, and the sandbox runs again. Neither
//! carries the sandbox's secret env value or the server's key.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);
const SECRET: &str = "s3cr3t-env-value-no-termination-may-show-77c1";

fn create(server: &Server, name: &str) -> String {
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                     "metadata": {"name": name},
                     "spec": {"memoryMB": 64, "env": {"API_TOKEN": SECRET}}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let running = server.wait_running(name);
    running["status"]["containerID"]
        .as_str()
        .expect("a running sandbox names its container")
        .to_string()
}

/// The sandbox once its `lastTermination` says `reason`, and it runs again.
fn wait_termination(server: &Server, name: &str, reason: &str) -> Value {
    server
        .wait_for("sandboxes", name, reason, WAIT, |s| {
            s.is_some_and(|s| {
                s["status"]["lastTermination"]["reason"] == reason
                    && s["status"]["phase"] == "Running"
            })
        })
        .unwrap()
}

fn warning(server: &Server, name: &str, reason: &str) -> Value {
    let mut found = None;
    wait_until(&format!("a {reason} event about {name}"), WAIT, || {
        let (status, body) =
            server.request("GET", &format!("{API}/events?involvedObject={name}"), None);
        assert_eq!(status, 200, "{body}");
        found = body["items"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["reason"] == reason)
            .cloned();
        found.is_some()
    });
    let event = found.unwrap();
    assert_eq!(event["type"], "Warning", "{event}");
    assert_eq!(event["involvedObject"]["kind"], "Sandbox", "{event}");
    event
}

fn no_secret_in(server: &Server, what: &Value) {
    let text = what.to_string();
    assert!(!text.contains(SECRET), "the env value shows: {text}");
    assert!(!text.contains(&server.key), "the key shows: {text}");
}

/// The running sandbox's container ID, once it differs from `old` or has started again.
fn started_again(server: &Server, name: &str, old_started: &Value) -> Value {
    server
        .wait_for("sandboxes", name, "running again", WAIT, |s| {
            s.is_some_and(|s| {
                s["status"]["phase"] == "Running" && s["status"]["startedAt"] != *old_started
            })
        })
        .unwrap()
}

#[test]
fn an_oom_killed_command_shows_its_reason_in_status_and_events() {
    let server = Server::start();
    let name = unique("oom");
    let container = create(&server, &name);
    let before = server.get("sandboxes", &name).unwrap();
    assert!(
        before["status"].get("lastTermination").is_none(),
        "{before}"
    );

    // A command that wants three times the sandbox's memory. Under runc the kernel kills it
    // and the sandbox runs on; under gVisor either the same happens or the whole sandbox goes
    // with it (and is started again), depending on which process the sentry's memory cgroup
    // takes down first. The answer of the exec is whatever is left to say: it is not checked.
    let (_, answer) = server.request(
        "POST",
        &format!("/v1/sandboxes/{name}/exec"),
        Some(&json!({"command": "dd if=/dev/zero of=/dev/null bs=200M count=1"})),
    );
    if !gvisor() {
        assert_eq!(answer["exit_code"], 137, "{answer}");
    }
    let mut sandbox = wait_termination(&server, &name, "OOMKilled");
    if gvisor() {
        // Under gVisor the OOM kill may take the command alone (as under runc) or the whole
        // sandbox, and Docker says `oom` before the container's `die`: the status may report a
        // command's death first and the sandbox's a moment later. Wait until it runs commands
        // again, then read what it settled on.
        wait_until("the sandbox runs commands again", WAIT, || {
            let body = json!({"command": "echo alive"});
            let (status, out) =
                server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
            status == 200 && out["stdout"] == "alive\n"
        });
        // Settled: the same status twice a second apart, and started again if the container
        // itself died.
        let mut last = Value::Null;
        wait_until("its status settles", WAIT, || {
            let now = server.get("sandboxes", &name).unwrap();
            let status = &now["status"];
            let settled = status["phase"] == "Running"
                && status["lastTermination"] == last["status"]["lastTermination"]
                && status["startedAt"] == last["status"]["startedAt"]
                && (status["lastTermination"].get("exitCode").is_none()
                    || status["startedAt"] != before["status"]["startedAt"]);
            last = now;
            if !settled {
                std::thread::sleep(Duration::from_secs(1));
            }
            settled
        });
        sandbox = last;
    }
    let termination = sandbox["status"]["lastTermination"].clone();
    assert_eq!(termination["reason"], "OOMKilled", "{termination}");
    assert_eq!(termination["signal"], 9, "{termination}");
    assert_eq!(
        termination["containerID"],
        container.as_str(),
        "{termination}"
    );
    assert!(termination["at"].is_string(), "{termination}");
    if gvisor() && termination.get("exitCode").is_some() {
        // The whole sandbox went, and was started again.
        assert_eq!(termination["exitCode"], 137, "{termination}");
        assert_ne!(
            sandbox["status"]["startedAt"], before["status"]["startedAt"],
            "{sandbox:#}"
        );
    } else {
        // The container itself was not killed.
        assert!(termination.get("exitCode").is_none(), "{termination}");
        assert_eq!(sandbox["status"]["containerID"], container.as_str());
        assert_eq!(
            sandbox["status"]["startedAt"],
            before["status"]["startedAt"]
        );
    }
    let event = warning(&server, &name, "OOMKilled");
    assert!(
        event["message"]
            .as_str()
            .unwrap()
            .contains("for want of memory"),
        "{event}"
    );
    no_secret_in(&server, &sandbox["status"]);
    no_secret_in(&server, &event);
    // The sandbox works afterwards.
    assert_eq!(server.exec(&name, "echo alive").1.trim(), "alive");
    // Reported once: the same OOM kill is not news again at the next reconcile.
    std::thread::sleep(Duration::from_secs(2));
    let again = server.get("sandboxes", &name).unwrap();
    assert_eq!(again["status"]["lastTermination"], termination);
}

/// Kills the container's main helper process from inside, as the sandbox's own user. It says
/// `found` first: once the helper (the container's PID 1) is dead, the killer goes with it.
const KILL_HELPER: &str = "for p in /proc/[0-9]*; do \
     if [ \"$(tr '\\0' ' ' < $p/cmdline 2>/dev/null)\" = '/opt/agent-sandbox/agent-sandbox-helper idle ' ]; then \
       echo found; kill -9 ${p#/proc/}; \
     fi; done";

#[test]
fn a_killed_helper_and_a_kill_from_outside_show_their_reasons() {
    let server = Server::start();
    let name = unique("lost");
    create(&server, &name);

    // A process of the sandbox kills the helper: the container stops, nobody asked Docker.
    let before = server.get("sandboxes", &name).unwrap();
    // Under gVisor the killer itself goes down with the sandbox before it can say so, and
    // `docker exec` may then never return: there it is started detached.
    if gvisor() {
        assert!(docker_status(&[
            "exec",
            "-d",
            "-u",
            "1000:1000",
            &format!("agent-sandbox-{name}"),
            "sh",
            "-c",
            KILL_HELPER,
        ]));
    } else {
        let (code, out) = docker_exec(&name, KILL_HELPER);
        assert!(
            out.contains("found"),
            "no helper found to kill ({code}): {out}"
        );
    }
    let sandbox = wait_termination(&server, &name, "HelperLost");
    let termination = sandbox["status"]["lastTermination"].clone();
    assert_eq!(termination["exitCode"], 137, "{termination}");
    assert_eq!(termination["signal"], 9, "{termination}");
    let event = warning(&server, &name, "HelperLost");
    assert!(
        event["message"].as_str().unwrap().contains("helper"),
        "{event}"
    );
    no_secret_in(&server, &sandbox["status"]);
    no_secret_in(&server, &event);
    let after_lost = started_again(&server, &name, &before["status"]["startedAt"]);
    assert_eq!(server.exec(&name, "echo alive").1.trim(), "alive");

    // Killed from outside, through Docker: Killed with the signal and exit code.
    docker(&["kill", "--signal", "KILL", &format!("agent-sandbox-{name}")]);
    let sandbox = wait_termination(&server, &name, "Killed");
    let termination = sandbox["status"]["lastTermination"].clone();
    assert_eq!(termination["exitCode"], 137, "{termination}");
    assert_eq!(termination["signal"], 9, "{termination}");
    let event = warning(&server, &name, "Killed");
    assert!(
        event["message"].as_str().unwrap().contains("from outside"),
        "{event}"
    );
    no_secret_in(&server, &sandbox["status"]);
    no_secret_in(&server, &event);
    started_again(&server, &name, &after_lost["status"]["startedAt"]);
    assert_eq!(server.exec(&name, "echo alive").1.trim(), "alive");
    assert!(
        !server.log().contains(SECRET),
        "the env value is in the log"
    );
}
