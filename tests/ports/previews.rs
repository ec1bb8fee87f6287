//! Preview hosts and tokens (`AGENT_SANDBOX_PREVIEW_DOMAIN`, `…/sandboxes/{name}/previews`): a
//! token opens one port of one sandbox through its preview host and nothing else, is traded for a
//! host-only cookie, expires, and is revoked; `Host` tricks reach nothing.

use std::time::Duration;

use super::common::*;
use super::{python_sandbox, send, start_web, Answer};
use serde_json::{json, Value};

const DOMAIN: &str = "preview.localhost";
const NO_KEY: (&str, &str) = ("authorization", "");

fn preview(server: &Server, sb: &str, body: Value) -> Value {
    let (status, p) = server.request(
        "POST",
        &format!("{API}/sandboxes/{sb}/previews"),
        Some(&body),
    );
    assert_eq!(status, 201, "{p}");
    p
}

fn on_host(server: &Server, host: &str, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("host", host), NO_KEY];
    all.extend_from_slice(headers);
    send(server, "GET", path, &all, b"")
}

#[test]
fn preview_tokens_open_one_port_of_one_sandbox() {
    let server = Server::start_with(&[("AGENT_SANDBOX_PREVIEW_DOMAIN", DOMAIN)]);
    let Some(sb) = python_sandbox(&server, "the preview test") else {
        return;
    };
    start_web(&server, &sb, 8000);
    start_web(&server, &sb, 8001);
    let (status, other) = server.request("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(status, 201, "{other}");
    let other = other["id"].as_str().unwrap().to_string();
    let listener_port = server.url.rsplit(':').next().unwrap().to_string();
    let host = format!("8000-{sb}.{DOMAIN}:{listener_port}");

    let p = preview(&server, &sb, json!({"port": 8000, "expiresInSeconds": 600}));
    let token = p["token"].as_str().unwrap().to_string();
    assert_eq!(
        p["url"],
        json!(format!("http://{host}/?token={token}")),
        "{p}"
    );
    assert!(p["expiresAt"].is_string(), "{p}");

    // The token is traded for a host-only cookie and the same URL without it.
    let a = on_host(&server, &host, &format!("/hello?a=1&token={token}"), &[]);
    assert_eq!(a.status, 303, "{}", a.head);
    assert_eq!(a.header("location").as_deref(), Some("/hello?a=1"));
    let set_cookie = a.header("set-cookie").unwrap();
    assert!(set_cookie.starts_with(&format!("agent-sandbox-preview={token};")));
    assert!(set_cookie.contains("HttpOnly") && set_cookie.contains("SameSite=Lax"));
    assert!(
        !set_cookie.to_ascii_lowercase().contains("domain="),
        "{set_cookie}"
    );
    let cookie = format!("agent-sandbox-preview={token}; other=1");
    let with_cookie = [("cookie", cookie.as_str())];
    let a = on_host(&server, &host, "/hello", &with_cookie);
    assert_eq!((a.status, a.text().as_str()), (200, "hello from 8000"));
    // The sandbox gets the path unchanged, no prefix, and not this server's cookie.
    let a = on_host(&server, &host, "/headers", &with_cookie);
    let seen: Value = serde_json::from_slice(&a.body).unwrap();
    assert_eq!(seen["cookie"], json!(["other=1"]), "{seen}");
    assert_eq!(seen["x-forwarded-host"], json!([host]));
    assert!(seen.get("x-forwarded-prefix").is_none(), "{seen}");
    // The API key opens it too, and never reaches the sandbox; nothing at all gets 401.
    let bearer = format!("Bearer {}", server.key);
    let a = on_host(&server, &host, "/hello", &[("authorization", &bearer)]);
    assert_eq!((a.status, a.text().as_str()), (200, "hello from 8000"));
    assert_eq!(on_host(&server, &host, "/hello", &[]).status, 401);
    let (_, recorded) = server.exec(&sb, "cat /tmp/headers-8000.log");
    assert!(
        !recorded.contains(&server.key),
        "the key reached the sandbox"
    );
    assert!(!recorded.contains(&token), "the token reached the sandbox");

    // The token opens nothing else: another port, another sandbox, the API.
    let host_8001 = format!("8001-{sb}.{DOMAIN}:{listener_port}");
    assert_eq!(
        on_host(&server, &host_8001, "/hello", &with_cookie).status,
        401
    );
    let a = on_host(&server, &host_8001, &format!("/hello?token={token}"), &[]);
    assert_eq!(a.status, 401);
    let host_other = format!("8000-{other}.{DOMAIN}:{listener_port}");
    assert_eq!(
        on_host(&server, &host_other, "/hello", &with_cookie).status,
        401
    );
    let api_host = server.url.trim_start_matches("http://");
    for (path, headers) in [
        (
            format!("{API}/sandboxes"),
            vec![("cookie", cookie.as_str())],
        ),
        (format!("{API}/sandboxes?token={token}"), vec![]),
        (
            "/v1/sandboxes".to_string(),
            vec![("authorization", &*format!("Bearer {token}"))],
        ),
    ] {
        let a = on_host(&server, api_host, &path, &headers);
        assert_eq!(a.status, 401, "{path}: {}", a.text());
    }

    // Host tricks reach nothing of the sandbox.
    let a = on_host(
        &server,
        &format!("8000-{sb}.{DOMAIN}.evil"),
        "/hello",
        &with_cookie,
    );
    assert_ne!(a.status, 200, "{}", a.text());
    assert!(!a.text().contains("hello from"));
    let a = on_host(
        &server,
        &format!("8000-{sb}.{DOMAIN}:1@other"),
        "/hello",
        &with_cookie,
    );
    assert_eq!(a.status, 400, "{}", a.text());
    let a = send(
        &server,
        "GET",
        "/hello",
        &[
            ("host", &host),
            ("host", api_host),
            NO_KEY,
            ("cookie", &cookie),
        ],
        b"",
    );
    assert_eq!(a.status, 400, "two Host headers: {}", a.text());
    let a = send(
        &server,
        "GET",
        &format!("http://{host}/hello"),
        &[("host", api_host), NO_KEY, ("cookie", &cookie)],
        b"",
    );
    assert_eq!(a.status, 400, "target and Host disagree: {}", a.text());

    // Expiry, then revocation.
    let short = preview(&server, &sb, json!({"port": 8000, "expiresInSeconds": 1}));
    std::thread::sleep(Duration::from_millis(2100));
    let short_cookie = format!("agent-sandbox-preview={}", short["token"].as_str().unwrap());
    let a = on_host(&server, &host, "/hello", &[("cookie", &short_cookie)]);
    assert_eq!(a.status, 401, "{}", a.text());
    assert!(a.text().contains("expired"), "{}", a.text());
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxes/{sb}/previews"), None);
    assert_eq!(status, 204);
    let a = on_host(&server, &host, "/hello", &with_cookie);
    assert_eq!(a.status, 401);
    assert!(a.text().contains("revoked"), "{}", a.text());
    let fresh = preview(&server, &sb, json!({"port": 8000}));
    let fresh_cookie = format!("agent-sandbox-preview={}", fresh["token"].as_str().unwrap());
    let a = on_host(&server, &host, "/hello", &[("cookie", &fresh_cookie)]);
    assert_eq!(a.status, 200, "{}", a.text());

    // Bad requests name the field.
    for (body, field) in [
        (json!({}), "port"),
        (json!({"port": 0}), "port"),
        (
            json!({"port": 8000, "expiresInSeconds": 0}),
            "expiresInSeconds",
        ),
        (json!({"port": 8000, "extra": 1}), "extra"),
    ] {
        let (status, e) = server.request(
            "POST",
            &format!("{API}/sandboxes/{sb}/previews"),
            Some(&body),
        );
        assert_eq!(status, 400, "{body}: {e}");
        assert!(e.to_string().contains(field), "{body}: {e}");
    }
    server.request("DELETE", &format!("/v1/sandboxes/{sb}"), None);
    server.request("DELETE", &format!("/v1/sandboxes/{other}"), None);
}

/// A sandbox deleted and made again under the same name has a new `uid`: the old tokens open
/// nothing on it, and new ones do.
#[test]
fn a_recreated_sandbox_of_the_same_name_refuses_old_tokens() {
    let server = Server::start_with(&[("AGENT_SANDBOX_PREVIEW_DOMAIN", DOMAIN)]);
    if !python_image("the recreated-sandbox preview test") {
        return;
    }
    let name = unique("prev-again");
    let make = || {
        let mut spec = json!({"image": PYTHON_IMAGE});
        if gvisor() {
            spec["pidsLimit"] = json!(4096);
        }
        let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                         "metadata": {"name": name}, "spec": spec});
        let (status, answer) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
        assert_eq!(status, 201, "{answer}");
        let running = server.wait_running(&name);
        start_web(&server, &name, 8000);
        running["metadata"]["uid"].as_str().unwrap().to_string()
    };
    let listener_port = server.url.rsplit(':').next().unwrap().to_string();
    let host = format!("8000-{name}.{DOMAIN}:{listener_port}");
    let cookie = |p: &Value| format!("agent-sandbox-preview={}", p["token"].as_str().unwrap());

    let first_uid = make();
    let old = cookie(&preview(&server, &name, json!({"port": 8000})));
    let a = on_host(&server, &host, "/hello", &[("cookie", &old)]);
    assert_eq!(a.status, 200, "{}", a.text());

    let (status, _) = server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    assert!(status == 200 || status == 202, "{status}");
    server.wait_gone("sandboxes", &name);
    let second_uid = make();
    assert_ne!(first_uid, second_uid);

    let a = on_host(&server, &host, "/hello", &[("cookie", &old)]);
    assert_eq!(
        a.status,
        401,
        "an old token opened the new sandbox: {}",
        a.text()
    );
    let new = cookie(&preview(&server, &name, json!({"port": 8000})));
    let a = on_host(&server, &host, "/hello", &[("cookie", &new)]);
    assert_eq!(a.status, 200, "{}", a.text());
    server.request("DELETE", &format!("{API}/sandboxes/{name}"), None);
    cleanup_sandbox_objects(&name);
}

/// `agent-sandbox preview NAME PORT` prints a link whose token opens that port through the
/// preview host, and no other port.
#[test]
fn the_preview_command_prints_a_link_that_opens_the_port() {
    let server = Server::start_with(&[("AGENT_SANDBOX_PREVIEW_DOMAIN", DOMAIN)]);
    let Some(sb) = python_sandbox(&server, "the preview command test") else {
        return;
    };
    start_web(&server, &sb, 8000);
    start_web(&server, &sb, 8001);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(["preview", &sb, "8000", "--expires", "600"])
        .env_clear()
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("works until"), "{stderr}");
    let listener_port = server.url.rsplit(':').next().unwrap().to_string();
    let host = format!("8000-{sb}.{DOMAIN}:{listener_port}");
    let url = stdout.trim();
    let token = url
        .strip_prefix(&format!("http://{host}/?token="))
        .unwrap_or_else(|| panic!("{url:?}"))
        .to_string();
    assert!(!token.is_empty() && !token.contains(&server.key), "{url}");

    // The link itself: traded for a cookie, which then opens port 8000.
    let a = on_host(&server, &host, &format!("/?token={token}"), &[]);
    assert_eq!(a.status, 303, "{}", a.head);
    assert_eq!(a.header("location").as_deref(), Some("/"));
    let cookie = format!("agent-sandbox-preview={token}");
    let a = on_host(&server, &host, "/hello", &[("cookie", &cookie)]);
    assert_eq!((a.status, a.text().as_str()), (200, "hello from 8000"));
    // Not port 8001.
    let host_8001 = format!("8001-{sb}.{DOMAIN}:{listener_port}");
    let a = on_host(&server, &host_8001, "/hello", &[("cookie", &cookie)]);
    assert_eq!(a.status, 401, "{}", a.text());

    server.request("DELETE", &format!("/v1/sandboxes/{sb}"), None);
}
