//! One command of `serve`: its shepherd (forked here, see `shepherd.rs`), the four pipes between
//! them, the shepherd's status records turned into protocol events, and the command's output read
//! into frames. It owns no timers and no loop: `serve.rs` decides when to read, kill or finish.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use helper_protocol::{Event, StartRequest};

use crate::{shepherd, sys};

/// PATH used when the request's environment has none (same as Docker's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One running command, as seen by the helper.
pub struct Command {
    pub id: u64,
    pub shepherd: libc::pid_t,
    /// Shepherd → helper records; `None` after EOF (the shepherd exited and was reaped).
    pub status: Option<OwnedFd>,
    pub status_buf: Vec<u8>,
    /// Helper → shepherd instructions.
    pub control: OwnedFd,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    /// Exec succeeded: output may be read (so `Started` always precedes output).
    pub started: bool,
    pub failure: Option<i32>,
    pub main_exit: Option<i32>,
    pub began: Instant,
    pub deadline: Option<Instant>,
    pub linger_ms: u64,
    pub linger_deadline: Option<Instant>,
    pub timed_out: bool,
    /// `'K'` or `'F'` was sent: the shepherd is on its way out.
    pub ending: bool,
    /// The command's main process (its process group), once started.
    pub main_pid: Option<libc::pid_t>,
    /// Past its deadline and told to kill: if the shepherd is still there at this instant, the
    /// helper kills the command's process group itself and, at the second such instant
    /// (`last_chance`), the shepherd too, and reports the command.
    pub force_at: Option<Instant>,
    /// The process group was killed from here and the shepherd woken: the next `force_at` is
    /// its last.
    pub last_chance: bool,
}

impl Command {
    pub fn tell(&mut self, byte: u8) {
        // Non-blocking; a full pipe already holds an instruction, a broken one means the shepherd is
        // gone (its status EOF reports that).
        let _ = sys::write(self.control.as_raw_fd(), &[byte]);
    }

    pub fn kill(&mut self) {
        if !self.ending && self.status.is_some() {
            self.ending = true;
            self.tell(shepherd::CTL_KILL);
        }
    }

    pub fn pipes_open(&self) -> bool {
        self.stdout.is_some() || self.stderr.is_some()
    }
}

/// Parses complete shepherd records from `c.status_buf`.
pub fn parse_status(c: &mut Command, events: &mut Vec<Event>) {
    loop {
        let b = &c.status_buf;
        if b.len() < 5 {
            return;
        }
        let value = i32::from_be_bytes([b[1], b[2], b[3], b[4]]);
        let used = match b[0] {
            shepherd::MSG_STARTED => {
                c.started = true;
                c.main_pid = Some(value);
                events.push(Event::Started {
                    id: c.id,
                    pid: value as u32,
                });
                5
            }
            shepherd::MSG_EXITED => {
                c.main_exit = Some(sys::exit_code(value));
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
                let message = String::from_utf8_lossy(&b[7..7 + len]).into_owned();
                c.failure = Some(value);
                events.push(Event::Failed {
                    id: c.id,
                    message: message.clone(),
                });
                events.push(Event::Stderr {
                    id: c.id,
                    data: format!("agent-sandbox-helper: {message}\n").into_bytes(),
                });
                7 + len
            }
            _ => {
                // Cannot happen (we wrote them); treat the shepherd as lost.
                c.status_buf.clear();
                return;
            }
        };
        c.status_buf.drain(..used);
    }
}

/// Reads one chunk from a command pipe; closes it at EOF.
pub fn read_output_once(
    c: &mut Command,
    stderr: bool,
    out: &mut Vec<u8>,
    buf: &mut [u8],
    discard: bool,
) -> bool {
    let slot = if stderr { &mut c.stderr } else { &mut c.stdout };
    let Some(fd) = slot else { return false };
    match sys::read(fd.as_raw_fd(), buf) {
        Ok(0) => {
            *slot = None;
            false
        }
        Ok(n) => {
            if !discard {
                let _ = helper_protocol::encode_output(out, c.id, stderr, &buf[..n]);
            }
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(_) => {
            *slot = None;
            false
        }
    }
}

/// The shepherd did not go within its grace after a kill past the deadline: kill the command's
/// process group from here and wake the shepherd in case it was stopped, so that it can finish
/// reaping its tree. It is not killed yet: a subreaper killed while its orphans are still exiting
/// takes the whole sandbox down under gVisor (an exiting orphan whose reaper is exiting too is
/// treated as the end of the PID namespace's init, and every process is killed, the container's
/// init included), and under a fork bomb with a fraction of a CPU the shepherd can need longer
/// than its first grace to reap every process of the tree.
pub fn hurry(c: &mut Command) {
    if let Some(pid) = c.main_pid.filter(|&p| p > 1) {
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    unsafe { libc::kill(c.shepherd, libc::SIGCONT) };
    c.last_chance = true;
}

/// The shepherd did not go within its last grace either (stuck, or stopped again):
/// SIGKILL the command's process group and the shepherd (our child, so its pid cannot have been
/// reused before we reap it here), then read what the pipes hold and close them. The status
/// pipe closes with the shepherd; the command is then reported like any other.
pub fn force_end(c: &mut Command, out: &mut Vec<u8>, buf: &mut [u8], discard: bool) {
    if let Some(pid) = c.main_pid.filter(|&p| p > 1) {
        unsafe { libc::kill(-pid, libc::SIGKILL) };
    }
    unsafe { libc::kill(c.shepherd, libc::SIGKILL) };
    let _ = sys::wait_for(c.shepherd);
    c.status = None;
    drain_and_close(c, out, buf, discard);
}

/// Reads whatever the pipes hold right now, then closes them.
pub fn drain_and_close(c: &mut Command, out: &mut Vec<u8>, buf: &mut [u8], discard: bool) {
    if !c.started {
        c.stdout = None;
        c.stderr = None;
        return;
    }
    for stderr in [false, true] {
        while read_output_once(c, stderr, out, buf, discard) {}
        if stderr {
            c.stderr = None;
        } else {
            c.stdout = None;
        }
    }
}

/// Validates a request and turns it into what the shepherd needs (allocations happen here, before
/// fork).
pub fn prepare(s: &StartRequest) -> Result<shepherd::Spec, String> {
    let cstr = |what: &str, v: &str| {
        CString::new(v).map_err(|_| format!("invalid request: {what} contains a NUL byte"))
    };
    let Some(program) = s.argv.first() else {
        return Err("invalid request: empty argv".into());
    };
    if program.is_empty() {
        return Err("invalid request: empty program name".into());
    }
    let argv = s
        .argv
        .iter()
        .map(|a| cstr("argv", a))
        .collect::<Result<Vec<_>, _>>()?;
    let mut envp = Vec::with_capacity(s.env.len());
    let mut path = None;
    for (k, v) in &s.env {
        if k.is_empty() || k.contains('=') {
            return Err(format!(
                "invalid request: bad environment variable name {k:?}"
            ));
        }
        envp.push(cstr("env", &format!("{k}={v}"))?);
        if k == "PATH" {
            path = Some(v.as_str());
        }
    }
    let has_slash = program.contains('/');
    let candidates = if has_slash {
        vec![cstr("argv", program)?]
    } else {
        path.unwrap_or(DEFAULT_PATH)
            .split(':')
            .map(|dir| {
                let dir = if dir.is_empty() { "." } else { dir };
                cstr("PATH", &format!("{}/{program}", dir.trim_end_matches('/')))
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    let workdir = if s.workdir.is_empty() {
        None
    } else {
        Some(cstr("workdir", &s.workdir)?)
    };
    Ok(shepherd::Spec {
        program: program.clone(),
        argv,
        envp,
        candidates,
        program_has_slash: has_slash,
        workdir,
        keep_background: s.keep_background,
        tty: false,
        use_subreaper: true,
    })
}

pub struct Pipes {
    pub status: OwnedFd,
    pub control: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// Forks the shepherd; returns its pid and the helper's ends of the pipes.
pub fn spawn(spec: &shepherd::Spec) -> Result<(libc::pid_t, Pipes), String> {
    let pipe = || sys::pipe().map_err(|e| format!("pipe: {e}"));
    let (status_r, status_w) = pipe()?;
    let (control_r, control_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    for fd in [&status_r, &out_r, &err_r, &control_w] {
        let _ = sys::set_nonblocking(fd.as_raw_fd());
    }
    let pid = unsafe { libc::fork() };
    if pid == -1 {
        return Err(format!("fork: {}", sys::strerror(sys::errno())));
    }
    if pid == 0 {
        shepherd::run(
            spec,
            shepherd::Fds {
                control: control_r.as_raw_fd(),
                status: status_w.as_raw_fd(),
                stdout: out_w.as_raw_fd(),
                stderr: err_w.as_raw_fd(),
                stdin: -1,
            },
        );
    }
    drop((status_w, control_r, out_w, err_w));
    Ok((
        pid,
        Pipes {
            status: status_r,
            control: control_w,
            stdout: out_r,
            stderr: err_r,
        },
    ))
}
