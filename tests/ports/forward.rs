//! Port-forward (`GET …/sandboxes/{name}/portforward?port=P` and `agent-sandbox port-forward`):
//! an HTTP client and a raw TCP echo reach a `network: false` sandbox through local ports, and
//! closing one side closes the other.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::common::*;
use super::{exchange, python_sandbox, start_web};
use serde_json::json;

const ECHO_PY: &str = include_str!("echo.py");

fn start_echo(server: &Server, sb: &str, port: u16) {
    let body = json!({ "argv": ["python3", "-c", ECHO_PY, port.to_string()] });
    let (status, p) = server.request(
        "POST",
        &format!("{API}/sandboxes/{sb}/processes"),
        Some(&body),
    );
    assert_eq!(status, 201, "{p}");
    wait_until("the sandbox's echo server", Duration::from_secs(30), || {
        let probe = format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port})).close()'"
        );
        server.exec(sb, &probe).0 == 0
    });
}

/// A child process that is killed when the test ends, however it ends.
struct Forwarder(std::process::Child);

impl Drop for Forwarder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn port_forward_carries_http_and_raw_tcp() {
    use tungstenite::client::IntoClientRequest;
    let server = Server::start();
    let Some(sb) = python_sandbox(&server, "the port-forward test") else {
        return;
    };
    start_web(&server, &sb, 8000);
    start_echo(&server, &sb, 9000);

    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(["port-forward", &sb, ":8000", ":9000"])
        .env_clear()
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let _forwarder = Forwarder(child);
    let mut local = Vec::new();
    for remote in [8000, 9000] {
        let line = lines.next().unwrap().unwrap();
        let port = line
            .strip_prefix("Forwarding from 127.0.0.1:")
            .and_then(|rest| rest.strip_suffix(&format!(" -> {remote}")))
            .unwrap_or_else(|| panic!("{line:?}"));
        local.push(format!("127.0.0.1:{port}"));
    }

    // HTTP through the local port.
    let a = exchange(
        &local[0],
        b"GET /hello HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
        b"",
    );
    assert_eq!((a.status, a.text().as_str()), (200, "hello from 8000"));

    // A raw echo of 4 MiB, written and read at once.
    let mut stream = TcpStream::connect(&local[1]).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let mut writer = stream.try_clone().unwrap();
    let sent = data.clone();
    let writing = std::thread::spawn(move || writer.write_all(&sent).unwrap());
    let mut back = vec![0u8; data.len()];
    stream.read_exact(&mut back).unwrap();
    writing.join().unwrap();
    assert!(back == data, "the echo differs");
    // Closing this side closes the other: the forward ends and this side sees the end.
    stream.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    assert_eq!(stream.read_to_end(&mut rest).unwrap(), 0);

    // The WebSocket itself: binary messages are the connection's bytes.
    let (url, mut socket) = ping_through_forward(&server, &sb);
    socket.close(None).unwrap();

    // Nothing listening: refused before the upgrade, naming the port; no key: 401.
    for (port, key, want) in [(8001, true, 502), (9000, false, 401)] {
        let mut request = url
            .replace("port=9000", &format!("port={port}"))
            .into_client_request()
            .unwrap();
        if key {
            request.headers_mut().insert(
                "authorization",
                format!("Bearer {}", server.key).parse().unwrap(),
            );
        }
        match tungstenite::connect(request) {
            Err(tungstenite::Error::Http(response)) => {
                assert_eq!(response.status().as_u16(), want);
                if want == 502 {
                    let body = String::from_utf8_lossy(response.body().as_deref().unwrap_or(&[]))
                        .into_owned();
                    assert!(body.contains("port 8001"), "{body}");
                }
            }
            other => panic!("port {port}: {:?}", other.map(|_| ())),
        }
    }
    server.request("DELETE", &format!("/v1/sandboxes/{sb}"), None);
}

/// How many in-sandbox relays (`agent-sandbox-helper relay`) run in `sb` now.
fn relays(server: &Server, sb: &str) -> usize {
    let count = "python3 -c 'import glob\nn = 0\nfor f in glob.glob(\"/proc/[0-9]*/cmdline\"):\n    try:\n        a = open(f, \"rb\").read().split(b\"\\0\")\n    except OSError:\n        continue\n    n += len(a) > 1 and a[0].endswith(b\"agent-sandbox-helper\") and a[1] == b\"relay\"\nprint(n)'";
    let (code, out) = server.exec(sb, count);
    assert_eq!(code, 0, "{out}");
    out.trim().parse().unwrap_or_else(|_| panic!("{out:?}"))
}

type Socket = tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>;

/// A port-forward WebSocket to port 9000 of `sb` (its URL, and the socket still open) that has
/// carried a "ping" there and back.
fn ping_through_forward(server: &Server, sb: &str) -> (String, Socket) {
    use tungstenite::client::IntoClientRequest;
    use tungstenite::Message;
    let url = format!(
        "{}{API}/sandboxes/{sb}/portforward?port=9000",
        server.url.replacen("http", "ws", 1)
    );
    let mut request = url.clone().into_client_request().unwrap();
    request.headers_mut().insert(
        "authorization",
        format!("Bearer {}", server.key).parse().unwrap(),
    );
    let (mut socket, _) = tungstenite::connect(request).unwrap();
    socket.send(Message::binary(b"ping".to_vec())).unwrap();
    let mut got = Vec::new();
    while got.len() < 4 {
        match socket.read().unwrap() {
            Message::Binary(b) => got.extend_from_slice(&b),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, b"ping");
    (url, socket)
}

/// The relays running in `sb` while a port-forward connection is open.
fn echo_and_count_relays(server: &Server, sb: &str) -> usize {
    let (_, mut socket) = ping_through_forward(server, sb);
    let running = relays(server, sb);
    socket.close(None).unwrap();
    running
}

/// Under runc with a daemon on this host the server connects inside the container's network
/// namespace itself: no relay runs in the sandbox. Under gVisor (its own network stack), or with
/// `AGENT_SANDBOX_DIRECT_PORTS=false`, every connection is relayed by the helper. Both carry
/// the same bytes.
#[test]
fn connections_are_direct_under_runc_and_relayed_otherwise() {
    for direct in ["true", "false"] {
        let server = Server::start_with(&[("AGENT_SANDBOX_DIRECT_PORTS", direct)]);
        let Some(sb) = python_sandbox(&server, "the direct connection test") else {
            return;
        };
        start_echo(&server, &sb, 9000);
        let relayed = direct == "false" || gvisor();
        assert_eq!(
            echo_and_count_relays(&server, &sb),
            usize::from(relayed),
            "direct ports {direct}, runtime {:?}\n{}",
            test_runtime(),
            server.log()
        );
        server.request("DELETE", &format!("/v1/sandboxes/{sb}"), None);
    }
}
