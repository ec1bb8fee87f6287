//! One long-lived process of the supervisor (`supervisor.rs`): its shepherd (the same child
//! subreaper as `serve`'s commands, `shepherd.rs`), its pipes or terminal, the rings holding the
//! retained tail of its output (`ring.rs`), its stdin queue, and its truthful end (from the main
//! process's wait status, never from a pipe closing). It owns no loop and no socket: the
//! supervisor decides when to read, write, kill and forget.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use helper_protocol::supervisor::{ProcInfo, ProcStart};
use helper_protocol::StartRequest;

use crate::ring::Ring;
use crate::{command, shepherd, sys};

/// How long output may keep arriving after the main process exited (as `docker exec` waits).
pub const LINGER_MS: u64 = 2000;
/// Stdin bytes queued per process before the supervisor stops reading that client's requests.
pub const STDIN_QUEUE: usize = 256 * 1024;

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub struct Process {
    pub id: String,
    pub command: String,
    pub argv: Vec<String>,
    pub tty: bool,
    pub pid: u32,
    pub shepherd: libc::pid_t,
    pub status: Option<OwnedFd>,
    status_buf: Vec<u8>,
    control: OwnedFd,
    /// stdout, or the terminal's master side for a tty.
    pub out: Option<OwnedFd>,
    pub err: Option<OwnedFd>,
    pub stdin: Option<OwnedFd>,
    /// The terminal's master side, kept for resizes.
    master: Option<OwnedFd>,
    pub stdin_queue: Vec<u8>,
    pub close_stdin_after: bool,
    pub stdout: Ring,
    pub stderr: Ring,
    pub started_at_ms: u64,
    /// The main process's raw wait status once it exited (or the shepherd vanished: SIGKILL).
    pub main_status: Option<i32>,
    /// A start failure: shell-style code (126/127).
    pub failure: Option<i32>,
    main_exited_at: Option<Instant>,
    pub deadline: Option<Instant>,
    pub finished_at_ms: Option<u64>,
    pub killing: bool,
}

fn winsize(cols: u16, rows: u16) -> libc::winsize {
    libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Opens a pseudo-terminal pair (master, slave) of the given size.
fn open_pty(cols: u16, rows: u16) -> Result<(OwnedFd, OwnedFd), String> {
    unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC);
        if m < 0 {
            return Err(format!("posix_openpt: {}", sys::strerror(sys::errno())));
        }
        let master = OwnedFd::from_raw_fd(m);
        if libc::grantpt(m) != 0 || libc::unlockpt(m) != 0 {
            return Err(format!("unlockpt: {}", sys::strerror(sys::errno())));
        }
        let mut name = [0 as libc::c_char; 128];
        if libc::ptsname_r(m, name.as_mut_ptr(), name.len()) != 0 {
            return Err(format!("ptsname: {}", sys::strerror(sys::errno())));
        }
        let s = libc::open(
            name.as_ptr(),
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        );
        if s < 0 {
            return Err(format!("open pty slave: {}", sys::strerror(sys::errno())));
        }
        let slave = OwnedFd::from_raw_fd(s);
        let ws = winsize(cols, rows);
        libc::ioctl(m, libc::TIOCSWINSZ, &ws);
        Ok((master, slave))
    }
}

fn dup(fd: &OwnedFd) -> Result<OwnedFd, String> {
    fd.try_clone().map_err(|e| format!("dup: {e}"))
}

impl Process {
    /// Starts `s` under a new shepherd. A command that cannot be started still yields a process
    /// (ended, with the shell's 126/127 and the reason on stderr), like a shell would.
    pub fn start(id: String, s: &ProcStart) -> Result<Process, String> {
        let req = StartRequest {
            id: 0,
            argv: s.argv.clone(),
            env: s.env.clone(),
            workdir: s.workdir.clone(),
            timeout_ms: 0,
            linger_ms: 0,
            keep_background: false,
        };
        let mut spec = command::prepare(&req)?;
        spec.tty = s.tty;
        let pipe = || sys::pipe().map_err(|e| format!("pipe: {e}"));
        let (status_r, status_w) = pipe()?;
        let (control_r, control_w) = pipe()?;
        // The child's ends, then ours.
        let (child_out, child_err, child_in, out, err, stdin, master);
        if s.tty {
            let (m, slave) = open_pty(s.cols.max(1), s.rows.max(1))?;
            child_out = slave;
            child_err = None;
            child_in = None;
            out = dup(&m)?;
            err = None;
            stdin = if s.stdin { Some(dup(&m)?) } else { None };
            master = Some(m);
        } else {
            let (out_r, out_w) = pipe()?;
            let (err_r, err_w) = pipe()?;
            child_out = out_w;
            child_err = Some(err_w);
            out = out_r;
            err = Some(err_r);
            master = None;
            if s.stdin {
                let (in_r, in_w) = pipe()?;
                child_in = Some(in_r);
                stdin = Some(in_w);
            } else {
                child_in = None;
                stdin = None;
            }
        }
        let mut fds: Vec<RawFd> = vec![status_r.as_raw_fd(), control_w.as_raw_fd()];
        fds.push(out.as_raw_fd());
        fds.extend(err.iter().map(AsRawFd::as_raw_fd));
        fds.extend(stdin.iter().map(AsRawFd::as_raw_fd));
        for fd in fds {
            let _ = sys::set_nonblocking(fd);
        }
        let child_fds = shepherd::Fds {
            control: control_r.as_raw_fd(),
            status: status_w.as_raw_fd(),
            stdout: child_out.as_raw_fd(),
            stderr: child_err
                .as_ref()
                .map_or(child_out.as_raw_fd(), AsRawFd::as_raw_fd),
            stdin: if s.tty {
                child_out.as_raw_fd()
            } else {
                child_in.as_ref().map_or(-1, AsRawFd::as_raw_fd)
            },
        };
        let pid = unsafe { libc::fork() };
        if pid == -1 {
            return Err(format!("fork: {}", sys::strerror(sys::errno())));
        }
        if pid == 0 {
            shepherd::run(&spec, child_fds);
        }
        drop((status_w, control_r, child_out, child_err, child_in));
        let retain = s.retain_bytes.clamp(4096, 1 << 34) as usize;
        Ok(Process {
            id,
            command: s.command.clone(),
            argv: s.argv.clone(),
            tty: s.tty,
            pid: 0,
            shepherd: pid,
            status: Some(status_r),
            status_buf: Vec::new(),
            control: control_w,
            out: Some(out),
            err,
            stdin,
            master,
            stdin_queue: Vec::new(),
            close_stdin_after: false,
            stdout: Ring::new(retain),
            stderr: Ring::new(retain),
            started_at_ms: now_ms(),
            main_status: None,
            failure: None,
            main_exited_at: None,
            deadline: (s.timeout_ms > 0)
                .then(|| Instant::now() + std::time::Duration::from_millis(s.timeout_ms)),
            finished_at_ms: None,
            killing: false,
        })
    }

    pub fn running(&self) -> bool {
        self.finished_at_ms.is_none()
    }

    /// `(exit_code, signal)` once ended.
    pub fn outcome(&self) -> (Option<i32>, Option<u32>) {
        if let Some(code) = self.failure {
            return (Some(code), None);
        }
        match self.main_status {
            Some(st) if libc::WIFEXITED(st) => (Some(libc::WEXITSTATUS(st)), None),
            Some(st) if libc::WIFSIGNALED(st) => (None, Some(libc::WTERMSIG(st) as u32)),
            Some(_) => (None, Some(libc::SIGKILL as u32)),
            None => (None, None),
        }
    }

    pub fn info(&self) -> ProcInfo {
        let (exit_code, signal) = if self.running() {
            (None, None)
        } else {
            self.outcome()
        };
        ProcInfo {
            id: self.id.clone(),
            pid: self.pid,
            command: self.command.clone(),
            argv: self.argv.clone(),
            tty: self.tty,
            stdin_open: self.stdin.is_some() && !self.close_stdin_after && self.running(),
            running: self.running(),
            exit_code,
            signal,
            started_at_ms: self.started_at_ms,
            finished_at_ms: self.finished_at_ms,
            stdout_bytes: self.stdout.end(),
            stderr_bytes: self.stderr.end(),
        }
    }

    /// Kills the whole tree (the shepherd reports the main process's end as usual).
    pub fn kill(&mut self) {
        if !self.killing && self.status.is_some() {
            self.killing = true;
            let _ = sys::write(self.control.as_raw_fd(), &[shepherd::CTL_KILL]);
        }
    }

    /// Sends `sig` to the process group while the main process lives (its pid, the group id,
    /// cannot have been reused before we read its status).
    pub fn signal(&self, sig: i32) -> bool {
        if self.pid == 0 || self.main_status.is_some() {
            return false;
        }
        unsafe { libc::kill(-(self.pid as libc::pid_t), sig) == 0 }
    }

    pub fn resize(&self, cols: u16, rows: u16) -> bool {
        match &self.master {
            Some(m) => {
                let ws = winsize(cols.max(1), rows.max(1));
                unsafe { libc::ioctl(m.as_raw_fd(), libc::TIOCSWINSZ, &ws) == 0 }
            }
            None => false,
        }
    }

    /// Reads what the shepherd reported.
    pub fn read_status(&mut self) {
        let Some(fd) = &self.status else { return };
        let mut buf = [0u8; 512];
        match sys::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => self.shepherd_gone(),
            Ok(n) => {
                self.status_buf.extend_from_slice(&buf[..n]);
                self.parse_status();
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => self.shepherd_gone(),
        }
    }

    fn shepherd_gone(&mut self) {
        self.status = None;
        let _ = sys::wait_for(self.shepherd);
        if self.main_status.is_none() && self.failure.is_none() {
            // The shepherd was killed from outside; its tree went with it.
            self.main_status = Some(libc::SIGKILL);
            self.main_exited_at = Some(Instant::now());
        }
    }

    fn parse_status(&mut self) {
        loop {
            let b = &self.status_buf;
            if b.len() < 5 {
                return;
            }
            let value = i32::from_be_bytes([b[1], b[2], b[3], b[4]]);
            let used = match b[0] {
                shepherd::MSG_STARTED => {
                    self.pid = value as u32;
                    5
                }
                shepherd::MSG_EXITED => {
                    self.main_status = Some(value);
                    self.main_exited_at = Some(Instant::now());
                    5
                }
                shepherd::MSG_FAILED => {
                    if b.len() < 7 {
                        return;
                    }
                    let len = u16::from_be_bytes([b[5], b[6]]) as usize;
                    if b.len() < 7 + len {
                        return;
                    }
                    let msg = format!(
                        "agent-sandbox-helper: {}\n",
                        String::from_utf8_lossy(&b[7..7 + len])
                    );
                    self.failure = Some(value);
                    self.main_exited_at = Some(Instant::now());
                    if self.tty {
                        self.stdout.push(msg.as_bytes());
                    } else {
                        self.stderr.push(msg.as_bytes());
                    }
                    7 + len
                }
                _ => {
                    self.status_buf.clear();
                    return;
                }
            };
            self.status_buf.drain(..used);
        }
    }

    /// Reads one chunk of stdout (`stderr == false`) or stderr into its ring; closes at EOF
    /// (or EIO, how a terminal's master says that every slave is closed).
    pub fn read_output(&mut self, stderr: bool, buf: &mut [u8]) {
        let slot = if stderr { &mut self.err } else { &mut self.out };
        let Some(fd) = slot else { return };
        match sys::read(fd.as_raw_fd(), buf) {
            Ok(0) => *slot = None,
            Ok(n) => {
                if stderr {
                    self.stderr.push(&buf[..n]);
                } else {
                    self.stdout.push(&buf[..n]);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => *slot = None,
        }
    }

    /// Writes queued stdin; `Err` when the process no longer reads it (the queue is dropped).
    pub fn write_stdin(&mut self) -> Result<(), ()> {
        let Some(fd) = &self.stdin else {
            self.stdin_queue.clear();
            return Err(());
        };
        while !self.stdin_queue.is_empty() {
            match sys::write(fd.as_raw_fd(), &self.stdin_queue) {
                Ok(n) => {
                    self.stdin_queue.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(_) => {
                    self.stdin_queue.clear();
                    self.stdin = None;
                    return Err(());
                }
            }
        }
        if self.close_stdin_after {
            self.stdin = None;
        }
        Ok(())
    }

    /// Decides whether the process has ended: its main process exited (or never started) and
    /// its output closed, or lingered open too long. Returns true when it just ended.
    pub fn check_end(&mut self, now: Instant) -> bool {
        if !self.running() {
            return false;
        }
        if let Some(d) = self.deadline {
            if now >= d {
                self.deadline = None;
                self.kill();
            }
        }
        let Some(at) = self.main_exited_at else {
            return false;
        };
        let output_open = self.out.is_some() || self.err.is_some();
        let lingered = now.duration_since(at).as_millis() as u64 >= LINGER_MS;
        if output_open && !lingered {
            return false;
        }
        self.out = None;
        self.err = None;
        self.stdin = None;
        self.master = None;
        self.stdin_queue.clear();
        self.finished_at_ms = Some(now_ms());
        // Leftover background processes go with it.
        let _ = sys::write(self.control.as_raw_fd(), &[shepherd::CTL_FINISH]);
        true
    }

    /// When `check_end` next needs to run, if it is waiting for a time.
    pub fn next_deadline(&self) -> Option<Instant> {
        let linger = self
            .main_exited_at
            .filter(|_| self.running())
            .map(|t| t + std::time::Duration::from_millis(LINGER_MS));
        match (self.deadline, linger) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}
