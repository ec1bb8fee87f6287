//! Shared harness for integration tests: runs the real `agent-sandbox` binary against the real
//! Docker daemon with its own data directory, port and server identity, and cleans up every Docker
//! object it created, even when a test fails.

#![allow(dead_code)]

pub mod archive;
pub mod cow;
pub mod routed;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub const TEST_IMAGE: &str = "agent-sandbox-test/busybox:latest";
pub const API: &str = "/apis/agent-sandbox.io/v1";
/// The optional image with Python and bash (`scripts/build-test-images.sh --python`).
pub const PYTHON_IMAGE: &str = "agent-sandbox-test/python:latest";

/// A unique, valid resource-name prefix for one test.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:08x}", rand::random::<u32>())
}

/// The runtime integration tests run under (`AGENT_SANDBOX_TEST_RUNTIME=runsc` for gVisor).
pub fn test_runtime() -> String {
    std::env::var("AGENT_SANDBOX_TEST_RUNTIME").unwrap_or_default()
}

/// Whether the tests run under gVisor (`runsc`, or a `runsc-…` variant registered beside it).
pub fn gvisor() -> bool {
    agent_sandbox::docker::is_gvisor(&test_runtime())
}

pub struct Server {
    child: Option<Child>,
    pub url: String,
    pub key: String,
    pub data_dir: PathBuf,
    pub watch_dir: PathBuf,
    _tmp: tempfile::TempDir,
    port: u16,
    extra_env: Vec<(String, String)>,
    pub log_path: PathBuf,
}

impl Server {
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// Starts a server with extra `AGENT_SANDBOX_*` settings.
    pub fn start_with(env: &[(&str, &str)]) -> Server {
        let tmp = tempfile::tempdir().expect("temp dir");
        let data_dir = tmp.path().join("data");
        let watch_dir = tmp.path().join("gitops");
        std::fs::create_dir_all(&watch_dir).unwrap();
        let mut server = Server {
            child: None,
            url: String::new(),
            key: format!("test-key-{:032x}", rand::random::<u128>()),
            data_dir,
            watch_dir,
            log_path: tmp.path().join("server.log"),
            _tmp: tmp,
            // The kernel's choice on the first start, read back from the ready line: a port picked
            // here and passed on could be taken by another test's server in between, whose
            // answers would then look like this one's (401 to this server's key).
            port: 0,
            extra_env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let log_start = std::fs::metadata(&self.log_path).map_or(0, |m| m.len());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
        cmd.arg("serve")
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("AGENT_SANDBOX_PORT", self.port.to_string())
            .env("AGENT_SANDBOX_DATA_DIR", &self.data_dir)
            .env("AGENT_SANDBOX_WATCH_DIRS", &self.watch_dir)
            .env("AGENT_SANDBOX_API_KEYS", &self.key)
            .env("AGENT_SANDBOX_DEFAULT_IMAGE", TEST_IMAGE)
            .env("AGENT_SANDBOX_DOCKER_RUNTIME", test_runtime())
            .env("AGENT_SANDBOX_REAP_INTERVAL_SECONDS", "0.5")
            .env("AGENT_SANDBOX_LOG", "info,agent_sandbox=debug")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        if let Ok(host) = std::env::var("DOCKER_HOST") {
            cmd.env("DOCKER_HOST", host);
        }
        for (k, v) in &self.extra_env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("start agent-sandbox"));
        if self.port == 0 {
            self.port = self.bound_port(log_start, Duration::from_secs(30));
            self.url = format!("http://127.0.0.1:{}", self.port);
        }
        self.wait_healthy(Duration::from_secs(30));
    }

    /// The port in the ready line this start printed (the log past `log_start`).
    fn bound_port(&mut self, log_start: u64, limit: Duration) -> u16 {
        const READY: &str = " ready at http://127.0.0.1:";
        let deadline = Instant::now() + limit;
        loop {
            let log = std::fs::read(&self.log_path).unwrap_or_default();
            let new = String::from_utf8_lossy(log.get(log_start as usize..).unwrap_or_default());
            if let Some(at) = new.find(READY) {
                let digits: String = new[at + READY.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                if let Ok(port) = digits.parse() {
                    return port;
                }
            }
            self.still_starting(deadline, "no ready line");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Panics with the log when the server exited, or when `deadline` passed with `what`.
    fn still_starting(&mut self, deadline: Instant, what: &str) {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("server exited with {status}:\n{}", self.log());
            }
        }
        assert!(Instant::now() < deadline, "{what} in time:\n{}", self.log());
    }

    pub fn wait_healthy(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(resp) = ureq_get(&format!("{}/healthz", self.url), None) {
                if resp.0 == 200 {
                    return;
                }
            }
            self.still_starting(deadline, "server not healthy");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// SIGKILL, no cleanup: what a crash looks like.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// SIGTERM and wait for a graceful exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut child = self.child.take().expect("running");
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no graceful exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let (status, text) = http(
            method,
            &format!("{}{}", self.url, path),
            Some(&self.key),
            body.map(|b| b.to_string()),
            "application/json",
        );
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, value)
    }

    /// Runs `command` in sandbox `name` through `/v1` exec (which gives it the sandbox's env, as
    /// a plain `docker exec` would not); returns the exit code and stdout.
    pub fn exec(&self, name: &str, command: &str) -> (i64, String) {
        let body = serde_json::json!({ "command": command });
        let (status, out) =
            self.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
        assert_eq!(status, 200, "/v1 exec of {command:?} in {name}: {out}");
        (
            out["exit_code"].as_i64().unwrap_or(-1),
            out["stdout"].as_str().unwrap_or_default().to_string(),
        )
    }

    pub fn request_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        content_type: &str,
    ) -> (u16, String) {
        http(
            method,
            &format!("{}{}", self.url, path),
            Some(&self.key),
            body,
            content_type,
        )
    }

    /// Runs the command-line client against this server, with stdout and stderr piped (no
    /// terminal); returns (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
            .args(args)
            .env_clear()
            .env("AGENT_SANDBOX_URL", &self.url)
            .env("AGENT_SANDBOX_API_KEY", &self.key)
            .output()
            .expect("run agent-sandbox");
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    /// The resource of key `name` (`team-a.web` is `web` in namespace `team-a`).
    pub fn get(&self, kind_plural: &str, name: &str) -> Option<Value> {
        let (status, body) = self.request("GET", &object_path(kind_plural, name), None);
        (status == 200).then_some(body)
    }

    /// Polls until `check` holds for the resource, or panics with the last state and server log.
    pub fn wait_for(
        &self,
        kind_plural: &str,
        name: &str,
        what: &str,
        limit: Duration,
        check: impl Fn(Option<&Value>) -> bool,
    ) -> Option<Value> {
        let deadline = Instant::now() + limit;
        loop {
            let current = self.get(kind_plural, name);
            if check(current.as_ref()) {
                return current;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {kind_plural}/{name} to be {what}; last: {current:#?}\nserver log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until sandbox `name` is Running at exactly `generation`.
    pub fn wait_running_at(&self, name: &str, generation: u64, limit: Duration) -> Value {
        let what = format!("Running at generation {generation}");
        self.wait_for("sandboxes", name, &what, limit, |r| {
            r.is_some_and(|r| {
                r["status"]["observedGeneration"] == generation && r["status"]["phase"] == "Running"
            })
        })
        .unwrap()
    }

    pub fn wait_running(&self, name: &str) -> Value {
        self.wait_for("sandboxes", name, "Running", Duration::from_secs(60), |r| {
            r.is_some_and(|r| {
                r["status"]["phase"] == "Running"
                    && r["status"]["observedGeneration"] == r["metadata"]["generation"]
            })
        })
        .unwrap()
    }

    pub fn wait_gone(&self, kind_plural: &str, name: &str) {
        self.wait_for(kind_plural, name, "gone", Duration::from_secs(60), |r| {
            r.is_none()
        });
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
        // Remove what this server's sandboxes left, matched by the data directory's manifests and
        // state: every sandbox name the server knew.
        let mut names = Vec::new();
        for dir in ["manifests/sandboxes", "state/sandboxes"] {
            if let Ok(entries) = std::fs::read_dir(self.data_dir.join(dir)) {
                for e in entries.flatten() {
                    let n = e.file_name().to_string_lossy().to_string();
                    if let Some(stem) = n.strip_suffix(".yaml").or_else(|| n.strip_suffix(".json"))
                    {
                        names.push(stem.to_string());
                    }
                }
            }
        }
        for name in &names {
            cleanup_sandbox_objects(name);
        }
        // Then everything else labeled with this server's identity (warm-pool members, claimed
        // workspaces), and workspaces named after its sandboxes whatever their labels.
        if let Ok(id) = std::fs::read_to_string(self.data_dir.join("server-id")) {
            let filter = format!("label=io.agent-sandbox.server={}", id.trim());
            for c in docker(&["ps", "-aq", "--filter", &filter]).split_whitespace() {
                let _ = docker_status(&["rm", "-f", c]);
            }
            // Views the killed server mounted itself (a warm member's, over its volume's
            // directory) are not Docker's to take away: Docker would fail to remove the volume.
            unmount_views_of(&self.data_dir);
            for v in docker(&["volume", "ls", "-q", "--filter", &filter]).split_whitespace() {
                let _ = docker_status(&["volume", "rm", "-f", v]);
            }
            // Its heartbeat (see `gc`).
            let filter = format!("label=io.agent-sandbox.heartbeat={}", id.trim());
            for v in docker(&["volume", "ls", "-q", "--filter", &filter]).split_whitespace() {
                let _ = docker_status(&["volume", "rm", "-f", v]);
            }
        }
        for name in &names {
            let _ = docker_status(&[
                "volume",
                "rm",
                "-f",
                &format!("agent-sandbox-{name}-workspace"),
            ]);
        }
        // The file systems of its disk-limited workspaces (`spec.diskMB`), mounted on this host:
        // unmounted (which releases their loop devices) before the directory goes.
        if let Ok(entries) = std::fs::read_dir(self.data_dir.join("disks")) {
            for entry in entries.flatten() {
                if entry.path().is_dir() {
                    let _ = Command::new("umount").arg(entry.path()).status();
                }
            }
        }
    }
}

/// Lazily unmounts every overlay whose layers live in `data_dir`'s `views/` (what is left
/// mounted once the server is killed and its containers are gone).
pub fn unmount_views_of(data_dir: &Path) {
    let views = format!("{}/views/", data_dir.display());
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in table.lines().filter(|line| line.contains(&views)) {
        if let Some(point) = line.split(' ').nth(4) {
            let _ = Command::new("umount").args(["-l", point]).status();
        }
    }
}

/// The resource API path of the object of key `key`: namespaced when the key names a namespace.
pub fn object_path(kind_plural: &str, key: &str) -> String {
    match key.split_once('.') {
        Some((namespace, name)) => format!("{API}/namespaces/{namespace}/{kind_plural}/{name}"),
        None => format!("{API}/{kind_plural}/{key}"),
    }
}

/// Removes containers and volumes labeled with this sandbox name.
pub fn cleanup_sandbox_objects(name: &str) {
    let filter = format!("label=io.agent-sandbox.id={name}");
    let ids = docker(&["ps", "-aq", "--filter", &filter]);
    for id in ids.split_whitespace() {
        let _ = docker_status(&["rm", "-f", id]);
    }
    let vols = docker(&["volume", "ls", "-q", "--filter", &filter]);
    for v in vols.split_whitespace() {
        let _ = docker_status(&["volume", "rm", "-f", v]);
    }
}

pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI");
    String::from_utf8_lossy(&out.stdout).to_string()
}

pub fn docker_status(args: &[&str]) -> bool {
    Command::new("docker")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether the optional Python image is there for the part of a test that needs it. Without it
/// that part is skipped, saying so, unless `AGENT_SANDBOX_REQUIRE_PYTHON_IMAGE=1` (set by
/// `scripts/test-all.sh`, which builds it): then a missing image fails the test instead of
/// letting it pass without having run.
pub fn python_image(what: &str) -> bool {
    if docker_status(&["image", "inspect", PYTHON_IMAGE]) {
        return true;
    }
    let hint = "scripts/build-test-images.sh --python builds it";
    assert!(
        std::env::var("AGENT_SANDBOX_REQUIRE_PYTHON_IMAGE").as_deref() != Ok("1"),
        "{PYTHON_IMAGE} is missing and AGENT_SANDBOX_REQUIRE_PYTHON_IMAGE=1: {what} cannot run ({hint})"
    );
    eprintln!("{PYTHON_IMAGE} is missing ({hint}): {what} skipped");
    false
}

/// `docker inspect` of one object as JSON, or `None` when it does not exist.
pub fn inspect(args: &[&str]) -> Option<Value> {
    let mut full = vec!["inspect"];
    full.extend_from_slice(args);
    let out = Command::new("docker").args(&full).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let value: Value = serde_json::from_slice(&out.stdout).ok()?;
    value.as_array()?.first().cloned()
}

pub fn container(name: &str) -> Option<Value> {
    inspect(&["--type", "container", &format!("agent-sandbox-{name}")])
}

/// Sandbox `name`'s container, waited for up to 10 s: a claimed pool member takes the sandbox's
/// name on a task of its own right after the claim is recorded (controller/naming.rs), so on a
/// loaded machine an inspect right after the API's answer can come first.
pub fn named_container(name: &str) -> Value {
    let mut found = None;
    wait_until(
        "the container named after the sandbox",
        Duration::from_secs(10),
        || {
            found = container(name);
            found.is_some()
        },
    );
    found.expect("the sandbox's container")
}

/// The docker volume mounted at sandbox `name`'s `/workspace`, and its driver options.
pub fn workspace_volume(name: &str) -> (String, Value) {
    let inspected = named_container(name);
    let volume = inspected["Mounts"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["Destination"] == "/workspace"))
        .and_then(|m| m["Name"].as_str())
        .expect("a volume at /workspace")
        .to_string();
    let inspected = inspect(&["--type", "volume", &volume]).expect("the workspace volume");
    (volume, inspected["Options"].clone())
}

/// Runs a command in the sandbox's container as the sandbox user, returning (exit code, stdout).
pub fn docker_exec(name: &str, script: &str) -> (i32, String) {
    let out = Command::new("docker")
        .args([
            "exec",
            "-u",
            "1000:1000",
            &format!("agent-sandbox-{name}"),
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("docker exec");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

/// Removes Docker networks a test made (a server's own, and its `-egress` twin) when dropped.
pub struct NetworkGuard(pub Vec<String>);

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        for name in &self.0 {
            remove_network(name);
        }
    }
}

/// Removes a Docker network a test made, and the server's firewall guard rules that name its
/// bridge (they would outlive it on the host).
pub fn remove_network(name: &str) {
    if let Some(id) =
        inspect(&["--type", "network", name]).and_then(|n| n["Id"].as_str().map(String::from))
    {
        let bridge = format!("br-{}", &id[..12]);
        for chain in ["INPUT", "DOCKER-USER"] {
            let Ok(out) = Command::new("iptables").args(["-S", chain]).output() else {
                continue;
            };
            for rule in String::from_utf8_lossy(&out.stdout).lines() {
                if rule.contains(&bridge) && rule.contains("agent-sandbox open network guard") {
                    let delete = format!("iptables -w {}", rule.replacen("-A ", "-D ", 1));
                    let _ = Command::new("sh").args(["-c", &delete]).status();
                }
            }
        }
    }
    let _ = docker_status(&["network", "rm", name]);
}

/// Runs `script` as root in the sandbox's container (without capabilities, as the server's own
/// execs do); fails the test unless it succeeds, and answers its stdout.
pub fn as_root(name: &str, script: &str) -> String {
    let out = Command::new("docker")
        .args([
            "exec",
            "-u",
            "0",
            &format!("agent-sandbox-{name}"),
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("docker exec");
    assert!(out.status.success(), "{script}: {out:?}");
    String::from_utf8_lossy(&out.stdout).to_string()
}

/// The files of the server's snapshot directory, sorted (stored snapshots and temp files).
pub fn snapshot_files(server: &Server) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(server.data_dir.join("snapshots"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Managed containers carrying `io.agent-sandbox.id=<name>`.
pub fn containers_of(name: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=io.agent-sandbox.id={name}"),
    ])
    .split_whitespace()
    .map(String::from)
    .collect()
}

pub fn volumes_of(name: &str) -> Vec<String> {
    docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=io.agent-sandbox.id={name}"),
    ])
    .split_whitespace()
    .map(String::from)
    .collect()
}

pub fn write_manifest(dir: &Path, file: &str, text: &str) {
    let path = dir.join(file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let tmp = dir.join(format!(".{}.tmp", file.replace('/', "_")));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, &path).unwrap();
}

pub fn sandbox_manifest(name: &str, extra_spec: &str) -> String {
    format!(
        "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\nspec:\n  image: {TEST_IMAGE}\n{extra_spec}"
    )
}

pub fn wait_until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ureq_get(url: &str, key: Option<&str>) -> Result<(u16, String), String> {
    let (status, body) = http("GET", url, key, None, "application/json");
    if status == 0 {
        Err(body)
    } else {
        Ok((status, body))
    }
}

/// A minimal blocking HTTP/1.1 client over std, so tests need no async runtime. Returns status 0
/// and the error text when the connection fails.
pub fn http(
    method: &str,
    url: &str,
    key: Option<&str>,
    body: Option<String>,
    content_type: &str,
) -> (u16, String) {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("http url");
    let (host, path) = rest
        .split_once('/')
        .map(|(h, p)| (h, format!("/{p}")))
        .unwrap_or((rest, "/".into()));
    let mut stream = match std::net::TcpStream::connect(host) {
        Ok(s) => s,
        Err(e) => return (0, e.to_string()),
    };
    stream.set_read_timeout(Some(Duration::from_secs(120))).ok();
    let body = body.unwrap_or_default();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    if !body.is_empty() {
        req.push_str(&format!("Content-Type: {content_type}\r\n"));
    }
    if let Some(key) = key {
        req.push_str(&format!("Authorization: Bearer {key}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(&body);
    if let Err(e) = stream.write_all(req.as_bytes()) {
        return (0, e.to_string());
    }
    let mut raw = Vec::new();
    if let Err(e) = stream.read_to_end(&mut raw) {
        if raw.is_empty() {
            return (0, e.to_string());
        }
    }
    let text = String::from_utf8_lossy(&raw).to_string();
    let Some((head, rest)) = text.split_once("\r\n\r\n") else {
        return (0, text);
    };
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// A Docker daemon stopped by [`stop_dockerd`], with what it takes to start it again the same way
/// (there is no service manager to ask).
pub struct StoppedDockerd {
    args: Vec<String>,
    env: Vec<String>,
}

/// Stops dockerd with SIGTERM and waits until it is gone, keeping its command line and
/// environment for [`StoppedDockerd::start`]. Only for the tests gated on
/// `AGENT_SANDBOX_TEST_DOCKER_RESTART`.
pub fn stop_dockerd() -> StoppedDockerd {
    let pid: i32 = std::fs::read_to_string("/var/run/docker.pid")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let split = |b: Vec<u8>| -> Vec<String> {
        b.split(|c| *c == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).to_string())
            .collect()
    };
    let args = split(std::fs::read(format!("/proc/{pid}/cmdline")).unwrap());
    let env = split(std::fs::read(format!("/proc/{pid}/environ")).unwrap());
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    wait_until("dockerd stopped", Duration::from_secs(60), || {
        !Path::new(&format!("/proc/{pid}")).exists()
    });
    StoppedDockerd { args, env }
}

impl StoppedDockerd {
    /// Starts the daemon again with the stopped one's command line and environment, logging to
    /// `/var/log/dockerd.log`; returns once `docker info` answers.
    pub fn start(self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open("/var/log/dockerd.log")
            .unwrap();
        let mut cmd = Command::new(&self.args[0]);
        cmd.args(&self.args[1..]).env_clear();
        for kv in &self.env {
            if let Some((k, v)) = kv.split_once('=') {
                cmd.env(k, v);
            }
        }
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
        // The daemon outlives the test, as the one it replaced did: never waited for.
        #[allow(clippy::zombie_processes)]
        let _daemon = cmd
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        wait_until("docker answers again", Duration::from_secs(120), || {
            Command::new("docker")
                .arg("info")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        });
    }
}

/// A byte-exact HTTP/1.1 exchange (the shared helper speaks text only).
pub fn http_bytes(server: &Server, method: &str, path: &str, body: &[u8]) -> (u16, Vec<u8>) {
    let host = server.url.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(120)))
        .unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAuthorization: Bearer {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        server.key,
        body.len()
    );
    // A server that refuses early may close before the whole body is sent.
    use std::io::{Read, Write};
    let _ = stream
        .write_all(head.as_bytes())
        .and_then(|_| stream.write_all(body));
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let mut rest = &raw[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return (status, rest.to_vec());
    }
    let mut out = Vec::new();
    loop {
        let line_end = rest.windows(2).position(|w| w == b"\r\n").unwrap();
        let size =
            usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap().trim(), 16)
                .unwrap();
        if size == 0 {
            return (status, out);
        }
        out.extend_from_slice(&rest[line_end + 2..line_end + 2 + size]);
        rest = &rest[line_end + 2 + size + 2..];
    }
}

/// A snapshot tar the restore path must refuse: a benign file first, so that a partial restore
/// would show, then a setuid file named `suid-tool`.
pub fn benign_then_setuid_tar() -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut benign = tar::Header::new_gnu();
    benign.set_entry_type(tar::EntryType::Regular);
    benign.set_mode(0o644);
    benign.set_size(6);
    builder
        .append_data(&mut benign, "benign", &b"benign"[..])
        .unwrap();
    let mut evil = tar::Header::new_gnu();
    evil.set_entry_type(tar::EntryType::Regular);
    evil.set_mode(0o4755);
    evil.set_size(4);
    builder
        .append_data(&mut evil, "suid-tool", &b"evil"[..])
        .unwrap();
    builder.into_inner().unwrap()
}

/// Creates a resource of `kind` through the resource API and expects 201.
pub fn create(server: &Server, plural: &str, kind: &str, name: &str, spec: Value) {
    let body = serde_json::json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    });
    let (status, answer) = server.request("POST", &format!("{API}/{plural}"), Some(&body));
    assert_eq!(status, 201, "{answer}");
}

/// The container's host-side cgroup directory for `controller` (cgroup v1 or v2).
pub fn cgroup_dir(id: &str, controller: &str) -> Option<std::path::PathBuf> {
    [
        format!("/sys/fs/cgroup/{controller}/docker/{id}"),
        format!("/sys/fs/cgroup/system.slice/docker-{id}.scope"),
        format!("/sys/fs/cgroup/docker/{id}"),
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.is_dir())
}

/// Whether host process `pid` is dead (gone, or a zombie its parent has yet to reap).
pub fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z') || rest.starts_with('X')),
    }
}

/// When sandbox `name`'s container last started, as Docker says: a change means it restarted.
pub fn started_at(name: &str) -> String {
    container(name).expect("container")["State"]["StartedAt"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}
