//! The kubectl-style CLI end to end: the real `agent-sandbox` binary as a client of a real server
//! on the real Docker daemon. Every test runs its own server and names its resources uniquely; the
//! harness removes whatever containers and volumes they leave.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{container, unique, Server, TEST_IMAGE};
use serde_json::Value;

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn command(server: &Server, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
    cmd.args(args)
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key);
    cmd
}

fn run_with(mut cmd: Command, stdin: Option<&[u8]>) -> Run {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("run agent-sandbox");
    {
        let mut input = child.stdin.take().unwrap();
        if let Some(bytes) = stdin {
            input.write_all(bytes).unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn cli(server: &Server, args: &[&str]) -> Run {
    run_with(command(server, args), None)
}

/// Runs and insists on exit status 0.
fn ok(server: &Server, args: &[&str]) -> String {
    let r = cli(server, args);
    assert_eq!(
        r.code,
        0,
        "agent-sandbox {args:?} failed:\nstdout: {}\nstderr: {}\nserver log:\n{}",
        r.stdout,
        r.stderr,
        server.log()
    );
    r.stdout
}

fn sandbox_doc(name: &str, extra: &str) -> String {
    format!(
        "apiVersion: agent-sandbox.io/v1\nkind: Sandbox\nmetadata:\n  name: {name}\n  labels: {{suite: cli}}\nspec:\n  image: {TEST_IMAGE}\n  ttlSeconds: 900\n{extra}"
    )
}

fn write(path: &Path, text: &str) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    std::fs::write(path, text).unwrap();
}

/// Applies one sandbox and waits for it with the CLI's own `wait`.
fn running_sandbox(server: &Server, dir: &Path, name: &str) {
    let file = dir.join(format!("{name}.yaml"));
    write(&file, &sandbox_doc(name, ""));
    ok(server, &["apply", "-f", file.to_str().unwrap()]);
    ok(
        server,
        &[
            "wait",
            &format!("sandbox/{name}"),
            "--for=condition=Ready",
            "--timeout=90s",
        ],
    );
}

#[test]
fn apply_get_diff_and_delete_a_folder() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let a = unique("cli-a");
    let b = unique("cli-b");
    // A folder with a nested file holding two documents, and a file that is not a manifest.
    write(&dir.path().join("1.yaml"), &sandbox_doc(&a, "  cpus: 1\n"));
    write(
        &dir.path().join("2/more.yml"),
        &format!(
            "# two in one\n{}---\napiVersion: agent-sandbox.io/v1\nkind: Fork\nmetadata:\n  name: {b}\nspec:\n  snapshot: nothing-yet\n  replicas: 1\n",
            sandbox_doc(&b, "")
        ),
    );
    write(&dir.path().join("README.md"), "# not a manifest\n");
    let folder = dir.path().to_str().unwrap();

    // A new resource is "created" in a diff, and a diff with differences exits 1.
    let d = cli(&server, &["diff", "-f", folder]);
    assert_eq!(d.code, 1, "{}{}", d.stdout, d.stderr);
    assert!(
        d.stdout.contains(&format!("sandbox/{a}: created")),
        "{}",
        d.stdout
    );

    let out = ok(&server, &["apply", "-f", folder]);
    assert_eq!(
        out,
        format!("sandbox/{a} created\nsandbox/{b} created\nfork/{b} created\n")
    );
    let out = ok(&server, &["apply", "-f", folder]);
    assert_eq!(
        out,
        format!("sandbox/{a} unchanged\nsandbox/{b} unchanged\nfork/{b} unchanged\n")
    );
    let d = cli(&server, &["diff", "-f", folder]);
    assert_eq!((d.code, d.stdout.as_str()), (0, ""), "{}", d.stderr);

    for name in [&a, &b] {
        ok(
            &server,
            &[
                "wait",
                &format!("sandbox/{name}"),
                "--for=condition=Ready",
                "--timeout=90s",
            ],
        );
    }

    // The table: headers, one aligned row per sandbox.
    let table = ok(&server, &["get", "sandboxes"]);
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAME"), "{table}");
    for col in ["PHASE", "IMAGE", "AGE", "EXPIRES"] {
        assert!(lines[0].contains(col), "{table}");
    }
    let row = lines.iter().find(|l| l.starts_with(&a)).expect("row of a");
    assert!(
        row.contains("Running") && row.contains(TEST_IMAGE),
        "{table}"
    );
    let phase_at = lines[0].find("PHASE").unwrap();
    assert_eq!(
        &row[phase_at..phase_at + 7],
        "Running",
        "columns align:\n{table}"
    );

    // JSON is the server's list; YAML of one resource is a document `apply` takes back.
    let json: Value =
        serde_json::from_str(&ok(&server, &["get", "sandboxes", "-o", "json"])).unwrap();
    let names: Vec<&str> = json["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&a.as_str()) && names.contains(&b.as_str()),
        "{json}"
    );
    let one: Value = serde_json::from_str(&ok(
        &server,
        &["get", &format!("sandbox/{a}"), "-o", "json"],
    ))
    .unwrap();
    assert_eq!(one["spec"]["cpus"], 1.0);
    let yaml = ok(&server, &["get", "sandbox", &a, "-o", "yaml"]);
    let again = run_with(
        command(&server, &["apply", "-f", "-"]),
        Some(yaml.as_bytes()),
    );
    assert_eq!(
        again.stdout,
        format!("sandbox/{a} unchanged\n"),
        "{}",
        again.stderr
    );

    // Limits and env change in place; the root filesystem mode replaces the container but keeps
    // /workspace.
    write(&dir.path().join("1.yaml"), &sandbox_doc(&a, "  cpus: 2\n"));
    let d = cli(&server, &["diff", "-f", folder]);
    assert_eq!(d.code, 1, "{}", d.stderr);
    assert!(
        d.stdout
            .contains(&format!("sandbox/{a}: configured; in place")),
        "{}",
        d.stdout
    );
    assert!(
        d.stdout.contains("spec.cpus") && d.stdout.contains("1.0 -> 2.0"),
        "{}",
        d.stdout
    );
    assert!(
        !d.stdout.contains(&format!("sandbox/{b}")),
        "unchanged ones are not listed: {}",
        d.stdout
    );

    write(
        &dir.path().join("1.yaml"),
        &sandbox_doc(
            &a,
            "  cpus: 2\n  readOnlyRootfs: false\n  env: {MODE: test}\n",
        ),
    );
    let d = cli(&server, &["diff", "-f", folder]);
    assert_eq!(d.code, 1, "{}", d.stderr);
    assert!(
        d.stdout.contains(
            "replaces the container: state outside /workspace is lost, /workspace is kept"
        ),
        "{}",
        d.stdout
    );
    let env_line = d
        .stdout
        .lines()
        .find(|l| l.contains("spec.env.MODE"))
        .unwrap();
    assert!(
        env_line.contains("<unset> -> \"test\"") && env_line.contains("in place"),
        "{env_line}"
    );
    let rootfs_line = d
        .stdout
        .lines()
        .find(|l| l.contains("spec.readOnlyRootfs"))
        .unwrap();
    assert!(
        rootfs_line.contains("replaces the container"),
        "{rootfs_line}"
    );
    // A change of an immutable field would be refused: diff says so and exits 2.
    write(
        &dir.path().join("1.yaml"),
        &sandbox_doc(
            &a,
            "  cpus: 2\n  source: {snapshot: snap_0000000000000000}\n",
        ),
    );
    let d = cli(&server, &["diff", "-f", folder]);
    assert_eq!(d.code, 2, "{}", d.stdout);
    assert!(
        d.stderr.contains("spec.source: field is immutable"),
        "{}",
        d.stderr
    );
    write(&dir.path().join("1.yaml"), &sandbox_doc(&a, "  cpus: 2\n"));

    // A document the server would refuse is an error: exit 2, with the file and line.
    let bad = dir.path().join("bad/bad.yaml");
    write(&bad, &sandbox_doc("bad-one", "  memoryMB: 1\n"));
    let d = cli(&server, &["diff", "-f", bad.to_str().unwrap()]);
    assert_eq!(d.code, 2, "{}{}", d.stdout, d.stderr);
    assert!(
        d.stderr.contains("bad.yaml:") && d.stderr.contains("spec.memoryMB"),
        "{}",
        d.stderr
    );
    std::fs::remove_dir_all(dir.path().join("bad")).unwrap();

    write(
        &dir.path().join("1.yaml"),
        &sandbox_doc(
            &a,
            "  cpus: 2\n  readOnlyRootfs: false\n  env: {MODE: test}\n",
        ),
    );
    let before = container(&a).unwrap()["Id"].clone();
    let out = ok(&server, &["apply", "-f", folder]);
    assert!(out.contains(&format!("sandbox/{a} configured")), "{out}");
    assert!(out.contains(&format!("sandbox/{b} unchanged")), "{out}");
    ok(
        &server,
        &[
            "wait",
            &format!("sandbox/{a}"),
            "--for=condition=Ready",
            "--timeout=90s",
        ],
    );
    assert_ne!(
        container(&a).unwrap()["Id"],
        before,
        "the root filesystem mode replaced the container"
    );
    let d = cli(&server, &["diff", "-f", folder]);
    assert_eq!(d.code, 0, "{}{}", d.stdout, d.stderr);

    // describe: spec, status and conditions.
    let text = ok(&server, &["describe", "sandbox", &a]);
    for part in [
        "Name:",
        "Spec:",
        "MODE: test",
        "Status:",
        "Conditions:",
        "Ready",
        "History:",
    ] {
        assert!(text.contains(part), "{part} missing:\n{text}");
    }

    // delete -f removes everything the folder declares, and waits for it.
    let out = ok(&server, &["delete", "-f", folder]);
    assert_eq!(
        out,
        format!("sandbox/{a} deleted\nsandbox/{b} deleted\nfork/{b} deleted\n")
    );
    assert!(server.get("sandboxes", &a).is_none());
    assert!(container(&a).is_none());
    let r = cli(&server, &["delete", "sandbox", &a]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("error: ") && r.stderr.contains("not found"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1, "{}", r.stderr);
    ok(&server, &["delete", "sandbox", &a, "--ignore-not-found"]);
}

#[test]
fn validate_names_file_line_and_field_offline() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    write(&good, &sandbox_doc("fine", "  cpus: 1.5\n"));
    let bad = dir.path().join("sub/bad.yaml");
    write(
        &bad,
        &format!(
            "{}---\n{}",
            sandbox_doc("ok-one", ""),
            sandbox_doc("typo", "  memoryMB: 512\n  netwrk: true\n")
        ),
    );
    // No server anywhere: validate must not need one.
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
    cmd.args(["validate", good.to_str().unwrap()])
        .env("AGENT_SANDBOX_URL", "http://127.0.0.1:1");
    let r = run_with(cmd, None);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(r.stdout, "1 document(s) in 1 file(s) are valid\n");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
    cmd.args(["validate", dir.path().to_str().unwrap()]);
    let r = run_with(cmd, None);
    assert_ne!(r.code, 0);
    // The first document has 8 lines, `---` is line 9, and `netwrk` the 10th line after it.
    let expected = format!("error: {}:19: spec", bad.display());
    assert!(r.stderr.starts_with(&expected), "{}", r.stderr);
    assert!(r.stderr.contains("netwrk"), "{}", r.stderr);
}

#[test]
fn exec_streams_separately_and_exits_with_the_commands_status() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique("cli-exec");
    running_sandbox(&server, dir.path(), &name);

    let r = cli(
        &server,
        &[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ],
    );
    assert_eq!(r.code, 7, "{}", r.stderr);
    assert_eq!(r.stdout, "out\n");
    assert_eq!(r.stderr, "err\n");

    let r = cli(
        &server,
        &[
            "exec",
            &name,
            "-e",
            "GREETING=hi there",
            "-w",
            "/tmp",
            "--",
            "sh",
            "-c",
            "echo \"$GREETING\"; pwd",
        ],
    );
    assert_eq!(
        (r.code, r.stdout.as_str()),
        (0, "hi there\n/tmp\n"),
        "{}",
        r.stderr
    );

    // Output arrives as it is written, not when the command ends.
    let mut child = command(
        &server,
        &[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo first; sleep 3; echo second",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "first");
    let first_at = Instant::now();
    assert_eq!(lines.next().unwrap().unwrap(), "second");
    assert!(
        first_at.elapsed() >= Duration::from_secs(2),
        "the first line came only at the end"
    );
    assert!(child.wait().unwrap().success());

    let r = cli(
        &server,
        &["exec", &name, "--timeout", "1s", "--", "sleep", "30"],
    );
    assert_eq!(r.code, 137, "{}", r.stderr);
    assert!(r.stderr.contains("timed out"), "{}", r.stderr);

    let r = cli(&server, &["exec", "no-such-sandbox", "--", "true"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("error: ") && r.stderr.contains("not found"),
        "{}",
        r.stderr
    );
}

#[test]
fn cp_round_trips_random_bytes() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique("cli-cp");
    running_sandbox(&server, dir.path(), &name);

    let mut data: Vec<u8> = (0..=255u8).collect();
    data.extend((0..300_000).map(|_| rand::random::<u8>()));
    let local = dir.path().join("data.bin");
    std::fs::write(&local, &data).unwrap();
    ok(
        &server,
        &[
            "cp",
            local.to_str().unwrap(),
            &format!("{name}:/workspace/in/data.bin"),
        ],
    );

    let back = dir.path().join("back.bin");
    ok(
        &server,
        &["cp", &format!("{name}:in/data.bin"), back.to_str().unwrap()],
    );
    assert_eq!(std::fs::read(&back).unwrap(), data);

    // To an existing folder: the file keeps its name. To stdout: the raw bytes.
    let folder = dir.path().join("out");
    std::fs::create_dir(&folder).unwrap();
    ok(
        &server,
        &[
            "cp",
            &format!("{name}:/workspace/in/data.bin"),
            folder.to_str().unwrap(),
        ],
    );
    assert_eq!(std::fs::read(folder.join("data.bin")).unwrap(), data);
    let out = command(
        &server,
        &["cp", &format!("{name}:/workspace/in/data.bin"), "-"],
    )
    .output()
    .unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, data);

    // From stdin, and the sandbox sees the same bytes.
    let r = run_with(
        command(
            &server,
            &["cp", "-", &format!("{name}:/workspace/stdin.txt")],
        ),
        Some(b"from stdin\n"),
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_eq!(
        ok(
            &server,
            &["exec", &name, "--", "cat", "/workspace/stdin.txt"]
        ),
        "from stdin\n"
    );

    let r = cli(
        &server,
        &[
            "cp",
            &format!("{name}:/workspace/missing"),
            back.to_str().unwrap(),
        ],
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("error: ") && r.stderr.contains("not found"),
        "{}",
        r.stderr
    );
    let r = cli(
        &server,
        &[
            "cp",
            local.to_str().unwrap(),
            &format!("{name}:/etc/passwd"),
        ],
    );
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("/workspace"), "{}", r.stderr);
}

#[test]
fn wait_snapshot_rollback_fork_and_timeout() {
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let name = unique("cli-snap");
    running_sandbox(&server, dir.path(), &name);

    ok(
        &server,
        &[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo v1 > /workspace/state.txt",
        ],
    );
    let out = ok(&server, &["snapshot", &name, "--name", "v1"]);
    assert!(
        out.starts_with("snapshot/snap_") && out.contains("created"),
        "{out}"
    );
    let snap = ok(&server, &["snapshot", &name, "-q"]).trim().to_string();
    assert!(snap.starts_with("snap_"), "{snap}");
    let table = ok(&server, &["get", "snapshots"]);
    assert!(table.contains(&snap) && table.contains(&name), "{table}");

    ok(
        &server,
        &[
            "exec",
            &name,
            "--",
            "sh",
            "-c",
            "echo broken > /workspace/state.txt",
        ],
    );
    let out = ok(&server, &["rollback", &name, &snap]);
    assert_eq!(
        out,
        format!("sandbox/{name} rolled back to snapshot/{snap}\n")
    );
    assert_eq!(
        ok(
            &server,
            &["exec", &name, "--", "cat", "/workspace/state.txt"]
        ),
        "v1\n"
    );

    // One replica: a sandbox at once, through the wire API.
    let out = ok(&server, &["fork", &snap, "-q"]);
    let child = out.trim().to_string();
    assert!(child.starts_with("sb_"), "{out}");
    assert_eq!(
        ok(
            &server,
            &["exec", &child, "--", "cat", "/workspace/state.txt"]
        ),
        "v1\n"
    );

    // Several: a Fork resource that keeps them, seen live by `get -w`.
    let fork = unique("cli-fork");
    let mut watcher = command(&server, &["get", "forks", "-w"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let watched = watcher.stdout.take().unwrap();
    let watch_fork = fork.clone();
    let seen = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in BufReader::new(watched).lines().map_while(Result::ok) {
            let done = line.starts_with(&watch_fork) && line.contains("2/2");
            lines.push(line);
            if done {
                break;
            }
        }
        lines
    });
    let out = ok(
        &server,
        &[
            "fork",
            &snap,
            "--replicas",
            "2",
            "--name",
            &fork,
            "--wait",
            "--timeout",
            "3m",
        ],
    );
    assert!(
        out.contains(&format!("fork/{fork} created")) && out.contains("2/2 ready"),
        "{out}"
    );
    let forks = ok(&server, &["get", "forks"]);
    let row = forks
        .lines()
        .find(|l| l.starts_with(&fork))
        .expect("fork row");
    assert!(row.contains("2/2"), "{forks}");
    assert_eq!(
        ok(
            &server,
            &["exec", &format!("{fork}-1"), "--", "cat", "state.txt"]
        ),
        "v1\n"
    );
    ok(
        &server,
        &[
            "wait",
            &format!("fork/{fork}"),
            "--for=condition=Ready",
            "--timeout=30s",
        ],
    );
    let lines = seen.join().unwrap();
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("READY"),
        "{lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&fork) && !l.contains("2/2")),
        "the watch shows the fork before it is ready too: {lines:?}"
    );

    let out = ok(&server, &["timeout", &name, "120"]);
    assert!(
        out.contains("expires at") && (out.contains("(in 119s)") || out.contains("(in 120s)")),
        "{out}"
    );

    ok(&server, &["delete", "fork", &fork, "--wait=false"]);
    ok(
        &server,
        &[
            "wait",
            &format!("fork/{fork}"),
            "--for=delete",
            "--timeout=90s",
        ],
    );
    assert!(server.get("sandboxes", &format!("{fork}-0")).is_none());

    // Waiting for something that does not happen is an error after the timeout, in one line.
    let r = cli(
        &server,
        &[
            "wait",
            "sandbox/never-there",
            "--for=condition=Ready",
            "--timeout=1s",
        ],
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("error: timed out") && r.stderr.lines().count() == 1,
        "{}",
        r.stderr
    );

    ok(&server, &["delete", "sandbox", &name, &child]);
}

#[test]
fn errors_are_one_line_and_help_has_examples() {
    let server = Server::start();
    let mut cmd = command(&server, &["get", "sandboxes"]);
    cmd.env("AGENT_SANDBOX_API_KEY", "not-the-key-at-all");
    let r = run_with(cmd, None);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr.starts_with("error: ") && r.stderr.contains("401"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1);

    let r = cli(
        &server,
        &["get", "sandboxes", "--server", "http://127.0.0.1:1"],
    );
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("cannot reach the server at http://127.0.0.1:1"),
        "{}",
        r.stderr
    );
    assert_eq!(r.stderr.lines().count(), 1);

    let r = cli(&server, &["get", "pods"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("unknown kind"), "{}", r.stderr);

    let empty = cli(&server, &["get", "forks"]);
    assert_eq!(empty.code, 0);
    assert!(empty.stderr.contains("No forks found"), "{}", empty.stderr);

    for sub in [
        "apply", "delete", "get", "describe", "diff", "validate", "exec", "cp", "wait", "snapshot",
        "rollback", "fork", "timeout", "mcp",
    ] {
        let help = ok(&server, &[sub, "--help"]);
        assert!(
            help.contains("Example"),
            "{sub} --help has no example:\n{help}"
        );
    }
}
