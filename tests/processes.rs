//! Long-lived processes (`…/sandboxes/{name}/processes`) against the real daemon: they outlive
//! clients and a SIGKILL of the server, replay byte-exact from offsets, report truthful exits,
//! take stdin, run on terminals, die with their whole tree on DELETE, turn `Lost` when their
//! container goes, and refuse hostile input naming the field.

mod common;
#[path = "processes/must_hold.rs"]
mod must_hold;
#[path = "processes/sandbox_end.rs"]
mod sandbox_end;
#[path = "processes/storage.rs"]
mod storage;
#[path = "processes/terminal.rs"]
mod terminal;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};

fn sandbox(server: &Server) -> String {
    let mut body = json!({});
    if gvisor() {
        body["pids_limit"] = json!(4096);
    }
    let (status, body) = server.request("POST", "/v1/sandboxes", Some(&body));
    assert_eq!(status, 201, "{body}\n{}", server.log());
    body["id"].as_str().unwrap().to_string()
}

fn procs(sb: &str) -> String {
    format!("{API}/sandboxes/{sb}/processes")
}

fn start(server: &Server, sb: &str, body: Value) -> Value {
    let (status, p) = server.request("POST", &procs(sb), Some(&body));
    assert_eq!(status, 201, "start {body}: {p}\n{}", server.log());
    let id = p["id"].as_str().unwrap();
    assert!(id.len() == 18 && id.starts_with("p_"), "process id {id:?}");
    p
}

/// The NDJSON events of an output read.
fn events(server: &Server, sb: &str, id: &str, query: &str) -> Vec<Value> {
    let (status, body) = http_bytes(
        server,
        "GET",
        &format!("{}/{id}/output?{query}", procs(sb)),
        b"",
    );
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    String::from_utf8(body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Bytes of `stream` from the events (base64), checking that offsets are contiguous from `from`.
fn bytes_of(events: &[Value], stream: &str, from: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e["type"] == stream) {
        assert_eq!(e["offset"].as_u64().unwrap(), from + out.len() as u64);
        let data = base64::engine::general_purpose::STANDARD
            .decode(e["data"].as_str().unwrap())
            .unwrap();
        out.extend_from_slice(&data);
    }
    out
}

fn text_of(events: &[Value], stream: &str) -> String {
    events
        .iter()
        .filter(|e| e["type"] == stream)
        .map(|e| e["data"].as_str().unwrap())
        .collect()
}

/// Follows a process to its end; its last event.
fn follow_to_end(server: &Server, sb: &str, id: &str) -> (Vec<Value>, Value) {
    let ev = events(server, sb, id, "follow=true&encoding=base64");
    let last = ev.last().cloned().unwrap();
    (ev, last)
}

fn get(server: &Server, sb: &str, id: &str) -> Value {
    let (status, p) = server.request("GET", &format!("{}/{id}", procs(sb)), None);
    assert_eq!(status, 200, "{p}");
    p
}

fn stdin(server: &Server, sb: &str, id: &str, data: &[u8], close: bool) -> u16 {
    let q = if close { "?close=true" } else { "" };
    http_bytes(
        server,
        "POST",
        &format!("{}/{id}/stdin{q}", procs(sb)),
        data,
    )
    .0
}

/// Waits until the process's stdout holds `needle` (utf8 read, not following).
fn wait_output(server: &Server, sb: &str, id: &str, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ev = events(server, sb, id, "");
        let out = text_of(&ev, "stdout");
        if out.contains(needle) {
            return out;
        }
        assert!(Instant::now() < deadline, "no {needle:?} in {out:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A known block (1 MiB + 7, random) written into the workspace.
fn known_block(server: &Server, sb: &str) -> Vec<u8> {
    let block: Vec<u8> = (0..(1 << 20) + 7).map(|_| rand::random::<u8>()).collect();
    let (status, body) = http_bytes(
        server,
        "PUT",
        &format!("/v1/sandboxes/{sb}/files?path=/workspace/block&mode=0644"),
        &block,
    );
    assert!(
        status == 200 || status == 201 || status == 204,
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
    block
}

#[test]
fn processes_survive_a_server_sigkill_and_replay_byte_exact() {
    let mut server = Server::start_with(&[("AGENT_SANDBOX_PROCESS_OUTPUT_BYTES", "33554432")]);
    let sb = sandbox(&server);
    let block = known_block(&server, &sb);
    let expected: Vec<u8> = block
        .iter()
        .copied()
        .cycle()
        .take(block.len() * 20)
        .collect();
    assert!(expected.len() > 20 << 20);

    let big = start(
        &server,
        &sb,
        json!({"command": "i=0; while [ $i -lt 20 ]; do cat /workspace/block; i=$((i+1)); done"}),
    );
    let big = big["id"].as_str().unwrap().to_string();
    let ticker = start(
        &server,
        &sb,
        json!({"command": "i=0; while true; do echo $i; i=$((i+1)); sleep 0.1; done"}),
    );
    let ticker = ticker["id"].as_str().unwrap().to_string();
    // A background server: busybox httpd on loopback.
    let web = start(
        &server,
        &sb,
        json!({"argv": ["httpd", "-f", "-p", "127.0.0.1:8000", "-h", "/workspace"]}),
    );
    let web = web["id"].as_str().unwrap().to_string();

    let (ev, last) = follow_to_end(&server, &sb, &big);
    assert_eq!(last["type"], "exit", "{last}");
    assert_eq!(last["exitCode"], 0);
    assert!(last["signal"].is_null());
    let check = |server: &Server| {
        for from in [0u64, 1, 4095, expected.len() as u64] {
            let ev = events(
                server,
                &sb,
                &big,
                &format!("stdoutFrom={from}&encoding=base64"),
            );
            let got = bytes_of(&ev, "stdout", from);
            assert!(
                got == expected[from as usize..],
                "replay from {from} differs ({} bytes vs {})",
                got.len(),
                expected.len() - from as usize
            );
            assert_eq!(ev.last().unwrap()["type"], "exit");
            assert!(ev.iter().all(|e| e["type"] != "truncated"));
        }
    };
    assert_eq!(bytes_of(&ev, "stdout", 0), expected);
    check(&server);

    let before = get(&server, &sb, &ticker)["stdoutBytes"].as_u64().unwrap();
    server.kill9();
    std::thread::sleep(Duration::from_secs(2));
    server.restart();

    check(&server);
    let p = get(&server, &sb, &ticker);
    assert_eq!(p["state"], "Running", "{p}");
    assert!(p["stdoutBytes"].as_u64().unwrap() > before + 5, "{p}");
    // Its lines continue without gap or duplicate across the restart.
    let ev = events(&server, &sb, &ticker, "");
    assert_eq!(ev.last().unwrap()["type"], "running");
    let out = text_of(&ev, "stdout");
    let numbers: Vec<u64> = out.lines().map(|l| l.parse().unwrap()).collect();
    assert!(numbers.len() > 20);
    assert!(numbers.iter().enumerate().all(|(i, n)| *n == i as u64));
    // The web server still answers. (Under gVisor, busybox's wget gets EAGAIN from any local
    // httpd, supervised or not, so there only its state is checked.)
    if !gvisor() {
        let (code, body) = server.exec(
            &sb,
            "echo served > /workspace/index.html; wget -qO- http://127.0.0.1:8000/index.html",
        );
        assert_eq!((code, body.trim()), (0, "served"));
    }
    assert_eq!(get(&server, &sb, &web)["state"], "Running");
    let (status, list) = server.request("GET", &procs(&sb), None);
    assert_eq!(status, 200);
    assert_eq!(list["items"].as_array().unwrap().len(), 3, "{list}");
}

#[test]
fn exits_stdin_terminals_and_deletion() {
    let server = Server::start();
    let sb = sandbox(&server);

    // Truthful exits.
    for (cmd, code, signal) in [
        ("exit 0", json!(0), Value::Null),
        ("echo out; echo err >&2; exit 3", json!(3), Value::Null),
        ("kill -9 $$", Value::Null, json!("KILL")),
    ] {
        let p = start(&server, &sb, json!({ "command": cmd }));
        let (ev, last) = follow_to_end(&server, &sb, p["id"].as_str().unwrap());
        assert_eq!(last["type"], "exit", "{cmd}: {ev:?}");
        assert_eq!(
            (&last["exitCode"], &last["signal"]),
            (&code, &signal),
            "{cmd}"
        );
        let p = get(&server, &sb, p["id"].as_str().unwrap());
        assert_eq!(p["state"], "Exited");
        assert_eq!((&p["exitCode"], &p["signal"]), (&code, &signal), "{cmd}");
        assert!(p["finishedAt"].is_string());
    }
    // Signalled through the API.
    let p = start(&server, &sb, json!({ "argv": ["sleep", "300"] }));
    let id = p["id"].as_str().unwrap();
    assert_eq!(p["state"], "Running");
    assert!(p["pid"].as_u64().unwrap() > 0);
    let (status, _) = server.request(
        "POST",
        &format!("{}/{id}/signal", procs(&sb)),
        Some(&json!({"signal": "TERM"})),
    );
    assert_eq!(status, 202);
    let (_, last) = follow_to_end(&server, &sb, id);
    assert_eq!(last["signal"], "TERM", "{last}");

    // A process that closes its stdout keeps running; a read ends with `running`.
    let p = start(
        &server,
        &sb,
        json!({"command": "echo bye; exec >&- 2>&-; sleep 300"}),
    );
    let id = p["id"].as_str().unwrap().to_string();
    std::thread::sleep(Duration::from_millis(500));
    let ev = events(&server, &sb, &id, "");
    assert_eq!(text_of(&ev, "stdout"), "bye\n");
    assert_eq!(
        ev.last().unwrap(),
        &json!({"type": "running", "stdoutOffset": 4, "stderrOffset": 0})
    );
    assert!(ev.iter().all(|e| e["type"] != "exit"));
    assert_eq!(get(&server, &sb, &id)["state"], "Running");

    // stdin: cat, read, a shell keeping state between two inputs.
    let cat = start(&server, &sb, json!({"argv": ["cat"], "stdin": true}));
    let cat = cat["id"].as_str().unwrap();
    assert_eq!(stdin(&server, &sb, cat, b"hello \xff\n", false), 204);
    assert_eq!(stdin(&server, &sb, cat, b"world\n", true), 204);
    let (ev, last) = follow_to_end(&server, &sb, cat);
    assert_eq!(bytes_of(&ev, "stdout", 0), b"hello \xff\nworld\n");
    assert_eq!(last["exitCode"], 0);
    assert_eq!(stdin(&server, &sb, cat, b"late", false), 409);
    // utf8 encoding replaces the invalid byte but offsets count raw bytes.
    let ev = events(&server, &sb, cat, "stdoutFrom=6");
    assert_eq!(ev[0]["offset"], 6);
    assert_eq!(text_of(&ev, "stdout"), "\u{fffd}\nworld\n");

    let read = start(
        &server,
        &sb,
        json!({"command": "read a; echo got:$a", "stdin": true}),
    );
    let read = read["id"].as_str().unwrap();
    assert_eq!(stdin(&server, &sb, read, b"line\n", false), 204);
    let (ev, _) = follow_to_end(&server, &sb, read);
    assert_eq!(bytes_of(&ev, "stdout", 0), b"got:line\n");

    let repl = start(&server, &sb, json!({"argv": ["sh", "-s"], "stdin": true}));
    let repl = repl["id"].as_str().unwrap();
    assert_eq!(stdin(&server, &sb, repl, b"x=41\n", false), 204);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(stdin(&server, &sb, repl, b"echo $((x+1))\n", false), 204);
    wait_output(&server, &sb, repl, "42\n");

    let no_stdin = start(&server, &sb, json!({"argv": ["sleep", "300"]}));
    assert_eq!(
        stdin(&server, &sb, no_stdin["id"].as_str().unwrap(), b"x", false),
        409
    );

    // A terminal.
    let tty = start(
        &server,
        &sb,
        json!({
            "command": "test -t 0 && test -t 1 && echo ISATTY; echo TERM=$TERM; read x; stty size",
            "tty": true, "stdin": true, "cols": 90, "rows": 30,
        }),
    );
    let tty_id = tty["id"].as_str().unwrap();
    assert_eq!(tty["tty"], true);
    wait_output(&server, &sb, tty_id, "TERM=");
    let (status, _) = server.request(
        "POST",
        &format!("{}/{tty_id}/resize", procs(&sb)),
        Some(&json!({"cols": 100, "rows": 40})),
    );
    assert_eq!(status, 204);
    assert_eq!(stdin(&server, &sb, tty_id, b"go\r", false), 204);
    let (ev, last) = follow_to_end(&server, &sb, tty_id);
    let out = String::from_utf8_lossy(&bytes_of(&ev, "stdout", 0)).to_string();
    assert!(out.contains("ISATTY"), "{out:?}");
    assert!(out.contains("TERM=xterm"), "{out:?}");
    assert!(out.contains("40 100"), "{out:?}");
    assert!(ev.iter().all(|e| e["type"] != "stderr"));
    assert_eq!(last["exitCode"], 0);

    // DELETE kills a tree that called setsid.
    let p = start(
        &server,
        &sb,
        json!({"command": "setsid sleep 4242 & echo started; wait"}),
    );
    let id = p["id"].as_str().unwrap();
    wait_output(&server, &sb, id, "started");
    let (_, ps) = server.exec(&sb, "ps -o args | grep -c '^sleep 4242' || true");
    assert_eq!(ps.trim(), "1", "the setsid sleeper runs");
    let (status, _) = server.request("DELETE", &format!("{}/{id}", procs(&sb)), None);
    assert_eq!(status, 204);
    let (_, ps) = server.exec(&sb, "ps -o args | grep -c '^sleep 4242' || true");
    assert_eq!(ps.trim(), "0", "the setsid sleeper survived DELETE");
    let (status, _) = server.request("GET", &format!("{}/{id}", procs(&sb)), None);
    assert_eq!(status, 404);
    let (status, _) = server.request("DELETE", &format!("{}/{id}", procs(&sb)), None);
    assert_eq!(status, 404);
}

#[test]
fn truncation_limits_hostile_input_and_lost() {
    let server = Server::start_with(&[
        ("AGENT_SANDBOX_PROCESS_OUTPUT_BYTES", "65536"),
        ("AGENT_SANDBOX_MAX_PROCESSES", "3"),
    ]);
    let sb = sandbox(&server);

    // Only the last 64 KiB are kept; an older offset is reported once, then output resumes.
    let p = start(
        &server,
        &sb,
        json!({"command": "i=0; while [ $i -lt 3000 ]; do echo 0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ; i=$((i+1)); done"}),
    );
    let id = p["id"].as_str().unwrap().to_string();
    let (_, last) = follow_to_end(&server, &sb, &id);
    assert_eq!(last["exitCode"], 0);
    let total = get(&server, &sb, &id)["stdoutBytes"].as_u64().unwrap();
    assert_eq!(total, 3000 * 125);
    let ev = events(&server, &sb, &id, "stdoutFrom=10&encoding=base64");
    assert_eq!(
        ev[0],
        json!({"type": "truncated", "stream": "stdout", "requested": 10, "retainedFrom": total - 65536})
    );
    assert_eq!(ev.iter().filter(|e| e["type"] == "truncated").count(), 1);
    assert_eq!(bytes_of(&ev[1..], "stdout", total - 65536).len(), 65536);

    // At most 3 running.
    for _ in 0..3 {
        start(&server, &sb, json!({"argv": ["sleep", "300"]}));
    }
    let (status, body) = server.request("POST", &procs(&sb), Some(&json!({"argv": ["true"]})));
    assert_eq!(status, 429, "{body}");

    // Hostile input is refused naming the field.
    let bad = [
        (json!({"argv": ["ls", 3]}), "argv[1]"),
        (json!({"command": "x", "tty": "yes"}), "tty"),
        (json!({"command": "x", "cols": 0}), "cols"),
        (json!({"command": "x", "nonsense": 1}), "nonsense"),
        (json!({"argv": []}), "argv"),
        (json!({}), "command"),
        (json!({"command": "x", "env": {"A=B": "c"}}), "env"),
    ];
    for (body, field) in bad {
        let (status, resp) = server.request("POST", &procs(&sb), Some(&body));
        assert_eq!(status, 400, "{body}: {resp}");
        assert!(resp.to_string().contains(field), "{body}: {resp}");
    }
    let (status, resp) = server.request_raw(
        "POST",
        &procs(&sb),
        Some("{\"argv\": [".into()),
        "application/json",
    );
    assert_eq!(status, 400, "{resp}");
    let huge = "a".repeat(2 << 20);
    let (status, resp) =
        server.request("POST", &procs(&sb), Some(&json!({"argv": ["echo", huge]})));
    assert!(status == 413 || status == 400, "{status} {resp}");
    let (status, resp) = server.request(
        "POST",
        &format!("{}/{id}/signal", procs(&sb)),
        Some(&json!({"signal": "NOPE"})),
    );
    assert_eq!(status, 400);
    assert!(resp.to_string().contains("signal"));
    let (status, _) = server.request(
        "GET",
        &format!("{}/{id}/output?follow=maybe", procs(&sb)),
        None,
    );
    assert_eq!(status, 400);
    let (status, _) = server.request("GET", &format!("{}/p_0000000000000000", procs(&sb)), None);
    assert_eq!(status, 404);
    let (status, _) = server.request("GET", &format!("{API}/sandboxes/nope/processes"), None);
    assert_eq!(status, 404);

    // The container removed under running processes: they turn Lost, without hanging.
    let (_, list) = server.request("GET", &procs(&sb), None);
    let running: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "Running")
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(running.len(), 3, "{list}");
    assert!(docker_status(&["rm", "-f", &format!("agent-sandbox-{sb}")]));
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let asked = Instant::now();
        let (status, p) = server.request("GET", &format!("{}/{}", procs(&sb), running[0]), None);
        assert!(asked.elapsed() < Duration::from_secs(30), "a GET hung");
        if status == 200 && p["state"] == "Lost" {
            assert!(p["message"].as_str().unwrap().contains("container"), "{p}");
            break;
        }
        assert!(Instant::now() < deadline, "never Lost: {status} {p}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // Once the sandbox runs again (a new container), the list still shows them Lost.
    server.wait_for(
        "sandboxes",
        &sb,
        "running again",
        Duration::from_secs(90),
        |r| r.is_some_and(|r| r["status"]["phase"] == "Running"),
    );
    let (status, list) = server.request("GET", &procs(&sb), None);
    assert_eq!(status, 200, "{list}");
    let lost = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["state"] == "Lost")
        .count();
    assert_eq!(lost, 3, "{list}");
}

/// A WebSocket in Kubernetes' channel framing, to `path` on the server.
fn websocket(
    server: &Server,
    path: &str,
) -> tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>> {
    use tungstenite::client::IntoClientRequest;
    let url = format!("{}{path}", server.url.replace("http://", "ws://"));
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "Authorization",
        format!("Bearer {}", server.key).parse().unwrap(),
    );
    req.headers_mut().insert(
        "Sec-WebSocket-Protocol",
        "v5.channel.k8s.io".parse().unwrap(),
    );
    let (socket, response) = tungstenite::connect(req).expect("websocket");
    assert_eq!(
        response.headers()["sec-websocket-protocol"],
        "v5.channel.k8s.io"
    );
    if let tungstenite::stream::MaybeTlsStream::Plain(s) = socket.get_ref() {
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    }
    socket
}

/// A binary message on channel `ch`.
fn framed(ch: u8, data: &[u8]) -> tungstenite::Message {
    let mut m = vec![ch];
    m.extend_from_slice(data);
    tungstenite::Message::Binary(m.into())
}

/// Reads messages until the status channel speaks: (stdout, stderr, status).
fn until_status(
    ws: &mut tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    want_stdout: Option<&str>,
) -> (Vec<u8>, Vec<u8>, Option<Value>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    loop {
        let msg = match ws.read() {
            Ok(m) => m,
            Err(e) => {
                eprintln!("websocket read: {e}");
                return (out, err, None);
            }
        };
        let tungstenite::Message::Binary(b) = msg else {
            if msg.is_close() {
                return (out, err, None);
            }
            continue;
        };
        match b[0] {
            1 => out.extend_from_slice(&b[1..]),
            2 => err.extend_from_slice(&b[1..]),
            3 => return (out, err, Some(serde_json::from_slice(&b[1..]).unwrap())),
            other => panic!("channel {other}"),
        }
        if let Some(w) = want_stdout {
            if String::from_utf8_lossy(&out).contains(w) {
                return (out, err, None);
            }
        }
    }
}

#[test]
fn websocket_exec_and_attach_speak_kubernetes_channels() {
    let server = Server::start();
    let sb = sandbox(&server);

    // exec: start and attach in one; stdin round-trips through cat; closing stdin ends it.
    let mut ws = websocket(
        &server,
        &format!("{API}/sandboxes/{sb}/exec?command=cat&command=-&stdin=true"),
    );
    ws.send(framed(0, b"ping\n")).unwrap();
    let (out, _, status) = until_status(&mut ws, Some("ping\n"));
    assert_eq!(out, b"ping\n", "{status:?} {}", server.log());
    assert!(status.is_none());
    ws.send(framed(255, &[0])).unwrap();
    let (_, _, status) = until_status(&mut ws, None);
    let status = status.expect("a status message");
    assert_eq!(status["status"], "Success", "{status}");

    // attach to a terminal; a resize reaches stty; the exit code comes back in the status.
    let p = start(
        &server,
        &sb,
        json!({"argv": ["sh"], "tty": true, "stdin": true}),
    );
    let id = p["id"].as_str().unwrap();
    let mut a = websocket(&server, &format!("{}/{id}/attach", procs(&sb)));
    let mut b = websocket(&server, &format!("{}/{id}/attach", procs(&sb)));
    a.send(framed(4, br#"{"Width": 120, "Height": 50}"#))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    a.send(framed(0, b"stty size; exit 3\r")).unwrap();
    let (out_a, _, status_a) = until_status(&mut a, None);
    let (out_b, _, status_b) = until_status(&mut b, None);
    for (out, status) in [(out_a, status_a), (out_b, status_b)] {
        let out = String::from_utf8_lossy(&out).to_string();
        assert!(out.contains("50 120"), "{out:?}");
        let status = status.expect("a status message");
        assert_eq!(status["exitCode"], 3, "{status}");
        assert_eq!(status["reason"], "NonZeroExitCode");
    }
}

/// The command line's `run --detach`, `ps`, `logs` and `kill`.
fn cli(server: &Server, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(args)
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn the_command_line_runs_lists_reads_and_kills() {
    let server = Server::start();
    let sb = sandbox(&server);
    let (code, id, err) = cli(
        &server,
        &[
            "run",
            &sb,
            "--detach",
            "--",
            "sh",
            "-c",
            "printf 'a\\377b'; exit 4",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let id = id.trim().to_string();
    assert!(id.starts_with("p_"), "{id:?}");
    let (code, _, _) = cli(&server, &["logs", &sb, &id, "-f"]);
    assert_eq!(code, 4, "the process's exit status becomes ours");
    let raw = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(["logs", &sb, &id, "--from", "1"])
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .output()
        .unwrap();
    assert_eq!(raw.stdout, b"\xffb", "logs print the bytes as they are");
    let (_, sleeper, _) = cli(&server, &["run", &sb, "-d", "--", "sleep", "300"]);
    let sleeper = sleeper.trim().to_string();
    let (_, table, _) = cli(&server, &["ps", &sb]);
    assert!(
        table.contains(&id) && table.contains("Exited(4)"),
        "{table}"
    );
    assert!(
        table.contains(&sleeper) && table.contains("Running"),
        "{table}"
    );
    let (code, _, err) = cli(&server, &["kill", &sb, &sleeper]);
    assert_eq!(code, 0, "{err}");
    let (_, table, _) = cli(&server, &["ps", &sb]);
    assert!(!table.contains(&sleeper), "{table}");

    // `--signal` sends that signal (any case) and leaves the process to decide what it does.
    let (code, trapper, err) = cli(
        &server,
        &[
            "run",
            &sb,
            "-d",
            "--",
            "sh",
            "-c",
            "trap 'echo got-usr1' USR1; echo ready; while true; do sleep 0.1; done",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let trapper = trapper.trim().to_string();
    wait_output(&server, &sb, &trapper, "ready");
    let (code, _, err) = cli(&server, &["kill", &sb, &trapper, "--signal", "usr1"]);
    assert_eq!(code, 0, "{err}");
    wait_output(&server, &sb, &trapper, "got-usr1");
    assert_eq!(get(&server, &sb, &trapper)["state"], "Running");
    let (code, _, err) = cli(&server, &["kill", &sb, &trapper, "--signal", "BOGUS"]);
    assert_ne!(code, 0, "an unknown signal is refused");
    assert!(err.contains("signal"), "{err}");
    let (code, _, err) = cli(&server, &["kill", &sb, &trapper, "-s", "TERM"]);
    assert_eq!(code, 0, "{err}");
    let (_, last) = follow_to_end(&server, &sb, &trapper);
    assert_eq!(last["signal"], "TERM", "{last}");
    let (_, table, _) = cli(&server, &["ps", &sb]);
    assert!(
        table.contains(&trapper),
        "a signalled process is kept, not forgotten: {table}"
    );
}

#[test]
fn a_sandbox_keeps_64_exited_processes_forgetting_the_oldest_exited_first() {
    let server = Server::start();
    let sb = sandbox(&server);
    // Started first, exited last.
    let long = start(&server, &sb, json!({"command": "sleep 300"}));
    let long = long["id"].as_str().unwrap().to_string();
    let mut exited = Vec::new();
    for n in 0..65 {
        let p = start(
            &server,
            &sb,
            json!({"command": format!("exit {}", n % 100)}),
        );
        let id = p["id"].as_str().unwrap().to_string();
        let (_, last) = follow_to_end(&server, &sb, &id);
        assert_eq!(last["exitCode"], n % 100, "{last}");
        exited.push(id);
    }
    let listed = |server: &Server| -> Vec<String> {
        let (status, list) = server.request("GET", &procs(&sb), None);
        assert_eq!(status, 200, "{list}");
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_string())
            .collect()
    };
    // 65 exited: the first to exit is forgotten, the running one is kept.
    let ids = listed(&server);
    assert_eq!(ids.len(), 65, "{ids:?}");
    assert!(ids.contains(&long));
    assert!(!ids.contains(&exited[0]), "the oldest exited is forgotten");
    let (status, _) = server.request("GET", &format!("{}/{}", procs(&sb), exited[0]), None);
    assert_eq!(status, 404);
    for id in &exited[1..] {
        assert!(ids.contains(id), "{id} kept");
    }
    // The long one exits now: it is the newest exited, so the oldest exited goes, not it.
    let (status, body) = server.request(
        "POST",
        &format!("{}/{long}/signal", procs(&sb)),
        Some(&json!({"signal": "TERM"})),
    );
    assert!(status < 300, "{body}");
    follow_to_end(&server, &sb, &long);
    let ids = listed(&server);
    assert_eq!(ids.len(), 64, "{ids:?}");
    assert!(ids.contains(&long), "the newest exited is kept");
    assert!(!ids.contains(&exited[1]), "the oldest exited is forgotten");
    assert_eq!(get(&server, &sb, &exited[2])["state"], "Exited");
}
