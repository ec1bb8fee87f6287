//! The per-command shepherd: a child subreaper that starts the command in its own process group,
//! reports on it, and kills its whole tree on request.
//!
//! Finding the tree: normally the shepherd is a child subreaper (`PR_SET_CHILD_SUBREAPER`), so
//! every orphaned descendant (setsid, double fork) is re-parented to it and killing "all my
//! children until none is left" kills the whole tree. Where that prctl is refused (gVisor's runsc
//! release 20221219 answers EINVAL), orphans go to PID 1 instead, so the command is tagged: its
//! soft `RLIMIT_RSS` (inherited across fork, exec and setsid, and enforced by neither Linux since
//! 2.6 nor gVisor) is set to a value unique to this shepherd, and killing means "SIGKILL every
//! live process whose RSS limit carries the tag (read with prlimit64), until a scan of /proc finds
//! none". A process can only escape that by changing its own RSS limit on purpose.
//!
//! The helper forks one shepherd per command (the helper is single-threaded, so the forked shepherd
//! may allocate and use `std` freely). The shepherd talks to the helper over two pipes:
//!
//! * status (shepherd → helper), fixed records:
//!   `'S' pid:u32` the command was exec'd; `'E' code:i32 len:u16 message` it could not be started
//!   (the shepherd exits right after); `'X' status:i32` the main process exited (its raw wait
//!   status, so that readers can tell an exit code from a signal).
//!   The shepherd closes it only by exiting, so EOF means "shepherd gone, its tree is dead (or
//!   released with keep_background)". A shepherd whose main process exited without leaving any
//!   descendant exits on its own right after `'X'`.
//! * control (helper → shepherd), single bytes: `'K'` kill the tree now and exit; `'F'` the command
//!   finished (main exited, output closed): kill leftovers (or leave them, with keep_background) and
//!   exit. EOF (the helper died or is shutting down) is handled like `'K'`.

use std::ffi::CString;
use std::os::fd::RawFd;
use std::ptr;
use std::sync::atomic::{AtomicI32, Ordering};

use crate::sys;
use helper_protocol as protocol;

pub const MSG_STARTED: u8 = b'S';
pub const MSG_FAILED: u8 = b'E';
pub const MSG_EXITED: u8 = b'X';
pub const CTL_KILL: u8 = b'K';
pub const CTL_FINISH: u8 = b'F';

/// Everything the shepherd needs, prepared by the helper before forking.
pub struct Spec {
    /// `argv[0]` as given, for messages.
    pub program: String,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    /// Paths to try with `execve`, in order (PATH search already expanded).
    pub candidates: Vec<CString>,
    pub program_has_slash: bool,
    pub workdir: Option<CString>,
    pub keep_background: bool,
    /// The command's stdin, stdout and stderr are one terminal (the `stdout` descriptor, a pty
    /// slave): the command starts a new session and makes it its controlling terminal.
    pub tty: bool,
    /// Try `PR_SET_CHILD_SUBREAPER` (false only to test the fallback).
    pub use_subreaper: bool,
}

/// Tags are `TAG_BASE + shepherd pid`: far above any real memory size, unique among live
/// shepherds of the PID namespace.
const TAG_BASE: u64 = 0x4153_4800_0000_0000;

/// The descriptors the shepherd keeps.
pub struct Fds {
    pub control: RawFd,
    pub status: RawFd,
    pub stdout: RawFd,
    pub stderr: RawFd,
    /// The command's stdin; -1 means `/dev/null`.
    pub stdin: RawFd,
}

static SIGCHLD_PIPE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_sigchld(_: libc::c_int) {
    let fd = SIGCHLD_PIPE.load(Ordering::Relaxed);
    if fd >= 0 {
        let saved = unsafe { *libc::__errno_location() };
        unsafe {
            libc::write(fd, [0u8].as_ptr().cast(), 1);
            *libc::__errno_location() = saved;
        }
    }
}

fn send(status: RawFd, msg: &[u8]) {
    // Records are far below PIPE_BUF, so each write is atomic. If the helper is gone there is
    // nobody to tell; the control pipe's EOF will make us clean up.
    let _ = sys::write_all(status, msg);
}

fn send_code(status: RawFd, kind: u8, value: i32) {
    let mut m = [kind, 0, 0, 0, 0];
    m[1..].copy_from_slice(&value.to_be_bytes());
    send(status, &m);
}

fn send_failure(status: RawFd, code: i32, message: &str) {
    let msg = &message.as_bytes()[..message.len().min(4000)];
    let mut m = vec![MSG_FAILED];
    m.extend_from_slice(&code.to_be_bytes());
    m.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    m.extend_from_slice(msg);
    send(status, &m);
}

/// Closes every descriptor except 0, 1, 2 and `keep`.
fn close_other_fds(keep: &[RawFd]) {
    // close_range(2) over the gaps between the kept descriptors (Linux 5.9+).
    let mut kept: Vec<RawFd> = keep.iter().copied().filter(|&fd| fd > 2).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut first: libc::c_uint = 3;
    let mut ok = true;
    for &fd in kept.iter().chain(std::iter::once(&-1)) {
        let last = if fd < 0 {
            libc::c_uint::MAX
        } else {
            fd as libc::c_uint - 1
        };
        if first <= last {
            let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) };
            if r != 0 {
                ok = false;
                break;
            }
        }
        if fd >= 0 {
            first = fd as libc::c_uint + 1;
        }
    }
    if ok {
        return;
    }
    let listed: Option<Vec<RawFd>> = std::fs::read_dir("/proc/self/fd").ok().map(|dir| {
        dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect()
    });
    let candidates: Vec<RawFd> = match listed {
        Some(v) => v,
        None => {
            let max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
            (3..max.clamp(1024, 65536) as RawFd).collect()
        }
    };
    for fd in candidates {
        if fd > 2 && !keep.contains(&fd) {
            unsafe { libc::close(fd) };
        }
    }
}

/// One process, from /proc/<pid>/stat.
struct ProcInfo {
    pid: libc::pid_t,
    ppid: libc::pid_t,
    /// Zombie or dead: nothing left to kill.
    gone: bool,
}

/// Every process in our PID namespace (as far as /proc shows).
fn scan_procs() -> Vec<ProcInfo> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|s| s.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses; take the last ')'.
        let Some(close) = stat.iter().rposition(|&b| b == b')') else {
            continue;
        };
        let rest = String::from_utf8_lossy(&stat[close + 1..]);
        let mut fields = rest.split_ascii_whitespace();
        let gone = matches!(fields.next(), Some("Z" | "X" | "x"));
        let Some(ppid) = fields.next().and_then(|p| p.parse::<libc::pid_t>().ok()) else {
            continue;
        };
        out.push(ProcInfo { pid, ppid, gone });
    }
    out
}

/// The soft RSS limit of `pid`, where the fallback tag lives.
fn rss_limit(pid: libc::pid_t) -> Option<u64> {
    let mut lim: libc::rlimit64 = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::prlimit64(pid, libc::RLIMIT_RSS, ptr::null(), &mut lim) };
    (r == 0).then_some(lim.rlim_cur)
}

/// Whether this process can be a child subreaper (probes, then restores the setting).
pub fn subreaper_available() -> bool {
    unsafe {
        if libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
            return false;
        }
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
    }
    true
}

struct Shepherd {
    fds: Fds,
    sig_r: RawFd,
    main: libc::pid_t,
    main_alive: bool,
    keep_background: bool,
    /// We are a child subreaper: orphaned descendants come to us.
    subreaper: bool,
    /// Otherwise: the RSS-limit tag the command's processes carry, if it could be set.
    tag: Option<u64>,
}

enum Reaped {
    /// Reaped everything that had exited; live children remain.
    Some,
    /// No children at all.
    None,
}

impl Shepherd {
    /// Reaps every exited child (reporting the main process), without blocking.
    fn reap(&mut self) -> Reaped {
        loop {
            let mut status = 0;
            let r = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if r > 0 {
                if r == self.main && self.main_alive {
                    self.main_alive = false;
                    send_code(self.fds.status, MSG_EXITED, status);
                }
                continue;
            }
            if r == 0 {
                return Reaped::Some;
            }
            match sys::errno() {
                libc::EINTR => continue,
                _ => return Reaped::None, // ECHILD
            }
        }
    }

    fn drain_sigchld_pipe(&self) {
        let mut buf = [0u8; 64];
        while let Ok(n) = sys::read(self.sig_r, &mut buf) {
            if n < buf.len() {
                break;
            }
        }
    }

    fn wait_sigchld(&self, timeout_ms: i32) {
        let mut p = [libc::pollfd {
            fd: self.sig_r,
            events: libc::POLLIN,
            revents: 0,
        }];
        let _ = sys::poll(&mut p, timeout_ms);
        self.drain_sigchld_pipe();
    }

    /// Kills the process group, then every remaining descendant, and returns once none is left.
    fn kill_tree(&mut self) {
        if self.main_alive {
            // The main process is not reaped yet, so its pid (the group id) cannot have been reused.
            unsafe { libc::kill(-self.main, libc::SIGKILL) };
        }
        if self.subreaper {
            // Descendants are re-parented to us as their parents die: kill our children until
            // waitpid says there are none.
            let me = unsafe { libc::getpid() };
            loop {
                if let Reaped::None = self.reap() {
                    return;
                }
                for p in scan_procs() {
                    if p.ppid == me && !p.gone {
                        unsafe { libc::kill(p.pid, libc::SIGKILL) };
                    }
                }
                if let Reaped::None = self.reap() {
                    return;
                }
                self.wait_sigchld(10);
            }
        }
        // Fallback: kill everything that carries our tag or still hangs below us, until a whole
        // scan finds nothing alive.
        let me = unsafe { libc::getpid() };
        loop {
            let procs = scan_procs();
            let mut below = vec![me];
            let mut grew = true;
            while grew {
                grew = false;
                for p in &procs {
                    if below.contains(&p.ppid) && !below.contains(&p.pid) {
                        below.push(p.pid);
                        grew = true;
                    }
                }
            }
            let mut found = false;
            for p in &procs {
                if p.pid == me || p.gone {
                    continue;
                }
                let tagged = self.tag.is_some() && rss_limit(p.pid) == self.tag;
                if tagged || below.contains(&p.pid) {
                    unsafe { libc::kill(p.pid, libc::SIGKILL) };
                    found = true;
                }
            }
            self.reap();
            if !found && !self.main_alive {
                return;
            }
            self.wait_sigchld(10);
        }
    }

    /// keep_background: the survivors are left alone. Without a subreaper they carry our tag;
    /// take it off (back to an unlimited RSS limit), so that a later shepherd that happens to get
    /// our pid does not take them for its own.
    fn release_tree(&mut self) {
        let Some(tag) = self.tag else { return };
        let unlimited = libc::rlimit64 {
            rlim_cur: libc::RLIM64_INFINITY,
            rlim_max: libc::RLIM64_INFINITY,
        };
        // A tagged process forking meanwhile passes the tag on: repeat until none is left.
        for _ in 0..100 {
            let mut found = false;
            for p in scan_procs() {
                if !p.gone && rss_limit(p.pid) == Some(tag) {
                    unsafe {
                        libc::prlimit64(p.pid, libc::RLIMIT_RSS, &unlimited, ptr::null_mut())
                    };
                    found = true;
                }
            }
            if !found {
                return;
            }
        }
    }

    fn serve(&mut self) -> ! {
        let mut buf = [0u8; 64];
        loop {
            if let Reaped::None = self.reap() {
                if !self.main_alive && self.subreaper {
                    // The main process exited and left no descendants: nothing to wait for, kill
                    // or release. Exiting now (status EOF) saves the helper a round trip.
                    exit();
                }
            }
            let mut p = [
                libc::pollfd {
                    fd: self.fds.control,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.sig_r,
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            if sys::poll(&mut p, -1).is_err() {
                // Cannot wait for instructions: fail safe.
                self.kill_tree();
                exit();
            }
            if p[1].revents != 0 {
                self.drain_sigchld_pipe();
            }
            if p[0].revents == 0 {
                continue;
            }
            let n = match sys::read(self.fds.control, &mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => 0,
            };
            if n == 0 || buf[..n].contains(&CTL_KILL) {
                // 'K', or the helper went away.
                self.kill_tree();
                exit();
            }
            if buf[..n].contains(&CTL_FINISH) {
                self.reap();
                if self.keep_background {
                    self.release_tree();
                } else {
                    self.kill_tree();
                }
                exit();
            }
        }
    }
}

/// Ends the shepherd. It gives up being a child subreaper first: gVisor hands the children of an
/// exiting process to its nearest subreaper ancestor even while that ancestor is exiting too, and
/// finding no live task there, takes the exiting process for its PID namespace's init and kills
/// every process of the sandbox (seen with `kill $!` of a job just before its shell exits: the
/// job, still exiting, had come to us as the shell died, and we had found no child left to
/// wait for). Once we are no subreaper, an orphan goes past us to PID 1, as Linux sends it past a
/// dying subreaper anyway.
fn exit() -> ! {
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0);
        libc::_exit(0)
    }
}

/// Error report from the command child to the shepherd, before exec: stage and errno.
const STAGE_CHDIR: i32 = 1;
const STAGE_EXEC: i32 = 2;

/// Runs in the freshly forked shepherd; never returns.
pub fn run(spec: &Spec, fds: Fds) -> ! {
    // Our own stdio must not keep the helper's protocol pipes open.
    let devnull = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    let null_in = if devnull >= 0 {
        devnull
    } else {
        // No /dev/null: a pipe whose write end is closed reads as empty too.
        match sys::pipe() {
            Ok((r, _w)) => std::os::fd::IntoRawFd::into_raw_fd(r),
            Err(_) => -1,
        }
    };
    if null_in >= 0 {
        for fd in 0..3 {
            unsafe { libc::dup2(null_in, fd) };
        }
    }
    close_other_fds(&[
        fds.control,
        fds.status,
        fds.stdout,
        fds.stderr,
        fds.stdin,
        null_in,
    ]);

    let subreaper =
        spec.use_subreaper && unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == 0;
    let tag = if subreaper {
        None
    } else {
        // Only when the hard limit allows any value; otherwise rely on the group and the tree.
        let mut lim: libc::rlimit64 = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::getrlimit64(libc::RLIMIT_RSS, &mut lim) } == 0;
        (ok && lim.rlim_max == libc::RLIM64_INFINITY)
            .then(|| TAG_BASE + u64::from(unsafe { libc::getpid() }.unsigned_abs()))
    };

    let (sig_r, sig_w) = match sys::pipe() {
        Ok(p) => p,
        Err(e) => {
            send_failure(
                fds.status,
                protocol::EXIT_CODE_CANNOT_EXECUTE,
                &format!("pipe: {e}"),
            );
            exit();
        }
    };
    let sig_r = std::os::fd::IntoRawFd::into_raw_fd(sig_r);
    let sig_w = std::os::fd::IntoRawFd::into_raw_fd(sig_w);
    let _ = sys::set_nonblocking(sig_r);
    let _ = sys::set_nonblocking(sig_w);
    SIGCHLD_PIPE.store(sig_w, Ordering::Relaxed);
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigchld as extern "C" fn(libc::c_int) as usize;
        sa.sa_flags = libc::SA_RESTART | libc::SA_NOCLDSTOP;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGCHLD, &sa, ptr::null_mut());
    }
    let _ = sys::set_nonblocking(fds.control);

    let stdin = if fds.stdin >= 0 { fds.stdin } else { null_in };
    let mut child = ChildArgs::new(spec, fds.stdout, fds.stderr, stdin, tag);
    let pid = match spawn_command(&mut child) {
        Ok(pid) => pid,
        Err(e) => {
            send_failure(
                fds.status,
                protocol::EXIT_CODE_CANNOT_EXECUTE,
                &format!("fork: {}", sys::strerror(e)),
            );
            exit();
        }
    };
    unsafe {
        libc::close(fds.stdout);
        if fds.stderr != fds.stdout {
            libc::close(fds.stderr);
        }
        if fds.stdin >= 0 && fds.stdin != fds.stdout {
            libc::close(fds.stdin);
        }
    }
    // CLONE_VFORK: the child has exec'd or exited by now, and left any error in `child`.
    let (stage, errno) = unsafe {
        (
            ptr::read_volatile(&child.stage),
            ptr::read_volatile(&child.errno),
        )
    };
    if stage != 0 {
        let _ = sys::wait_for(pid);
        let (code, message) = describe_failure(spec, stage, errno);
        send_failure(fds.status, code, &message);
        exit();
    }
    unsafe {
        // Also done by the child; harmless here (and keeps kill(-pid) valid in any case).
        libc::setpgid(pid, pid);
    }
    let mut m = [MSG_STARTED, 0, 0, 0, 0];
    m[1..].copy_from_slice(&(pid as u32).to_be_bytes());
    send(fds.status, &m);

    let mut shepherd = Shepherd {
        fds,
        sig_r,
        main: pid,
        main_alive: true,
        keep_background: spec.keep_background,
        subreaper,
        tag,
    };
    shepherd.serve()
}

fn describe_failure(spec: &Spec, stage: i32, errno: i32) -> (i32, String) {
    if stage == STAGE_CHDIR {
        let dir = spec
            .workdir
            .as_ref()
            .map(|d| d.to_string_lossy().into_owned())
            .unwrap_or_default();
        return (
            protocol::EXIT_CODE_CANNOT_EXECUTE,
            format!("workdir {dir}: {}", sys::strerror(errno)),
        );
    }
    match errno {
        libc::ENOENT | libc::ENOTDIR if !spec.program_has_slash => (
            protocol::EXIT_CODE_NOT_FOUND,
            format!("{}: command not found", spec.program),
        ),
        libc::ENOENT | libc::ENOTDIR => (
            protocol::EXIT_CODE_NOT_FOUND,
            format!("{}: {}", spec.program, sys::strerror(errno)),
        ),
        _ => (
            protocol::EXIT_CODE_CANNOT_EXECUTE,
            format!("{}: {}", spec.program, sys::strerror(errno)),
        ),
    }
}

/// Everything the command child touches. It is built before the child starts because the child
/// shares the shepherd's memory (`CLONE_VM`) and must not allocate; the child reports a failure by
/// writing `stage`/`errno` here.
struct ChildArgs<'a> {
    spec: &'a Spec,
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    /// Per candidate: `/bin/sh candidate args...`, for files without a known format (ENOEXEC).
    sh_argvs: Vec<Vec<*const libc::c_char>>,
    stdout: RawFd,
    stderr: RawFd,
    null_in: RawFd,
    tag: Option<u64>,
    stage: i32,
    errno: i32,
}

impl<'a> ChildArgs<'a> {
    fn new(
        spec: &'a Spec,
        stdout: RawFd,
        stderr: RawFd,
        null_in: RawFd,
        tag: Option<u64>,
    ) -> ChildArgs<'a> {
        let nul = std::iter::once(ptr::null());
        let argv: Vec<_> = spec
            .argv
            .iter()
            .map(|a| a.as_ptr())
            .chain(nul.clone())
            .collect();
        let envp: Vec<_> = spec
            .envp
            .iter()
            .map(|a| a.as_ptr())
            .chain(nul.clone())
            .collect();
        let sh_argvs = spec
            .candidates
            .iter()
            .map(|cand| {
                [c"/bin/sh".as_ptr(), cand.as_ptr()]
                    .into_iter()
                    .chain(spec.argv.iter().skip(1).map(|a| a.as_ptr()))
                    .chain(nul.clone())
                    .collect()
            })
            .collect();
        ChildArgs {
            spec,
            argv,
            envp,
            sh_argvs,
            stdout,
            stderr,
            null_in,
            tag,
            stage: 0,
            errno: 0,
        }
    }
}

/// Starts the command like `posix_spawn` does: `clone(CLONE_VM | CLONE_VFORK)` on a separate
/// stack, so nothing is copied and the shepherd resumes once the child has exec'd or failed.
/// Returns the child's pid or an errno.
fn spawn_command(child: &mut ChildArgs) -> Result<libc::pid_t, i32> {
    const STACK: usize = 128 * 1024;
    let mut stack = vec![0u8; STACK];
    let top = unsafe { stack.as_mut_ptr().add(STACK) };
    let top = (top as usize & !15) as *mut libc::c_void;
    unsafe {
        // No signal handler may run in the child while it shares our memory.
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child_main,
            top,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (child as *mut ChildArgs).cast(),
        );
        let e = sys::errno();
        libc::sigprocmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        drop(stack);
        if pid == -1 {
            Err(e)
        } else {
            Ok(pid)
        }
    }
}

/// The command child: new process group, clean signal state, stdio, workdir, exec. Never returns.
/// Runs on its own stack in the shepherd's memory: no allocation, no unwinding.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    let a = unsafe { &mut *arg.cast::<ChildArgs>() };
    let fail = |a: &mut ChildArgs, stage: i32, errno: i32| -> ! {
        unsafe {
            ptr::write_volatile(&mut a.errno, errno);
            ptr::write_volatile(&mut a.stage, stage);
            libc::_exit(protocol::EXIT_CODE_CANNOT_EXECUTE)
        }
    };
    unsafe {
        if a.spec.tty {
            // A new session (and so a new process group whose id is our pid, like setpgid).
            libc::setsid();
        } else {
            libc::setpgid(0, 0);
        }
        // Ignored signals survive exec: the Rust runtime ignores SIGPIPE (the helper already reset
        // every other ignored signal it inherited, see `reset_inherited_signals`). The SIGCHLD
        // handler would be reset by exec anyway, but must not run before it.
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, ptr::null_mut());

        if a.null_in >= 0 && libc::dup2(a.null_in, 0) == -1 {
            fail(a, STAGE_EXEC, sys::errno());
        }
        if libc::dup2(a.stdout, 1) == -1 || libc::dup2(a.stderr, 2) == -1 {
            fail(a, STAGE_EXEC, sys::errno());
        }
        if a.spec.tty && libc::ioctl(0, libc::TIOCSCTTY, 0) == -1 {
            fail(a, STAGE_EXEC, sys::errno());
        }
        if let Some(tag) = a.tag {
            let lim = libc::rlimit64 {
                rlim_cur: tag,
                rlim_max: libc::RLIM64_INFINITY,
            };
            libc::setrlimit64(libc::RLIMIT_RSS, &lim);
        }
        if let Some(dir) = &a.spec.workdir {
            if libc::chdir(dir.as_ptr()) == -1 {
                fail(a, STAGE_CHDIR, sys::errno());
            }
        }
    }

    // execvp semantics: remember EACCES and keep searching; stop at unexpected errors.
    let mut result = libc::ENOENT;
    let mut saw_eacces = false;
    for (i, cand) in a.spec.candidates.iter().enumerate() {
        unsafe { libc::execve(cand.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr()) };
        let e = sys::errno();
        match e {
            libc::ENOEXEC => {
                // Like execvp: a file without a recognised format is a shell script.
                unsafe {
                    libc::execve(c"/bin/sh".as_ptr(), a.sh_argvs[i].as_ptr(), a.envp.as_ptr())
                };
                fail(a, STAGE_EXEC, libc::ENOEXEC);
            }
            libc::EACCES => saw_eacces = true,
            libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
            other => {
                result = other;
                break;
            }
        }
        result = e;
    }
    if saw_eacces && (result == libc::ENOENT || result == libc::ENOTDIR) {
        result = libc::EACCES;
    }
    fail(a, STAGE_EXEC, result)
}
