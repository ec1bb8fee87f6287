//! Hostile input against the real server binary: YAML bombs, deep nesting, duplicate keys, invalid
//! UTF-8 and huge documents, through the API and as files in a watched folder; files written in
//! pieces, swapped in by rename or linked from outside; output floods; slow clients; and the
//! authentication matrix, with keys kept out of the log. Each case must be refused quickly, apply
//! nothing, and leave the server's memory bounded and its other clients answered.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// The server's resident memory, from /proc (found by its data directory in the environment).
fn server_rss_mb(server: &Server) -> u64 {
    let needle = format!("AGENT_SANDBOX_DATA_DIR={}", server.data_dir.display());
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else {
            continue;
        };
        let found = environ
            .split(|b| *b == 0)
            .any(|var| var == needle.as_bytes());
        if !found {
            continue;
        }
        let status = std::fs::read_to_string(entry.path().join("status")).unwrap_or_default();
        if let Some(kb) = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        {
            return kb / 1024;
        }
    }
    panic!("server process not found");
}

/// One raw request with arbitrary body bytes; (status, body, elapsed). Status 0: the server
/// closed the connection without an answer.
fn raw(
    server: &Server,
    method: &str,
    path: &str,
    content_type: &str,
    body: &[u8],
) -> (u16, String, Duration) {
    let started = Instant::now();
    let mut stream = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n",
        server.key,
        body.len()
    );
    let _ = stream.write_all(head.as_bytes());
    // The server may answer (413) and close before the whole body is sent.
    let _ = stream.write_all(body);
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body, started.elapsed())
}

fn billion_laughs() -> String {
    let mut s = String::from("apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: laughs\n  annotations:\n");
    s.push_str(
        "    a0: &a0 [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..10 {
        let p = i - 1;
        s.push_str(&format!(
            "    a{i}: &a{i} [*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p},*a{p}]\n"
        ));
    }
    s.push_str("spec:\n  image: x\n  env: *a9\n");
    s
}

fn alias_bomb() -> String {
    // One anchor referenced many times from many places: quadratic rather than exponential.
    let mut s = String::from("apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: aliases\n  labels: &l {");
    for i in 0..1000 {
        s.push_str(&format!("k{i}: v,"));
    }
    s.push_str("}\nspec:\n  image: x\n  env:\n");
    for i in 0..5000 {
        s.push_str(&format!("    e{i}: *l\n"));
    }
    s
}

/// The hostile documents: (label, bytes, statuses the API may answer).
fn hostile_documents() -> Vec<(&'static str, Vec<u8>, &'static [u16])> {
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let deep_map = "a:\n".to_string()
        + &(1..1_000)
            .map(|i| format!("{}b:\n", " ".repeat(i)))
            .collect::<String>();
    let mut invalid_utf8 = sandbox_manifest("utf8", "  env:\n    X: \"").into_bytes();
    invalid_utf8.extend_from_slice(&[0xff, 0xfe, 0xc3, 0x28, b'"', b'\n']);
    let huge = format!(
        "{}  env:\n    BIG: \"{}\"\n",
        sandbox_manifest("huge", ""),
        "x".repeat(2 * 1024 * 1024)
    );
    vec![
        ("billion laughs", billion_laughs().into_bytes(), &[422]),
        ("alias bomb", alias_bomb().into_bytes(), &[422]),
        ("100,000-deep sequence", deep.into_bytes(), &[422]),
        ("deep mapping", deep_map.into_bytes(), &[422]),
        (
            "duplicate keys",
            "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: dup\n  name: dup2\nspec:\n  image: x\n  image: y\n"
                .as_bytes()
                .to_vec(),
            &[422],
        ),
        ("invalid UTF-8", invalid_utf8, &[422, 400]),
        ("over 1 MiB", huge.into_bytes(), &[413]),
    ]
}

#[test]
fn hostile_documents_through_the_api_are_refused_quickly() {
    let server = Server::start();
    let before = server_rss_mb(&server);
    for (label, bytes, allowed) in hostile_documents() {
        for ct in ["application/yaml", "application/json"] {
            let (status, body, took) =
                raw(&server, "POST", &format!("{API}/sandboxes"), ct, &bytes);
            assert!(
                allowed.contains(&status),
                "{label} as {ct}: {status} {body}"
            );
            // A bound against blow-ups (an expanded billion laughs never finishes), not a
            // speed check: a debug build on a busy machine takes seconds.
            assert!(
                took < Duration::from_secs(15),
                "{label} as {ct} took {took:?}"
            );
            let err: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
            assert!(
                err["error"]["code"].is_string(),
                "{label}: error shape: {body}"
            );
        }
        // The /v1 API takes JSON only; a hostile body is still a quick 4xx.
        let (status, body, took) =
            raw(&server, "POST", "/v1/sandboxes", "application/json", &bytes);
        assert!((400..500).contains(&status), "/v1 {label}: {status} {body}");
        assert!(took < Duration::from_secs(3), "/v1 {label} took {took:?}");
    }
    // Deep JSON and a huge JSON body to /v1.
    let deep_json = format!("{{\"env\":{}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    let (status, _, took) = raw(
        &server,
        "POST",
        "/v1/sandboxes",
        "application/json",
        deep_json.as_bytes(),
    );
    assert_eq!(status, 422);
    assert!(took < Duration::from_secs(3));
    let big = vec![b' '; 64 * 1024 * 1024];
    let (status, body, took) = raw(&server, "POST", "/v1/sandboxes", "application/json", &big);
    assert_eq!(status, 413, "{body}");
    assert!(took < Duration::from_secs(10), "64 MiB body took {took:?}");
    let (status, _, _) = raw(
        &server,
        "POST",
        &format!("{API}/sandboxes"),
        "application/yaml",
        &big,
    );
    assert_eq!(status, 413);

    let (_, list) = server.request("GET", &format!("{API}/sandboxes"), None);
    assert_eq!(list["items"], json!([]), "{list}");
    let after = server_rss_mb(&server);
    eprintln!("server RSS: {before} MB before, {after} MB after");
    assert!(after < 200, "server RSS grew to {after} MB");
}

fn errors(server: &Server) -> Vec<Value> {
    let (status, body) = server.request("GET", &format!("{API}/errors"), None);
    assert_eq!(status, 200, "{body}");
    body["errors"].as_array().cloned().unwrap_or_default()
}

fn error_for<'a>(errors: &'a [Value], file: &str) -> Option<&'a Value> {
    errors
        .iter()
        .find(|e| e["file"].as_str().is_some_and(|f| f.ends_with(file)))
}

#[test]
fn hostile_files_in_a_watched_folder_are_reported_and_apply_nothing() {
    let server = Server::start();
    // A good document beside the bad ones still applies.
    let good = unique("hostile-good");
    write_manifest(&server.watch_dir, "good.yaml", &sandbox_manifest(&good, ""));
    let docs = hostile_documents();
    for (i, (_, bytes, _)) in docs.iter().enumerate() {
        let path = server.watch_dir.join(format!("bad-{i}.yaml"));
        std::fs::write(&path, bytes).unwrap();
    }
    wait_until(
        "every hostile file is reported",
        Duration::from_secs(20),
        || {
            let errs = errors(&server);
            (0..docs.len()).all(|i| error_for(&errs, &format!("bad-{i}.yaml")).is_some())
        },
    );
    server.wait_running(&good);
    let errs = errors(&server);
    for (i, (label, _, _)) in docs.iter().enumerate() {
        let e = error_for(&errs, &format!("bad-{i}.yaml")).unwrap();
        assert!(!e["message"].as_str().unwrap().is_empty(), "{label}: {e}");
        assert!(
            e["message"].as_str().unwrap().len() < 4096,
            "{label}: message too long"
        );
    }
    let (_, list) = server.request("GET", &format!("{API}/sandboxes"), None);
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [good.as_str()], "only the good document applies");
    let rss = server_rss_mb(&server);
    eprintln!("server RSS after hostile files: {rss} MB");
    assert!(rss < 200, "server RSS {rss} MB");
}

#[test]
fn partial_writes_renames_and_outside_links() {
    let server = Server::start();
    let (partial, swapped, linked) = (unique("part"), unique("swap"), unique("link"));

    // Written in two pieces with a pause: the half must not apply as something else, and the
    // completed document applies.
    let full = sandbox_manifest(&partial, "  env:\n    STAGE: complete\n");
    let (head, _) = full.split_at(full.len() - 12);
    let path = server.watch_dir.join("partial.yaml");
    let mut f = std::fs::File::create(&path).unwrap();
    f.write_all(head.as_bytes()).unwrap();
    f.flush().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    f.write_all(&full.as_bytes()[head.len()..]).unwrap();
    drop(f);
    let sb = server.wait_running(&partial);
    assert_eq!(sb["spec"]["env"]["STAGE"], "complete", "{sb}");
    wait_until(
        "the partial file's error clears",
        Duration::from_secs(10),
        || error_for(&errors(&server), "partial.yaml").is_none(),
    );

    // Swapped in by rename over an existing file.
    write_manifest(
        &server.watch_dir,
        "swap.yaml",
        &sandbox_manifest(&swapped, "  env:\n    V: one\n"),
    );
    server.wait_running(&swapped);
    let tmp = server.watch_dir.join("swap.yaml.new");
    std::fs::write(&tmp, sandbox_manifest(&swapped, "  env:\n    V: two\n")).unwrap();
    std::fs::rename(&tmp, server.watch_dir.join("swap.yaml")).unwrap();
    server.wait_for(
        "sandboxes",
        &swapped,
        "updated by rename",
        Duration::from_secs(30),
        |r| r.is_some_and(|r| r["spec"]["env"]["V"] == "two" && r["status"]["phase"] == "Running"),
    );

    // A symlink leading outside the folder is not followed, and the error names it.
    let outside_dir = tempfile::tempdir().unwrap();
    let target = outside_dir.path().join("outside.yaml");
    std::fs::write(&target, sandbox_manifest(&linked, "")).unwrap();
    std::os::unix::fs::symlink(&target, server.watch_dir.join("evil.yaml")).unwrap();
    wait_until(
        "the outside link is reported",
        Duration::from_secs(15),
        || {
            errors(&server)
                .iter()
                .any(|e| e.to_string().contains("evil.yaml"))
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        server.get("sandboxes", &linked).is_none(),
        "followed a link outside the folder"
    );
    assert!(containers_of(&linked).is_empty());
}

#[test]
fn exec_output_flood_is_truncated_and_memory_stays_flat() {
    let cap = 1024 * 1024;
    let server = Server::start_with(&[("AGENT_SANDBOX_MAX_EXEC_OUTPUT_BYTES", &cap.to_string())]);
    let name = unique("flood");
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                     "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);
    let exec = |cmd: &str| {
        server.request(
            "POST",
            &format!("/v1/sandboxes/{name}/exec"),
            Some(&json!({"command": cmd, "timeout_seconds": 120})),
        )
    };
    let (status, _) = exec("true");
    assert_eq!(status, 200);
    let before = server_rss_mb(&server);
    let started = Instant::now();
    // gVisor's pipes (ptrace platform) are far slower: a smaller flood, still 100 times the cap.
    let flood = if gvisor() {
        "yes | head -c 100m; yes err | head -c 20m >&2; echo done"
    } else {
        "yes | head -c 500m; yes err | head -c 100m >&2; echo done"
    };
    let (status, out) = exec(flood);
    assert_eq!(status, 200, "{out}");
    let took = started.elapsed();
    let after = server_rss_mb(&server);
    eprintln!("flood: {took:?}, server RSS {before} MB -> {after} MB");
    assert_eq!(out["truncated"], true);
    let kept = out["stdout"].as_str().unwrap().len() + out["stderr"].as_str().unwrap().len();
    assert!(kept <= cap, "kept {kept} bytes over the cap {cap}");
    assert!(kept >= cap / 2, "kept only {kept} bytes");
    assert_eq!(out["exit_code"], 0);
    assert!(
        after < before + 64,
        "server RSS grew from {before} to {after} MB"
    );
    // Streamed, the flood passes through without piling up in the server either.
    let (status, text) = server.request_raw(
        "POST",
        &format!("/v1/sandboxes/{name}/exec/stream"),
        Some(json!({"command": "yes | head -c 50m", "timeout_seconds": 120}).to_string()),
        "application/json",
    );
    assert_eq!(status, 200);
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["type"], "exit", "{last}");
    let streamed = server_rss_mb(&server);
    assert!(
        streamed < before + 64,
        "server RSS grew to {streamed} MB while streaming"
    );
}

#[test]
fn slow_clients_are_cut_off_and_others_are_served() {
    let server = Server::start();
    let addr = server.url.trim_start_matches("http://").to_string();
    // Headers, one byte per second: closed within the header timeout (10 s).
    let trickle = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            let started = Instant::now();
            for b in
                b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
                    .iter()
            {
                if s.write_all(&[*b]).is_err() {
                    return Some(started.elapsed());
                }
                std::thread::sleep(Duration::from_secs(1));
                // Closed by the server: a read sees the end (or an error answer) at once.
                s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
                let mut buf = [0u8; 256];
                match s.read(&mut buf) {
                    Ok(_) => return Some(started.elapsed()),
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return Some(started.elapsed()),
                }
            }
            None
        })
    };
    // A body that stalls after its first bytes: closed within the body idle timeout (30 s).
    let stall = {
        let (addr, key) = (addr.clone(), server.key.clone());
        std::thread::spawn(move || {
            let mut s = TcpStream::connect(&addr).unwrap();
            let started = Instant::now();
            let head = format!("POST {API}/sandboxes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nContent-Type: application/yaml\r\nContent-Length: 1000\r\n\r\napiVersion: ");
            s.write_all(head.as_bytes()).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            let mut out = Vec::new();
            let _ = s.read_to_end(&mut out);
            (started.elapsed(), String::from_utf8_lossy(&out).to_string())
        })
    };
    // Meanwhile everyone else is answered promptly.
    for _ in 0..20 {
        let started = Instant::now();
        let (status, _) = server.request("GET", &format!("{API}/sandboxes"), None);
        assert_eq!(status, 200);
        assert!(started.elapsed() < Duration::from_secs(2));
        std::thread::sleep(Duration::from_millis(500));
    }
    let cut = trickle
        .join()
        .unwrap()
        .expect("the trickling client was never cut off");
    eprintln!("header trickle cut after {cut:?}");
    assert!(cut <= Duration::from_secs(16), "cut after {cut:?}");
    let (took, answer) = stall.join().unwrap();
    eprintln!(
        "stalled body ended after {took:?}: {}",
        answer.lines().next().unwrap_or("")
    );
    assert!(
        took <= Duration::from_secs(40),
        "stalled body held {took:?}"
    );
    assert!(
        !answer.starts_with("HTTP/1.1 2"),
        "a stalled body was accepted: {answer}"
    );
}

#[test]
fn authentication_matrix_and_keys_stay_out_of_the_log() {
    let server = Server::start();
    let wrong = format!("wrong-key-{:032x}", rand::random::<u128>());
    let send = |path: &str, headers: &[(&str, &str)]| -> (u16, String) {
        let mut s = TcpStream::connect(server.url.trim_start_matches("http://")).unwrap();
        let mut req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        (status, out)
    };
    let bearer_wrong = format!("Bearer {wrong}");
    let basic = format!("Basic {}", server.key);
    let token_scheme = format!("Token {}", server.key);
    let bare = server.key.clone();
    let bearer_ok = format!("Bearer {}", server.key);
    let bearer_lower = format!("bearer {}", server.key);
    for path in [format!("{API}/sandboxes"), "/v1/sandboxes".to_string()] {
        let refused: Vec<Vec<(&str, &str)>> = vec![
            vec![],
            vec![("Authorization", "")],
            vec![("Authorization", "Bearer ")],
            vec![("Authorization", &bearer_wrong)],
            vec![("Authorization", &basic)],
            vec![("Authorization", &token_scheme)],
            vec![("Authorization", &bare)],
            vec![("X-API-Key", "")],
            vec![("X-API-Key", &wrong)],
        ];
        for headers in refused {
            let (status, out) = send(&path, &headers);
            assert_eq!(status, 401, "{path} {headers:?}: {out}");
            let body = out.split_once("\r\n\r\n").unwrap().1;
            let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{body}"));
            assert_eq!(v["error"]["code"], "unauthorized", "{body}");
            assert!(v["error"]["message"].is_string());
            assert!(!out.contains(&server.key), "the key was echoed");
        }
        for headers in [
            vec![("Authorization", bearer_ok.as_str())],
            vec![("Authorization", bearer_lower.as_str())],
            vec![("X-API-Key", server.key.as_str())],
        ] {
            let (status, out) = send(&path, &headers);
            assert_eq!(status, 200, "{path} {headers:?}: {out}");
        }
    }
    let (status, _) = send("/healthz", &[]);
    assert_eq!(status, 200);
    // Failed requests with wrong keys, and a create, all went through the log: no key is in it.
    let (status, _) = server.request(
        "POST",
        "/v1/sandboxes",
        Some(&json!({"image": TEST_IMAGE, "env": {"TOKEN": "not-a-key"}})),
    );
    assert_eq!(status, 201);
    let log = server.log();
    assert!(log.len() > 100, "the log is empty");
    assert!(
        !log.contains(&server.key),
        "the API key appears in the server log"
    );
    assert!(
        !log.contains(&wrong),
        "a wrong key appears in the server log"
    );
}
