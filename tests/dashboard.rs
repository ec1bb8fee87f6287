//! The dashboard at `/ui` end to end, in a real headless Chromium against the real server and
//! Docker daemon (runc, or gVisor with `AGENT_SANDBOX_TEST_RUNTIME=runsc`): sign in with the key,
//! see a sandbox appear live when its manifest is written into the data directory, open it, take a
//! snapshot, upload a file, roll back; the key never shows in a page; pages and the script answer
//! 401 without a session; the session cookie cannot be used from another origin, without the
//! CSRF token, or through the proxy into a sandbox; a key of one namespace sees and opens that
//! namespace's sandboxes only.
//!
//! With `AGENT_SANDBOX_UI_SCREENSHOTS=<dir>` the screenshots are also written there (the ones in
//! `docs/` come from `AGENT_SANDBOX_UI_SCREENSHOTS=docs`).

#[path = "dashboard/browser.rs"]
mod browser;
mod common;

use std::io::{Read, Write};
use std::time::Duration;

use browser::Browser;
use common::{sandbox_manifest, unique, write_manifest, NetworkGuard, Server, API, TEST_IMAGE};

/// One HTTP/1.1 request with the given headers; status, response head and body.
fn raw(
    server: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String, String) {
    let host = server.url.strip_prefix("http://").unwrap();
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: 0\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).to_string();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

const SECRET: &str = "s3cr3t-env-value-the-page-must-not-show-5a4b";

fn keep_screenshot(browser: &mut Browser, file: &str) {
    let png = browser.screenshot();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{file}: not a drawn page ({} bytes)",
        png.len()
    );
    if let Ok(dir) = std::env::var("AGENT_SANDBOX_UI_SCREENSHOTS") {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(std::path::Path::new(&dir).join(file), png).unwrap();
    }
}

/// What the page holds, everywhere a key could hide: its markup, its text, its scripts' view of
/// the cookies and its storage.
fn everything_in_the_page(browser: &mut Browser) -> String {
    browser
        .eval(
            "document.documentElement.outerHTML + document.body.innerText + document.cookie \
             + JSON.stringify(sessionStorage) + JSON.stringify(localStorage) + location.href",
        )
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn pages_answer_401_without_a_session() {
    let server = Server::start();
    for path in ["/ui", "/ui/app.js"] {
        let (status, head, body) = raw(&server, "GET", path, &[]);
        assert_eq!(status, 401, "{path}");
        assert!(body.contains("action=\"/ui/login\""), "{path}: {body}");
        assert!(head
            .to_ascii_lowercase()
            .contains("content-security-policy"));
    }
    // A wrong key in the cookie is no session; the style sheet alone is public.
    let wrong = format!("agent_sandbox_key=wrong-{}", "k".repeat(30));
    assert_eq!(raw(&server, "GET", "/ui", &[("Cookie", &wrong)]).0, 401);
    assert_eq!(
        raw(
            &server,
            "GET",
            &format!("{API}/sandboxes"),
            &[("Cookie", &wrong)]
        )
        .0,
        401
    );
    assert_eq!(raw(&server, "GET", "/ui/app.css", &[]).0, 200);
    // A refused sign-in does not echo what was typed.
    let tried = "not-the-key-but-long-enough";
    let (status, body) = common::http(
        "POST",
        &format!("{}/ui/login", server.url),
        None,
        Some(format!("key={tried}")),
        "application/x-www-form-urlencoded",
    );
    assert_eq!(status, 401);
    assert!(
        body.contains("not accepted") && !body.contains(tried),
        "{body}"
    );
}

#[test]
fn the_session_cookie_is_refused_across_origins_without_csrf_and_through_the_proxy() {
    let server = Server::start();
    let cookie = format!(
        "agent_sandbox_key={}; agent_sandbox_csrf={}",
        server.key,
        "c".repeat(32)
    );
    let list = format!("{API}/sandboxes");
    assert_eq!(raw(&server, "GET", &list, &[("Cookie", &cookie)]).0, 200);
    assert_eq!(raw(&server, "GET", "/ui", &[("Cookie", &cookie)]).0, 200);
    assert_eq!(
        raw(&server, "GET", "/ui/app.js", &[("Cookie", &cookie)]).0,
        200
    );
    let evil = [
        ("Cookie", cookie.as_str()),
        ("Origin", "http://attacker.test"),
    ];
    assert_eq!(raw(&server, "GET", &list, &evil).0, 403);
    let site = [
        ("Cookie", cookie.as_str()),
        ("Sec-Fetch-Site", "cross-site"),
    ];
    assert_eq!(raw(&server, "GET", &list, &site).0, 403);
    // A write needs the token repeated in the header, exactly.
    let post = "/v1/sandboxes/nobody-here/snapshots";
    let (status, _, body) = raw(&server, "POST", post, &[("Cookie", &cookie)]);
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("X-CSRF-Token"), "{body}");
    let other_token = "d".repeat(32);
    let wrong = [
        ("Cookie", cookie.as_str()),
        ("X-CSRF-Token", other_token.as_str()),
    ];
    assert_eq!(raw(&server, "POST", post, &wrong).0, 403);
    let right_token = "c".repeat(32);
    let right = [
        ("Cookie", cookie.as_str()),
        ("X-CSRF-Token", right_token.as_str()),
    ];
    // Past the session's checks: the sandbox does not exist.
    assert_eq!(raw(&server, "POST", post, &right).0, 404);
    // The proxy into a sandbox never takes the session (pages a sandbox serves must not run
    // with it).
    let proxy = format!("{API}/sandboxes/nobody-here/proxy/8080/");
    assert_eq!(raw(&server, "GET", &proxy, &[("Cookie", &cookie)]).0, 401);
    // A sign-in posted from another origin is refused before the key is looked at.
    let (status, _, _) = raw(
        &server,
        "POST",
        "/ui/login",
        &[("Origin", "http://attacker.test")],
    );
    assert_eq!(status, 403);
}

/// Signs in through the form, as a person would, and waits for the sandbox list.
fn sign_in(browser: &mut Browser, server: &Server, screenshot: Option<&str>) {
    sign_in_as(browser, server, &server.key, screenshot);
}

fn sign_in_as(browser: &mut Browser, server: &Server, key: &str, screenshot: Option<&str>) {
    browser.navigate(&format!("{}/ui", server.url));
    browser.wait_for(
        "document.getElementById('sign-in')",
        Duration::from_secs(10),
    );
    if let Some(file) = screenshot {
        keep_screenshot(browser, file);
    }
    let typed = serde_json::to_string(key).unwrap();
    browser.eval(&format!(
        "document.getElementById('key').value = {typed}; \
         document.getElementById('sign-in').submit(); true"
    ));
    browser.wait_for(
        "document.body && document.body.dataset.view === 'sandboxes' && document.getElementById('sandbox-count')",
        Duration::from_secs(20),
    );
}

#[test]
fn sign_in_see_a_sandbox_appear_upload_and_roll_back() {
    let server = Server::start();
    let name = unique("ui");
    let mut browser = Browser::start();

    // Signing in: the page asks for the key, and once given never shows it.
    sign_in(&mut browser, &server, Some("ui-sign-in.png"));
    assert!(!everything_in_the_page(&mut browser).contains(&server.key));
    assert!(
        browser
            .eval("document.cookie")
            .as_str()
            .unwrap()
            .contains("agent_sandbox_csrf="),
        "the CSRF token is readable by the page's script"
    );

    // A manifest written into the data directory shows up on the open page, then runs. (One in
    // a watched folder would show up the same way, but its folder owns it: the API, and so the
    // dashboard, could not roll it back.)
    let manifests = server.data_dir.join("manifests").join("sandboxes");
    write_manifest(
        &manifests,
        &format!("{name}.yaml"),
        &sandbox_manifest(
            &name,
            &format!("  memoryMB: 128\n  env:\n    API_TOKEN: {SECRET}\n"),
        ),
    );
    let row = format!("document.querySelector('tr[data-name=\"{name}\"]')");
    browser.wait_for(&row, Duration::from_secs(30));
    browser.wait_for(
        &format!("{row}.innerText.includes('Running') && {row}.innerText.includes('128 MiB')"),
        Duration::from_secs(120),
    );
    // Live memory from the sandbox's stats fills in.
    browser.wait_for(
        &format!("{row}.querySelector('.bar')"),
        Duration::from_secs(30),
    );
    keep_screenshot(&mut browser, "ui-sandboxes.png");

    // Open it.
    browser.eval(&format!("{row}.querySelector('a').click(); true"));
    browser.wait_for("document.querySelector('#yaml') && document.querySelector('#yaml').textContent.includes('phase: Running')", Duration::from_secs(30));
    browser.wait_for(
        "document.querySelector('#events tbody tr')",
        Duration::from_secs(30),
    );
    browser.wait_for(
        "document.querySelector('#folder').textContent === '/workspace'",
        Duration::from_secs(30),
    );
    // The environment's values are not shown (they often hold secrets); its names are.
    let page = everything_in_the_page(&mut browser);
    assert!(page.contains("API_TOKEN") && !page.contains(SECRET) && !page.contains(&server.key));

    // A snapshot of the empty workspace.
    browser.eval("document.getElementById('snapshot-name').value = 'before'; document.getElementById('snapshot-button').click(); true");
    browser.wait_for(
        "document.querySelector('#snapshots tr[data-snapshot]')",
        Duration::from_secs(120),
    );

    // Upload a file through the file input, as a user picking it would.
    let dir = tempfile::tempdir().unwrap();
    let upload = dir.path().join("hello.txt");
    std::fs::write(&upload, "uploaded from the dashboard\n").unwrap();
    browser.set_files("#upload", &[&upload]);
    browser.eval("document.getElementById('upload-button').click(); true");
    browser.wait_for(
        "document.querySelector('#files tr[data-file=\"hello.txt\"]')",
        Duration::from_secs(30),
    );
    let (code, out) = server.exec(&name, "cat /workspace/hello.txt");
    assert_eq!((code, out.as_str()), (0, "uploaded from the dashboard\n"));
    // Its download link is served with the session.
    let downloaded = browser.eval(
        "fetch(document.querySelector('#files tr[data-file=\"hello.txt\"] a.download').href).then(r => r.text())",
    );
    assert_eq!(downloaded, "uploaded from the dashboard\n");

    // A process's output, live.
    browser.eval("document.getElementById('command').value = 'echo from-a-process; sleep 1; echo done'; document.getElementById('start-process').click(); true");
    browser.wait_for(
        "document.getElementById('output').textContent.includes('done')",
        Duration::from_secs(60),
    );
    keep_screenshot(&mut browser, "ui-sandbox.png");

    // Roll back to the snapshot: the uploaded file is gone, in the page and in the sandbox.
    browser.eval("window.confirm = () => true; document.querySelector('#snapshots button.rollback').click(); true");
    browser.wait_for("document.body.dataset.rolledBack", Duration::from_secs(180));
    let sandbox = server.wait_running(&name);
    assert!(
        sandbox["status"]["lastRollback"]["snapshot"].is_string(),
        "{sandbox}"
    );
    browser.wait_for(
        "document.querySelector('#folder').textContent === '/workspace' && !document.querySelector('#files tr[data-file=\"hello.txt\"]')",
        Duration::from_secs(30),
    );
    let (code, _) = server.exec(&name, "test -e /workspace/hello.txt");
    assert_ne!(code, 0, "the rollback left the uploaded file");
    browser.wait_for(
        "document.querySelector('#yaml').textContent.includes('lastRollback')",
        Duration::from_secs(30),
    );

    // Fork the snapshot: the page opens the new sandbox, which runs on the snapshot's content.
    browser.eval("document.querySelector('#snapshots button.fork').click(); true");
    let opened = format!(
        "location.hash.startsWith('#/sandboxes/') && location.hash !== '#/sandboxes/{name}'"
    );
    browser.wait_for(&opened, Duration::from_secs(120));
    let child = browser
        .eval("decodeURIComponent(location.hash.slice('#/sandboxes/'.length))")
        .as_str()
        .unwrap()
        .to_string();
    browser.wait_for(
        "document.querySelector('#yaml') && document.querySelector('#yaml').textContent.includes('phase: Running')",
        Duration::from_secs(60),
    );
    let forked = server.wait_running(&child);
    assert!(forked["spec"]["source"]["snapshot"].is_string(), "{forked}");
    let (code, _) = server.exec(&child, "test -e /workspace/hello.txt");
    assert_ne!(code, 0, "the fork has a file the snapshot did not");

    // The other views draw, and say what they hold.
    let template = unique("ui-tmpl");
    let (status, body) = server.request(
        "POST",
        &format!("{API}/sandboxtemplates"),
        Some(
            &serde_json::json!({"apiVersion": "agent-sandbox.io/v1", "kind": "SandboxTemplate",
            "metadata": {"name": template}, "spec": {"memoryMB": 96, "pool": {"size": 0}}}),
        ),
    );
    assert_eq!(status, 201, "{body}");
    let templates_check =
        format!("document.querySelector('#list') && document.querySelector('#list').innerText.includes('{template}')");
    write_manifest(&server.watch_dir, "broken.yaml", "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: broken\nspec:\n  memoryMB: lots\n");
    for (view, check, shot) in [
        ("snapshots", "document.querySelector('#list tbody tr td') && document.querySelector('#list').innerText.includes('Ready')", "ui-snapshots.png"),
        ("errors", "document.querySelector('#list').innerText.includes('broken.yaml')", "ui-errors.png"),
        ("health", "document.querySelector('#health') && document.querySelector('#health').innerText.includes('docker')", "ui-health.png"),
        ("pools", "document.querySelector('#list tbody tr')", "ui-pools.png"),
        ("forks", "document.querySelector('#list tbody tr')", "ui-forks.png"),
        ("templates", &templates_check, "ui-templates.png"),
    ] {
        browser.eval(&format!("location.hash = '#/{view}'; true"));
        browser.wait_for(check, Duration::from_secs(30));
        keep_screenshot(&mut browser, shot);
    }
    assert!(!everything_in_the_page(&mut browser).contains(&server.key));

    // Signing out ends the session: the page asks for the key again.
    browser.eval("document.getElementById('sign-out').click(); true");
    browser.wait_for(
        "document.getElementById('sign-in')",
        Duration::from_secs(20),
    );
    let status = browser.eval(&format!("fetch('{API}/sandboxes').then(r => r.status)"));
    assert_eq!(status, 401);

    std::fs::remove_file(manifests.join(format!("{name}.yaml"))).unwrap();
    server.wait_gone("sandboxes", &name);
}

#[test]
fn a_policed_sandbox_shows_its_egress_decisions() {
    // Its own network, so that its egress gateway is this server's alone.
    let net = unique("ui-eg");
    let _networks = NetworkGuard(vec![format!("{net}-egress"), net.clone()]);
    let server = Server::start_with(&[("AGENT_SANDBOX_NETWORK_NAME", &net)]);
    let name = unique("ui-eg");
    let doc = serde_json::json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": TEST_IMAGE, "network": true,
                 "egress": {"allow": ["allowed.example.test"]}}});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(&name);
    // A lookup the list refuses: the gateway's name server answers it, nothing leaves the host.
    let (_, out) = server.exec(&name, "nslookup refused.example.test 2>&1");
    assert!(!out.contains("Address: 1"), "{out}");

    let mut browser = Browser::start();
    sign_in(&mut browser, &server, None);
    browser.eval(&format!("location.hash = '#/sandboxes/{name}'; true"));
    let row = "document.querySelector('#egress tr[data-host=\"refused.example.test\"]')";
    browser.wait_for(
        &format!("{row} && {row}.dataset.allowed === 'false' && {row}.innerText.includes('refused') && {row}.innerText.includes('dns')"),
        Duration::from_secs(30),
    );
    assert!(!everything_in_the_page(&mut browser).contains(&server.key));
}

#[test]
fn a_namespaced_key_sees_and_opens_its_own_sandboxes_only() {
    let dir = tempfile::tempdir().unwrap();
    let keys_file = dir.path().join("keys.yaml");
    let namespace = unique("team");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args([
            "keys",
            "create",
            "--name",
            "team",
            "--namespace",
            &namespace,
        ])
        .args(["--role", "edit"])
        .env_clear()
        .env("AGENT_SANDBOX_KEYS_FILE", &keys_file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let server = Server::start_with(&[("AGENT_SANDBOX_KEYS_FILE", keys_file.to_str().unwrap())]);
    // One sandbox of the admin's in `default`, one of the team's in its namespace.
    let theirs = unique("ui-admin");
    let ours = unique("ui-team");
    for (path, name) in [
        (format!("{API}/sandboxes"), &theirs),
        (format!("{API}/namespaces/{namespace}/sandboxes"), &ours),
    ] {
        let doc = serde_json::json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
            "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}});
        let (status, body) = server.request("POST", &path, Some(&doc));
        assert_eq!(status, 201, "{body}");
    }
    server.wait_running(&theirs);
    server.wait_running(&format!("{namespace}.{ours}"));

    let mut browser = Browser::start();
    sign_in_as(&mut browser, &server, &key, None);
    let row = format!("document.querySelector('tr[data-name=\"{namespace}.{ours}\"]')");
    browser.wait_for(
        &format!("{row} && {row}.innerText.includes('Running')"),
        Duration::from_secs(60),
    );
    let page = everything_in_the_page(&mut browser);
    assert!(
        !page.contains(&theirs),
        "the admin's sandbox shows to the team's key"
    );
    // Opening it reads it through its namespaced path.
    browser.eval(&format!("{row}.querySelector('a').click(); true"));
    browser.wait_for(
        "document.querySelector('#yaml') && document.querySelector('#yaml').textContent.includes('phase: Running')",
        Duration::from_secs(30),
    );
    // The admin's sandbox, asked for by its name, does not exist for this key.
    browser.navigate(&format!("{}/ui#/sandboxes/{theirs}", server.url));
    std::thread::sleep(Duration::from_secs(2));
    let page = everything_in_the_page(&mut browser);
    assert!(!page.contains("phase: Running"), "{page}");
}
