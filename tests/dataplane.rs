//! The data plane against the real daemon, through the `/v1` API of a real server: exec (buffered
//! and streamed), timeouts that kill whole process trees, client disconnects, concurrency, output
//! caps, UTF-8 in streams, and file reads, writes and listings confined to `/workspace`.
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc` runs the same checks under gVisor.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const MAX_OUTPUT: usize = 1_000_000;
const MAX_FILE: usize = 8_000_000;

fn server() -> Server {
    Server::start_with(&[
        ("AGENT_SANDBOX_MAX_EXEC_OUTPUT_BYTES", "1000000"),
        ("AGENT_SANDBOX_MAX_FILE_BYTES", "8000000"),
    ])
}

/// Creates a sandbox through `/v1` and returns its ID (also its container's name suffix).
fn sandbox(server: &Server, env: Value) -> String {
    let mut body = json!({ "env": env });
    if gvisor() {
        // gVisor's ptrace platform spends host threads (counted by the pids limit) per guest
        // task: 25 concurrent commands need several hundred.
        body["pids_limit"] = json!(4096);
    }
    let (status, body) = server.request("POST", "/v1/sandboxes", Some(&body));
    assert_eq!(status, 201, "{body}\n{}", server.log());
    body["id"].as_str().unwrap().to_string()
}

fn exec(server: &Server, id: &str, body: Value) -> Value {
    let (status, resp) = server.request("POST", &format!("/v1/sandboxes/{id}/exec"), Some(&body));
    assert_eq!(status, 200, "{resp}");
    resp
}

fn sh(server: &Server, id: &str, script: &str) -> Value {
    exec(server, id, json!({ "command": script }))
}

fn put_file(server: &Server, id: &str, path: &str, mode: &str, body: &[u8]) -> (u16, Value) {
    let (status, bytes) = http_bytes(
        server,
        "PUT",
        &format!("/v1/sandboxes/{id}/files?path={path}&mode={mode}"),
        body,
    );
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

fn get_file(server: &Server, id: &str, path: &str) -> (u16, Vec<u8>) {
    http_bytes(
        server,
        "GET",
        &format!("/v1/sandboxes/{id}/files?path={path}"),
        b"",
    )
}

/// Opens a streamed exec and returns the reader positioned at the first NDJSON line.
fn open_stream(server: &Server, id: &str, body: &Value) -> BufReader<TcpStream> {
    let host = server.url.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let body = body.to_string();
    let head = format!(
        "POST /v1/sandboxes/{id}/exec/stream HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        server.key,
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line == "\r\n" {
            return reader;
        }
        if line.starts_with("HTTP/1.1") && !line.contains(" 200 ") {
            let mut rest = String::new();
            let _ = reader.read_to_string(&mut rest);
            panic!("{line}{rest}");
        }
    }
}

/// Reads the next NDJSON event of a chunked stream (one event per chunk or several).
fn next_event(reader: &mut BufReader<TcpStream>) -> Option<Value> {
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let t = line.trim();
        if t.starts_with('{') {
            return serde_json::from_str(t).ok();
        }
        if t == "0" {
            return None;
        }
    }
}

fn stream_all(server: &Server, id: &str, body: &Value) -> Vec<Value> {
    let mut reader = open_stream(server, id, body);
    let mut events = Vec::new();
    while let Some(e) = next_event(&mut reader) {
        events.push(e);
    }
    events
}

/// Processes in the sandbox whose command line contains `pattern` (seen from inside, as root).
fn processes(id: &str, pattern: &str) -> Vec<String> {
    let out = docker(&[
        "exec",
        &format!("agent-sandbox-{id}"),
        "ps",
        "-o",
        "pid,args",
    ]);
    out.lines()
        .filter(|l| l.contains(pattern) && !l.contains("ps -o"))
        .map(String::from)
        .collect()
}

fn wait_no_processes(id: &str, pattern: &str, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let left = processes(id, pattern);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still running: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn exec_reports_output_exit_codes_env_and_workdir() {
    let server = server();
    let id = sandbox(&server, json!({"FROM_SANDBOX": "s", "BOTH": "sandbox"}));

    let r = sh(&server, &id, "echo out; echo err >&2; exit 3");
    assert_eq!(r["stdout"], "out\n");
    assert_eq!(r["stderr"], "err\n");
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["timed_out"], false);
    assert_eq!(r["truncated"], false);
    let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 6, "{r}");

    let r = exec(
        &server,
        &id,
        json!({"command": "echo $FROM_SANDBOX $BOTH $HOME $(id -u):$(id -g) $(pwd)", "env": {"BOTH": "request"}}),
    );
    assert_eq!(r["stdout"], "s request /workspace 1000:1000 /workspace\n");

    sh(&server, &id, "mkdir -p /workspace/sub/dir");
    let r = exec(
        &server,
        &id,
        json!({"command": ["pwd"], "workdir": "sub/dir"}),
    );
    assert_eq!(r["stdout"], "/workspace/sub/dir\n");
    assert_eq!(r["exit_code"], 0);

    let r = exec(
        &server,
        &id,
        json!({"command": "pwd", "workdir": "/workspace/missing"}),
    );
    assert_eq!(r["exit_code"], 126, "{r}");

    let r = exec(&server, &id, json!({"command": ["no-such-program"]}));
    assert_eq!(r["exit_code"], 127, "{r}");
    let r = sh(&server, &id, "kill -9 $$");
    assert_eq!(r["exit_code"], 137);
    assert_eq!(r["timed_out"], false);

    // Stdin is empty, and invalid UTF-8 is replaced.
    let r = sh(&server, &id, "cat; printf 'a\\377b'");
    assert_eq!(r["stdout"], "a\u{fffd}b");

    // Background processes outlive a command that finished normally (like docker exec).
    let r = sh(&server, &id, "sleep 997 >/dev/null 2>&1 & echo started");
    assert_eq!(r["stdout"], "started\n");
    assert_eq!(processes(&id, "sleep 997").len(), 1);
}

#[test]
fn timeouts_and_disconnects_kill_the_whole_tree() {
    let server = server();
    let id = sandbox(&server, json!({}));

    let script = "sleep 1000 & setsid sleep 1001 & (setsid sh -c \"sleep 1002 &\") ; sleep 1003";
    let started = Instant::now();
    let r = exec(
        &server,
        &id,
        json!({"command": script, "timeout_seconds": 1}),
    );
    let took = started.elapsed();
    assert_eq!(r["timed_out"], true, "{r}");
    assert_eq!(r["exit_code"], 137);
    // About a second past the deadline, with slack for a loaded machine.
    assert!(took < Duration::from_millis(3500), "took {took:?}");
    assert!(took >= Duration::from_millis(950), "took {took:?}");
    wait_no_processes(&id, "sleep 10", Duration::from_secs(3));

    // The stream reports the timeout in its one exit event.
    let events = stream_all(
        &server,
        &id,
        &json!({"command": "echo hi; sleep 1004", "timeout_seconds": 0.5}),
    );
    assert_eq!(events[0], json!({"type": "stdout", "data": "hi\n"}));
    let last = events.last().unwrap();
    assert_eq!(last["type"], "exit");
    assert_eq!(last["timed_out"], true);
    assert_eq!(last["exit_code"], 137);
    assert_eq!(events.iter().filter(|e| e["type"] == "exit").count(), 1);
    wait_no_processes(&id, "sleep 1004", Duration::from_secs(3));

    // A client that goes away mid-stream takes its command with it.
    let mut reader = open_stream(
        &server,
        &id,
        &json!({"command": "echo first; sleep 1005 & setsid sleep 1006 & sleep 1007"}),
    );
    let first = next_event(&mut reader).unwrap();
    assert_eq!(first["data"], "first\n");
    assert!(!processes(&id, "sleep 100").is_empty());
    drop(reader);
    wait_no_processes(&id, "sleep 100", Duration::from_secs(5));
}

/// Jobs killed just before their shell exits are still exiting when the shell's command ends:
/// none of that may take the sandbox down. Under gVisor it did, about one command in five, while
/// the command's shepherd was a child subreaper as it exited (gVisor then took the exiting job for
/// the init of the sandbox's PID namespace and killed every process); the shepherd now gives that
/// role up before it exits. Each job holds some memory, so that its exit takes a while.
#[test]
fn jobs_killed_as_their_shell_exits_leave_the_sandbox_running() {
    let server = server();
    let id = sandbox(&server, json!({}));
    sh(&server, &id, "true");
    let started = started_at(&id);
    let script = "for i in 1 2 3 4 5 6; do \
        awk 'BEGIN { s = \"x\"; while (length(s) < 20000000) s = s s; while (1) {} }' \
        >/dev/null 2>&1 & done; sleep 1; echo done; kill $(jobs -p)";
    for round in 0..15 {
        let (status, answer) = server.request(
            "POST",
            &format!("/v1/sandboxes/{id}/exec"),
            Some(&json!({"command": script, "timeout_seconds": 30})),
        );
        assert_eq!(status, 200, "round {round}: {answer}\n{}", server.log());
        assert_eq!(answer["stdout"], "done\n", "round {round}: {answer}");
    }
    assert_eq!(started_at(&id), started, "the container restarted");
    let now = container(&id).expect("container")["State"].clone();
    assert_eq!(now["Running"], true, "{now}");
}

#[test]
fn concurrent_execs_and_streams_do_not_wait_for_each_other() {
    let server = server();
    let id = sandbox(&server, json!({}));
    sh(&server, &id, "true");
    let started = Instant::now();
    std::thread::scope(|s| {
        let mut handles = Vec::new();
        for i in 0..20 {
            let (server, id) = (&server, &id);
            handles.push(s.spawn(move || {
                let r = sh(server, id, &format!("sleep 1; echo {i}"));
                assert_eq!(r["stdout"], format!("{i}\n"), "{r}");
            }));
        }
        for i in 0..5 {
            let (server, id) = (&server, &id);
            handles.push(s.spawn(move || {
                let events = stream_all(
                    server,
                    id,
                    &json!({"command": format!("echo a{i}; sleep 1; echo b{i}")}),
                );
                let out: String = events.iter().filter_map(|e| e["data"].as_str()).collect();
                assert_eq!(out, format!("a{i}\nb{i}\n"));
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
    });
    let took = started.elapsed();
    // One after another they would take 25 s; together, about one (slack for a loaded machine).
    assert!(
        took < Duration::from_secs(12),
        "25 one-second commands took {took:?}"
    );
}

/// Resident memory of the server process, in KiB, found by its data directory.
fn server_rss_kib(server: &Server) -> Option<u64> {
    let needle = format!("AGENT_SANDBOX_DATA_DIR={}", server.data_dir.display());
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(env) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()) {
            let status = std::fs::read_to_string(entry.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
            return line.split_whitespace().nth(1)?.parse().ok();
        }
    }
    None
}

#[test]
fn output_is_capped_and_streams_keep_characters_whole() {
    let server = server();
    let id = sandbox(&server, json!({}));

    let r = sh(
        &server,
        &id,
        &format!("head -c {MAX_OUTPUT} /dev/zero | tr '\\0' a"),
    );
    assert_eq!(r["truncated"], false);
    assert_eq!(r["stdout"].as_str().unwrap().len(), MAX_OUTPUT);

    let before = server_rss_kib(&server);
    let r = sh(
        &server,
        &id,
        "head -c 50000000 /dev/zero | tr '\\0' a; echo done >&2",
    );
    assert_eq!(r["truncated"], true);
    assert_eq!(
        r["exit_code"], 0,
        "the command runs to completion past the cap"
    );
    let total = r["stdout"].as_str().unwrap().len() + r["stderr"].as_str().unwrap().len();
    assert_eq!(total, MAX_OUTPUT);
    if let (Some(before), Some(after)) = (before, server_rss_kib(&server)) {
        assert!(
            after < before + 64 * 1024,
            "server grew from {before} KiB to {after} KiB"
        );
    }

    let events = stream_all(
        &server,
        &id,
        &json!({"command": "printf '\\303'; sleep 0.3; printf '\\251'; printf '\\342\\202' >&2; sleep 0.2; printf '\\254' >&2"}),
    );
    let out: String = events
        .iter()
        .filter(|e| e["type"] == "stdout")
        .filter_map(|e| e["data"].as_str())
        .collect();
    let err: String = events
        .iter()
        .filter(|e| e["type"] == "stderr")
        .filter_map(|e| e["data"].as_str())
        .collect();
    assert_eq!(out, "é");
    assert_eq!(err, "€");
    assert_eq!(events.last().unwrap()["exit_code"], 0);
}

#[test]
fn files_round_trip_atomically_with_modes_and_owner() {
    let server = server();
    let id = sandbox(&server, json!({}));

    let data: Vec<u8> = (0..300_000).map(|_| rand::random::<u8>()).collect();
    let (status, info) = put_file(&server, &id, "deep/er/blob.bin", "640", &data);
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["name"], "blob.bin");
    assert_eq!(info["path"], "/workspace/deep/er/blob.bin");
    assert_eq!(info["type"], "file");
    assert_eq!(info["size"], data.len());
    let (status, back) = get_file(&server, &id, "/workspace/deep/er/blob.bin");
    assert_eq!(status, 200);
    assert!(back == data, "binary round trip differs");
    let r = sh(
        &server,
        &id,
        "stat -c '%a %u:%g' deep/er/blob.bin deep/er deep",
    );
    assert_eq!(r["stdout"], "640 1000:1000\n755 1000:1000\n755 1000:1000\n");

    // Reads follow links and may name any path; errors map like the reference.
    sh(&server, &id, "ln -s deep/er/blob.bin link; mkfifo fifo");
    assert!(get_file(&server, &id, "link").1 == data);
    let (status, passwd) = get_file(&server, &id, "/etc/passwd");
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&passwd).contains("root:"));
    assert_eq!(get_file(&server, &id, "nope").0, 404);
    assert_eq!(get_file(&server, &id, "deep").0, 400);
    assert_eq!(get_file(&server, &id, "fifo").0, 400);
    let (status, _) = put_file(&server, &id, "big", "644", &vec![b'x'; MAX_FILE]);
    assert_eq!(status, 200);
    sh(&server, &id, "echo >> big");
    assert_eq!(get_file(&server, &id, "big").0, 413);
    assert_eq!(
        put_file(&server, &id, "bigger", "644", &vec![b'x'; MAX_FILE + 1]).0,
        413
    );

    // Listing: sorted by name, with types, hidden entries included.
    sh(
        &server,
        &id,
        "mkdir -p l/sub; echo hi > l/b.txt; echo > l/.hidden; ln -s b.txt l/a-link",
    );
    let (status, list) = server.request(
        "GET",
        &format!("/v1/sandboxes/{id}/files/list?path=l"),
        None,
    );
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["path"], "/workspace/l");
    let got: Vec<(String, String)> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["name"].as_str().unwrap().into(),
                e["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    let want = [
        (".hidden", "file"),
        ("a-link", "symlink"),
        ("b.txt", "file"),
        ("sub", "directory"),
    ];
    assert_eq!(got, want.map(|(a, b)| (a.to_string(), b.to_string())));
    let b = &list["entries"][2];
    assert_eq!(b["path"], "/workspace/l/b.txt");
    assert_eq!(b["size"], 3);
    assert!(b["modified_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        server
            .request(
                "GET",
                &format!("/v1/sandboxes/{id}/files/list?path=nope"),
                None
            )
            .0,
        404
    );
    assert_eq!(
        server
            .request(
                "GET",
                &format!("/v1/sandboxes/{id}/files/list?path=l/b.txt"),
                None
            )
            .0,
        400
    );

    // A reader never sees a partial file while a 5 MB file is rewritten again and again.
    let a = vec![b'a'; 5_000_000];
    let b = vec![b'b'; 5_000_000];
    assert_eq!(put_file(&server, &id, "atomic", "644", &a).0, 200);
    let sums = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            sh(&server, &id, "for i in $(seq 60); do md5sum < atomic; done")["stdout"]
                .as_str()
                .unwrap()
                .to_string()
        });
        for i in 0..8 {
            let body = if i % 2 == 0 { &b } else { &a };
            assert_eq!(put_file(&server, &id, "atomic", "644", body).0, 200);
        }
        reader.join().unwrap()
    });
    let r = sh(&server, &id, "head -c 5000000 /dev/zero | tr '\\0' a | md5sum; head -c 5000000 /dev/zero | tr '\\0' b | md5sum");
    let allowed: Vec<&str> = r["stdout"].as_str().unwrap().lines().collect();
    for sum in sums.lines() {
        assert!(allowed.contains(&sum), "a reader saw a partial file: {sum}");
    }
    let r = sh(&server, &id, "ls -a | grep -c tmp || true");
    assert_eq!(r["stdout"], "0\n", "no temporary files are left");
}

#[test]
fn writes_never_leave_the_workspace() {
    let server = server();
    let id = sandbox(&server, json!({}));
    sh(&server, &id, "ln -s / root; ln -s /etc etc; ln -s /tmp tmp; ln -s .. up; mkdir real; ln -s real inside; ln -s /workspace/real abs");

    for path in [
        "../etc/x",
        "/etc/x",
        "/tmp/x",
        "/workspace",
        "root/tmp/x",
        "etc/x",
        "tmp/x",
        "up/tmp/x",
        "tmp/../../tmp/x",
    ] {
        let (status, body) = put_file(&server, &id, path, "644", b"escape");
        assert_eq!(status, 400, "{path}: {body}");
    }
    let r = sh(
        &server,
        &id,
        "ls /tmp /etc | grep -x x; ls /workspace/x 2>&1 >/dev/null | grep -c 'No such'",
    );
    assert_eq!(r["stdout"], "1\n", "something was written outside: {r}");

    // Links that stay inside are followed; a link at the target is replaced, not followed.
    assert_eq!(put_file(&server, &id, "inside/a", "644", b"1").0, 200);
    assert_eq!(put_file(&server, &id, "abs/b/c", "644", b"2").0, 200);
    assert_eq!(sh(&server, &id, "cat real/a real/b/c")["stdout"], "12");
    assert_eq!(put_file(&server, &id, "tmp", "644", b"now a file").0, 200);
    assert_eq!(
        sh(&server, &id, "cat tmp; ls /tmp | wc -l")["stdout"],
        "now a file0\n"
    );
    assert_eq!(
        put_file(&server, &id, "real", "644", b"x").0,
        400,
        "a directory is not replaced"
    );

    // A directory flipped to a link to /tmp and back while writes go through it.
    let flipper = std::thread::scope(|s| {
        let flip = s.spawn(|| {
            sh(&server, &id, "i=0; while [ $i -lt 3000 ]; do rm -rf d; mkdir d; rm -rf d; ln -s /tmp d; i=$((i+1)); done; echo flipped")
        });
        let mut codes = Vec::new();
        for _ in 0..40 {
            let (code, body) = put_file(&server, &id, "d/x", "644", b"race");
            if code != 200 && code != 400 {
                eprintln!("{code}: {body}");
            }
            codes.push(code);
        }
        let _ = flip.join();
        codes
    });
    assert!(
        flipper.iter().all(|c| *c == 200 || *c == 400),
        "{flipper:?}"
    );
    let r = sh(&server, &id, "ls /tmp");
    assert_eq!(r["stdout"], "", "a swapped link redirected a write");
}

/// PIDs of the helper processes serving channels in the sandbox.
fn helper_pids(id: &str) -> Vec<String> {
    processes(id, "agent-sandbox-helper serve")
        .iter()
        .filter_map(|l| l.split_whitespace().next().map(String::from))
        .collect()
}

#[test]
fn streams_reuse_channels_and_survive_a_killed_helper() {
    let server = server();
    let id = sandbox(&server, json!({}));
    sh(&server, &id, "true");

    // Back-to-back streams reuse finished streams' channels: a handful of helpers, not one each.
    for i in 0..6 {
        let events = stream_all(&server, &id, &json!({"command": format!("echo s{i}")}));
        let out: String = events.iter().filter_map(|e| e["data"].as_str()).collect();
        assert_eq!(out, format!("s{i}\n"), "{events:?}");
        assert_eq!(events.last().unwrap()["type"], "exit", "{events:?}");
    }
    let helpers = helper_pids(&id);
    // The shared channel plus at most two idle spares.
    assert!(helpers.len() <= 3, "helpers: {helpers:?}");

    // A stream whose client does not read holds up neither buffered execs nor writes.
    let mut slow = open_stream(
        &server,
        &id,
        &json!({"command": "head -c 50000000 /dev/zero | tr '\\0' x; echo done"}),
    );
    assert!(next_event(&mut slow).is_some());
    let started = Instant::now();
    for i in 0..3 {
        assert_eq!(
            sh(&server, &id, &format!("echo b{i}"))["stdout"],
            format!("b{i}\n")
        );
        let body = format!("w{i}");
        let (status, info) = put_file(&server, &id, "w.txt", "600", body.as_bytes());
        assert_eq!(status, 200, "{info}");
        assert_eq!(get_file(&server, &id, "w.txt").1, body.as_bytes());
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a stalled stream slowed other commands: {:?}",
        started.elapsed()
    );
    drop(slow);

    // Every helper killed from inside the sandbox: streams, execs and writes still work (the
    // dead channels are noticed and replaced).
    let pids = helper_pids(&id);
    assert!(!pids.is_empty());
    let mut args = vec![
        "exec".to_string(),
        format!("agent-sandbox-{id}"),
        "kill".into(),
        "-9".into(),
    ];
    args.extend(pids);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let _ = docker_status(&args);
    // At once: a spare whose helper died may not be known dead yet; the stream must not care.
    let events = stream_all(&server, &id, &json!({"command": "echo again"}));
    let out: String = events.iter().filter_map(|e| e["data"].as_str()).collect();
    assert_eq!(out, "again\n", "{events:?}");
    let (status, info) = put_file(&server, &id, "after.txt", "644", b"after kill");
    assert_eq!(status, 200, "{info}");
    assert_eq!(get_file(&server, &id, "after.txt").1, b"after kill");
    assert_eq!(sh(&server, &id, "stat -c %a after.txt")["stdout"], "644\n");
}
