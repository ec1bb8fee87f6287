//! The first five minutes, against the real daemon: `agent-sandbox doctor` says what is wrong
//! and how to fix it, `serve` on its defaults prints a ready line whose command creates a first
//! sandbox, `GET /` names the API roots, and a missing default image is explained where it is
//! met. The servers here run as a newcomer runs them: no key configured (one is generated).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{free_port, gvisor, http, test_runtime, TEST_IMAGE};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_agent-sandbox");

/// The binary with a clean environment: only what a newcomer's shell would pass, plus `env`.
fn agent_sandbox(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .current_dir(cwd)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("AGENT_SANDBOX_DOCKER_RUNTIME", test_runtime());
    if let Ok(host) = std::env::var("DOCKER_HOST") {
        cmd.env("DOCKER_HOST", host);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn doctor(cwd: &Path, env: &[(&str, &str)]) -> (i32, String) {
    let out = agent_sandbox(cwd, &["doctor"], env).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn line_of<'a>(text: &'a str, verdict: &str, check: &str) -> &'a str {
    let prefix = format!("{verdict:<5} {check:<10} ");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no `{verdict} {check}` line in:\n{text}"))
}

#[test]
fn doctor_passes_on_a_ready_machine_and_names_each_fix() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port().to_string();
    let ready = [
        ("AGENT_SANDBOX_DEFAULT_IMAGE", TEST_IMAGE),
        ("AGENT_SANDBOX_PORT", port.as_str()),
    ];
    let (code, text) = doctor(tmp.path(), &ready);
    assert_eq!(code, 0, "{text}");
    assert!(text.ends_with("no check failed\n"), "{text}");
    assert!(line_of(&text, "ok", "docker").contains("API 1."), "{text}");
    let runtime = line_of(&text, "ok", "runtime");
    assert!(runtime.contains("starts a hardened container"), "{runtime}");
    if gvisor() {
        assert!(runtime.contains("\"runsc\""), "{runtime}");
    }
    line_of(&text, "ok", "image");
    assert!(line_of(&text, "ok", "data").contains("will be created"));
    assert!(line_of(&text, "ok", "key").contains("will be generated"));
    line_of(&text, "ok", "port");
    line_of(&text, "ok", "workspace");
    // Docker's own release decides this one; when it warns, it names the problem and the fix.
    if let Some(known) = text.lines().find(|l| l.starts_with("warn  docker")) {
        assert!(known.contains("moby/moby#46661") && known.contains("fix: upgrade"));
    }
    // What a newcomer meets: no image, a busy port, an unknown runtime, a readable key file.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let busy = taken.local_addr().unwrap().port().to_string();
    std::fs::create_dir_all(tmp.path().join("data")).unwrap();
    let key = tmp.path().join("data/api-key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let (code, text) = doctor(
        tmp.path(),
        &[
            (
                "AGENT_SANDBOX_DEFAULT_IMAGE",
                "agent-sandbox-test/missing:1",
            ),
            ("AGENT_SANDBOX_PORT", busy.as_str()),
        ],
    );
    assert_eq!(code, 1, "{text}");
    let image = line_of(&text, "FAIL", "image");
    assert!(image.contains("agent-sandbox-test/missing:1"), "{image}");
    assert!(image.contains("scripts/build-test-images.sh"), "{image}");
    assert!(image.contains("AGENT_SANDBOX_DEFAULT_IMAGE"), "{image}");
    assert!(line_of(&text, "FAIL", "port").contains("already in use"));
    assert!(line_of(&text, "FAIL", "key").contains("chmod 600"));
    assert!(text.ends_with("3 check(s) failed\n"), "{text}");
    drop(taken);

    let (code, text) = doctor(
        tmp.path(),
        &[
            ("AGENT_SANDBOX_DEFAULT_IMAGE", TEST_IMAGE),
            ("AGENT_SANDBOX_DOCKER_RUNTIME", "no-such-runtime"),
        ],
    );
    assert_eq!(code, 1, "{text}");
    let runtime = line_of(&text, "FAIL", "runtime");
    assert!(runtime.contains("not registered"), "{runtime}");
    assert!(
        runtime.contains("AGENT_SANDBOX_DOCKER_RUNTIME"),
        "{runtime}"
    );
}

/// A server started in `cwd` on its defaults but for the port and the image.
struct FirstServer {
    child: Child,
    ready_line: String,
    /// The address the ready line names (the kernel chose the port).
    url: String,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl FirstServer {
    fn start(cwd: &Path, image: &str) -> FirstServer {
        // Port 0: a port picked here could be taken by another test's server before this one
        // binds it.
        let mut child = agent_sandbox(
            cwd,
            &["serve"],
            &[
                ("AGENT_SANDBOX_PORT", "0"),
                ("AGENT_SANDBOX_DEFAULT_IMAGE", image),
            ],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
        let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = child.stderr.take().unwrap();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut ready_line = String::new();
        stdout.read_line(&mut ready_line).unwrap();
        assert!(
            !ready_line.is_empty(),
            "no ready line:\n{}",
            log.lock().unwrap()
        );
        let url = ready_line
            .split_once("ready at ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {ready_line}"))
            .to_string();
        assert!(
            url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"),
            "the bound address: {ready_line}"
        );
        FirstServer {
            child,
            ready_line: ready_line.trim_end().to_string(),
            url,
            log,
        }
    }

    fn wait_for_log(&self, needle: &str) -> String {
        common::wait_until(needle, Duration::from_secs(60), || {
            self.log.lock().unwrap().contains(needle)
        });
        self.log.lock().unwrap().clone()
    }
}

impl Drop for FirstServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn serve_on_its_defaults_prints_a_ready_line_whose_command_creates_a_sandbox() {
    let tmp = tempfile::tempdir().unwrap();
    let server = FirstServer::start(tmp.path(), TEST_IMAGE);
    let line = &server.ready_line;
    let url = server.url.clone();
    assert!(line.contains("API key in ./data/api-key"), "{line}");
    let key = std::fs::read_to_string(tmp.path().join("data/api-key")).unwrap();

    // `GET /` names the roots, without a key.
    let (status, body) = http("GET", &format!("{url}/"), None, None, "application/json");
    assert_eq!(status, 200, "{body}");
    let roots: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(roots["apis"]["resources"], "/apis/agent-sandbox.io/v1");
    assert_eq!(roots["apis"]["v1"], "/v1");
    assert_eq!(roots["apis"]["openapi"], "/openapi.json");

    // The command the line offers, run as a person would paste it, creates a running sandbox.
    let command = line
        .split_once("first sandbox: ")
        .map(|(_, c)| c)
        .unwrap_or_else(|| panic!("no command in {line}"));
    assert!(command.starts_with("curl "), "{command}");
    let out = Command::new("sh")
        .args(["-c", command])
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let answer: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    let id = answer["id"].as_str().unwrap_or_else(|| panic!("{answer}"));
    assert_eq!(answer["status"], "running", "{answer}");
    let (status, _) = http(
        "DELETE",
        &format!("{url}/v1/sandboxes/{id}"),
        Some(key.trim()),
        None,
        "application/json",
    );
    assert_eq!(status, 204);
    common::cleanup_sandbox_objects(id);
}

#[test]
fn a_missing_default_image_is_explained_at_start_and_in_the_first_answer() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = "agent-sandbox-test/missing:1";
    let server = FirstServer::start(tmp.path(), missing);
    let log = server.wait_for_log("FAIL  image");
    let logged = log.lines().find(|l| l.contains("FAIL  image")).unwrap();
    assert!(logged.contains("ERROR"), "{logged}");
    assert!(logged.contains("scripts/build-test-images.sh"), "{logged}");

    let key = std::fs::read_to_string(tmp.path().join("data/api-key")).unwrap();
    let (status, body) = http(
        "POST",
        &format!("{}/v1/sandboxes", server.url),
        Some(key.trim()),
        Some("{}".into()),
        "application/json",
    );
    assert_eq!(status, 502, "{body}");
    let error: Value = serde_json::from_str(&body).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains(missing), "{message}");
    assert!(message.contains("AGENT_SANDBOX_DEFAULT_IMAGE"), "{message}");
    assert!(message.contains("agent-sandbox doctor"), "{message}");
}

#[test]
fn the_systemd_unit_verifies_and_keeps_its_hardening() {
    // The unit as shipped, pointed at the binary under test (verify needs ExecStart to exist).
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/agent-sandbox.service"
    ))
    .unwrap();
    for line in [
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=CAP_CHOWN CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH CAP_FOWNER CAP_FSETID CAP_SYS_PTRACE",
        "StateDirectoryMode=0700",
        "Environment=AGENT_SANDBOX_DATA_DIR=/var/lib/agent-sandbox",
    ] {
        assert!(shipped.lines().any(|l| l == line), "the unit lost `{line}`");
    }
    let tmp = tempfile::tempdir().unwrap();
    let unit = tmp.path().join("agent-sandbox.service");
    std::fs::write(&unit, shipped.replace("/usr/local/bin/agent-sandbox", BIN)).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (Debian's systemd package) runs");
    let said =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}");
    // verify exits 0 on unknown keys and bad values, and says so: it must say nothing.
    assert!(said.trim().is_empty(), "{said}");
    // The exposure score runs 0 (hardened) to 10 (none); the threshold is in tenths.
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--threshold=30"])
        .arg(&unit)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "exposure above 3.0: {}",
        said.lines().last().unwrap_or_default()
    );
}
