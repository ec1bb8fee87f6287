//! Scoped API keys against a real server and Docker: a view key reads but never runs or writes;
//! an edit key scoped to another namespace cannot get, list, watch, exec, read files of,
//! snapshot, fork from, delete or even detect a sandbox of `default`, through the resource API,
//! `/v1`, the CLI and MCP; two edit keys of two namespaces each have their own sandbox of one
//! name, and neither reaches the other's; a data directory from before namespaces loads with its
//! containers; a revoked key fails on its open watch within about a second.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, unique, Server, API};
use serde_json::{json, Value};

/// A server with a keys file, and the keys the CLI made in it.
struct Tenancy {
    server: Server,
    keys_file: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

fn keys_cli(file: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .arg("keys")
        .args(args)
        .env_clear()
        .env("AGENT_SANDBOX_KEYS_FILE", file)
        .output()
        .expect("run agent-sandbox keys");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

impl Tenancy {
    fn start() -> Tenancy {
        let dir = tempfile::tempdir().unwrap();
        let keys_file = dir.path().join("keys.yaml");
        let server =
            Server::start_with(&[("AGENT_SANDBOX_KEYS_FILE", keys_file.to_str().unwrap())]);
        Tenancy {
            server,
            keys_file,
            _dir: dir,
        }
    }

    /// Creates a key with the CLI and waits until the server accepts it.
    fn key(&self, name: &str, namespace: &str, role: &str) -> String {
        let (code, out, err) = keys_cli(
            &self.keys_file,
            &[
                "create",
                "--name",
                name,
                "--namespace",
                namespace,
                "--role",
                role,
            ],
        );
        assert_eq!(code, 0, "keys create: {err}");
        let key = out.trim().to_string();
        assert!(key.len() >= 32, "{out}");
        let text = std::fs::read_to_string(&self.keys_file).unwrap();
        assert!(!text.contains(&key), "the keys file holds the key itself");
        let deadline = Instant::now() + Duration::from_secs(5);
        while as_key(&self.server, &key, "GET", "/v1/sandboxes", None).0 != 200 {
            assert!(
                Instant::now() < deadline,
                "the server never took key {name}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        key
    }
}

fn as_key(
    server: &Server,
    key: &str,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let (status, text) = http(
        method,
        &format!("{}{path}", server.url),
        Some(key),
        body.map(|b| b.to_string()),
        "application/json",
    );
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn cli_as(server: &Server, key: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(args)
        .env_clear()
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", key)
        .output()
        .expect("run agent-sandbox");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// Creates a sandbox through `/v1` with the admin key and returns its id, once it runs.
fn sandbox(server: &Server) -> String {
    let (status, body) = server.request("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(status, 201, "{body}\n{}", server.log());
    body["id"].as_str().unwrap().to_string()
}

fn snapshot(server: &Server, id: &str) -> String {
    let (status, body) = server.request(
        "POST",
        &format!("/v1/sandboxes/{id}/snapshots"),
        Some(&json!({})),
    );
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_string()
}

/// Opens a watch with `key` and returns the reader positioned after the response head.
fn open_watch(server: &Server, key: &str, path: &str) -> (u16, BufReader<TcpStream>) {
    let host = server.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let mut reader = BufReader::new(stream);
    let mut status_line = String::new();
    reader.read_line(&mut status_line).unwrap();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" || line.is_empty() {
            break;
        }
    }
    (status, reader)
}

#[test]
fn a_view_key_reads_but_cannot_exec_write_or_change() {
    let t = Tenancy::start();
    let id = sandbox(&t.server);
    let view = t.key("viewer", "default", "view");
    let edit = t.key("editor", "default", "edit");
    let s = &t.server;

    let (status, body) = as_key(s, &view, "GET", &format!("{API}/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{body}");
    let (status, body) = as_key(s, &view, "GET", "/v1/sandboxes", None);
    assert_eq!(status, 200, "{body}");
    assert!(body.to_string().contains(&id), "{body}");

    let refused: Vec<(&str, String, Option<Value>)> = vec![
        (
            "POST",
            format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": "echo hi"})),
        ),
        ("PUT", format!("/v1/sandboxes/{id}/files?path=a.txt"), None),
        ("GET", format!("/v1/sandboxes/{id}/files?path=a.txt"), None),
        (
            "POST",
            format!("/v1/sandboxes/{id}/snapshots"),
            Some(json!({})),
        ),
        ("DELETE", format!("/v1/sandboxes/{id}"), None),
        ("POST", "/v1/sandboxes".into(), Some(json!({}))),
        ("GET", format!("{API}/sandboxes/{id}/exec?command=id"), None),
        (
            "POST",
            format!("{API}/sandboxes/{id}/processes"),
            Some(json!({"command": ["sleep", "1"]})),
        ),
        ("DELETE", format!("{API}/sandboxes/{id}"), None),
        ("GET", "/metrics".into(), None),
    ];
    for (method, path, body) in refused {
        let (status, answer) = as_key(s, &view, method, &path, body);
        assert_eq!(status, 403, "view {method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "forbidden", "{answer}");
        assert!(answer.to_string().contains("viewer"), "{answer}");
    }
    let (code, _, err) = cli_as(s, &view, &["exec", &id, "--", "echo", "hi"]);
    assert_ne!(code, 0, "a view key ran a command through the CLI");
    assert!(err.contains("view"), "{err}");

    // The same calls with an edit key of the namespace work: the refusals were the role's.
    let (status, body) = as_key(
        s,
        &edit,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "echo hi > /workspace/a.txt && cat /workspace/a.txt"})),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stdout"], "hi\n", "{body}");
    // The sandbox is untouched by the view key's attempts.
    assert!(s.get("sandboxes", &id).is_some());
}

/// Replaces the sandbox's and snapshot's names by placeholders so that answers about them and
/// about names that never existed can be compared.
fn anonymous(answer: &Value, names: &[&str]) -> String {
    let mut text = answer.to_string();
    for name in names {
        text = text.replace(name, "NAME");
    }
    text
}

#[test]
fn an_edit_key_of_another_namespace_cannot_reach_or_detect_a_sandbox() {
    let t = Tenancy::start();
    let s = &t.server;
    let id = sandbox(s);
    s.wait_running(&id);
    let snap = snapshot(s, &id);
    let other = t.key("team-b-ci", "team-b", "edit");
    let ghost = "sb_00000000000000aa";
    let ghost_snap = "snap_00000000000000aa";

    // Every call about the sandbox answers exactly as about one that never existed.
    let calls = |sb: &str, sn: &str| -> Vec<(&'static str, String, Option<Value>)> {
        vec![
            ("GET", format!("{API}/sandboxes/{sb}"), None),
            ("DELETE", format!("{API}/sandboxes/{sb}"), None),
            ("GET", format!("{API}/snapshots/{sn}"), None),
            ("GET", format!("/v1/sandboxes/{sb}"), None),
            (
                "POST",
                format!("/v1/sandboxes/{sb}/exec"),
                Some(json!({"command": "id"})),
            ),
            ("GET", format!("/v1/sandboxes/{sb}/files?path=a.txt"), None),
            ("GET", format!("/v1/sandboxes/{sb}/files/list?path=."), None),
            (
                "POST",
                format!("/v1/sandboxes/{sb}/snapshots"),
                Some(json!({})),
            ),
            ("DELETE", format!("/v1/sandboxes/{sb}"), None),
            ("GET", format!("/v1/snapshots/{sn}"), None),
            ("POST", format!("/v1/snapshots/{sn}/fork"), Some(json!({}))),
            ("DELETE", format!("/v1/snapshots/{sn}"), None),
        ]
    };
    for ((method, path, body), (_, ghost_path, ghost_body)) in
        calls(&id, &snap).into_iter().zip(calls(ghost, ghost_snap))
    {
        let (status, answer) = as_key(s, &other, method, &path, body);
        assert_eq!(status, 404, "{method} {path}: {answer}");
        let (_, ghost_answer) = as_key(s, &other, method, &ghost_path, ghost_body);
        assert_eq!(
            anonymous(&answer, &[&id, &snap]),
            anonymous(&ghost_answer, &[ghost, ghost_snap]),
            "{method} {path} tells an existing object from a missing one"
        );
    }
    // Lists and watches are empty; events say nothing.
    for path in [
        format!("{API}/sandboxes"),
        format!("{API}/snapshots"),
        format!("{API}/events"),
        "/v1/sandboxes".to_string(),
        "/v1/snapshots".to_string(),
    ] {
        let (status, answer) = as_key(s, &other, "GET", &path, None);
        assert_eq!(status, 200, "{path}: {answer}");
        assert!(!answer.to_string().contains(&id), "{path}: {answer}");
        let items = answer
            .get("items")
            .or_else(|| answer.get("sandboxes"))
            .or_else(|| answer.get("snapshots"))
            .and_then(Value::as_array)
            .map(Vec::len);
        assert_eq!(items, Some(0), "{path}: {answer}");
    }
    let (status, watch) = as_key(
        s,
        &other,
        "GET",
        &format!("{API}/sandboxes?watch=true&timeoutSeconds=1"),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(
        watch,
        Value::String(String::new()),
        "the watch showed something"
    );
    // The admin key sees it all (the filter is the key's, not an empty server).
    let (_, admin_list) = s.request("GET", &format!("{API}/sandboxes"), None);
    assert!(admin_list.to_string().contains(&id));
    // Nor can it create in the default namespace (its `/v1` creates go to its own).
    let (status, answer) = as_key(
        s,
        &other,
        "POST",
        &format!("{API}/namespaces/default/sandboxes"),
        Some(
            json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
            "metadata": {"name": "intruder"}, "spec": {}}),
        ),
    );
    assert_eq!(status, 403, "{answer}");
    assert!(!answer.to_string().contains(&id));

    // The CLI.
    let (code, out, err) = cli_as(s, &other, &["get", "sandboxes"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains(&id) && !err.contains(&id), "{out}{err}");
    let (code, _, err) = cli_as(s, &other, &["exec", &id, "--", "id"]);
    assert_ne!(code, 0);
    assert!(err.contains("not found"), "{err}");
    let (code, _, err) = cli_as(s, &other, &["delete", "sandbox", &id]);
    assert_ne!(code, 0);
    assert!(err.contains("not found"), "{err}");

    // MCP.
    let answers = mcp(
        s,
        &other,
        &[
            ("sandbox_list", json!({})),
            ("sandbox_exec", json!({"sandbox_id": id, "command": "id"})),
            (
                "sandbox_read_file",
                json!({"sandbox_id": id, "path": "a.txt"}),
            ),
            ("sandbox_destroy", json!({"sandbox_id": id})),
        ],
    );
    assert!(!answers[0].to_string().contains(&id), "{}", answers[0]);
    assert_ne!(answers[0]["isError"], true, "{}", answers[0]);
    for answer in &answers[1..] {
        assert_eq!(answer["isError"], true, "{answer}");
        assert!(answer.to_string().contains("not found"), "{answer}");
    }
    // Still there and running for its owner.
    assert_eq!(s.exec(&id, "echo alive").1, "alive\n");
}

/// Calls MCP `tools` in order through `agent-sandbox mcp` with `key`; returns their results.
fn mcp(server: &Server, key: &str, tools: &[(&str, Value)]) -> Vec<Value> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .arg("mcp")
        .env_clear()
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut send = |v: Value| writeln!(stdin, "{v}").unwrap();
    let mut receive = |id: u64| -> Value {
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "mcp ended");
            let v: Value = serde_json::from_str(&line).unwrap();
            if v["id"] == id {
                return v;
            }
        }
    };
    send(
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "tenancy-test", "version": "1"}}}),
    );
    receive(0);
    send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    let mut results = Vec::new();
    for (i, (tool, arguments)) in tools.iter().enumerate() {
        let id = i as u64 + 1;
        send(json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": tool, "arguments": arguments}}));
        let answer = receive(id);
        results.push(answer["result"].clone());
    }
    let _ = child.kill();
    let _ = child.wait();
    results
}

#[test]
fn a_revoked_key_fails_on_its_open_watch_within_a_second() {
    let t = Tenancy::start();
    let s = &t.server;
    let name = unique("watched");
    let doomed = t.key("doomed", "default", "edit");
    let (status, mut watch) = open_watch(s, &doomed, &format!("{API}/sandboxes?watch=true"));
    assert_eq!(status, 200);
    // The watch is live: an object made now shows up on it.
    let (status, body) = s.request(
        "POST",
        &format!("{API}/sandboxes"),
        Some(
            &json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
            "metadata": {"name": name}, "spec": {}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let mut seen = String::new();
    while !seen.contains(&name) {
        let mut line = String::new();
        assert!(
            watch.read_line(&mut line).unwrap() > 0,
            "the watch ended early"
        );
        seen.push_str(&line);
    }
    let (code, _, err) = keys_cli(&t.keys_file, &["revoke", "doomed"]);
    assert_eq!(code, 0, "{err}");
    let revoked_at = Instant::now();
    // The stream ends (without its closing chunk) soon after.
    let mut rest = Vec::new();
    let ended = watch.read_to_end(&mut rest);
    let took = revoked_at.elapsed();
    assert!(
        took < Duration::from_millis(1500),
        "the watch stayed open {took:?} after the key was revoked ({ended:?})"
    );
    assert!(
        !String::from_utf8_lossy(&rest).contains("\r\n0\r\n\r\n"),
        "the watch ended as if complete"
    );
    let (status, _) = as_key(s, &doomed, "GET", "/v1/sandboxes", None);
    assert_eq!(status, 401);
    // Another key, unchanged in the file, keeps working.
    let (code, list, _) = keys_cli(&t.keys_file, &["list"]);
    assert_eq!(code, 0);
    assert!(!list.contains("doomed"), "{list}");
    let admin = s.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert!(admin.0 == 200 || admin.0 == 202, "{admin:?}");
    s.wait_gone("sandboxes", &name);
}

#[test]
fn audit_lines_name_the_key_never_the_key_and_survive_kill_9() {
    let mut t = Tenancy::start();
    let id = sandbox(&t.server);
    t.server.wait_running(&id);
    let editor = t.key("editor", "default", "edit");
    let viewer = t.key("viewer", "default", "view");
    let s = &t.server;
    let (status, body) = as_key(
        s,
        &editor,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "true"})),
    );
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(
        "PUT",
        &format!("{}/v1/sandboxes/{id}/files?path=audited.txt", s.url),
        Some(&editor),
        Some("hello".into()),
        "application/octet-stream",
    );
    assert!(
        status == 200 || status == 201 || status == 204,
        "{status} {body}"
    );
    let (status, _) = as_key(
        s,
        &viewer,
        "POST",
        &format!("/v1/sandboxes/{id}/exec"),
        Some(json!({"command": "true"})),
    );
    assert_eq!(status, 403);
    // Reads are not audited.
    as_key(s, &editor, "GET", &format!("{API}/sandboxes/{id}"), None);

    let has = |items: &[Value], key: &str, verb: &str, code: u64| {
        items.iter().any(|l| {
            l["key"] == key
                && l["verb"] == verb
                && l["name"] == id.as_str()
                && l["resource"] == "sandboxes"
                && l["namespace"] == "default"
                && l["code"] == code
                && l["source"].as_str().is_some_and(|s| s.starts_with("v1"))
        })
    };
    let audit = |s: &Server| -> Vec<Value> {
        let (status, body) = s.request("GET", &format!("{API}/audit"), None);
        assert_eq!(status, 200, "{body}");
        body["items"].as_array().unwrap().clone()
    };
    let items = audit(s);
    assert!(has(&items, "editor", "exec", 200), "{items:#?}");
    assert!(
        has(&items, "editor", "write-file", 200)
            || has(&items, "editor", "write-file", 201)
            || has(&items, "editor", "write-file", 204),
        "{items:#?}"
    );
    assert!(has(&items, "viewer", "exec", 403), "{items:#?}");
    assert!(
        has(&items, "admin", "create", 201)
            || items
                .iter()
                .any(|l| l["key"] == "admin" && l["verb"] == "create"),
        "{items:#?}"
    );
    assert!(
        !items.iter().any(|l| l["verb"] == "get"),
        "reads were audited: {items:#?}"
    );
    // Only admin keys read it; `since` bounds it.
    assert_eq!(
        as_key(s, &editor, "GET", &format!("{API}/audit"), None).0,
        403
    );
    let (status, later) = s.request(
        "GET",
        &format!("{API}/audit?since=2999-01-01T00:00:00Z"),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(later["items"], json!([]));
    assert_eq!(
        s.request("GET", &format!("{API}/audit?since=yesterday"), None)
            .0,
        400
    );

    // No key appears in the files, and every line is whole after a kill -9.
    let dir = s.data_dir.join("audit");
    t.server.kill9();
    let mut text = String::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        text.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
    }
    for key in [&editor, &viewer, &t.server.key] {
        assert!(!text.contains(key.as_str()), "a key is in the audit trail");
    }
    assert!(text.ends_with('\n'));
    for line in text.lines() {
        serde_json::from_str::<Value>(line).unwrap_or_else(|e| panic!("torn line {line:?}: {e}"));
    }
    t.server.restart();
    let after = audit(&t.server);
    assert!(
        has(&after, "editor", "exec", 200),
        "lost after kill -9: {after:#?}"
    );
}

/// The resource API path of `rest` in `namespace`.
fn in_ns(namespace: &str, rest: &str) -> String {
    format!("{API}/namespaces/{namespace}/{rest}")
}

#[test]
fn two_namespaces_each_have_their_own_sandbox_of_one_name() {
    let t = Tenancy::start();
    let s = &t.server;
    let a = t.key("team-a-ci", "team-a", "edit");
    let b = t.key("team-b-ci", "team-b", "edit");
    // One name, three namespaces: each key creates in its own; the admin in `default`.
    let web = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": "web"}, "spec": {}});
    for (key, namespace) in [(&a, "team-a"), (&b, "team-b")] {
        let (status, body) = as_key(
            s,
            key,
            "POST",
            &in_ns(namespace, "sandboxes"),
            Some(web.clone()),
        );
        assert_eq!(status, 201, "{body}\n{}", s.log());
        assert_eq!(body["metadata"]["namespace"], namespace, "{body}");
        assert_eq!(body["metadata"]["name"], "web", "{body}");
    }
    let (status, body) = s.request("POST", &format!("{API}/sandboxes"), Some(&web));
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["metadata"]["namespace"], "default", "{body}");
    // A key cannot create in a namespace it does not reach, nor name another in its document.
    let (status, body) = as_key(
        s,
        &a,
        "POST",
        &in_ns("team-b", "sandboxes"),
        Some(web.clone()),
    );
    assert_eq!(status, 403, "{body}");
    let (status, body) = as_key(
        s,
        &a,
        "POST",
        &in_ns("team-a", "sandboxes"),
        Some(
            json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
            "metadata": {"name": "x", "namespace": "team-b"}, "spec": {}}),
        ),
    );
    assert_eq!(status, 400, "{body}");
    for key in ["team-a.web", "team-b.web", "web"] {
        s.wait_running(key);
    }

    // Each writes into its own; `/v1` IDs of another namespace are keys.
    for (key, id, who) in [(&a, "team-a.web", "a"), (&b, "team-b.web", "b")] {
        let (status, body) = as_key(
            s,
            key,
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": format!("echo {who} > who; cat who")})),
        );
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["stdout"], format!("{who}\n"), "{body}");
    }
    // The admin's `web` of `default` is a third sandbox: it has no such file.
    assert_eq!(
        s.exec("web", "test -e who && echo yes || echo no").1,
        "no\n"
    );

    // Team b reaches nothing of team a's, and learns nothing: answers match a name that never
    // existed.
    let ghost = "nobody";
    let calls = |name: &str| -> Vec<(&'static str, String, Option<Value>)> {
        vec![
            ("GET", in_ns("team-a", &format!("sandboxes/{name}")), None),
            (
                "DELETE",
                in_ns("team-a", &format!("sandboxes/{name}")),
                None,
            ),
            (
                "GET",
                in_ns("team-a", &format!("sandboxes/{name}/stats")),
                None,
            ),
            (
                "POST",
                format!("/v1/sandboxes/team-a.{name}/exec"),
                Some(json!({"command": "id"})),
            ),
            (
                "GET",
                format!("/v1/sandboxes/team-a.{name}/files?path=who"),
                None,
            ),
            (
                "POST",
                format!("/v1/sandboxes/team-a.{name}/snapshots"),
                Some(json!({})),
            ),
        ]
    };
    for ((method, path, body), (_, ghost_path, ghost_body)) in
        calls("web").into_iter().zip(calls(ghost))
    {
        let (status, answer) = as_key(s, &b, method, &path, body);
        assert_eq!(status, 404, "{method} {path}: {answer}");
        let (_, ghost_answer) = as_key(s, &b, method, &ghost_path, ghost_body);
        assert_eq!(
            anonymous(&answer, &["web"]),
            anonymous(&ghost_answer, &[ghost]),
            "{method} {path} tells an existing object from a missing one"
        );
    }
    // Un-namespaced paths mean `default` for one object: team b's key does not reach it either.
    let (status, _) = as_key(s, &b, "GET", &format!("{API}/sandboxes/web"), None);
    assert_eq!(status, 404);
    // A key is not a name: only the namespaced path names another namespace's object.
    let (status, _) = s.request("GET", &format!("{API}/sandboxes/team-a.web"), None);
    assert_eq!(status, 404);

    // Lists across namespaces show each key its own only; the admin sees all three.
    let namespaces_of = |answer: &Value| -> Vec<String> {
        let mut out: Vec<String> = answer["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| {
                format!(
                    "{}/{}",
                    i["metadata"]["namespace"].as_str().unwrap(),
                    i["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        out.sort();
        out
    };
    let (_, list) = as_key(s, &a, "GET", &format!("{API}/sandboxes"), None);
    assert_eq!(namespaces_of(&list), vec!["team-a/web"]);
    let (status, list) = as_key(s, &b, "GET", &in_ns("team-a", "sandboxes"), None);
    assert_eq!(status, 200);
    assert_eq!(namespaces_of(&list), Vec::<String>::new());
    let (_, list) = s.request("GET", &format!("{API}/sandboxes"), None);
    assert_eq!(
        namespaces_of(&list),
        vec!["default/web", "team-a/web", "team-b/web"]
    );
    let (_, list) = s.request("GET", &in_ns("team-b", "sandboxes"), None);
    assert_eq!(namespaces_of(&list), vec!["team-b/web"]);
    let (_, v1) = as_key(s, &b, "GET", "/v1/sandboxes", None);
    let ids: Vec<&str> = v1["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|x| x["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["team-b.web"], "{v1}");
    let (status, watch) = as_key(
        s,
        &b,
        "GET",
        &in_ns("team-a", "sandboxes?watch=true&timeoutSeconds=1"),
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(
        watch,
        Value::String(String::new()),
        "the watch showed something"
    );
    let (_, events) = as_key(s, &b, "GET", &format!("{API}/events"), None);
    for event in events["items"].as_array().unwrap() {
        assert_eq!(event["involvedObject"]["namespace"], "team-b", "{event}");
    }

    // Snapshots and forks stay in their namespace: team a forks its own snapshot; a Fork of
    // team b naming it finds nothing.
    let (status, snap) = as_key(
        s,
        &a,
        "POST",
        "/v1/sandboxes/team-a.web/snapshots",
        Some(json!({})),
    );
    assert_eq!(status, 201, "{snap}");
    let snap_id = snap["id"].as_str().unwrap().to_string();
    let snap_name = snap_id
        .strip_prefix("team-a.")
        .expect("a key of team-a")
        .to_string();
    let (status, snapshot) = as_key(
        s,
        &a,
        "GET",
        &in_ns("team-a", &format!("snapshots/{snap_name}")),
        None,
    );
    assert_eq!(status, 200, "{snapshot}");
    assert_eq!(snapshot["spec"]["sandbox"], "web");
    let fork = |name: &str| {
        json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Fork",
            "metadata": {"name": name}, "spec": {"snapshot": snap_name, "replicas": 1}})
    };
    let (status, body) = as_key(s, &a, "POST", &in_ns("team-a", "forks"), Some(fork("try")));
    assert_eq!(status, 201, "{body}");
    let (status, body) = as_key(
        s,
        &b,
        "POST",
        &in_ns("team-b", "forks"),
        Some(fork("steal")),
    );
    assert_eq!(status, 201, "{body}");
    let child = s.wait_running("team-a.try-0");
    assert_eq!(child["metadata"]["namespace"], "team-a");
    let (_, out) = as_key(
        s,
        &a,
        "POST",
        "/v1/sandboxes/team-a.try-0/exec",
        Some(json!({"command": "cat who"})),
    );
    assert_eq!(out["stdout"], "a\n", "{out}");
    s.wait_for(
        "forks",
        "team-b.steal",
        "Failed",
        Duration::from_secs(30),
        |f| f.is_some_and(|f| f["status"]["phase"] == "Failed"),
    );
    let (status, _) = as_key(
        s,
        &b,
        "POST",
        &format!("/v1/snapshots/{snap_id}/fork"),
        Some(json!({})),
    );
    assert_eq!(status, 404);
    let (status, _) = as_key(
        s,
        &b,
        "POST",
        "/v1/sandboxes/team-b.web/rollback",
        Some(json!({"snapshot_id": snap_id})),
    );
    assert_eq!(status, 404);

    // The CLI with --namespace.
    let (code, out, err) = cli_as(s, &a, &["exec", "-n", "team-a", "web", "--", "cat", "who"]);
    assert_eq!((code, out.as_str()), (0, "a\n"), "{err}");
    let (code, out, err) = cli_as(s, &b, &["get", "sandboxes", "-n", "team-a"]);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("web"), "{out}");
    let (code, _, err) = cli_as(s, &b, &["delete", "sandbox", "web", "-n", "team-a"]);
    assert_ne!(code, 0);
    assert!(err.contains("not found"), "{err}");

    // MCP: its IDs are `/v1`'s, and team b's key reaches nothing of team a's by them.
    let answers = mcp(
        s,
        &b,
        &[
            ("sandbox_list", json!({})),
            (
                "sandbox_exec",
                json!({"sandbox_id": "team-a.web", "command": "cat who"}),
            ),
            (
                "sandbox_read_file",
                json!({"sandbox_id": "team-a.web", "path": "who"}),
            ),
            ("sandbox_destroy", json!({"sandbox_id": "team-a.web"})),
        ],
    );
    assert!(
        answers[0].to_string().contains("team-b.web"),
        "{}",
        answers[0]
    );
    assert!(!answers[0].to_string().contains("team-a"), "{}", answers[0]);
    for answer in &answers[1..] {
        assert_eq!(answer["isError"], true, "{answer}");
        assert!(answer.to_string().contains("not found"), "{answer}");
    }

    // Deleting one leaves the others of its name.
    let (status, body) = as_key(s, &a, "DELETE", &in_ns("team-a", "sandboxes/web"), None);
    assert_eq!(status, 200, "{body}");
    let (_, out) = as_key(
        s,
        &b,
        "POST",
        "/v1/sandboxes/team-b.web/exec",
        Some(json!({"command": "cat who"})),
    );
    assert_eq!(out["stdout"], "b\n", "{out}");
    assert!(s.get("sandboxes", "web").is_some());
}

#[test]
fn a_data_directory_from_before_namespaces_loads_with_its_containers() {
    let mut s = Server::start();
    let id = sandbox(&s);
    let before = s.wait_running(&id);
    let container = before["status"]["containerID"]
        .as_str()
        .unwrap()
        .to_string();
    s.exec(&id, "echo kept > kept");
    s.kill9();
    // What the release before namespaces wrote: no namespace in the manifest or the state.
    let manifest = s.data_dir.join(format!("manifests/sandboxes/{id}.yaml"));
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(text.contains("namespace: default"), "{text}");
    std::fs::write(&manifest, text.replace("  namespace: default\n", "")).unwrap();
    let state = s.data_dir.join(format!("state/sandboxes/{id}.json"));
    let mut json: Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    json["declaration"]["metadata"]
        .as_object_mut()
        .unwrap()
        .remove("namespace");
    std::fs::write(&state, serde_json::to_vec_pretty(&json).unwrap()).unwrap();

    s.restart();
    let after = s.wait_running(&id);
    assert_eq!(after["metadata"]["namespace"], "default");
    assert_eq!(after["metadata"]["uid"], before["metadata"]["uid"]);
    assert_eq!(
        after["status"]["containerID"].as_str(),
        Some(container.as_str()),
        "the sandbox was recreated:\n{}",
        s.log()
    );
    assert_eq!(s.exec(&id, "cat kept").1, "kept\n");
}

#[test]
fn a_folder_bound_to_a_namespace_declares_into_it() {
    let folder = tempfile::tempdir().unwrap();
    // Its own namespace: the suite's other servers share the Docker host.
    let ns = common::unique("team");
    let binding = format!("{ns}={}", folder.path().display());
    let s = Server::start_with(&[("AGENT_SANDBOX_WATCH_DIRS", &binding)]);
    common::write_manifest(
        folder.path(),
        "web.yaml",
        &format!(
            "{}---\napiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: elsewhere\n  namespace: team-b\nspec: {{}}\n",
            common::sandbox_manifest("web", "")
        ),
    );
    let web = s.wait_running(&format!("{ns}.web"));
    assert_eq!(web["metadata"]["namespace"], ns.as_str());
    assert!(
        s.get("sandboxes", "web").is_none(),
        "it went to default too"
    );
    common::wait_until(
        "the misplaced document's error",
        Duration::from_secs(10),
        || {
            let (_, errors) = s.request("GET", &format!("{API}/errors"), None);
            errors["errors"].as_array().is_some_and(|list| {
                list.iter().any(|e| {
                    e["field"] == "metadata.namespace"
                        && e["line"].as_u64().is_some_and(|l| l > 1)
                        && e["message"].as_str().is_some_and(|m| m.contains(&ns))
                })
            })
        },
    );
    assert!(s.get("sandboxes", "team-b.elsewhere").is_none());
}
