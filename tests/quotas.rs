//! `ResourceQuota` against a real server and Docker: the 3rd sandbox of a quota of 2 is refused
//! with `quota_exceeded` and the numbers, through the resource API and `/v1`; concurrent creates
//! from several clients never pass a quota; `status.used` follows what exists; a folder manifest
//! over quota is held with a `QuotaExceeded` condition and no container, without affecting the
//! others, and starts once room is made; a snapshot past `snapshotBytes` fails and stores nothing.

mod common;

use std::time::Duration;

use common::{containers_of, sandbox_manifest, unique, write_manifest, Server, API};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

fn quota(server: &Server, name: &str, spec: Value) {
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": spec,
    });
    let (code, out) = server.request("POST", &format!("{API}/resourcequotas"), Some(&body));
    assert_eq!(code, 201, "{out}");
}

fn sandbox_body(name: &str) -> Value {
    json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"cpus": 0.5, "memoryMB": 64},
    })
}

fn create_sandbox(server: &Server, name: &str) -> (u16, Value) {
    server.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(&sandbox_body(name)),
    )
}

fn used(server: &Server, quota: &str) -> Value {
    server
        .get("resourcequotas", quota)
        .map(|q| q["status"]["used"].clone())
        .unwrap_or(Value::Null)
}

fn wait_used(server: &Server, quota: &str, field: &str, value: Value) {
    server.wait_for("resourcequotas", quota, "counted", LONG, |q| {
        q.is_some_and(|q| q["status"]["used"][field] == value)
    });
}

#[test]
fn the_third_sandbox_of_a_quota_of_two_is_refused_with_the_numbers() {
    let server = Server::start();
    quota(&server, "team", json!({"sandboxes": 2, "memoryMB": 1024}));
    let (a, b, c) = (unique("qa"), unique("qb"), unique("qc"));
    assert_eq!(create_sandbox(&server, &a).0, 201);
    assert_eq!(create_sandbox(&server, &b).0, 201);
    let (code, out) = create_sandbox(&server, &c);
    assert_eq!(code, 403, "{out}");
    assert_eq!(out["error"]["code"], "quota_exceeded", "{out}");
    assert_eq!(
        out["error"]["message"],
        "ResourceQuota \"team\" of namespace \"default\" allows 2 sandboxes: 2 used, 1 more \
         requested"
    );
    assert!(
        server.get("sandboxes", &c).is_none(),
        "a refused create wrote nothing"
    );
    // /v1 creates count against the same quota.
    let (code, out) = server.request("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(code, 403, "{out}");
    assert_eq!(out["error"]["code"], "quota_exceeded", "{out}");
    wait_used(&server, "team", "sandboxes", json!(2));
    assert_eq!(used(&server, "team")["memoryMB"], 128);

    // Room made by a delete is room for the next create.
    let (code, _) = server.request("DELETE", &format!("{API}/sandboxes/{a}"), None);
    assert_eq!(code, 200);
    assert_eq!(create_sandbox(&server, &c).0, 201);
    wait_used(&server, "team", "sandboxes", json!(2));

    // An edit that raises memory past the quota is refused; one within it passes.
    let mut edit = server.get("sandboxes", &c).unwrap();
    edit["spec"]["memoryMB"] = json!(2048);
    let (code, out) = server.request("PUT", &format!("{API}/sandboxes/{c}"), Some(&edit));
    assert_eq!(code, 403, "{out}");
    assert!(
        out["error"]["message"]
            .as_str()
            .unwrap()
            .contains("allows 1024 memoryMB: 128 used, 1984 more requested"),
        "{out}"
    );
    // A merge patch is checked as a PUT is.
    let (code, out) = server.request_raw(
        "PATCH",
        &format!("{API}/sandboxes/{c}"),
        Some(json!({"spec": {"memoryMB": 4096}}).to_string()),
        "application/merge-patch+json",
    );
    assert_eq!(code, 403, "{out}");
    assert!(out.contains("quota_exceeded"), "{out}");
    // An edit key cannot raise its own quota: only an admin sets quotas (tested in tenancy's
    // unit tests); the document itself is checked like any other.
    let bad = json!({
        "apiVersion": "agent-sandbox.io/v1", "kind": "ResourceQuota",
        "metadata": {"name": "bad"}, "spec": {"sandbox": 3},
    });
    let (code, out) = server.request("POST", &format!("{API}/resourcequotas"), Some(&bad));
    assert_eq!(code, 422, "{out}");
    assert!(out.to_string().contains("sandbox"), "{out}");
}

#[test]
fn concurrent_creates_from_several_clients_never_pass_a_quota() {
    let server = Server::start();
    quota(&server, "three", json!({"sandboxes": 3}));
    let names: Vec<String> = (0..8).map(|i| unique(&format!("race{i}"))).collect();
    let codes: Vec<u16> = std::thread::scope(|scope| {
        let handles: Vec<_> = names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let server = &server;
                scope.spawn(move || {
                    if i % 2 == 0 {
                        create_sandbox(server, name).0
                    } else {
                        server.request("POST", "/v1/sandboxes", Some(&json!({}))).0
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let admitted = codes.iter().filter(|c| **c == 201 || **c == 200).count();
    let refused = codes.iter().filter(|c| **c == 403).count();
    assert_eq!((admitted, refused), (3, 5), "{codes:?}");
    let (_, list) = server.request("GET", &format!("{API}/sandboxes"), None);
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{list}");
    wait_used(&server, "three", "sandboxes", json!(3));
}

#[test]
fn a_folder_manifest_over_quota_is_held_and_starts_once_room_is_made() {
    let server = Server::start();
    quota(&server, "one", json!({"sandboxes": 1}));
    let (first, second) = (unique("qf1"), unique("qf2"));
    write_manifest(
        &server.watch_dir,
        "first.yaml",
        &sandbox_manifest(&first, ""),
    );
    server.wait_running(&first);
    write_manifest(
        &server.watch_dir,
        "second.yaml",
        &sandbox_manifest(&second, ""),
    );
    let held = server
        .wait_for("sandboxes", &second, "held by the quota", LONG, |r| {
            r.is_some_and(|r| {
                r["status"]["conditions"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["type"] == "QuotaExceeded"))
            })
        })
        .unwrap();
    let condition = held["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "QuotaExceeded")
        .unwrap()
        .clone();
    assert_eq!(condition["status"], "True");
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains("ResourceQuota \"one\" of namespace \"default\" allows 1 sandboxes: 1 used"),
        "{condition}"
    );
    assert_eq!(held["status"]["phase"], "Pending", "{held:#}");
    assert!(
        containers_of(&second).is_empty(),
        "a held sandbox started nothing"
    );
    // The other one runs on, untouched.
    let (code, out) = server.exec(&first, "echo fine");
    assert_eq!((code, out.trim()), (0, "fine"));
    wait_used(&server, "one", "sandboxes", json!(1));

    // Raising the quota lets it start, and the condition goes.
    let mut q = server.get("resourcequotas", "one").unwrap();
    q["spec"]["sandboxes"] = json!(2);
    let (code, out) = server.request("PUT", &format!("{API}/resourcequotas/one"), Some(&q));
    assert_eq!(code, 200, "{out}");
    let running = server.wait_running(&second);
    let conditions = running["status"]["conditions"].as_array().unwrap();
    assert!(
        !conditions.iter().any(|c| c["type"] == "QuotaExceeded"),
        "{running:#}"
    );
    wait_used(&server, "one", "sandboxes", json!(2));
}

#[test]
fn a_snapshot_past_snapshot_bytes_fails_and_stores_nothing() {
    let server = Server::start();
    quota(
        &server,
        "bytes",
        json!({"snapshotBytes": 200000, "snapshots": 5}),
    );
    let sb = unique("qsnap");
    assert_eq!(create_sandbox(&server, &sb).0, 201);
    server.wait_running(&sb);
    let (code, _) = server.exec(&sb, "head -c 50000 /dev/urandom > /workspace/small");
    assert_eq!(code, 0);
    let snapshot = |name: &str| {
        let body = json!({
            "apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
            "metadata": {"name": name}, "spec": {"sandbox": sb},
        });
        server.request("POST", &format!("{API}/snapshots"), Some(&body))
    };
    // A status in the request counts for nothing (it is ignored when written, too).
    let faked = json!({
        "apiVersion": "agent-sandbox.io/v1", "kind": "Snapshot",
        "metadata": {"name": "fits"}, "spec": {"sandbox": sb},
        "status": {"phase": "Ready", "sizeBytes": 999999999},
    });
    let (code, out) = server.request("POST", &format!("{API}/snapshots"), Some(&faked));
    assert_eq!(code, 201, "{out}");
    server.wait_for("snapshots", "fits", "Ready", LONG, |r| {
        r.is_some_and(|r| r["status"]["phase"] == "Ready")
    });
    let (code, _) = server.exec(&sb, "head -c 300000 /dev/urandom > /workspace/big");
    assert_eq!(code, 0);
    assert_eq!(snapshot("too-big").0, 201);
    let failed = server
        .wait_for("snapshots", "too-big", "Failed", LONG, |r| {
            r.is_some_and(|r| r["status"]["phase"] == "Failed")
        })
        .unwrap();
    let message = failed["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(
            "ResourceQuota \"bytes\" of namespace \"default\" allows 200000 snapshotBytes"
        ) && message.contains("nothing was stored"),
        "{failed:#}"
    );
    // Through /v1 the same refusal is a 403 quota_exceeded, and no snapshot is left.
    let (code, out) = server.request(
        "POST",
        &format!("/v1/sandboxes/{sb}/snapshots"),
        Some(&json!({})),
    );
    assert_eq!(code, 403, "{out}");
    assert_eq!(out["error"]["code"], "quota_exceeded", "{out}");
    let files = common::snapshot_files(&server);
    assert!(
        !files.iter().any(|f| f.contains("too-big")),
        "the refused snapshot left data: {files:?}"
    );
    // The /v1 snapshot is deleted with its refusal; the count follows (the status is written
    // after each change).
    wait_used(&server, "bytes", "snapshots", json!(2));
    let used = used(&server, "bytes");
    let bytes = used["snapshotBytes"].as_u64().unwrap();
    assert!((50000..200000).contains(&bytes), "{used}");
}
