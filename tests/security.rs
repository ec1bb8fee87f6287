//! The security model, proved against the real daemon: every isolation promise of SECURITY.md is
//! checked twice, once from `docker inspect` (what was asked of Docker) and once from a probe
//! inside the sandbox (what the sandboxed code actually gets). The same tests run under runc and
//! gVisor (`AGENT_SANDBOX_TEST_RUNTIME=runsc`); where gVisor shows a promise differently, the test
//! says so and proves it another way.
//!
//! Inside probes go through `/v1/sandboxes/{id}/exec`, the path users take.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Runs `script` with `/bin/sh -c` inside the sandbox through `/v1` exec; (exit code, stdout).
fn inside(server: &Server, name: &str, script: &str) -> (i64, String) {
    inside_for(server, name, script, 60)
}

fn inside_for(server: &Server, name: &str, script: &str, timeout: u64) -> (i64, String) {
    let body = json!({"command": script, "timeout_seconds": timeout});
    let (status, out) = server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
    assert_eq!(status, 200, "/v1 exec of {script:?} in {name}: {out}");
    (
        out["exit_code"].as_i64().unwrap_or(-1),
        out["stdout"].as_str().unwrap_or_default().to_string(),
    )
}

/// Starts `script` inside the sandbox without waiting for it; the exec's timeout ends it.
fn inside_background(server: &Server, name: &str, script: &str, secs: u64) {
    let (url, key, name, script) = (
        server.url.clone(),
        server.key.clone(),
        name.to_string(),
        script.to_string(),
    );
    std::thread::spawn(move || {
        let body = json!({"command": script, "timeout_seconds": secs}).to_string();
        http(
            "POST",
            &format!("{url}/v1/sandboxes/{name}/exec"),
            Some(&key),
            Some(body),
            "application/json",
        )
    });
    std::thread::sleep(Duration::from_millis(300));
}

/// Creates a sandbox through the resource API and waits for it to run.
fn create(server: &Server, name: &str, spec: Value) -> Value {
    let mut spec = spec;
    spec["image"] = json!(TEST_IMAGE);
    let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                     "metadata": {"name": name}, "spec": spec});
    let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
    assert_eq!(status, 201, "{body}");
    server.wait_running(name)
}

fn host_config(name: &str) -> Value {
    container(name).expect("container")["HostConfig"].clone()
}

fn status_field(status: &str, field: &str) -> Option<String> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
}

#[test]
fn identity_capabilities_and_privilege_gain() {
    let server = Server::start();
    let name = unique("sec-id");
    create(&server, &name, json!({}));
    let c = container(&name).unwrap();
    let host = &c["HostConfig"];

    // Inspect: what Docker was told.
    assert_eq!(c["Config"]["User"], "1000:1000");
    assert!(c["Config"]["Env"]
        .as_array()
        .unwrap()
        .contains(&json!("HOME=/workspace")));
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert!(host["CapAdd"].is_null() || host["CapAdd"] == json!([]));
    assert!(host["SecurityOpt"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o.as_str().unwrap().starts_with("no-new-privileges")));
    assert_eq!(host["Privileged"], false);
    assert_eq!(c["Config"]["Hostname"], "sandbox");

    // Inside: what the code gets.
    let (code, out) = inside(&server, &name, "id -u; id -g; echo $HOME; hostname");
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["1000", "1000", "/workspace", "sandbox"]
    );
    let (_, status) = inside(&server, &name, "cat /proc/self/status");
    for field in ["CapEff", "CapPrm", "CapBnd", "CapInh"] {
        assert_eq!(
            status_field(&status, field).as_deref(),
            Some("0000000000000000"),
            "{field}: {status}"
        );
    }
    if gvisor() {
        // gVisor's /proc/self/status has no NoNewPrivs line; the setuid probe below proves it.
        assert!(status_field(&status, "NoNewPrivs").is_none_or(|v| v == "1"));
    } else {
        assert_eq!(status_field(&status, "NoNewPrivs").as_deref(), Some("1"));
    }

    // A setuid-root binary does not raise privileges. First the positive control: the same probe
    // in a plain container (no hardening) does become root, so the probe is meaningful.
    // (gVisor here ignores setuid bits of image files even in a plain container, so the control
    // exists only under runc; the probe must fail under both.)
    let probe = r#"exec -a su /usr/local/bin/suid-busybox -c "id -u""#;
    if !gvisor() {
        let control = [
            "run",
            "--rm",
            "--user",
            "1000:1000",
            TEST_IMAGE,
            "sh",
            "-c",
            probe,
        ];
        assert_eq!(docker(&control).trim(), "0", "positive control");
    }
    let (code, out) = inside(&server, &name, &format!("{probe} 2>&1"));
    assert_ne!(code, 0, "{out}");
    assert!(!out.lines().any(|l| l.trim() == "0"), "{out}");
    assert!(out.contains("must be suid"), "{out}");
}

#[test]
fn filesystems_mounts_and_devices() {
    let server = Server::start_with(&[("AGENT_SANDBOX_TMP_SIZE_MB", "8")]);
    let name = unique("sec-fs");
    create(&server, &name, json!({}));
    let c = container(&name).unwrap();
    let host = &c["HostConfig"];

    // Root filesystem read-only; /tmp writable, bounded, nosuid, nodev.
    assert_eq!(host["ReadonlyRootfs"], true);
    let tmpfs = host["Tmpfs"]["/tmp"].as_str().unwrap();
    for opt in ["rw", "nosuid", "nodev", "size=8m"] {
        assert!(tmpfs.split(',').any(|o| o == opt), "{opt} in {tmpfs}");
    }
    let (code, out) = inside(
        &server,
        &name,
        "touch /x 2>/dev/null && echo root-writable; touch /etc/x 2>/dev/null && echo etc-writable; \
         echo hello > /tmp/f && cat /tmp/f; echo ok > /workspace/f && cat /workspace/f",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "hello\nok\n");
    let (code, out) = inside(
        &server,
        &name,
        "dd if=/dev/zero of=/tmp/big bs=1M count=16 2>/dev/null; echo rc=$?; wc -c < /tmp/big; rm /tmp/big",
    );
    assert_eq!(code, 0, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_ne!(
        lines[0], "rc=0",
        "writing 16 MiB into an 8 MiB /tmp succeeded: {out}"
    );
    let written: u64 = lines[1].trim().parse().unwrap();
    assert!(written <= 8 * 1024 * 1024, "{written} bytes landed in /tmp");

    let (_, mounts) = inside(&server, &name, "cat /proc/mounts");
    let tmp_line = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/tmp"))
        .unwrap_or_else(|| panic!("no /tmp mount: {mounts}"));
    let opts: Vec<&str> = tmp_line
        .split_whitespace()
        .nth(3)
        .unwrap()
        .split(',')
        .collect();
    assert!(opts.contains(&"rw"), "{tmp_line}");
    if gvisor() {
        // gVisor's own tmpfs lists only rw,noexec,size; nosuid/nodev are moot there (no device
        // nodes can be made, and no-new-privileges disarms setuid), and inspect shows they were
        // asked for.
        assert!(opts.contains(&"size=8m"), "{tmp_line}");
    } else {
        assert!(
            opts.contains(&"nosuid") && opts.contains(&"nodev"),
            "{tmp_line}"
        );
        assert!(opts.contains(&"size=8192k"), "{tmp_line}");
    }

    // No host mounts: from inspect, only named volumes — the workspace, and the read-only helper
    // — and, bound read-only at /etc/hosts, the hosts file inside that same helper volume (under
    // runc, where the sandbox has no Docker network sandbox to provide one).
    let mounts_inspect = c["Mounts"].as_array().unwrap();
    let helper_volume = mounts_inspect
        .iter()
        .find(|m| m["Destination"] == "/opt/agent-sandbox")
        .map(|m| m["Name"].as_str().unwrap().to_string())
        .expect("helper volume mounted");
    let helper_dir = inspect(&["--type", "volume", &helper_volume]).unwrap()["Mountpoint"]
        .as_str()
        .unwrap()
        .to_string();
    for m in mounts_inspect {
        match m["Destination"].as_str().unwrap() {
            "/workspace" => {
                assert_eq!(m["Type"], "volume", "{m}");
                assert_eq!(m["RW"], true);
                assert_eq!(m["Name"], format!("agent-sandbox-{name}-workspace"));
            }
            "/opt/agent-sandbox" => {
                assert_eq!(m["Type"], "volume", "{m}");
                assert_eq!(m["RW"], false, "{m}");
            }
            "/etc/hosts" if !gvisor() => {
                assert_eq!(m["Type"], "bind", "{m}");
                assert_eq!(m["RW"], false, "{m}");
                assert_eq!(m["Source"], format!("{helper_dir}/hosts"), "{m}");
            }
            other => panic!("unexpected mount {other}: {m}"),
        }
    }
    assert!(
        host["Binds"].is_null() || host["Binds"] == json!([]),
        "{host}"
    );
    // From inside: every mount point is the root, the two volumes, /tmp, the kernel's
    // filesystems, or one of the files Docker itself provides (hosts, hostname, resolv.conf, init).
    let allowed_files = [
        "/etc/hosts",
        "/etc/hostname",
        "/etc/resolv.conf",
        "/sbin/docker-init",
    ];
    for line in mounts.lines() {
        let point = line.split_whitespace().nth(1).unwrap();
        let ok = ["/", "/workspace", "/opt/agent-sandbox", "/tmp"].contains(&point)
            || allowed_files.contains(&point)
            || ["/proc", "/dev", "/sys"]
                .iter()
                .any(|p| point == *p || point.starts_with(&format!("{p}/")));
        assert!(ok, "unexpected mount inside the sandbox: {line}");
    }
    for point in ["/opt/agent-sandbox", "/etc/hosts"] {
        let line = mounts
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(point))
            .unwrap_or_else(|| panic!("{point} is not mounted: {mounts}"));
        let opts = line.split_whitespace().nth(3).unwrap();
        assert!(opts.split(',').any(|o| o == "ro"), "{line}");
    }
    // /etc/hosts cannot be changed, and `localhost` names a loopback that works.
    let (code, out) = inside(
        &server,
        &name,
        "echo x >> /etc/hosts 2>/dev/null && echo hosts-writable; grep -c localhost /etc/hosts; \
         nc -l -p 8001 -e echo reached-localhost & sleep 0.5; nc -w 2 localhost 8001 </dev/null; \
         kill $! 2>/dev/null; true",
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(out, "2\nreached-localhost\n");

    // Devices: nothing beyond Docker's defaults.
    assert!(
        host["Devices"].is_null() || host["Devices"] == json!([]),
        "{host}"
    );
    assert_eq!(host["Privileged"], false);
    let (_, dev) = inside(&server, &name, "ls -A /dev");
    let mut defaults: BTreeSet<&str> = [
        "null", "zero", "full", "random", "urandom", "tty", "pts", "shm", "mqueue", "ptmx", "fd",
        "stdin", "stdout", "stderr", "console", "core",
    ]
    .into();
    if gvisor() {
        // gVisor's emulated FUSE device, served by its own kernel, not the host's.
        defaults.insert("fuse");
    }
    for entry in dev.split_whitespace() {
        assert!(defaults.contains(entry), "unexpected device /dev/{entry}");
    }
    let (_, out) = inside(
        &server,
        &name,
        "echo x > /dev/kmsg 2>/dev/null && echo kmsg-writable; ls /dev/sd* /dev/nvme* /dev/mem 2>/dev/null; true",
    );
    assert_eq!(out, "", "device access: {out}");
}

#[test]
fn no_network_private_ipc_and_init() {
    let server = Server::start();
    let (a, b) = (unique("sec-ipc-a"), unique("sec-ipc-b"));
    create(&server, &a, json!({}));
    create(&server, &b, json!({}));
    let host = host_config(&a);
    assert_eq!(host["NetworkMode"], "none");
    let inspected = container(&a).unwrap();
    let nets = inspected["NetworkSettings"]["Networks"].clone();
    if gvisor() {
        // gVisor needs the loopback Docker's `none` network sandbox brings up.
        assert_eq!(
            nets.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["none"]
        );
    } else {
        // Networking disabled: not even Docker's `none` network sandbox is built.
        assert_eq!(inspected["Config"]["NetworkDisabled"], true);
        assert!(
            nets.is_null() || nets.as_object().is_some_and(|n| n.is_empty()),
            "{nets}"
        );
    }
    let (_, netdev) = inside(&server, &a, "cat /proc/net/dev");
    let ifaces: Vec<&str> = netdev
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, ["lo"], "{netdev}");

    // Private IPC: separate namespaces (runc shows them), and a POSIX shared-memory object made in
    // one sandbox is invisible in another (both runtimes).
    assert_eq!(host["IpcMode"], "private");
    assert_eq!(host_config(&b)["IpcMode"], "private");
    let (_, out) = inside(&server, &a, "echo secret > /dev/shm/marker && ls /dev/shm");
    assert_eq!(out.trim(), "marker");
    let (_, out) = inside(&server, &b, "ls -A /dev/shm");
    assert_eq!(out.trim(), "", "shared memory leaked between sandboxes");
    if !gvisor() {
        let (_, ns_a) = inside(&server, &a, "readlink /proc/self/ns/ipc");
        let (_, ns_b) = inside(&server, &b, "readlink /proc/self/ns/ipc");
        let ns_host = std::fs::read_link("/proc/self/ns/ipc").unwrap();
        assert!(ns_a.starts_with("ipc:["), "{ns_a}");
        assert_ne!(ns_a.trim(), ns_host.to_string_lossy());
        assert_ne!(ns_a, ns_b);
    }

    // An init process reaps zombies: orphans that exit after their parent are reaped.
    assert_eq!(host["Init"], true);
    let (_, cmdline) = inside(&server, &a, "tr '\\0' ' ' < /proc/1/cmdline");
    assert!(cmdline.contains("docker-init"), "PID 1 is {cmdline}");
    let (code, _) = inside(
        &server,
        &a,
        "for i in 1 2 3 4 5; do (sleep 1 &) ; done; sh -c 'sleep 1 & exit 0'; echo spawned",
    );
    assert_eq!(code, 0);
    std::thread::sleep(Duration::from_secs(3));
    let (_, zombies) = inside(
        &server,
        &a,
        "grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l",
    );
    assert_eq!(zombies.trim(), "0", "zombies remain");
}

#[test]
fn memory_limit_without_swap_kills_the_allocation_not_the_service() {
    let server = Server::start();
    let name = unique("sec-mem");
    create(&server, &name, json!({"memoryMB": 128}));
    let host = host_config(&name);
    assert_eq!(host["Memory"], 128 * 1024 * 1024);
    assert_eq!(host["MemorySwap"], host["Memory"], "swap must be off");
    if !gvisor() {
        let (_, limit) = inside(
            &server,
            &name,
            "cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null || cat /sys/fs/cgroup/memory.max",
        );
        assert_eq!(limit.trim(), (128u64 * 1024 * 1024).to_string());
    }
    // `tail` keeps the whole newline-free input in memory: 300 MiB cannot fit.
    let started = Instant::now();
    let body = json!({"command": "head -c 300m /dev/zero | tail | wc -c; echo done",
                      "timeout_seconds": 30});
    let (status, out) = server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&body));
    if status == 200 {
        // runc: the kernel killed the allocating process; its shell reports it.
        let stdout = out["stdout"].as_str().unwrap_or_default();
        assert!(
            !stdout.starts_with("314572800"),
            "allocation past the limit succeeded: {out}"
        );
        assert!(!gvisor() || out["exit_code"] != 0, "{out}");
    } else {
        // gVisor: the whole sandbox kernel was killed, and the command with it.
        assert_eq!(status, 502, "{out}");
        assert_eq!(out["error"]["code"], "backend_error", "{out}");
    }
    assert!(started.elapsed() < Duration::from_secs(40));
    // Under runc the kernel kills the allocating process; under gVisor it kills the whole sandbox
    // kernel and the controller starts the sandbox again. Either way it is usable afterwards.
    let deadline = Instant::now() + Duration::from_secs(60);
    let alive = json!({"command": "echo alive", "timeout_seconds": 10});
    loop {
        server.wait_running(&name);
        let (status, out) =
            server.request("POST", &format!("/v1/sandboxes/{name}/exec"), Some(&alive));
        if status == 200 && out["stdout"] == "alive\n" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "sandbox unusable after OOM: {status} {out}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        server.log().lines().all(|l| !l.contains("panicked")),
        "{}",
        server.log()
    );
}

fn read_u64(path: &std::path::Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Processes of the server's own `docker exec`s that may join a sandbox's cgroup while a fork
/// bomb holds it at its pids limit: one exec's runc init, helper and child, twice over.
const EXEC_JOINERS: u64 = 6;

#[test]
fn pids_limit_contains_a_fork_bomb() {
    let server = Server::start();
    let (bomb, other) = (unique("sec-bomb"), unique("sec-calm"));
    let limit = 256;
    create(&server, &bomb, json!({"pidsLimit": limit}));
    create(&server, &other, json!({}));
    let c = container(&bomb).unwrap();
    // Under gVisor the pids cgroup counts gVisor's own host threads, so the engine asks for more
    // (SECURITY.md); the bound enforced inside is the sandbox user's RLIMIT_NPROC.
    let host_limit = if gvisor() {
        agent_sandbox::docker::gvisor_pids_limit(limit)
    } else {
        limit
    };
    assert_eq!(c["HostConfig"]["PidsLimit"], host_limit);
    let id = c["Id"].as_str().unwrap().to_string();
    if !gvisor() {
        let (_, max) = inside(
            &server,
            &bomb,
            "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max",
        );
        assert_eq!(max.trim(), limit.to_string());
    }

    // Each shell forks again forever; only the pids limit stops it.
    inside_background(
        &server,
        &bomb,
        "b(){ while :; do (b &) 2>/dev/null; done; }; b",
        20,
    );
    let pids_current = cgroup_dir(&id, "pids").map(|d| d.join("pids.current"));
    let mut max_seen = 0;
    let until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < until {
        if let Some(n) = pids_current.as_deref().and_then(read_u64) {
            max_seen = max_seen.max(n);
        }
        // The rest of the service keeps answering while the bomb runs.
        let (status, _) = http("GET", &format!("{}/healthz", server.url), None, None, "");
        assert_eq!(status, 200, "server stopped answering during the fork bomb");
        let (code, out) = inside_for(&server, &other, "echo calm", 20);
        assert_eq!((code, out.as_str()), (0, "calm\n"));
        std::thread::sleep(Duration::from_millis(300));
    }
    // The pids controller refuses forks past the limit, not processes that join the cgroup: a
    // `docker exec` the server makes meanwhile (e.g. reading the listening ports) adds its few
    // processes on top of a full cgroup.
    assert!(
        max_seen <= host_limit + EXEC_JOINERS,
        "{max_seen} pids > limit {host_limit} (+{EXEC_JOINERS} for the server's own execs)"
    );
    if pids_current.is_some() && !gvisor() {
        // The bomb really ran into the limit (gVisor's kernel dies first: its own threads count).
        assert!(max_seen > limit / 2, "the bomb never grew: {max_seen}");
    }

    // Deleting the sandbox cleans the bomb up.
    let (status, _) = server.request("DELETE", &format!("{API}/sandboxes/{bomb}"), None);
    assert_eq!(
        status,
        200,
        "the deletion did not finish within its minute; server log:\n{}",
        server.log()
    );
    server.wait_gone("sandboxes", &bomb);
    // The deletion answers once the bomb's container is killed and renamed away; its removal
    // finishes in the background.
    wait_until(
        "the bomb's container is removed",
        Duration::from_secs(60),
        || containers_of(&bomb).is_empty(),
    );
    let (code, _) = inside(&server, &other, "true");
    assert_eq!(code, 0);
}

#[test]
fn cpu_limit_is_a_quota() {
    let server = Server::start();
    let name = unique("sec-cpu");
    create(&server, &name, json!({"cpus": 0.5}));
    let c = container(&name).unwrap();
    assert_eq!(c["HostConfig"]["NanoCpus"], 500_000_000);
    if !gvisor() {
        let (_, quota) = inside(
            &server,
            &name,
            "cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us /sys/fs/cgroup/cpu/cpu.cfs_period_us 2>/dev/null || cat /sys/fs/cgroup/cpu.max",
        );
        let nums: Vec<u64> = quota
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        assert_eq!(nums.len(), 2, "{quota}");
        assert_eq!(nums[0] * 2, nums[1], "quota is half the period: {quota}");
    }
    // Two busy loops (one per core) for three seconds use at most half a CPU. The usage is read
    // from the container's cgroup on the host, which gVisor's sentry also lives in.
    let id = c["Id"].as_str().unwrap();
    let Some(dir) = cgroup_dir(id, "cpuacct").or_else(|| cgroup_dir(id, "cpu")) else {
        eprintln!("note: no readable cgroup for {id}; usage not measured");
        return;
    };
    let usage = || -> Option<f64> {
        if let Some(ns) = read_u64(&dir.join("cpuacct.usage")) {
            return Some(ns as f64 / 1e9);
        }
        let stat = std::fs::read_to_string(dir.join("cpu.stat")).ok()?;
        let us: f64 = status_field(&stat.replace(' ', ":"), "usage_usec")?
            .parse()
            .ok()?;
        Some(us / 1e6)
    };
    let before = usage().expect("cpu usage");
    let started = Instant::now();
    let (code, _) = inside_for(
        &server,
        &name,
        "busy(){ end=$(( $(date +%s) + 3 )); while [ $(date +%s) -lt $end ]; do :; done; }; busy & busy; wait",
        30,
    );
    let wall = started.elapsed().as_secs_f64();
    let used = usage().expect("cpu usage") - before;
    assert_eq!(code, 0);
    let rate = used / wall;
    eprintln!("cpu: {used:.2}s over {wall:.2}s = {rate:.2} CPUs");
    assert!(
        rate <= 0.65,
        "two busy loops used {rate:.2} CPUs with cpus 0.5"
    );
    assert!(used > 0.2, "the busy loops barely ran: {used:.2}s");
}

#[test]
fn network_sandboxes_cannot_reach_each_other() {
    let net = unique("sec-net");
    let _net_guard = NetworkGuard(vec![net.clone()]);
    let server = Server::start_with(&[("AGENT_SANDBOX_NETWORK_NAME", &net)]);
    let (a, b) = (unique("sec-net-a"), unique("sec-net-b"));
    create(&server, &a, json!({"network": true}));
    create(&server, &b, json!({"network": true}));

    let network = inspect(&["--type", "network", &net]).expect("network created");
    assert_eq!(network["Driver"], "bridge");
    assert_eq!(
        network["Options"]["com.docker.network.bridge.enable_icc"], "false",
        "{network}"
    );
    let ip_of = |name: &str| -> String {
        let c = container(name).unwrap();
        assert_eq!(c["HostConfig"]["NetworkMode"], net.as_str());
        let nets = c["NetworkSettings"]["Networks"]
            .as_object()
            .unwrap()
            .clone();
        assert_eq!(nets.keys().collect::<Vec<_>>(), [&net]);
        nets[&net]["IPAddress"].as_str().unwrap().to_string()
    };
    let ip_b = ip_of(&b);
    ip_of(&a);

    inside_background(&server, &b, "nc -ll -p 8000 -e echo reached-b", 30);
    // The listener is up: the host reaches it.
    let addr: std::net::SocketAddr = format!("{ip_b}:8000").parse().unwrap();
    wait_until(
        "B's listener answers the host",
        Duration::from_secs(10),
        || {
            use std::io::Read;
            let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1))
            else {
                return false;
            };
            s.set_read_timeout(Some(Duration::from_secs(2))).ok();
            let mut got = String::new();
            let _ = s.read_to_string(&mut got);
            got.contains("reached-b")
        },
    );
    // A cannot reach it.
    let (code, out) = inside_for(
        &server,
        &a,
        &format!("nc -w 2 {ip_b} 8000 </dev/null 2>&1; echo rc=$?"),
        20,
    );
    assert_eq!(code, 0);
    assert!(!out.contains("reached-b"), "A reached B: {out}");
    assert!(!out.contains("rc=0"), "A connected to B: {out}");
    // A reaches its own listener on loopback.
    let (_, out) = inside_for(
        &server,
        &a,
        "nc -ll -p 9000 -e echo reached-self >/dev/null 2>&1 & sleep 0.5; nc -w 2 127.0.0.1 9000 </dev/null; kill $! 2>/dev/null; true",
        20,
    );
    assert!(out.contains("reached-self"), "{out}");
    drop(server);
}

#[test]
fn the_api_and_manifests_cannot_weaken_the_sandbox() {
    let server = Server::start();
    let forbidden: [(&str, Value); 8] = [
        ("privileged", json!(true)),
        ("capabilities", json!({"add": ["SYS_ADMIN"]})),
        ("capAdd", json!(["ALL"])),
        ("binds", json!(["/:/host"])),
        ("volumes", json!(["/etc:/etc"])),
        ("user", json!("0:0")),
        ("devices", json!(["/dev/sda"])),
        (
            "securityContext",
            json!({"privileged": true, "runAsUser": 0}),
        ),
    ];
    for (i, (field, value)) in forbidden.iter().enumerate() {
        let name = format!("{}-{i}", unique("sec-weak"));
        // Resource API, in the spec and at the top of the document.
        let mut spec = json!({"image": TEST_IMAGE});
        spec[*field] = value.clone();
        let doc = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                         "metadata": {"name": name}, "spec": spec});
        let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&doc));
        assert_eq!(status, 422, "spec.{field}: {body}");
        assert_eq!(body["error"]["code"], "validation_error", "{body}");
        let mut top = json!({"apiVersion": "agent-sandbox.io/v1", "kind": "Sandbox",
                             "metadata": {"name": name}, "spec": {"image": TEST_IMAGE}});
        top[*field] = value.clone();
        let (status, body) = server.request("POST", &format!("{API}/sandboxes"), Some(&top));
        assert_eq!(status, 422, "top-level {field}: {body}");
        // /v1.
        let mut create = json!({"image": TEST_IMAGE});
        create[*field] = value.clone();
        let (status, body) = server.request("POST", "/v1/sandboxes", Some(&create));
        assert_eq!(status, 422, "/v1 {field}: {body}");
        // A folder.
        write_manifest(
            &server.watch_dir,
            &format!("weak-{i}.yaml"),
            &format!("{}  {field}: {value}\n", sandbox_manifest(&name, "")),
        );
        assert!(server.get("sandboxes", &name).is_none());
    }
    wait_until(
        "every weakening manifest is reported",
        Duration::from_secs(15),
        || {
            let (_, errors) = server.request("GET", &format!("{API}/errors"), None);
            let errors = errors["errors"].as_array().cloned().unwrap_or_default();
            (0..forbidden.len()).all(|i| {
                errors.iter().any(|e| {
                    e["file"]
                        .as_str()
                        .is_some_and(|f| f.ends_with(&format!("weak-{i}.yaml")))
                })
            })
        },
    );
    std::thread::sleep(Duration::from_secs(1));
    let (_, list) = server.request("GET", &format!("{API}/sandboxes"), None);
    assert_eq!(list["items"], json!([]), "{list}");
    let (_, list) = server.request("GET", "/v1/sandboxes", None);
    assert_eq!(list["sandboxes"], json!([]), "{list}");
    let server_id = std::fs::read_to_string(server.data_dir.join("server-id")).unwrap();
    let ours = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=io.agent-sandbox.server={}", server_id.trim()),
        "--filter",
        "label=io.agent-sandbox.id",
    ]);
    assert_eq!(ours.trim(), "", "containers were created");
}
