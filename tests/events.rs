//! Events against the real Docker daemon: a sandbox's lifecycle (created, started, paused and
//! resumed twice, snapshotted, rolled back, deleted) and a folder manifest error appear as
//! events, deduplicated with counts, listed and watched by object, refused for writes, shown by
//! `get events` and `describe`, and kept across a SIGKILL of the server.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const WAIT: Duration = Duration::from_secs(90);

fn events_of(server: &Server, name: &str) -> Vec<Value> {
    let (status, body) =
        server.request("GET", &format!("{API}/events?involvedObject={name}"), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["kind"], "EventList");
    body["items"].as_array().cloned().unwrap_or_default()
}

/// The event about `name` with `reason`, once the server has recorded it.
fn wait_event(server: &Server, name: &str, reason: &str) -> Value {
    let mut found = None;
    wait_until(&format!("a {reason} event about {name}"), WAIT, || {
        found = events_of(server, name)
            .into_iter()
            .find(|e| e["reason"] == reason);
        found.is_some()
    });
    found.unwrap()
}

fn wait_phase(server: &Server, name: &str, phase: &str) {
    server.wait_for("sandboxes", name, phase, WAIT, |r| {
        r.is_some_and(|r| {
            r["status"]["phase"] == phase
                && r["status"]["observedGeneration"] == r["metadata"]["generation"]
        })
    });
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
    wait_phase(server, name, "Running");
}

fn by_reason(events: &[Value], reason: &str) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["reason"] == reason)
        .cloned()
        .collect()
}

#[test]
fn a_sandbox_lifecycle_is_recorded_counted_watched_and_kept_across_a_crash() {
    let mut server = Server::start();
    let name = unique("ev");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                     "metadata": {"name": name}, "spec": {}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let uid = body["metadata"]["uid"].as_str().unwrap().to_string();
    server.wait_running(&name);

    // Pausing and resuming twice is one event each, counted twice.
    pause_and_resume(&server, &name);
    pause_and_resume(&server, &name);
    let paused = wait_event(&server, &name, "Paused");
    wait_until("the second pause counted", WAIT, || {
        by_reason(&events_of(&server, &name), "Resumed")
            .first()
            .is_some_and(|e| e["count"] == 2)
    });

    // A snapshot becomes ready, and the sandbox is rolled back to it.
    let snap = format!("{name}-snap");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/snapshots"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
                     "metadata": {"name": snap}, "spec": {"sandbox": name}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let ready = wait_event(&server, &snap, "SnapshotReady");
    assert_eq!(ready["involvedObject"]["kind"], "Snapshot");
    let (code, out, err) = server.cli(&["rollback", &name, &snap]);
    assert_eq!(code, 0, "{out}{err}");
    let rolled = wait_event(&server, &name, "RolledBack");
    assert!(
        rolled["message"].as_str().unwrap().contains(&snap),
        "{rolled}"
    );

    // A manifest that does not parse, in a watched folder, is a Warning about its file.
    write_manifest(
        &server.watch_dir,
        "broken.yaml",
        "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata: [\n",
    );
    let file = server.watch_dir.join("broken.yaml").display().to_string();
    let broken = wait_event(&server, &file, "ManifestInvalid");
    assert_eq!(broken["type"], "Warning");
    assert_eq!(broken["involvedObject"]["kind"], "Manifest");

    let events = events_of(&server, &name);
    for event in &events {
        assert_eq!(event["apiVersion"], "agent-sandbox.io/v1");
        assert_eq!(event["kind"], "Event");
        assert_eq!(event["involvedObject"]["kind"], "Sandbox", "{event}");
        assert_eq!(event["involvedObject"]["name"], name.as_str(), "{event}");
        assert_eq!(event["involvedObject"]["uid"], uid.as_str(), "{event}");
        assert!(event["firstTimestamp"].as_str() <= event["lastTimestamp"].as_str());
    }
    for reason in ["Created", "Started", "Paused", "Resumed", "RolledBack"] {
        let found = by_reason(&events, reason);
        assert_eq!(
            found.len(),
            1,
            "one {reason} event, deduplicated: {events:#?}"
        );
        assert_eq!(found[0]["type"], "Normal");
    }
    assert_eq!(by_reason(&events, "Paused")[0]["count"], 2, "{events:#?}");
    assert_eq!(by_reason(&events, "Started")[0]["count"], 1, "{events:#?}");
    assert!(
        events
            .iter()
            .all(|e| e["involvedObject"]["name"] == name.as_str()),
        "the filter holds"
    );
    let (status, all) = server.request("GET", &format!("{API}/events"), None);
    assert_eq!(status, 200);
    assert!(
        all["items"].as_array().unwrap().len() > events.len(),
        "{all}"
    );

    // Read-only: every write is refused, saying why.
    for (method, path) in [
        ("POST", format!("{API}/events")),
        (
            "PUT",
            format!(
                "{API}/events/{}",
                paused["metadata"]["name"].as_str().unwrap()
            ),
        ),
        (
            "DELETE",
            format!(
                "{API}/events/{}",
                paused["metadata"]["name"].as_str().unwrap()
            ),
        ),
    ] {
        let (status, body) = server.request(method, &path, Some(&json!({})));
        assert_eq!(status, 405, "{method} {path}: {body}");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("read-only"),
            "{body}"
        );
    }
    let (status, one) = server.request(
        "GET",
        &format!(
            "{API}/events/{}",
            paused["metadata"]["name"].as_str().unwrap()
        ),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(one["reason"], "Paused");

    // A watch by object: the current events, then new ones as they happen, and none of others.
    let url = format!(
        "{}{API}/events?watch=true&timeoutSeconds=6&involvedObject={name}",
        server.url
    );
    let key = server.key.clone();
    let watcher =
        std::thread::spawn(move || http("GET", &url, Some(&key), None, "application/json"));
    std::thread::sleep(Duration::from_secs(1));
    pause_and_resume(&server, &name);
    let (status, stream) = watcher.join().unwrap();
    assert_eq!(status, 200, "{stream}");
    let lines: Vec<Value> = stream
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .all(|l| l["object"]["involvedObject"]["name"] == name.as_str()),
        "{stream}"
    );
    let added = lines.iter().take_while(|l| l["type"] == "ADDED").count();
    assert_eq!(added, events.len(), "every current event first: {stream}");
    let live: Vec<&Value> = lines[added..].iter().collect();
    assert!(
        live.iter().any(|l| l["type"] == "MODIFIED"
            && l["object"]["reason"] == "Paused"
            && l["object"]["count"] == 3),
        "the third pause arrives as a count: {stream}"
    );

    // The command line shows them.
    let (code, out, err) = server.cli(&["get", "events", "--for", &name]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("LAST SEEN") && out.contains("RolledBack"),
        "{out}"
    );
    assert!(out.contains("(x3)"), "{out}");
    let (code, out, err) = server.cli(&["describe", "sandbox", &name]);
    assert_eq!(code, 0, "{err}");
    let section = out
        .split("Events:")
        .nth(1)
        .unwrap_or_else(|| panic!("{out}"));
    assert!(
        section.contains("Started") && section.contains("sandbox/"),
        "{out}"
    );

    // A crash keeps them: what was recorded a moment before the SIGKILL is there after it.
    let before = events_of(&server, &name);
    std::thread::sleep(Duration::from_secs(1));
    server.kill9();
    server.restart();
    let after = events_of(&server, &name);
    let summary = |events: &[Value]| -> Vec<(String, u64)> {
        events
            .iter()
            .map(|e| {
                (
                    e["reason"].as_str().unwrap().to_string(),
                    e["count"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(summary(&after), summary(&before), "kept across a restart");
    pause_and_resume(&server, &name);
    wait_until("counting goes on after the restart", WAIT, || {
        by_reason(&events_of(&server, &name), "Paused")
            .first()
            .is_some_and(|e| e["count"] == 4)
    });

    // Deletion kills the container.
    let (status, body) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert_eq!(status, 200, "{body}");
    server.wait_gone("sandboxes", &name);
    wait_event(&server, &name, "Killed");
}

#[test]
fn a_failure_is_a_warning_with_its_reason() {
    let server = Server::start_with(&[("AGENT_SANDBOX_ALLOWED_IMAGES", "agent-sandbox-test/*")]);
    let name = unique("evfail");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                     "metadata": {"name": name}, "spec": {"image": "forbidden/image:1"}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let failed = wait_event(&server, &name, "Failed");
    assert_eq!(failed["type"], "Warning");
    let sandbox = server.get("sandboxes", &name).unwrap();
    let ready = sandbox["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .cloned()
        .unwrap();
    let reason = ready["reason"].as_str().unwrap();
    assert!(
        failed["message"].as_str().unwrap().starts_with(reason),
        "the event carries the condition's reason {reason}: {failed}"
    );
}

fn post(server: &Server, plural: &str, kind: &str, name: &str, spec: Value) {
    let (status, body) = server.request(
        "POST",
        &format!("{API}/{plural}"),
        Some(&json!({"apiVersion": "agent-sandbox.io/v1", "kind": kind,
                     "metadata": {"name": name}, "spec": spec})),
    );
    assert_eq!(status, 201, "{kind} {name}: {body}");
}

#[test]
fn claims_forks_and_expiries_are_events() {
    let server = Server::start();
    // A sandbox created while a warm pool has a member claims it.
    let pool = unique("ev-pool");
    post(
        &server,
        "sandboxpools",
        "SandboxPool",
        &pool,
        json!({"image": TEST_IMAGE, "size": 1}),
    );
    server.wait_for("sandboxpools", &pool, "1 ready", WAIT, |p| {
        p.is_some_and(|p| p["status"]["readyReplicas"] == 1)
    });
    let (status, created) = server.request("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(status, 201, "{created}");
    let claimer = created["id"].as_str().unwrap().to_string();
    let claimed = wait_event(&server, &claimer, "Claimed");
    assert_eq!(claimed["type"], "Normal");
    assert!(
        claimed["message"].as_str().unwrap().contains(&pool),
        "{claimed}"
    );
    assert!(
        by_reason(&events_of(&server, &claimer), "Created").is_empty(),
        "a claimed sandbox was not created afresh"
    );
    // Gone, so that the sandboxes below are made afresh.
    let (status, body) = server.request("DELETE", &format!("{API}/sandboxpools/{pool}"), None);
    assert!(matches!(status, 200 | 202), "{status} {body}");
    server.wait_gone("sandboxpools", &pool);

    // A fork of a snapshot says which sandboxes it made.
    let name = unique("ev-fork");
    post(&server, "sandboxes", "Sandbox", &name, json!({}));
    server.wait_running(&name);
    let snap = format!("{name}-snap");
    post(
        &server,
        "snapshots",
        "Snapshot",
        &snap,
        json!({"sandbox": name}),
    );
    wait_event(&server, &snap, "SnapshotReady");
    let fork = format!("{name}-fork");
    post(
        &server,
        "forks",
        "Fork",
        &fork,
        json!({"snapshot": snap, "replicas": 1}),
    );
    let forked = wait_event(&server, &fork, "Forked");
    assert_eq!(forked["involvedObject"]["kind"], "Fork", "{forked}");
    let children = server.get("forks", &fork).unwrap()["status"]["children"].clone();
    let child = children[0]
        .as_str()
        .unwrap_or_else(|| panic!("a child in {children}"));
    assert!(
        forked["message"].as_str().unwrap().contains(child),
        "{forked}"
    );

    // A sandbox whose time to live ends expires, and says when.
    let short = unique("ev-ttl");
    post(
        &server,
        "sandboxes",
        "Sandbox",
        &short,
        json!({"ttlSeconds": 3}),
    );
    let expired = wait_event(&server, &short, "Expired");
    assert!(
        expired["message"]
            .as_str()
            .unwrap()
            .contains("its lifetime ended"),
        "{expired}"
    );
    server.wait_gone("sandboxes", &short);
}
