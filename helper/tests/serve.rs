//! Runs the built `agent-sandbox-helper serve` as a normal process on the host and drives it
//! through the protocol.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use helper_protocol::*;

/// The helper under test: the binary cargo built for this test run, or the one named by
/// `AGENT_SANDBOX_HELPER_BIN` (e.g. the static release build).
fn bin() -> String {
    std::env::var("AGENT_SANDBOX_HELPER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_agent-sandbox-helper").to_string())
}
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A unique environment marker, inherited by every descendant of a command, used to find
/// survivors in /proc.
fn marker() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "ASH_TEST_MARKER=m{}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst),
        nanos
    )
}

/// Live (non-zombie) processes whose environment holds `marker` (`NAME=value`).
fn marked_pids(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        if env.split(|&b| b == 0).any(|kv| kv == marker.as_bytes()) {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = state
                .rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
                .unwrap_or(true);
            if !zombie {
                out.push(pid);
            }
        }
    }
    out
}

fn wait_for_marked(marker: &str, at_least: usize) -> Vec<i32> {
    let t = Instant::now();
    loop {
        let p = marked_pids(marker);
        if p.len() >= at_least {
            return p;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "only {} marked processes: {p:?}",
            p.len()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn env_with(marker: &str) -> Vec<(String, String)> {
    let (k, v) = marker.split_once('=').unwrap();
    vec![("PATH".into(), PATH.into()), (k.into(), v.into())]
}

fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}

/// How the shepherds find process trees: as child subreapers (the normal case), or through the
/// RSS-limit tag they fall back to where the prctl is refused (gVisor).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Subreaper,
    Tag,
}

/// Defines one test per mode from `fn name(mode: Mode)`.
macro_rules! both_modes {
    ($name:ident, $subreaper:ident, $tag:ident) => {
        #[test]
        fn $subreaper() {
            $name(Mode::Subreaper)
        }
        #[test]
        fn $tag() {
            $name(Mode::Tag)
        }
    };
}

#[derive(Debug, Default, Clone)]
struct Outcome {
    pid: Option<u32>,
    failed: Option<String>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit_code: i32,
    timed_out: bool,
    duration_ms: u64,
    /// Time from `collect` start until each stdout chunk arrived.
    stdout_times: Vec<Duration>,
    exit_at: Duration,
}

impl Outcome {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Result<Event, String>>,
    exited: BTreeSet<u64>,
    pending: BTreeMap<u64, Outcome>,
}

impl Helper {
    fn spawn() -> Helper {
        Helper::spawn_in(Mode::Subreaper)
    }

    fn spawn_in(mode: Mode) -> Helper {
        let mut cmd = Command::new(bin());
        if mode == Mode::Tag {
            cmd.env("AGENT_SANDBOX_HELPER_NO_SUBREAPER", "1");
        }
        let mut child = cmd
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn helper");
        let mut stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            let mut d = FrameDecoder::new();
            let mut buf = vec![0u8; 256 * 1024];
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        if let Err(e) = d.finish() {
                            let _ = tx.send(Err(e.to_string()));
                        }
                        return;
                    }
                    Ok(n) => n,
                };
                d.feed(&buf[..n]);
                loop {
                    match d.next_event() {
                        Ok(Some(ev)) => {
                            if tx.send(Ok(ev)).is_err() {
                                return;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            let _ = tx.send(Err(e.to_string()));
                            return;
                        }
                    }
                }
            }
        });
        let mut h = Helper {
            child,
            stdin,
            events: rx,
            exited: BTreeSet::new(),
            pending: BTreeMap::new(),
        };
        match h.next(Duration::from_secs(5)) {
            Some(Event::Hello { version }) => assert_eq!(version, PROTOCOL_VERSION),
            other => panic!("expected Hello, got {other:?}"),
        }
        h
    }

    fn send(&mut self, req: &Request) {
        let frame = req.to_frame().unwrap();
        self.send_raw(&frame);
    }

    fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    fn start(&mut self, s: StartRequest) {
        self.send(&Request::Start(s));
    }

    fn start_sh(&mut self, id: u64, script: &str, marker: &str, timeout_ms: u64) {
        self.start(StartRequest {
            id,
            argv: sh(script),
            env: env_with(marker),
            timeout_ms,
            ..Default::default()
        });
    }

    fn next(&mut self, timeout: Duration) -> Option<Event> {
        match self.events.recv_timeout(timeout) {
            Ok(Ok(ev)) => {
                if let Some(id) = ev.id() {
                    assert!(
                        !self.exited.contains(&id),
                        "frame after Exit for id {id}: {ev:?}"
                    );
                    if let Event::Exit { .. } = ev {
                        self.exited.insert(id);
                    }
                }
                Some(ev)
            }
            Ok(Err(e)) => panic!("helper sent a malformed stream: {e}"),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    /// Collects events until every id in `ids` has exited.
    fn collect(&mut self, ids: &[u64], timeout: Duration) -> BTreeMap<u64, Outcome> {
        let t0 = Instant::now();
        let mut done = BTreeMap::new();
        for id in ids {
            if let Some(o) = self.pending.remove(id) {
                done.insert(*id, o);
            }
        }
        let mut open: BTreeSet<u64> = ids.iter().copied().collect();
        open.retain(|id| !self.exited.contains(id));
        while !open.is_empty() {
            let left = timeout.checked_sub(t0.elapsed()).unwrap_or_else(|| {
                panic!("timed out waiting for {open:?}; so far {done:?}");
            });
            let Some(ev) = self.next(left) else {
                panic!("no Exit for {open:?} (helper gone or timeout); so far {done:?}")
            };
            let Some(id) = ev.id() else {
                panic!("unexpected {ev:?}")
            };
            let o = if ids.contains(&id) {
                done.entry(id).or_insert_with(Outcome::default)
            } else {
                self.pending.entry(id).or_default()
            };
            match ev {
                Event::Started { pid, .. } => {
                    assert!(
                        o.pid.is_none() && o.stdout.is_empty() && o.stderr.is_empty(),
                        "Started first"
                    );
                    o.pid = Some(pid);
                }
                Event::Stdout { data, .. } => {
                    assert!(data.len() <= MAX_CHUNK_LEN);
                    o.stdout.extend_from_slice(&data);
                    o.stdout_times.push(t0.elapsed());
                }
                Event::Stderr { data, .. } => {
                    assert!(data.len() <= MAX_CHUNK_LEN);
                    o.stderr.extend_from_slice(&data);
                }
                Event::Failed { message, .. } => o.failed = Some(message),
                Event::Exit {
                    exit_code,
                    timed_out,
                    duration_ms,
                    ..
                } => {
                    o.exit_code = exit_code;
                    o.timed_out = timed_out;
                    o.duration_ms = duration_ms;
                    o.exit_at = t0.elapsed();
                    open.remove(&id);
                }
                Event::Hello { .. } | Event::Error { .. } => unreachable!(),
            }
        }
        done
    }

    fn run(&mut self, s: StartRequest) -> Outcome {
        let id = s.id;
        self.start(s);
        self.collect(&[id], Duration::from_secs(60))
            .remove(&id)
            .unwrap()
    }

    fn run_sh(&mut self, id: u64, script: &str) -> Outcome {
        self.run(StartRequest {
            id,
            argv: sh(script),
            env: env_with(&marker()),
            ..Default::default()
        })
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let t = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(t.elapsed() < timeout, "helper did not exit");
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// No process carries the marker: killed ones may take a moment to go (a SIGKILL sent is not yet
/// a process gone, on a busy machine), survivors stay.
fn assert_none_left(marker: &str) {
    let t = Instant::now();
    loop {
        let left = marked_pids(marker);
        if left.is_empty() {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "processes survived: {left:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn output_exit_code_and_started_pid() {
    let mut h = Helper::spawn();
    let o = h.run_sh(1, "echo out; echo err >&2; echo $$; exit 3");
    assert_eq!(o.exit_code, 3);
    assert!(!o.timed_out);
    assert_eq!(o.err(), "err\n");
    let pid = o.pid.expect("Started");
    assert_eq!(o.out(), format!("out\n{pid}\n"));
    assert!(o.failed.is_none());
}

#[test]
fn output_is_streamed_as_it_arrives() {
    let mut h = Helper::spawn();
    h.start_sh(1, "printf first; sleep 1; printf second", &marker(), 0);
    let o = h.collect(&[1], Duration::from_secs(10)).remove(&1).unwrap();
    assert_eq!(o.out(), "firstsecond");
    assert_eq!(
        o.stdout_times.len(),
        2,
        "no line buffering, one chunk per write"
    );
    assert!(
        o.stdout_times[0] < Duration::from_millis(700),
        "first chunk late: {:?}",
        o.stdout_times
    );
    assert!(o.exit_at >= Duration::from_millis(900));
    assert!(
        o.duration_ms >= 900 && o.duration_ms < 5000,
        "{}",
        o.duration_ms
    );
}

#[test]
fn signal_death_reports_128_plus_signal() {
    let mut h = Helper::spawn();
    assert_eq!(h.run_sh(1, "kill -TERM $$").exit_code, 143);
    assert_eq!(h.run_sh(2, "kill -KILL $$").exit_code, 137);
    assert_eq!(h.run_sh(3, "exit 0").exit_code, 0);
    assert_eq!(h.run_sh(4, "exit 255").exit_code, 255);
}

#[test]
fn environment_is_exactly_the_request_and_workdir_applies() {
    let mut h = Helper::spawn();
    let o = h.run(StartRequest {
        id: 1,
        argv: vec!["env".into()],
        env: vec![
            ("PATH".into(), PATH.into()),
            ("FOO".into(), "bar baz".into()),
            ("E".into(), String::new()),
        ],
        ..Default::default()
    });
    assert_eq!(o.out(), format!("PATH={PATH}\nFOO=bar baz\nE=\n"));
    let o = h.run(StartRequest {
        id: 2,
        argv: vec!["pwd".into()],
        env: env_with(&marker()),
        workdir: "/proc/self".into(),
        ..Default::default()
    });
    assert_eq!(o.exit_code, 0);
    assert!(o.out().starts_with("/proc/"), "{}", o.out());
    // stdin is /dev/null
    let o = h.run_sh(3, "cat; echo rc=$?");
    assert_eq!(o.out(), "rc=0\n");
    // SIGPIPE is back to default in the command even though the helper ignores it (a shell cannot
    // undo a SIGPIPE ignored on entry, so `yes` would see EPIPE and exit 1 instead).
    let o = h.run_sh(5, "(yes; echo \"yes-exit=$?\" >&2) | head -c 1 >/dev/null");
    assert_eq!(o.err(), "yes-exit=141\n");
}

#[test]
fn missing_and_unexecutable_commands_map_to_127_and_126() {
    let mut h = Helper::spawn();
    let o = h.run(StartRequest {
        id: 1,
        argv: vec!["no-such-command-xyz".into()],
        env: env_with(&marker()),
        ..Default::default()
    });
    assert_eq!(o.exit_code, 127);
    assert!(o.pid.is_none());
    assert_eq!(
        o.failed.as_deref(),
        Some("no-such-command-xyz: command not found")
    );
    assert!(
        o.err().contains("no-such-command-xyz: command not found"),
        "{}",
        o.err()
    );

    let o = h.run(StartRequest {
        id: 2,
        argv: vec!["/no/such/file".into()],
        env: env_with(&marker()),
        ..Default::default()
    });
    assert_eq!(o.exit_code, 127);
    assert!(o.err().contains("No such file or directory"), "{}", o.err());

    let dir = std::env::temp_dir().join(format!("ash-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("plain");
    std::fs::write(&plain, "echo hi\n").unwrap();
    let o = h.run(StartRequest {
        id: 3,
        argv: vec![plain.to_str().unwrap().into()],
        env: env_with(&marker()),
        ..Default::default()
    });
    assert_eq!(o.exit_code, 126);
    assert!(o.err().contains("Permission denied"), "{}", o.err());

    // Not executable when found through PATH either: 126, like a shell.
    let o = h.run(StartRequest {
        id: 4,
        argv: vec!["plain".into()],
        env: vec![("PATH".into(), format!("{}:/usr/bin:/bin", dir.display()))],
        ..Default::default()
    });
    assert_eq!(o.exit_code, 126, "{o:?}");

    // A script without a #! line runs through /bin/sh, like execvp.
    let script = dir.join("script");
    std::fs::write(&script, "echo from-script \"$1\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let o = h.run(StartRequest {
        id: 5,
        argv: vec![script.to_str().unwrap().into(), "arg1".into()],
        env: env_with(&marker()),
        ..Default::default()
    });
    assert_eq!((o.exit_code, o.out().as_str()), (0, "from-script arg1\n"));

    let o = h.run(StartRequest {
        id: 6,
        argv: vec!["true".into()],
        env: env_with(&marker()),
        workdir: "/no/such/dir".into(),
        ..Default::default()
    });
    assert_eq!(o.exit_code, 126);
    assert!(
        o.err()
            .contains("workdir /no/such/dir: No such file or directory"),
        "{}",
        o.err()
    );

    // Invalid requests never reach a shepherd.
    let o = h.run(StartRequest {
        id: 7,
        argv: vec![],
        ..Default::default()
    });
    assert_eq!(o.exit_code, 126);
    assert!(o.failed.unwrap().contains("empty argv"));
    let o = h.run(StartRequest {
        id: 8,
        argv: vec!["a\0b".into()],
        ..Default::default()
    });
    assert_eq!(o.exit_code, 126);
    let o = h.run(StartRequest {
        id: 9,
        argv: vec!["true".into()],
        env: vec![("A=B".into(), "x".into())],
        ..Default::default()
    });
    assert_eq!(o.exit_code, 126);
    std::fs::remove_dir_all(&dir).unwrap();

    // The channel still works.
    assert_eq!(h.run_sh(10, "echo ok").out(), "ok\n");
}

#[test]
fn concurrent_commands_interleave() {
    let mut h = Helper::spawn();
    let m = marker();
    let t = Instant::now();
    let ids: Vec<u64> = (1..=20).collect();
    for &id in &ids {
        h.start_sh(
            id,
            &format!("echo start-{id}; sleep 1; echo end-{id} >&2; exit {id}"),
            &m,
            0,
        );
    }
    let res = h.collect(&ids, Duration::from_secs(30));
    assert!(
        t.elapsed() < Duration::from_secs(4),
        "not concurrent: {:?}",
        t.elapsed()
    );
    for id in ids {
        let o = &res[&id];
        assert_eq!(o.out(), format!("start-{id}\n"));
        assert_eq!(o.err(), format!("end-{id}\n"));
        assert_eq!(o.exit_code, id as i32);
    }
    assert_none_left(&m);
}

both_modes!(
    timeout_kills_setsid_tree,
    timeout_kills_setsid_tree_subreaper,
    timeout_kills_setsid_tree_tag
);

fn timeout_kills_setsid_tree(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(1, "setsid sh -c 'sleep 1000' & sleep 1000", &m, 1500);
    // sh, setsid'd sh (or its sleep), sleep: the tree is really there before the timeout.
    let before = wait_for_marked(&m, 3);
    let o = h.collect(&[1], Duration::from_secs(20)).remove(&1).unwrap();
    assert!(o.timed_out);
    assert_eq!(o.exit_code, EXIT_CODE_TIMEOUT);
    assert!(
        o.duration_ms >= 1500 && o.duration_ms < 5000,
        "{}",
        o.duration_ms
    );
    // Exit comes only after the whole tree has been killed and reaped.
    assert_none_left(&m);
    assert!(before.len() >= 3);
}

both_modes!(
    double_forked_daemon_is_killed_when_the_command_finishes,
    double_forked_daemon_is_killed_when_the_command_finishes_subreaper,
    double_forked_daemon_is_killed_when_the_command_finishes_tag
);

fn double_forked_daemon_is_killed_when_the_command_finishes(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    // The classic daemon dance: fork, setsid, fork again, parent exits, output detached.
    let o = h.run(StartRequest {
        id: 1,
        argv: sh(
            "(setsid sh -c 'sleep 1000 & exit 0' >/dev/null 2>&1 &); sleep 0.3; echo parent-done",
        ),
        env: env_with(&m),
        ..Default::default()
    });
    assert_eq!((o.exit_code, o.out().as_str()), (0, "parent-done\n"));
    assert_none_left(&m);
}

both_modes!(
    double_forked_daemon_is_killed_on_timeout,
    double_forked_daemon_is_killed_on_timeout_subreaper,
    double_forked_daemon_is_killed_on_timeout_tag
);

fn double_forked_daemon_is_killed_on_timeout(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(
        1,
        "(setsid sh -c 'sleep 1000 & exit 0' >/dev/null 2>&1 &); sleep 1000",
        &m,
        1000,
    );
    wait_for_marked(&m, 2);
    let o = h.collect(&[1], Duration::from_secs(20)).remove(&1).unwrap();
    assert!(o.timed_out);
    assert_none_left(&m);
}

both_modes!(
    keep_background_leaves_daemons_running,
    keep_background_leaves_daemons_running_subreaper,
    keep_background_leaves_daemons_running_tag
);

fn keep_background_leaves_daemons_running(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    let o = h.run(StartRequest {
        id: 1,
        argv: sh("setsid sleep 1000 >/dev/null 2>&1 & echo bg-started"),
        env: env_with(&m),
        keep_background: true,
        ..Default::default()
    });
    assert_eq!(o.exit_code, 0);
    let left = wait_for_marked(&m, 1);
    for &pid in &left {
        // Released: no tag left behind (the fallback marks commands through RLIMIT_RSS).
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let rss = limits
            .lines()
            .find(|l| l.starts_with("Max resident set"))
            .unwrap();
        assert!(
            rss.contains("unlimited            unlimited"),
            "{mode:?}: {rss}"
        );
    }
    for pid in left {
        unsafe { libc_kill(pid, 9) };
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
    #[link_name = "signal"]
    fn libc_signal(sig: i32, handler: usize) -> usize;
}

#[test]
fn commands_start_with_default_signal_dispositions() {
    use std::os::unix::process::CommandExt;
    // Start the helper the way `nohup` would: SIGHUP and SIGINT ignored.
    let mut cmd = Command::new(bin());
    cmd.arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    unsafe {
        cmd.pre_exec(|| {
            libc_signal(1, 1); // SIGHUP -> SIG_IGN
            libc_signal(2, 1); // SIGINT -> SIG_IGN
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut d = FrameDecoder::new();
    let mut buf = vec![0u8; 65536];
    let mut codes = BTreeMap::new();
    for (id, sig) in [(1u64, "HUP"), (2, "INT"), (3, "PIPE")] {
        let req = Request::Start(StartRequest {
            id,
            argv: sh(&format!("kill -{sig} $$; exit 0")),
            env: env_with(&marker()),
            ..Default::default()
        });
        stdin.write_all(&req.to_frame().unwrap()).unwrap();
    }
    while codes.len() < 3 {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0);
        d.feed(&buf[..n]);
        while let Some(ev) = d.next_event().unwrap() {
            if let Event::Exit { id, exit_code, .. } = ev {
                codes.insert(id, exit_code);
            }
        }
    }
    assert_eq!(codes, BTreeMap::from([(1, 129), (2, 130), (3, 141)]));
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

both_modes!(
    output_held_open_runs_until_timeout_without_linger,
    output_held_open_runs_until_timeout_without_linger_subreaper,
    output_held_open_runs_until_timeout_without_linger_tag
);

fn output_held_open_runs_until_timeout_without_linger(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(1, "echo hi; sleep 1000 &", &m, 1000);
    let o = h.collect(&[1], Duration::from_secs(20)).remove(&1).unwrap();
    assert_eq!(o.out(), "hi\n");
    assert!(o.timed_out);
    assert_eq!(o.exit_code, EXIT_CODE_TIMEOUT);
    assert!(o.duration_ms >= 1000);
    assert_none_left(&m);
}

both_modes!(
    linger_bounds_the_wait_for_background_output,
    linger_bounds_the_wait_for_background_output_subreaper,
    linger_bounds_the_wait_for_background_output_tag
);

fn linger_bounds_the_wait_for_background_output(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    let o = h.run(StartRequest {
        id: 1,
        argv: sh("echo hi; (sleep 0.1; echo soon; sleep 1000; echo late) & exit 4"),
        env: env_with(&m),
        timeout_ms: 30_000,
        linger_ms: 500,
        ..Default::default()
    });
    assert_eq!(o.out(), "hi\nsoon\n");
    assert_eq!(o.exit_code, 4);
    assert!(!o.timed_out);
    assert!(
        o.duration_ms >= 500 && o.duration_ms < 3000,
        "{}",
        o.duration_ms
    );
    assert_none_left(&m);
}

both_modes!(
    kill_frame_kills_the_tree,
    kill_frame_kills_the_tree_subreaper,
    kill_frame_kills_the_tree_tag
);

fn kill_frame_kills_the_tree(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(7, "setsid sh -c 'sleep 1000' & sleep 1000", &m, 0);
    wait_for_marked(&m, 3);
    h.send(&Request::Kill { id: 7 });
    let o = h.collect(&[7], Duration::from_secs(10)).remove(&7).unwrap();
    assert_eq!(o.exit_code, 137);
    assert!(!o.timed_out);
    assert_none_left(&m);
    // Kill of an unknown id is ignored.
    h.send(&Request::Kill { id: 12345 });
    assert_eq!(h.run_sh(8, "echo alive").out(), "alive\n");
}

both_modes!(
    stdin_eof_kills_everything_and_exits,
    stdin_eof_kills_everything_and_exits_subreaper,
    stdin_eof_kills_everything_and_exits_tag
);

fn stdin_eof_kills_everything_and_exits(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(1, "setsid sh -c 'sleep 1000' & sleep 1000", &m, 0);
    h.start_sh(
        2,
        "(setsid sh -c 'sleep 1000 & exit 0' &); sleep 1000",
        &m,
        0,
    );
    wait_for_marked(&m, 5);
    h.close_stdin();
    let res = h.collect(&[1, 2], Duration::from_secs(10));
    assert_eq!(res[&1].exit_code, 137);
    let st = h.wait_exit(Duration::from_secs(10));
    assert!(st.success(), "{st:?}");
    assert_none_left(&m);
}

both_modes!(
    shutdown_frame_kills_everything_and_exits,
    shutdown_frame_kills_everything_and_exits_subreaper,
    shutdown_frame_kills_everything_and_exits_tag
);

fn shutdown_frame_kills_everything_and_exits(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(1, "sleep 1000", &m, 0);
    h.start_sh(2, "setsid sleep 1000 & wait", &m, 0);
    wait_for_marked(&m, 3);
    h.send(&Request::Shutdown);
    h.collect(&[1, 2], Duration::from_secs(10));
    assert!(h.wait_exit(Duration::from_secs(10)).success());
    assert_none_left(&m);
}

both_modes!(
    killed_helper_still_gets_trees_cleaned_up,
    killed_helper_still_gets_trees_cleaned_up_subreaper,
    killed_helper_still_gets_trees_cleaned_up_tag
);

fn killed_helper_still_gets_trees_cleaned_up(mode: Mode) {
    let mut h = Helper::spawn_in(mode);
    let m = marker();
    h.start_sh(1, "setsid sh -c 'sleep 1000' & sleep 1000", &m, 0);
    wait_for_marked(&m, 3);
    h.child.kill().unwrap(); // SIGKILL: no chance to clean up itself
    h.child.wait().unwrap();
    // Each shepherd sees its control pipe close and kills its tree.
    let t = Instant::now();
    while !marked_pids(&m).is_empty() {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "survivors: {:?}",
            marked_pids(&m)
        );
        thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn malformed_frame_reports_error_kills_and_exits() {
    let mut h = Helper::spawn();
    let m = marker();
    h.start_sh(1, "sleep 1000", &m, 0);
    wait_for_marked(&m, 1);
    h.send_raw(&[0, 0, 0, 2, 0x55, 0]);
    let mut saw_error = false;
    let mut saw_exit = false;
    while let Some(ev) = h.next(Duration::from_secs(10)) {
        match ev {
            Event::Error { message } => {
                assert!(message.contains("0x55"), "{message}");
                saw_error = true;
            }
            Event::Exit {
                id: 1, exit_code, ..
            } => {
                assert_eq!(exit_code, 137);
                saw_exit = true;
            }
            _ => {}
        }
    }
    assert!(saw_error && saw_exit);
    assert_eq!(h.wait_exit(Duration::from_secs(5)).code(), Some(1));
    assert_none_left(&m);
}

#[test]
fn oversized_frame_is_rejected() {
    let mut h = Helper::spawn();
    h.send_raw(&((MAX_FRAME_LEN as u32) + 1).to_be_bytes());
    match h.next(Duration::from_secs(5)) {
        Some(Event::Error { message }) => assert!(message.contains("exceeds"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.wait_exit(Duration::from_secs(5)).code(), Some(1));
}

#[test]
fn truncated_frame_at_eof_is_an_error() {
    let mut h = Helper::spawn();
    let f = Request::Kill { id: 1 }.to_frame().unwrap();
    h.send_raw(&f[..6]);
    h.close_stdin();
    match h.next(Duration::from_secs(5)) {
        Some(Event::Error { message }) => assert!(message.contains("inside a frame"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.wait_exit(Duration::from_secs(5)).code(), Some(1));
}

#[test]
fn duplicate_running_id_is_a_reported_error_but_not_fatal() {
    let mut h = Helper::spawn();
    let m = marker();
    h.start_sh(1, "sleep 0.5; echo first", &m, 0);
    h.start_sh(1, "echo second", &m, 0);
    match h.next(Duration::from_secs(5)) {
        Some(Event::Started { id: 1, .. }) => match h.next(Duration::from_secs(5)) {
            Some(Event::Error { message }) => assert!(message.contains("id 1"), "{message}"),
            other => panic!("{other:?}"),
        },
        Some(Event::Error { message }) => assert!(message.contains("id 1"), "{message}"),
        other => panic!("{other:?}"),
    }
    let o = h.collect(&[1], Duration::from_secs(10)).remove(&1).unwrap();
    assert_eq!(o.out(), "first\n");
    // The id can be reused once the command has exited.
    h.exited.remove(&1);
    assert_eq!(h.run_sh(1, "echo again").out(), "again\n");
}

#[test]
fn large_output_flows_without_deadlock() {
    let mut h = Helper::spawn();
    let t = Instant::now();
    let o = h.run_sh(
        1,
        "head -c 20000000 /dev/zero >&2 & head -c 50000000 /dev/zero; wait",
    );
    assert_eq!(o.exit_code, 0);
    assert_eq!(o.stdout.len(), 50_000_000);
    assert_eq!(o.stderr.len(), 20_000_000);
    assert!(o.stdout.iter().all(|&b| b == 0));
    eprintln!("70 MB through the helper in {:?}", t.elapsed());
}

#[test]
fn slow_host_gets_backpressure_not_unbounded_buffering() {
    let mut child = Command::new(bin())
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let req = Request::Start(StartRequest {
        id: 1,
        argv: vec![
            "head".into(),
            "-c".into(),
            "50000000".into(),
            "/dev/zero".into(),
        ],
        env: env_with(&marker()),
        ..Default::default()
    });
    stdin.write_all(&req.to_frame().unwrap()).unwrap();
    thread::sleep(Duration::from_millis(1500));
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss_kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        rss_kb < 16 * 1024,
        "helper buffered too much: VmRSS {rss_kb} kB"
    );
    // Now read everything: all 50 MB arrive, then Exit.
    let mut d = FrameDecoder::new();
    let mut total = 0usize;
    let mut buf = vec![0u8; 1 << 20];
    let mut exit = None;
    while exit.is_none() {
        let n = stdout.read(&mut buf).unwrap();
        assert!(n > 0, "helper closed stdout early");
        d.feed(&buf[..n]);
        while let Some(ev) = d.next_event().unwrap() {
            match ev {
                Event::Stdout { data, .. } => total += data.len(),
                Event::Exit { exit_code, .. } => exit = Some(exit_code),
                _ => {}
            }
        }
    }
    assert_eq!((total, exit), (50_000_000, Some(0)));
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

#[test]
fn latency_of_true_through_an_open_channel() {
    let mut h = Helper::spawn();
    let env = vec![("PATH".to_string(), PATH.to_string())];
    let mut times = Vec::new();
    for id in 0..200u64 {
        let t = Instant::now();
        let o = h.run(StartRequest {
            id,
            argv: vec!["true".into()],
            env: env.clone(),
            ..Default::default()
        });
        times.push(t.elapsed());
        assert_eq!(o.exit_code, 0);
    }
    times.sort();
    let median = times[times.len() / 2];
    eprintln!(
        "`true` round trip: median {:?}, p90 {:?}, max {:?}",
        median,
        times[times.len() * 9 / 10],
        times[times.len() - 1]
    );
    assert!(median < Duration::from_millis(50), "median {median:?}");
}

#[test]
fn killing_one_tree_spares_the_others_in_both_modes() {
    for mode in [Mode::Subreaper, Mode::Tag] {
        let mut h = Helper::spawn_in(mode);
        let (ma, mb) = (marker(), marker());
        h.start_sh(
            1,
            "setsid sh -c 'sleep 1000' & (setsid sleep 1000 >/dev/null 2>&1 &); sleep 1000",
            &ma,
            0,
        );
        h.start_sh(
            2,
            "(setsid sleep 1000 >/dev/null 2>&1 &); sleep 1.5; echo b-done",
            &mb,
            0,
        );
        wait_for_marked(&ma, 4);
        wait_for_marked(&mb, 2);
        h.send(&Request::Kill { id: 1 });
        let a = h.collect(&[1], Duration::from_secs(10)).remove(&1).unwrap();
        assert_eq!(a.exit_code, 137, "{mode:?}");
        assert_none_left(&ma);
        assert!(
            !marked_pids(&mb).is_empty(),
            "{mode:?}: the other command was hit"
        );
        let b = h.collect(&[2], Duration::from_secs(10)).remove(&2).unwrap();
        assert_eq!((b.exit_code, b.out().as_str()), (0, "b-done\n"), "{mode:?}");
        assert_none_left(&mb);
    }
}

#[test]
fn rss_limit_is_untouched_when_the_subreaper_works() {
    let mut h = Helper::spawn();
    assert_eq!(h.run_sh(1, "ulimit -m").out(), "unlimited\n");
    let mut h = Helper::spawn_in(Mode::Tag);
    let tagged = h.run_sh(1, "ulimit -m").out();
    assert_ne!(tagged, "unlimited\n", "the fallback tags commands");
}

#[test]
fn file_writes_answer_like_write_file_and_can_be_abandoned() {
    let mut h = Helper::spawn();
    // Outside /workspace: refused with the write-file mode's code and outcome line; the data
    // that follows the refused start is swallowed.
    h.send(&Request::WriteFile {
        id: 1,
        path: "/etc/agent-sandbox-test".into(),
        mode: 0o644,
    });
    h.send(&Request::Data {
        id: 1,
        data: b"ignored".to_vec(),
    });
    h.send(&Request::End { id: 1 });
    let o = h.collect(&[1], Duration::from_secs(5)).remove(&1).unwrap();
    assert_eq!(o.exit_code, 3, "{o:?}");
    assert!(o.out().starts_with("{\"error\":3,"), "{}", o.out());
    assert!(o.err().contains("outside"), "{}", o.err());

    // A write that is killed before its end reports an exit and is forgotten: later data for
    // its id is ignored, and the id may be used again.
    h.send(&Request::WriteFile {
        id: 2,
        path: "/workspace/never/written".into(),
        mode: 0o600,
    });
    h.send(&Request::Kill { id: 2 });
    h.send(&Request::Data {
        id: 2,
        data: b"late".to_vec(),
    });
    let o = h.collect(&[2], Duration::from_secs(5)).remove(&2).unwrap();
    assert_eq!(o.exit_code, EXIT_CODE_LOST, "{o:?}");
    assert!(o.stdout.is_empty());
    h.exited.remove(&2);
    assert_eq!(h.run_sh(2, "echo still serving").out(), "still serving\n");

    // A write may not take the id of a running command.
    let m = marker();
    h.start_sh(3, "sleep 0.5; echo ran", &m, 0);
    h.send(&Request::WriteFile {
        id: 3,
        path: "/workspace/x".into(),
        mode: 0o600,
    });
    let o = loop {
        match h.next(Duration::from_secs(5)) {
            Some(Event::Started { id: 3, .. }) => {}
            Some(Event::Error { message }) => {
                assert!(message.contains("id 3"), "{message}");
                break h.collect(&[3], Duration::from_secs(10)).remove(&3).unwrap();
            }
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(o.out(), "ran\n");
}

/// Reads `id`'s events until its first stdout line; returns the main's pid and that line (the
/// scripts echo their shepherd's pid, `$PPID`, first).
fn first_line(h: &mut Helper, id: u64) -> (u32, String) {
    let mut got = Vec::new();
    let mut main = 0;
    while !got.contains(&b'\n') {
        match h.next(Duration::from_secs(20)) {
            Some(Event::Started { id: i, pid }) if i == id => main = pid,
            Some(Event::Stdout { id: i, data }) if i == id => got.extend_from_slice(&data),
            Some(Event::Exit { .. }) | None => panic!("no output from {id}"),
            Some(_) => {}
        }
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    (main, text.lines().next().unwrap().to_string())
}

/// Waits for `id`'s `Exit` (skipping other events) and returns (exit code, timed out, elapsed).
fn exit_of(h: &mut Helper, id: u64, within: Duration) -> (i32, bool, Duration) {
    let began = Instant::now();
    while began.elapsed() < within {
        if let Some(Event::Exit {
            id: i,
            exit_code,
            timed_out,
            ..
        }) = h.next(within.saturating_sub(began.elapsed()))
        {
            if i == id {
                return (exit_code, timed_out, began.elapsed());
            }
        }
    }
    panic!("{id} was not reported within {within:?}");
}

#[test]
fn a_stopped_shepherd_cannot_hold_a_command_past_its_deadline() {
    let mut h = Helper::spawn();
    let m = marker();
    h.start_sh(1, "echo $PPID; exec sleep 1000", &m, 1500);
    let shepherd: i32 = first_line(&mut h, 1).1.parse().unwrap();
    // A shepherd that no longer acts (stopped here; starved or stuck in a real sandbox) used to
    // keep the command unreported: its status pipe never closed.
    unsafe { libc::kill(shepherd, libc::SIGSTOP) };
    let (code, timed_out, _) = exit_of(&mut h, 1, Duration::from_secs(10));
    assert_eq!((code, timed_out), (EXIT_CODE_TIMEOUT, true));
    assert_none_left(&m);
}

#[test]
fn a_shepherd_that_cannot_be_woken_is_killed_after_its_last_grace() {
    let mut h = Helper::spawn();
    let m = marker();
    h.start_sh(1, "echo $PPID; exec sleep 1000", &m, 1000);
    let shepherd: i32 = first_line(&mut h, 1).1.parse().unwrap();
    // Held in a ptrace stop, which SIGCONT does not end: the helper's wake-up at the first grace
    // changes nothing, and it kills the shepherd after the last. The tracer stays until the
    // shepherd's end is consumed, so that the helper can reap it.
    let tracer = thread::spawn(move || unsafe {
        let none = std::ptr::null_mut::<libc::c_void>();
        assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, shepherd, none, none), 0);
        assert_eq!(
            libc::ptrace(libc::PTRACE_INTERRUPT, shepherd, none, none),
            0
        );
        let mut status = 0;
        loop {
            let r = libc::waitpid(shepherd, &mut status, libc::__WALL);
            if r == -1 || libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
                return;
            }
        }
    });
    let (code, timed_out, took) = exit_of(&mut h, 1, Duration::from_secs(20));
    tracer.join().unwrap();
    assert_eq!((code, timed_out), (EXIT_CODE_TIMEOUT, true));
    // The deadline, the first grace (the group is killed and the shepherd woken), then the last.
    assert!(
        took >= Duration::from_millis(6000),
        "reported after {took:?}"
    );
    assert_none_left(&m);
}

#[test]
fn a_shepherd_stuck_after_the_main_exit_is_reported_with_the_main_exit() {
    let mut h = Helper::spawn();
    let m = marker();
    // The main exits 3 at once; its background sleep holds the output open, so the helper
    // lingers a second, then closes the output and tells the shepherd to finish: a stopped shepherd
    // never does, and the deadline ends it with the main's own exit code.
    h.start(StartRequest {
        id: 1,
        argv: sh("echo $PPID; sleep 1000 & exit 3"),
        env: env_with(&m),
        timeout_ms: 3000,
        linger_ms: 1000,
        ..Default::default()
    });
    let (main, line) = first_line(&mut h, 1);
    let shepherd: i32 = line.parse().unwrap();
    // The shepherd reaps the main and reports it in one go: once the main is gone from /proc,
    // its exit is on its way to the helper.
    let gone = Instant::now();
    while std::path::Path::new(&format!("/proc/{main}")).exists() {
        assert!(
            gone.elapsed() < Duration::from_secs(10),
            "the main did not exit"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(50));
    unsafe { libc::kill(shepherd, libc::SIGSTOP) };
    let (code, timed_out, _) = exit_of(&mut h, 1, Duration::from_secs(10));
    assert_eq!((code, timed_out), (3, false));
    assert_none_left(&m);
}
