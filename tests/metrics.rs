//! `GET /metrics` and a sandbox's stats against the real daemon (runc, or gVisor with
//! `AGENT_SANDBOX_TEST_RUNTIME=runsc`), and scraped by a real Prometheus (Debian's `prometheus`
//! package, started here on 127.0.0.1 with a generated configuration): the API key as bearer
//! token, no key (refused), and a server whose metrics are public; PromQL over its HTTP API must
//! find the series.

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, unique, wait_until, Server, API, TEST_IMAGE};
use serde_json::{json, Value};

const SECRET: &str = "s3cr3t-value-that-must-never-show-0f9e8d7c";

/// Creates a running sandbox whose environment holds [`SECRET`], with a file in its workspace.
fn running_sandbox(server: &Server, name: &str) {
    let body = json!({
        "apiVersion": "agent-sandbox.io/v1",
        "kind": "Sandbox",
        "metadata": {"name": name},
        "spec": {"image": TEST_IMAGE, "memoryMB": 256, "env": {"API_TOKEN": SECRET}},
    });
    let (status, out) = server.request("POST", &format!("{API}/sandboxes"), Some(&body));
    assert_eq!(status, 201, "create {name}: {out}");
    server.wait_running(name);
    let (code, _) = server.exec(
        name,
        "dd if=/dev/zero of=/workspace/blob bs=1024 count=512 2>/dev/null",
    );
    assert_eq!(code, 0);
}

fn metrics(server: &Server, key: Option<&str>) -> (u16, String) {
    http(
        "GET",
        &format!("{}/metrics", server.url),
        key,
        None,
        "text/plain",
    )
}

/// The value of the one sample `line_start` begins (`name{labels}`), if it is there.
fn sample(text: &str, line_start: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(line_start)?.trim().parse().ok())
}

#[test]
fn metrics_need_the_key_report_usage_and_hold_no_secret() {
    let server = Server::start();
    let name = unique("metrics");
    running_sandbox(&server, &name);
    // Requests carrying a wrong key, and the key inside a path, leave nothing of either behind.
    let wrong = format!("wrong-key-{}", "x".repeat(24));
    assert_eq!(metrics(&server, Some(&wrong)).0, 401);
    let (status, _) = server.request("GET", &format!("/v1/sandboxes/{}", server.key), None);
    assert_eq!(status, 404);

    assert_eq!(metrics(&server, None).0, 401, "no key, no metrics");
    let (status, text) = metrics(&server, Some(&server.key));
    assert_eq!(status, 200, "{text}");
    let running = "agent_sandbox_sandboxes{namespace=\"default\",phase=\"Running\"}";
    assert_eq!(sample(&text, running), Some(1.0), "{text}");
    let of = |series: &str| format!("{series}{{namespace=\"default\",sandbox=\"{name}\"}}");
    let memory = sample(&text, &of("agent_sandbox_sandbox_memory_bytes")).expect("memory");
    assert!(memory > 0.0, "{text}");
    assert_eq!(
        sample(&text, &of("agent_sandbox_sandbox_memory_limit_bytes")),
        Some(256.0 * 1024.0 * 1024.0)
    );
    assert!(sample(&text, &of("agent_sandbox_sandbox_pids")).expect("pids") >= 1.0);
    assert!(sample(&text, &of("agent_sandbox_sandbox_cpu_seconds_total")).expect("cpu") > 0.0);
    assert!(text.contains("agent_sandbox_reconciles_total{kind=\"Sandbox\",result=\"ok\"}"));
    assert!(text.contains("agent_sandbox_docker_call_duration_seconds_count{operation=\"create_container\",result=\"ok\"}"));
    assert!(text.contains("agent_sandbox_exec_start_duration_seconds_count 1"));
    // Requests are counted by their route template, never by their path.
    assert!(text.contains(
        "agent_sandbox_http_request_duration_seconds_count{method=\"POST\",route=\"/v1/sandboxes/{id}/exec\",code=\"200\"} 1"
    ));
    // The workspace is measured in the background: a later scrape has it.
    wait_until("the workspace is measured", Duration::from_secs(30), || {
        let (_, text) = metrics(&server, Some(&server.key));
        sample(&text, &of("agent_sandbox_sandbox_workspace_bytes"))
            .is_some_and(|bytes| bytes >= 512.0 * 1024.0)
    });

    let (_, text) = metrics(&server, Some(&server.key));
    for secret in [server.key.as_str(), SECRET, wrong.as_str()] {
        assert!(!text.contains(secret), "a secret is in the metrics");
    }
}

#[test]
fn the_server_keeps_the_last_hour_of_a_sandboxs_cpu_and_memory() {
    let server = Server::start();
    let name = unique("history");
    running_sandbox(&server, &name);
    let path = format!("{API}/sandboxes/{name}/stats/history");
    // Sampled every 15 s by the server itself, whether anyone looks or not.
    let mut history = Value::Null;
    wait_until("two samples", Duration::from_secs(60), || {
        let (status, body) = server.request("GET", &path, None);
        assert_eq!(status, 200, "{body}");
        history = body;
        history["items"].as_array().unwrap().len() >= 2
    });
    assert_eq!(history["intervalSeconds"], 15, "{history}");
    let items = history["items"].as_array().unwrap();
    for point in items {
        assert!(point["memoryBytes"].as_u64().unwrap() > 0, "{point}");
        assert_eq!(point["memoryLimitBytes"], 256 * 1024 * 1024, "{point}");
        assert!(point["cpuSeconds"].as_f64().unwrap() > 0.0, "{point}");
    }
    let at =
        |i: usize| chrono::DateTime::parse_from_rfc3339(items[i]["at"].as_str().unwrap()).unwrap();
    let gap = (at(1) - at(0)).num_milliseconds();
    assert!((10_000..=20_000).contains(&gap), "{gap} ms between samples");
    assert!(items[1]["cpuSeconds"].as_f64() >= items[0]["cpuSeconds"].as_f64());

    let (status, body) = server.request(
        "GET",
        &format!("{API}/sandboxes/no-such-sandbox/stats/history"),
        None,
    );
    assert_eq!(status, 404, "{body}");
    let (status, _) = http(
        "GET",
        &format!("{}{path}", server.url),
        None,
        None,
        "application/json",
    );
    assert_eq!(status, 401);
}

#[test]
fn stats_report_what_a_sandbox_uses() {
    let server = Server::start();
    let name = unique("stats");
    running_sandbox(&server, &name);
    let (status, stats) = server.request("GET", &format!("{API}/sandboxes/{name}/stats"), None);
    assert_eq!(status, 200, "{stats}");
    assert!(stats["cpuSeconds"].as_f64().unwrap() > 0.0, "{stats}");
    assert!(stats["memoryBytes"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["memoryLimitBytes"], 256 * 1024 * 1024, "{stats}");
    assert!(stats["pids"].as_u64().unwrap() >= 1, "{stats}");
    assert!(
        stats["workspaceBytes"].as_u64().unwrap() >= 512 * 1024,
        "{stats}"
    );
    // No network: nothing but loopback, which is not counted.
    assert_eq!(stats["netRxBytes"], 0, "{stats}");
    assert_eq!(stats["netTxBytes"], 0, "{stats}");
    assert!(stats["sampledAt"]
        .as_str()
        .unwrap()
        .parse::<chrono::DateTime<chrono::Utc>>()
        .is_ok());

    // Memory taken inside shows.
    let before = stats["memoryBytes"].as_u64().unwrap();
    let (code, _) = server.exec(
        &name,
        "dd if=/dev/zero of=/tmp/fill bs=1M count=48 2>/dev/null",
    );
    assert_eq!(code, 0);
    let (_, after) = server.request("GET", &format!("{API}/sandboxes/{name}/stats"), None);
    assert!(
        after["memoryBytes"].as_u64().unwrap() >= before + 32 * 1024 * 1024,
        "{before} then {after}"
    );

    // `top` shows the same, one table with --once (CPU needs two samples, an interval apart).
    let (code, out, err) = server.cli(&["top", "--once", "--interval", "500ms"]);
    assert_eq!(code, 0, "{err}");
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header[..5],
        ["NAME", "PHASE", "CPU", "CPU-TIME", "MEMORY"],
        "{out}"
    );
    let row: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with(&name))
        .unwrap_or_else(|| panic!("{name} is not in\n{out}"))
        .split_whitespace()
        .collect();
    assert_eq!(row[1], "Running", "{out}");
    assert!(row[2].ends_with('%') && row[4].ends_with("MiB"), "{out}");
    let (code, _, err) = server.cli(&["top", "sandbox", "nope", "--once"]);
    assert_ne!(code, 0);
    assert!(err.contains("sandbox/nope not found"), "{err}");

    let (status, _) = server.request("GET", &format!("{API}/sandboxes/nope/stats"), None);
    assert_eq!(status, 404);
    let (status, out) = server.request_raw(
        "PATCH",
        &format!("{API}/sandboxes/{name}"),
        Some(json!({"spec": {"state": "Stopped"}}).to_string()),
        "application/merge-patch+json",
    );
    assert_eq!(status, 200, "{out}");
    server.wait_for(
        "sandboxes",
        &name,
        "Stopped",
        Duration::from_secs(60),
        |r| r.is_some_and(|r| r["status"]["phase"] == "Stopped"),
    );
    let (status, out) = server.request("GET", &format!("{API}/sandboxes/{name}/stats"), None);
    assert_eq!(status, 409, "{out}");
}

/// A Prometheus server of its own, on a free port of 127.0.0.1, stopped when dropped.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(config: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let port = common::free_port();
        let binary = ["/usr/bin/prometheus", "prometheus"]
            .into_iter()
            .find(|b| !b.starts_with('/') || Path::new(b).exists())
            .unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .expect(
                "Prometheus (Debian's `prometheus` package, which .ci/run installs) must be \
                 installed for this test",
            );
        let prometheus = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        wait_until("Prometheus is ready", Duration::from_secs(60), || {
            http(
                "GET",
                &format!("{}/-/ready", prometheus.url),
                None,
                None,
                "",
            )
            .0 == 200
        });
        prometheus
    }

    /// The result vector of an instant PromQL query.
    fn query(&self, promql: &str) -> Vec<Value> {
        let encoded: String = promql
            .bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect();
        let (status, body) = http(
            "GET",
            &format!("{}/api/v1/query?query={encoded}", self.url),
            None,
            None,
            "",
        );
        assert_eq!(status, 200, "{promql}: {body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(answer["status"], "success", "{promql}: {body}");
        answer["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Waits until `promql` returns exactly `count` series; returns them.
    fn wait_for(&self, promql: &str, count: usize) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let result = self.query(promql);
            if result.len() == count {
                return result;
            }
            assert!(
                Instant::now() < deadline,
                "{promql} gave {result:?}, not {count} series"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn prometheus_scrapes_with_the_key_and_when_public() {
    let keyed = Server::start();
    let public = Server::start_with(&[("AGENT_SANDBOX_METRICS_PUBLIC", "true")]);
    let name = unique("scraped");
    running_sandbox(&keyed, &name);
    let target = |server: &Server| server.url.trim_start_matches("http://").to_string();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n\
         - job_name: keyed\n  authorization:\n    type: Bearer\n    credentials: {key}\n  \
         static_configs:\n  - targets: ['{keyed}']\n\
         - job_name: keyless\n  static_configs:\n  - targets: ['{keyed}']\n\
         - job_name: public\n  static_configs:\n  - targets: ['{public}']\n",
        key = keyed.key,
        keyed = target(&keyed),
        public = target(&public),
    );
    let prometheus = Prometheus::start(&config);

    // Scraped with the key, refused without it, and public without one.
    prometheus.wait_for("up{job=\"keyed\"} == 1", 1);
    prometheus.wait_for("up{job=\"keyless\"} == 0", 1);
    prometheus.wait_for("up{job=\"public\"} == 1", 1);

    let running = prometheus.wait_for(
        "sum by (phase) (agent_sandbox_sandboxes{job=\"keyed\",phase=\"Running\"})",
        1,
    );
    assert_eq!(running[0]["value"][1], "1", "{running:?}");
    let memory = prometheus.wait_for(
        &format!("agent_sandbox_sandbox_memory_bytes{{job=\"keyed\",sandbox=\"{name}\"}} > 0"),
        1,
    );
    assert_eq!(memory[0]["metric"]["namespace"], "default");
    prometheus.wait_for(
        &format!(
            "rate(agent_sandbox_sandbox_cpu_seconds_total{{job=\"keyed\",sandbox=\"{name}\"}}[1m]) >= 0"
        ),
        1,
    );
    prometheus.wait_for(
        "sum(agent_sandbox_reconciles_total{job=\"keyed\",kind=\"Sandbox\",result=\"ok\"}) > 0",
        1,
    );
    prometheus.wait_for(
        "histogram_quantile(0.5, sum by (le) (rate(agent_sandbox_docker_call_duration_seconds_bucket{job=\"keyed\"}[1m]))) >= 0",
        1,
    );
    // The public server has no sandbox, and says so.
    let none = prometheus.wait_for(
        "agent_sandbox_sandboxes{job=\"public\",phase=\"Running\"}",
        1,
    );
    assert_eq!(none[0]["value"][1], "0");
}

/// Posts a resource of `kind` named `name` with `spec` through the resource API.
fn post(server: &Server, plural: &str, kind: &str, name: &str, spec: Value) {
    let (status, body) = server.request(
        "POST",
        &format!("{API}/{plural}"),
        Some(&json!({"apiVersion": "agent-sandbox.io/v1", "kind": kind,
                     "metadata": {"name": name}, "spec": spec})),
    );
    assert_eq!(status, 201, "{kind} {name}: {body}");
}

#[test]
fn metrics_count_the_queue_pools_snapshots_and_process_starts() {
    let server = Server::start();
    let wait = Duration::from_secs(90);
    let pool = unique("metrics-pool");
    post(
        &server,
        "sandboxpools",
        "SandboxPool",
        &pool,
        json!({"image": TEST_IMAGE, "size": 1}),
    );
    server.wait_for("sandboxpools", &pool, "1 ready", wait, |p| {
        p.is_some_and(|p| p["status"]["readyReplicas"] == 1)
    });
    let members = |text: &str, state: &str| {
        sample(
            text,
            &format!(
                "agent_sandbox_pool_members{{namespace=\"default\",pool=\"{pool}\",state=\"{state}\"}}"
            ),
        )
    };
    let (_, text) = metrics(&server, Some(&server.key));
    assert_eq!(members(&text, "ready"), Some(1.0), "{text}");
    assert_eq!(members(&text, "claimed"), Some(0.0), "{text}");
    // Nothing waits once the pool is full and nothing changes.
    wait_until("the work queue drains", wait, || {
        let (_, text) = metrics(&server, Some(&server.key));
        sample(&text, "agent_sandbox_workqueue_depth") == Some(0.0)
    });
    assert_eq!(
        sample(&text, "agent_sandbox_process_start_duration_seconds_count"),
        Some(0.0),
        "{text}"
    );

    // A /v1 sandbox claims the pool's member.
    let (status, created) = server.request("POST", "/v1/sandboxes", Some(&json!({})));
    assert_eq!(status, 201, "{created}");
    let name = created["id"].as_str().unwrap().to_string();
    wait_until("the claim is counted", wait, || {
        let (_, text) = metrics(&server, Some(&server.key));
        members(&text, "claimed") == Some(1.0)
    });

    // A process started through the API is timed.
    let (status, p) = server.request(
        "POST",
        &format!("{API}/sandboxes/{name}/processes"),
        Some(&json!({"command": "true"})),
    );
    assert_eq!(status, 201, "{p}");
    let (_, text) = metrics(&server, Some(&server.key));
    assert_eq!(
        sample(&text, "agent_sandbox_process_start_duration_seconds_count"),
        Some(1.0),
        "{text}"
    );

    // A ready snapshot's bytes are counted.
    let snapshot_bytes = "agent_sandbox_snapshot_bytes{namespace=\"default\"}";
    assert_eq!(sample(&text, snapshot_bytes), Some(0.0), "{text}");
    let (code, _) = server.exec(
        &name,
        "dd if=/dev/urandom of=/workspace/blob bs=1024 count=256 2>/dev/null",
    );
    assert_eq!(code, 0);
    let snap = format!("{name}-snap");
    post(
        &server,
        "snapshots",
        "Snapshot",
        &snap,
        json!({"sandbox": name}),
    );
    let ready = server
        .wait_for("snapshots", &snap, "Ready", wait, |s| {
            s.is_some_and(|s| s["status"]["phase"] == "Ready")
        })
        .unwrap();
    let size = ready["status"]["sizeBytes"].as_f64().expect("sizeBytes");
    assert!(size >= 256.0 * 1024.0, "{ready}");
    let (_, text) = metrics(&server, Some(&server.key));
    assert_eq!(sample(&text, snapshot_bytes), Some(size), "{text}");
}
