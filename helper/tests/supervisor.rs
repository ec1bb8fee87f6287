//! Runs the built `agent-sandbox-helper idle` (the process supervisor) on the host, each test on
//! its own abstract socket name, and drives it through `bridge`, as the server does.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use helper_protocol::supervisor::*;
use helper_protocol::FrameDecoder;

fn bin() -> String {
    std::env::var("AGENT_SANDBOX_HELPER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_agent-sandbox-helper").to_string())
}

struct Sup {
    child: Child,
    name: String,
}

impl Drop for Sup {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn supervisor() -> Sup {
    static N: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "ash-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    );
    let child = Command::new(bin())
        .arg("idle")
        .env("AGENT_SANDBOX_SUPERVISOR_SOCKET", &name)
        .spawn()
        .unwrap();
    let sup = Sup { child, name };
    // Wait until it accepts.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let mut c = Client::try_new(&sup);
        if let Some(c) = c.as_mut() {
            c.req(&SupRequest::List);
            if c.collect().last() == Some(&Reply::Ok) {
                break;
            }
        }
        assert!(Instant::now() < deadline, "supervisor did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    sup
}

struct Client {
    bridge: Child,
    stdin: ChildStdin,
    stdout: ChildStdout,
    decoder: FrameDecoder,
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.bridge.kill();
        let _ = self.bridge.wait();
    }
}

impl Client {
    fn try_new(sup: &Sup) -> Option<Client> {
        let mut bridge = Command::new(bin())
            .arg("bridge")
            .env("AGENT_SANDBOX_SUPERVISOR_SOCKET", &sup.name)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdin = bridge.stdin.take().unwrap();
        let mut stdout = bridge.stdout.take().unwrap();
        let mut hello = [0u8; 4];
        if stdout.read_exact(&mut hello).is_err() {
            let _ = bridge.wait();
            return None;
        }
        assert_eq!(u32::from_be_bytes(hello), SUPERVISOR_VERSION);
        Some(Client {
            bridge,
            stdin,
            stdout,
            decoder: FrameDecoder::new(),
        })
    }

    fn new(sup: &Sup) -> Client {
        Client::try_new(sup).expect("bridge connects")
    }

    fn req(&mut self, r: &SupRequest) {
        self.stdin.write_all(&r.to_frame().unwrap()).unwrap();
    }

    fn next(&mut self) -> Reply {
        loop {
            if let Some(r) = self.decoder.next_reply().unwrap() {
                return r;
            }
            let mut buf = [0u8; 65536];
            let n = self.stdout.read(&mut buf).unwrap();
            assert!(n > 0, "bridge closed");
            self.decoder.feed(&buf[..n]);
        }
    }

    /// Every reply up to and including the final one.
    fn collect(&mut self) -> Vec<Reply> {
        let mut v = Vec::new();
        loop {
            let r = self.next();
            let fin = r.is_final();
            v.push(r);
            if fin {
                return v;
            }
        }
    }

    fn start(&mut self, argv: &[&str], tty: bool, stdin: bool) -> ProcInfo {
        self.req(&start_request(argv, tty, stdin, false));
        match self.collect().as_slice() {
            [Reply::Process(p), Reply::Ok] => p.clone(),
            other => panic!("start answered {other:?}"),
        }
    }

    /// All output of a process (following to its end): (stdout, stderr, final reply).
    fn output(&mut self, id: &str, follow: bool) -> (Vec<u8>, Vec<u8>, Reply) {
        self.req(&SupRequest::Output {
            id: id.into(),
            stdout_from: 0,
            stderr_from: 0,
            follow,
        });
        self.read_output()
    }

    /// Chunks up to the final reply: (stdout, stderr, final reply).
    fn read_output(&mut self) -> (Vec<u8>, Vec<u8>, Reply) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        loop {
            match self.next() {
                Reply::Chunk {
                    stream,
                    offset,
                    data,
                } => {
                    let s = if stream == 1 { &mut out } else { &mut err };
                    assert_eq!(offset, s.len() as u64);
                    s.extend_from_slice(&data);
                }
                r if r.is_final() => return (out, err, r),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

fn start_request(argv: &[&str], tty: bool, stdin: bool, follow: bool) -> SupRequest {
    SupRequest::Start(ProcStart {
        command: String::new(),
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        workdir: "/".into(),
        tty,
        stdin,
        cols: 80,
        rows: 24,
        timeout_ms: 0,
        retain_bytes: 1 << 20,
        max_running: 8,
        follow,
    })
}

fn sh(script: &str) -> Vec<&str> {
    vec!["/bin/sh", "-c", script]
}

/// `end` says the process exited by itself with `code`.
fn assert_exited(end: &Reply, code: i32) {
    assert!(
        matches!(end, Reply::Exit { exit_code: Some(c), signal: None, .. } if *c == code),
        "{end:?}"
    );
}

#[test]
fn exit_codes_and_signals_are_truthful() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    let p = c.start(&sh("echo out; echo err >&2; exit 3"), false, false);
    assert!(p.pid > 0);
    let (out, err, end) = c.output(&p.id, true);
    assert_eq!(
        (out.as_slice(), err.as_slice()),
        (&b"out\n"[..], &b"err\n"[..])
    );
    assert_exited(&end, 3);

    let p = c.start(&["sleep", "30"], false, false);
    c.req(&SupRequest::Signal {
        id: p.id.clone(),
        signal: 9,
    });
    assert_eq!(c.next(), Reply::Ok);
    let (_, _, end) = c.output(&p.id, true);
    assert!(
        matches!(
            end,
            Reply::Exit {
                exit_code: None,
                signal: Some(9),
                ..
            }
        ),
        "{end:?}"
    );

    let p = c.start(&["no-such-program-here"], false, false);
    let (_, err, end) = c.output(&p.id, true);
    assert!(String::from_utf8_lossy(&err).contains("command not found"));
    assert_exited(&end, 127);
}

/// A start with `follow` answers its process and then its whole output up to its exit, on the
/// same request, as a start and an output request would; the connection serves the next request.
#[test]
fn a_start_that_follows_streams_the_output_to_the_exit() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    c.req(&start_request(
        &sh("echo out; sleep 0.2; echo err >&2; exit 5"),
        false,
        false,
        true,
    ));
    let p = match c.next() {
        Reply::Process(p) => p,
        other => panic!("start answered {other:?}"),
    };
    assert!(p.pid > 0);
    let (out, err, end) = c.read_output();
    assert_eq!((&out[..], &err[..]), (&b"out\n"[..], &b"err\n"[..]));
    assert_exited(&end, 5);

    // A command that cannot start ends the same way, with the reason on stderr.
    c.req(&start_request(
        &["no-such-program-here"],
        false,
        false,
        true,
    ));
    assert!(matches!(c.next(), Reply::Process(_)));
    let (_, err, end) = c.read_output();
    assert!(String::from_utf8_lossy(&err).contains("command not found"));
    assert_exited(&end, 127);

    // The output is still there for an output request of its own, as without `follow`.
    let (out, _, _) = c.output(&p.id, true);
    assert_eq!(out, b"out\n");
}

#[test]
fn a_running_process_ends_a_non_following_read_with_running() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    // Closing stdout does not end it.
    let p = c.start(&sh("printf abc; exec >&- 2>&-; sleep 30"), false, false);
    std::thread::sleep(Duration::from_millis(300));
    let (out, _, end) = c.output(&p.id, false);
    assert_eq!(out, b"abc");
    assert_eq!(
        end,
        Reply::Running {
            stdout_offset: 3,
            stderr_offset: 0
        }
    );
    c.req(&SupRequest::Get { id: p.id.clone() });
    assert!(matches!(
        c.next(),
        Reply::Process(ProcInfo { running: true, .. })
    ));
    assert_eq!(c.next(), Reply::Ok);
    c.req(&SupRequest::Delete { id: p.id.clone() });
    assert_eq!(c.next(), Reply::Ok);
    c.req(&SupRequest::Get { id: p.id.clone() });
    assert!(matches!(
        c.next(),
        Reply::Error {
            code: ErrorCode::NotFound,
            ..
        }
    ));
}

#[test]
fn stdin_round_trips_and_closes() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    let p = c.start(&["cat"], false, true);
    c.req(&SupRequest::Stdin {
        id: p.id.clone(),
        close: false,
        data: b"hello\xff\n".to_vec(),
    });
    assert_eq!(c.next(), Reply::Ok);
    c.req(&SupRequest::Stdin {
        id: p.id.clone(),
        close: true,
        data: b"bye".to_vec(),
    });
    assert_eq!(c.next(), Reply::Ok);
    let (out, _, end) = c.output(&p.id, true);
    assert_eq!(out, b"hello\xff\nbye");
    assert!(matches!(
        end,
        Reply::Exit {
            exit_code: Some(0),
            ..
        }
    ));
    c.req(&SupRequest::Stdin {
        id: p.id.clone(),
        close: false,
        data: b"x".to_vec(),
    });
    assert!(matches!(
        c.next(),
        Reply::Error {
            code: ErrorCode::Conflict,
            ..
        }
    ));

    let p = c.start(&["sleep", "5"], false, false);
    c.req(&SupRequest::Stdin {
        id: p.id.clone(),
        close: false,
        data: b"x".to_vec(),
    });
    assert!(matches!(
        c.next(),
        Reply::Error {
            code: ErrorCode::Conflict,
            ..
        }
    ));
}

#[test]
fn a_tty_is_a_terminal_and_resizes() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    let p = c.start(
        &sh("test -t 0 && test -t 1 && echo tty; read x; stty size"),
        true,
        true,
    );
    c.req(&SupRequest::Resize {
        id: p.id.clone(),
        cols: 100,
        rows: 40,
    });
    assert_eq!(c.next(), Reply::Ok);
    c.req(&SupRequest::Stdin {
        id: p.id.clone(),
        close: false,
        data: b"go\n".to_vec(),
    });
    assert_eq!(c.next(), Reply::Ok);
    let (out, err, end) = c.output(&p.id, true);
    let out = String::from_utf8_lossy(&out);
    assert!(out.contains("tty"), "{out:?}");
    assert!(out.contains("40 100"), "{out:?}");
    assert!(err.is_empty());
    assert_exited(&end, 0);
}

#[test]
fn output_is_retained_by_offset_and_truncation_is_reported() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    // 3 MiB through a 1 MiB window.
    let p = c.start(
        &sh("head -c 3145728 /dev/zero | tr '\\0' 'a'"),
        false,
        false,
    );
    // Followed to its end. A reader slower than the command (a loaded machine) is told on the
    // way that output it had not read yet was dropped: that is the window working, not an error.
    c.req(&SupRequest::Output {
        id: p.id.clone(),
        stdout_from: 0,
        stderr_from: 0,
        follow: true,
    });
    let end = loop {
        match c.next() {
            Reply::Chunk { .. } | Reply::Truncated { stream: 1, .. } => {}
            r => break r,
        }
    };
    assert!(matches!(end, Reply::Exit { .. }), "{end:?}");
    c.req(&SupRequest::Output {
        id: p.id.clone(),
        stdout_from: 5,
        stderr_from: 0,
        follow: false,
    });
    let first = c.next();
    assert_eq!(
        first,
        Reply::Truncated {
            stream: 1,
            requested: 5,
            retained_from: 2 << 20
        }
    );
    let mut got = 0u64;
    loop {
        match c.next() {
            Reply::Chunk { offset, data, .. } => {
                assert_eq!(offset, (2 << 20) + got);
                got += data.len() as u64;
            }
            r => {
                assert!(matches!(r, Reply::Exit { .. }));
                break;
            }
        }
    }
    assert_eq!(got, 1 << 20);
}

#[test]
fn delete_kills_a_tree_that_called_setsid_and_limits_hold() {
    let sup = supervisor();
    let mut c = Client::new(&sup);
    let p = c.start(&sh("setsid sleep 1000 & echo $!; wait"), false, false);
    std::thread::sleep(Duration::from_millis(300));
    let (out, _, _) = c.output(&p.id, false);
    let child: i32 = String::from_utf8_lossy(&out).trim().parse().unwrap();
    assert!(std::path::Path::new(&format!("/proc/{child}")).exists());
    c.req(&SupRequest::Delete { id: p.id.clone() });
    assert_eq!(c.next(), Reply::Ok);
    let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
    assert!(stat.is_empty() || stat.contains(") Z"), "survivor: {stat}");

    for _ in 0..8 {
        c.start(&["sleep", "30"], false, false);
    }
    c.req(&SupRequest::Start(ProcStart {
        argv: vec!["true".into()],
        max_running: 8,
        retain_bytes: 4096,
        ..Default::default()
    }));
    assert!(matches!(
        c.next(),
        Reply::Error {
            code: ErrorCode::TooMany,
            ..
        }
    ));
}

#[test]
fn a_process_outlives_its_client_and_garbage_is_refused() {
    let sup = supervisor();
    let id = {
        let mut c = Client::new(&sup);
        c.start(&sh("sleep 0.5; echo late"), false, false).id
    };
    std::thread::sleep(Duration::from_millis(900));
    let mut c = Client::new(&sup);
    let (out, _, end) = c.output(&id, true);
    assert_eq!(out, b"late\n");
    assert!(matches!(
        end,
        Reply::Exit {
            exit_code: Some(0),
            ..
        }
    ));

    let mut bad = Client::new(&sup);
    bad.stdin.write_all(&[0, 0, 0, 1, 0x7f]).unwrap();
    assert!(matches!(
        bad.next(),
        Reply::Error {
            code: ErrorCode::Invalid,
            ..
        }
    ));
}

/// A fresh directory of this test's own under the system's temporary directory.
fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ash-watch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn watch(path: &std::path::Path, recursive: bool, follow: bool, max_watchers: u32) -> SupRequest {
    SupRequest::Watch(WatchStart {
        path: path.to_str().unwrap().to_string(),
        recursive,
        follow,
        max_watchers,
        max_dirs: 64,
        max_queued: 1000,
        idle_ms: 0,
    })
}

/// Events a detached watcher has queued, asked for until `want` have come (or 5 s passed).
fn poll_events(c: &mut Client, id: &str, want: usize) -> Vec<(FsOp, String)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while got.len() < want && Instant::now() < deadline {
        c.req(&SupRequest::WatchEvents { id: id.into() });
        for r in c.collect() {
            match r {
                Reply::FsEvent { op, name } => got.push((op, name)),
                Reply::Ok => {}
                other => panic!("watch events answered {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    got
}

#[test]
fn a_streamed_watch_reports_real_changes_recursively_and_ends_with_its_connection() {
    let sup = supervisor();
    let dir = temp_dir("stream");
    std::fs::create_dir(dir.join("old")).unwrap();
    let mut c = Client::new(&sup);
    c.req(&watch(&dir, true, true, 1));
    assert!(matches!(c.next(), Reply::Watcher { .. }));
    std::fs::write(dir.join("a.txt"), b"x").unwrap();
    std::fs::set_permissions(
        dir.join("a.txt"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    std::fs::rename(dir.join("a.txt"), dir.join("b.txt")).unwrap();
    std::fs::remove_file(dir.join("b.txt")).unwrap();
    std::fs::write(dir.join("old/in-old"), b"").unwrap();
    std::fs::create_dir_all(dir.join("new/deeper")).unwrap();
    std::fs::write(dir.join("new/deeper/f"), b"y").unwrap();
    let mut got = Vec::new();
    let want = [
        (FsOp::Create, "a.txt"),
        (FsOp::Write, "a.txt"),
        (FsOp::Chmod, "a.txt"),
        (FsOp::Rename, "a.txt"),
        (FsOp::Create, "b.txt"),
        (FsOp::Remove, "b.txt"),
        (FsOp::Create, "old/in-old"),
        (FsOp::Create, "new"),
        (FsOp::Create, "new/deeper/f"),
    ];
    while !want
        .iter()
        .all(|(op, n)| got.iter().any(|(o, m): &(FsOp, String)| o == op && m == n))
    {
        match c.next() {
            Reply::FsEvent { op, name } => got.push((op, name)),
            other => panic!("the stream answered {other:?} after {got:?}"),
        }
    }
    // The first six in order: what happened to one file.
    let firsts: Vec<(FsOp, &str)> = got.iter().take(6).map(|(o, n)| (*o, n.as_str())).collect();
    assert_eq!(&firsts[..], &want[..6]);
    // One watcher at most: a second is refused while the stream lives...
    let mut other = Client::new(&sup);
    other.req(&watch(&dir, false, false, 1));
    assert!(matches!(
        other.collect().as_slice(),
        [Reply::Error {
            code: ErrorCode::TooMany,
            ..
        }]
    ));
    // ...and taken once the stream's connection is gone.
    drop(c);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        other.req(&watch(&dir, false, false, 1));
        match other.collect().as_slice() {
            [Reply::Watcher { .. }, Reply::Ok] => break,
            [Reply::Error { .. }] if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            r => panic!("after the stream ended a watch answered {r:?}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_detached_watcher_queues_until_asked_and_is_removed() {
    let sup = supervisor();
    let dir = temp_dir("detached");
    let mut c = Client::new(&sup);
    c.req(&watch(&dir, false, false, 4));
    let id = match c.collect().as_slice() {
        [Reply::Watcher { id }, Reply::Ok] => id.clone(),
        other => panic!("watch answered {other:?}"),
    };
    assert!(id.starts_with("w_"));
    std::fs::create_dir(dir.join("sub")).unwrap();
    // Not recursive: what happens inside `sub` is not reported.
    std::fs::write(dir.join("sub/inner"), b"").unwrap();
    std::fs::write(dir.join("top"), b"").unwrap();
    let got = poll_events(&mut c, &id, 2);
    assert_eq!(
        got,
        vec![(FsOp::Create, "sub".into()), (FsOp::Create, "top".into())]
    );
    c.req(&SupRequest::Unwatch { id: id.clone() });
    assert_eq!(c.collect(), vec![Reply::Ok]);
    c.req(&SupRequest::WatchEvents { id });
    assert!(matches!(
        c.collect().as_slice(),
        [Reply::Error {
            code: ErrorCode::NotFound,
            ..
        }]
    ));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn watch_limits_and_bad_paths_are_clear_errors() {
    let sup = supervisor();
    let dir = temp_dir("limits");
    let mut c = Client::new(&sup);
    let code = |c: &mut Client, req: SupRequest| match c.collect().as_slice() {
        [Reply::Error { code, message }] => (*code, message.clone()),
        other => panic!("{req:?} answered {other:?}"),
    };
    let missing = dir.join("missing");
    c.req(&watch(&missing, false, false, 4));
    let (e, m) = code(&mut c, watch(&missing, false, false, 4));
    assert_eq!(e, ErrorCode::NotFound);
    assert!(m.contains("not found"), "{m}");
    std::fs::write(dir.join("file"), b"").unwrap();
    c.req(&watch(&dir.join("file"), false, false, 4));
    assert_eq!(
        code(&mut c, watch(&dir, false, false, 4)).0,
        ErrorCode::Invalid
    );
    // A tree larger than max_dirs is refused whole.
    for i in 0..70 {
        std::fs::create_dir(dir.join(format!("d{i}"))).unwrap();
    }
    c.req(&watch(&dir, true, false, 4));
    assert_eq!(
        code(&mut c, watch(&dir, true, false, 4)).0,
        ErrorCode::TooMany
    );
    // More events than may wait: the watcher fails with a message saying so, after handing out
    // what it kept.
    c.req(&SupRequest::Watch(WatchStart {
        path: dir.to_str().unwrap().into(),
        max_watchers: 4,
        max_dirs: 4,
        max_queued: 3,
        ..WatchStart::default()
    }));
    let id = match c.collect().as_slice() {
        [Reply::Watcher { id }, Reply::Ok] => id.clone(),
        other => panic!("watch answered {other:?}"),
    };
    for i in 0..5 {
        std::fs::write(dir.join(format!("f{i}")), b"").unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    c.req(&SupRequest::WatchEvents { id: id.clone() });
    let replies = c.collect();
    assert_eq!(replies.len(), 4, "{replies:?}");
    match replies.last() {
        Some(Reply::Error {
            code: ErrorCode::TooMany,
            message,
        }) => assert!(message.contains("events were lost"), "{message}"),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn removing_the_watched_directory_ends_the_watch() {
    let sup = supervisor();
    let dir = temp_dir("gone");
    let mut c = Client::new(&sup);
    c.req(&watch(&dir, true, true, 4));
    assert!(matches!(c.next(), Reply::Watcher { .. }));
    std::fs::write(dir.join("f"), b"").unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    loop {
        match c.next() {
            Reply::FsEvent { .. } => {}
            Reply::Error {
                code: ErrorCode::NotFound,
                message,
            } => {
                assert!(message.contains("was removed"), "{message}");
                break;
            }
            other => panic!("the stream answered {other:?}"),
        }
    }
}
