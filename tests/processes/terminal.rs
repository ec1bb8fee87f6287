//! The command line's interactive sessions, end to end against the real daemon: `exec -it` on a
//! real pseudo-terminal (raw mode, Ctrl-C to the remote side, resize on SIGWINCH, the remote
//! exit code becomes ours, the terminal restored), `exec -i` piping stdin byte for byte with
//! stdout and stderr apart, and `attach` (stdin, exit code, Ctrl-P Ctrl-Q detaching).

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::*;

/// A pseudo-terminal pair: the test holds the master side, the command line gets the other.
struct Pty {
    master: std::fs::File,
    /// Kept to read the terminal's modes while the command line runs and after.
    slave: OwnedFd,
    screen: Arc<Mutex<Vec<u8>>>,
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

impl Pty {
    fn open(cols: u16, rows: u16) -> Pty {
        let (mut master, mut slave) = (0, 0);
        let ws = winsize(cols, rows);
        // SAFETY: out-pointers to two ints; null name and termios; a valid winsize.
        let r = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &ws,
            )
        };
        assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty gave us both descriptors; each is owned once.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                OwnedFd::from_raw_fd(slave),
            )
        };
        let screen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = Arc::clone(&screen);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once no one holds the other side any more.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty {
            master,
            slave,
            screen,
        }
    }

    /// Starts the command line on this terminal as its controlling terminal (so that the kernel
    /// sends it SIGWINCH when the size changes).
    fn spawn(&self, server: &Server, args: &[&str]) -> Child {
        let io = || Stdio::from(self.slave.try_clone().unwrap());
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"));
        cmd.args(args)
            .env("AGENT_SANDBOX_URL", &server.url)
            .env("AGENT_SANDBOX_API_KEY", &server.key)
            .stdin(io())
            .stdout(io())
            .stderr(io());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.spawn().unwrap()
    }

    fn type_in(&mut self, keys: &[u8]) {
        self.master.write_all(keys).unwrap();
    }

    fn screen(&self) -> String {
        String::from_utf8_lossy(&self.screen.lock().unwrap()).to_string()
    }

    /// Waits until the screen shows `needle` after byte `from`; where it ends on the screen.
    fn wait_for(&self, needle: &str, from: usize) -> usize {
        self.wait_for_within(needle, from, Duration::from_secs(30))
            .unwrap_or_else(|| panic!("{needle:?} never showed; the screen: {:?}", self.screen()))
    }

    /// [`Pty::wait_for`], giving up after `limit`.
    fn wait_for_within(&self, needle: &str, from: usize, limit: Duration) -> Option<usize> {
        let deadline = Instant::now() + limit;
        loop {
            let screen = self.screen.lock().unwrap().clone();
            let tail = String::from_utf8_lossy(&screen[from.min(screen.len())..]).to_string();
            if let Some(at) = tail.find(needle) {
                return Some(from + at + needle.len());
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn resize(&self, cols: u16, rows: u16) {
        let ws = winsize(cols, rows);
        // SAFETY: a valid winsize for the master side of our pty.
        let r = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        assert_eq!(r, 0);
    }

    /// Whether the terminal echoes and edits lines (cooked), as a shell leaves it.
    fn cooked(&self) -> bool {
        // SAFETY: termios is plain data, filled by tcgetattr.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor we own and a termios to write into.
        assert_eq!(
            unsafe { libc::tcgetattr(self.slave.as_raw_fd(), &mut t) },
            0
        );
        t.c_lflag & (libc::ICANON | libc::ECHO) == (libc::ICANON | libc::ECHO)
    }
}

fn wait_exit(child: &mut Child, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the command line did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The command line with `input` on its stdin (then closed); its output and status.
fn cli_with_input(server: &Server, args: &[&str], input: &[u8]) -> std::process::Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_agent-sandbox"))
        .args(args)
        .env("AGENT_SANDBOX_URL", &server.url)
        .env("AGENT_SANDBOX_API_KEY", &server.key)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

#[test]
fn exec_it_is_a_raw_terminal_that_resizes_and_returns_the_exit_code() {
    let server = Server::start();
    let sb = sandbox(&server);
    let mut pty = Pty::open(90, 30);
    assert!(pty.cooked());
    let mut cli = pty.spawn(&server, &["exec", "-it", &sb, "--", "sh"]);

    // The remote terminal starts at our size.
    pty.type_in(b"stty size\r");
    let mut seen = pty.wait_for("30 90", 0);
    // Ours is raw while the session lasts: Ctrl-C is a byte for the remote side, and we live on.
    assert!(!pty.cooked(), "the local terminal is not in raw mode");
    if test_runtime() == "runsc" {
        // gVisor's terminals raise SIGINT for Ctrl-C even in raw mode (`-isig`): there the
        // byte's arrival shows as the remote line discipline's interrupt, caught by a trap.
        pty.type_in(b"sh -c 'trap \"echo got-int\" INT; echo rea\"\"dy; sleep 60'\r");
        seen = pty.wait_for("ready", seen);
        // Now and then gVisor's terminal lets a Ctrl-C that arrives just as the command starts go
        // by without an interrupt (the byte is echoed, no signal follows); a second one is
        // interrupted. Each try still proves the byte reached the remote side and we live on.
        let mut tries = 0;
        seen = loop {
            pty.type_in(b"\x03");
            tries += 1;
            match pty.wait_for_within("got-int", seen, Duration::from_secs(4)) {
                Some(at) => break at,
                None if tries < 5 => continue,
                None => panic!("Ctrl-C never interrupted: {:?}", pty.screen()),
            }
        };
    } else {
        // Read there as it is, the remote terminal raw too.
        pty.type_in(
            b"echo key:$(stty raw -echo; echo rea\"\"dy >&2; dd bs=1 count=1 2>/dev/null | od -An -tx1 | tr -d ' '; stty sane)\r",
        );
        seen = pty.wait_for("ready", seen);
        pty.type_in(b"\x03");
        seen = pty.wait_for("key:03", seen);
    }
    assert!(cli.try_wait().unwrap().is_none(), "Ctrl-C ended the client");

    // A new size reaches the remote terminal through SIGWINCH.
    pty.resize(120, 50);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        pty.type_in(b"stty size\r");
        std::thread::sleep(Duration::from_millis(400));
        if pty.screen()[seen..].contains("50 120") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no resize: {:?}",
            &pty.screen()[seen..]
        );
    }

    pty.type_in(b"exit 7\r");
    assert_eq!(wait_exit(&mut cli, Duration::from_secs(30)), 7);
    assert!(pty.cooked(), "the terminal was left in raw mode");
}

#[test]
fn exec_i_pipes_stdin_and_returns_the_exit_code() {
    let server = Server::start();
    let sb = sandbox(&server);
    let run = |args: &[&str], input: &[u8]| cli_with_input(&server, args, input);

    // kubectl's example.
    let out = run(&["exec", "-i", &sb, "--", "cat"], b"hi\n");
    assert_eq!(
        out.stdout,
        b"hi\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0));

    // Binary input byte for byte, stderr apart, the exit code ours, the end of our input the
    // end of the command's.
    let input: Vec<u8> = (0..300_000).map(|_| rand::random::<u8>()).collect();
    let out = run(
        &[
            "exec",
            "-i",
            &sb,
            "-e",
            "WHO=env",
            "--",
            "sh",
            "-c",
            "cat; echo err-$WHO >&2; exit 5",
        ],
        &input,
    );
    assert!(out.stdout == input, "{} bytes back", out.stdout.len());
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err-env\n");
    assert_eq!(out.status.code(), Some(5));

    // A signal's end is 128 + its number, as a shell says.
    let out = run(&["exec", "-i", &sb, "--", "sh", "-c", "kill -9 $$"], b"");
    assert_eq!(out.status.code(), Some(137));

    // One program with no arguments runs as given (not as a shell command line).
    let out = run(&["exec", "-i", &sb, "--", "pwd"], b"");
    assert_eq!(out.stdout, b"/workspace\n");

    // A refusal is the server's message and no session.
    let out = run(&["exec", "-i", "no-such-sandbox", "--", "cat"], b"");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn attach_passes_stdin_returns_the_exit_code_and_detaches() {
    let server = Server::start();
    let sb = sandbox(&server);

    // attach -i: our input to a process started in the background; its exit code ours.
    let p = start(&server, &sb, json!({"argv": ["sh"], "stdin": true}));
    let id = p["id"].as_str().unwrap();
    let out = cli_with_input(
        &server,
        &["attach", "-i", &sb, id],
        b"echo attached-$((1+1)); exit 6\n",
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "attached-2\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(6));

    // An ended process is refused with its state.
    let (code, _, err) = cli(&server, &["attach", &sb, id]);
    assert_eq!(code, 1);
    assert!(err.contains("Exited(6)"), "{err}");

    // attach -it to a terminal: Ctrl-P Ctrl-Q leaves it running; a second attach ends it.
    let p = start(
        &server,
        &sb,
        json!({"argv": ["sh"], "tty": true, "stdin": true}),
    );
    let id = p["id"].as_str().unwrap();
    let mut pty = Pty::open(100, 40);
    let mut cli1 = pty.spawn(&server, &["attach", "-it", &sb, id]);
    std::thread::sleep(Duration::from_millis(500));
    pty.type_in(b"echo one-$((2+3))\r");
    let seen = pty.wait_for("one-5", 0);
    pty.type_in(b"\x10\x11");
    assert_eq!(wait_exit(&mut cli1, Duration::from_secs(30)), 0);
    assert!(pty.cooked());
    assert_eq!(get(&server, &sb, id)["state"], "Running");

    let mut cli2 = pty.spawn(&server, &["attach", "-it", &sb, id]);
    std::thread::sleep(Duration::from_millis(500));
    pty.type_in(b"stty size; exit 9\r");
    // The attach sent our size.
    pty.wait_for("40 100", seen);
    assert_eq!(wait_exit(&mut cli2, Duration::from_secs(30)), 9);
    assert!(pty.cooked());
}
