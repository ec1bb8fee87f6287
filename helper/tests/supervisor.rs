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
        self.req(&SupRequest::Start(ProcStart {
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
        }));
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

fn sh(script: &str) -> Vec<&str> {
    vec!["/bin/sh", "-c", script]
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
    assert!(
        matches!(
            end,
            Reply::Exit {
                exit_code: Some(3),
                signal: None,
                ..
            }
        ),
        "{end:?}"
    );

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
    assert!(
        matches!(
            end,
            Reply::Exit {
                exit_code: Some(127),
                ..
            }
        ),
        "{end:?}"
    );
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
    assert!(
        matches!(
            end,
            Reply::Exit {
                exit_code: Some(0),
                ..
            }
        ),
        "{end:?}"
    );
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
    let (_, _, end) = c.output(&p.id, true);
    assert!(matches!(end, Reply::Exit { .. }));
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
