//! The process supervisor: the container's main process (`idle` mode), which owns a sandbox's
//! long-lived processes (`process.rs`) for as long as the container lives.
//!
//! Why here: a process must outlive every client connection and a restart of the server, and its
//! output must keep being captured meanwhile. The container's main process is the one thing
//! inside the sandbox that lives exactly as long as the container, so it holds the processes'
//! shepherds and the retained tail of their output in memory (bounded rings, at most
//! `retain_bytes` per stream, nothing written to `/tmp` or `/workspace`). If it dies, its
//! shepherds see their control pipes close and kill their trees, and the container stops with it.
//!
//! Clients reach it on a Unix socket in the abstract namespace ([`SOCKET_NAME`]), so no file is
//! left behind and no directory must be writable; the server gets there through `bridge`
//! (`bridge.rs`), a short `docker exec` that relays its stdin and stdout to this socket. The
//! socket accepts only peers of our own uid or root. The wire format is
//! `helper_protocol::supervisor`: one request at a time per connection, each answered in full;
//! an output request that follows streams until the process ends or the client goes.
//!
//! One `poll(2)` loop owns everything; output is always read into the rings whether or not anyone
//! reads it, so a client that never reads stalls nothing but its own connection (whose queue is
//! bounded by [`CONN_HIGH_WATER`]). It keeps at most [`KEEP_EXITED`] ended processes, forgetting
//! the oldest first.
//!
//! It also owns the sandbox's directory watches (`watch.rs`, inotify): one streamed on a
//! connection ends with it; a detached one lives until it is removed, is not asked for its events
//! for its idle time, or the container ends. At most `max_watchers` exist at once.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::Instant;

use helper_protocol::supervisor::{ErrorCode, ProcStart, Reply, SupRequest, WatchStart};
use helper_protocol::{FrameDecoder, MAX_CHUNK_LEN};

use crate::process::{Process, STDIN_QUEUE};
use crate::sys;
use crate::watch::Watcher;

/// The abstract socket name (no leading NUL here; the address adds it).
pub const SOCKET_NAME: &str = "agent-sandbox-supervisor";
/// Overrides [`SOCKET_NAME`] (for tests outside a container, where the namespace is shared).
pub const SOCKET_ENV: &str = "AGENT_SANDBOX_SUPERVISOR_SOCKET";

/// The socket address in use.
pub fn address() -> std::io::Result<SocketAddr> {
    let name = std::env::var(SOCKET_ENV).unwrap_or_else(|_| SOCKET_NAME.to_string());
    SocketAddr::from_abstract_name(name.as_bytes())
}
/// Ended processes kept for their output and exit.
pub const KEEP_EXITED: usize = 64;
/// Reply bytes queued per connection before output is no longer copied to it.
pub const CONN_HIGH_WATER: usize = 256 * 1024;

enum Wait {
    None,
    /// A start, answered once the shepherd said the command started (or failed); with
    /// `follow`, its output is streamed after the answer.
    Started {
        id: String,
        follow: bool,
    },
    Output {
        id: String,
        out_pos: u64,
        err_pos: u64,
        follow: bool,
    },
    Stdin(String),
    Delete(String),
    /// Streaming a watcher's events.
    Watch(String),
}

struct Conn {
    stream: UnixStream,
    decoder: FrameDecoder,
    out: Vec<u8>,
    wait: Wait,
    dead: bool,
    /// A protocol error was answered: close once it is flushed.
    closing: bool,
}

impl Conn {
    fn reply(&mut self, r: &Reply) {
        if r.encode(&mut self.out).is_err() {
            let _ = Reply::Error {
                code: ErrorCode::Internal,
                message: "reply too large".into(),
            }
            .encode(&mut self.out);
        }
    }

    fn error(&mut self, code: ErrorCode, message: impl Into<String>) {
        self.reply(&Reply::Error {
            code,
            message: message.into(),
        });
    }
}

pub struct Supervisor {
    listener: UnixListener,
    conns: Vec<Conn>,
    procs: Vec<Process>,
    /// The order processes ended in, for forgetting the oldest.
    ended: Vec<String>,
    watchers: Vec<Watcher>,
    uid: u32,
}

/// Binds the socket; `None` when another supervisor already holds it (or sockets are refused).
pub fn bind() -> Option<UnixListener> {
    let addr = address().ok()?;
    let l = UnixListener::bind_addr(&addr).ok()?;
    l.set_nonblocking(true).ok()?;
    Some(l)
}

/// The container's main process: supervises until killed; idles if it cannot bind.
pub fn main() -> ! {
    sys::ensure_std_fds();
    if let Some(listener) = bind() {
        let mut s = Supervisor::new(listener);
        loop {
            s.turn(1000);
        }
    }
    loop {
        // SAFETY: pause has no preconditions; it returns only when a handled signal arrives.
        unsafe { libc::pause() };
    }
}

fn random_id() -> String {
    random_id_with("p_")
}

fn random_id_with(prefix: &str) -> String {
    let mut b = [0u8; 8];
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != 8 {
        // No getrandom: time and pid are unique enough among one sandbox's processes.
        let t = crate::process::now_ms() ^ (u64::from(std::process::id()) << 40);
        b = t.to_be_bytes();
    }
    let mut s = String::from(prefix);
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

fn peer_uid(stream: &UnixStream) -> Option<u32> {
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    let r = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

impl Supervisor {
    pub fn new(listener: UnixListener) -> Supervisor {
        Supervisor {
            listener,
            conns: Vec::new(),
            procs: Vec::new(),
            ended: Vec::new(),
            watchers: Vec::new(),
            uid: unsafe { libc::getuid() },
        }
    }

    fn find(&self, id: &str) -> Option<usize> {
        self.procs.iter().position(|p| p.id == id)
    }

    /// One round: wait for something (at most `max_wait_ms`), then do all that can be done.
    pub fn turn(&mut self, max_wait_ms: i32) {
        let now = Instant::now();
        let timeout = self
            .procs
            .iter()
            .filter_map(Process::next_deadline)
            .min()
            .map(|d| {
                d.saturating_duration_since(now)
                    .as_millis()
                    .min(i32::MAX as u128) as i32
            })
            .map_or(max_wait_ms, |t| t.min(max_wait_ms));

        // What each pollfd is about: (kind, index).
        const LISTEN: u8 = 0;
        const CONN: u8 = 1;
        const STATUS: u8 = 2;
        const OUT: u8 = 3;
        const ERR: u8 = 4;
        const STDIN: u8 = 5;
        const WATCH: u8 = 6;
        let mut pfds = vec![sys::pollfd(&self.listener, libc::POLLIN)];
        let mut what = vec![(LISTEN, 0)];
        for (i, c) in self.conns.iter().enumerate() {
            let mut ev = 0;
            if matches!(c.wait, Wait::None) && !c.closing && c.out.len() < CONN_HIGH_WATER {
                ev |= libc::POLLIN;
            }
            if !c.out.is_empty() {
                ev |= libc::POLLOUT;
            }
            pfds.push(sys::pollfd(&c.stream, ev));
            what.push((CONN, i));
        }
        for (i, p) in self.procs.iter().enumerate() {
            let fds = [
                (STATUS, p.status.as_ref(), libc::POLLIN),
                (OUT, p.out.as_ref(), libc::POLLIN),
                (ERR, p.err.as_ref(), libc::POLLIN),
                (
                    STDIN,
                    p.stdin.as_ref().filter(|_| !p.stdin_queue.is_empty()),
                    libc::POLLOUT,
                ),
            ];
            for (k, fd, ev) in fds {
                if let Some(fd) = fd {
                    pfds.push(sys::pollfd(fd, ev));
                    what.push((k, i));
                }
            }
        }
        for (i, w) in self.watchers.iter().enumerate() {
            if w.failed.is_none() {
                pfds.push(sys::pollfd(w.fd(), libc::POLLIN));
                what.push((WATCH, i));
            }
        }
        if sys::poll(&mut pfds, timeout).is_err() {
            return;
        }
        let mut buf = vec![0u8; MAX_CHUNK_LEN];
        for (pfd, &(k, i)) in pfds.iter().zip(&what) {
            if pfd.revents == 0 {
                continue;
            }
            match k {
                LISTEN => self.accept(),
                CONN => self.service_conn(i, pfd.revents, &mut buf),
                STATUS => self.procs[i].read_status(),
                OUT => self.procs[i].read_output(false, &mut buf),
                ERR => self.procs[i].read_output(true, &mut buf),
                WATCH => self.watchers[i].read(&mut buf),
                _ => {
                    let _ = self.procs[i].write_stdin();
                }
            }
        }
        let now = Instant::now();
        for p in &mut self.procs {
            if p.check_end(now) {
                self.ended.push(p.id.clone());
            }
        }
        for i in 0..self.conns.len() {
            self.progress(i);
        }
        self.forget_oldest();
        // A streamed watch ends with its connection; a detached one nobody asks about, in time.
        for c in self.conns.iter().filter(|c| c.dead) {
            if let Wait::Watch(id) = &c.wait {
                self.watchers.retain(|w| w.id != *id);
            }
        }
        self.watchers.retain(|w| !w.idle(now));
        self.conns.retain(|c| !c.dead);
    }

    fn accept(&mut self) {
        while let Ok((stream, _)) = self.listener.accept() {
            match peer_uid(&stream) {
                Some(uid) if uid == self.uid || uid == 0 => {}
                _ => continue,
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            self.conns.push(Conn {
                stream,
                decoder: FrameDecoder::new(),
                out: Vec::new(),
                wait: Wait::None,
                dead: false,
                closing: false,
            });
        }
    }

    fn service_conn(&mut self, i: usize, revents: libc::c_short, buf: &mut [u8]) {
        let c = &mut self.conns[i];
        if revents & libc::POLLOUT != 0 {
            match c.stream.write(&c.out) {
                Ok(n) => {
                    c.out.drain(..n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => c.dead = true,
            }
        }
        if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 && !c.dead {
            match c.stream.read(buf) {
                Ok(0) => c.dead = true,
                Ok(n) => c.decoder.feed(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => c.dead = true,
            }
        }
        if c.closing && c.out.is_empty() {
            c.dead = true;
        }
    }

    /// Advances a connection: finishes what it waits for, then takes its next requests.
    fn progress(&mut self, i: usize) {
        if self.conns[i].dead {
            return;
        }
        loop {
            if !self.advance_wait(i) {
                return;
            }
            let c = &mut self.conns[i];
            if c.closing {
                return;
            }
            match c.decoder.next_sup_request() {
                Ok(Some(req)) => self.handle(i, req),
                Ok(None) => return,
                Err(e) => {
                    c.error(ErrorCode::Invalid, format!("bad request: {e}"));
                    c.closing = true;
                    return;
                }
            }
        }
    }

    /// Returns true when the connection waits for nothing (any more).
    fn advance_wait(&mut self, i: usize) -> bool {
        let wait = std::mem::replace(&mut self.conns[i].wait, Wait::None);
        let found = |s: &Supervisor, id: &str| s.find(id);
        let (next, done) = match wait {
            Wait::None => (Wait::None, true),
            Wait::Started { id, follow } => match found(self, &id) {
                Some(p)
                    if self.procs[p].pid == 0
                        && self.procs[p].running()
                        && self.procs[p].failure.is_none() =>
                {
                    (Wait::Started { id, follow }, false)
                }
                Some(p) => {
                    let info = self.procs[p].info();
                    self.conns[i].reply(&Reply::Process(info));
                    if follow {
                        self.pump(i, id, 0, 0, true)
                    } else {
                        self.conns[i].reply(&Reply::Ok);
                        (Wait::None, true)
                    }
                }
                None => {
                    self.conns[i].error(ErrorCode::NotFound, format!("process {id} is gone"));
                    (Wait::None, true)
                }
            },
            Wait::Stdin(id) => match found(self, &id) {
                None => {
                    self.conns[i].error(ErrorCode::NotFound, format!("process {id} is gone"));
                    (Wait::None, true)
                }
                Some(p) => {
                    let p = &mut self.procs[p];
                    if !p.stdin_queue.is_empty() && p.stdin.is_some() {
                        (Wait::Stdin(id), false)
                    } else if p.stdin.is_none() && !p.close_stdin_after {
                        self.conns[i]
                            .error(ErrorCode::Conflict, "the process no longer reads its stdin");
                        (Wait::None, true)
                    } else {
                        if p.close_stdin_after {
                            p.stdin = None;
                        }
                        self.conns[i].reply(&Reply::Ok);
                        (Wait::None, true)
                    }
                }
            },
            Wait::Delete(id) => match found(self, &id) {
                Some(p) if self.procs[p].status.is_some() => (Wait::Delete(id), false),
                Some(p) => {
                    self.procs.remove(p);
                    self.ended.retain(|e| *e != id);
                    self.conns[i].reply(&Reply::Ok);
                    (Wait::None, true)
                }
                None => {
                    self.conns[i].reply(&Reply::Ok);
                    (Wait::None, true)
                }
            },
            Wait::Output {
                id,
                out_pos,
                err_pos,
                follow,
            } => self.pump(i, id, out_pos, err_pos, follow),
            Wait::Watch(id) => match self.hand_out(i, &id) {
                true => (Wait::None, true),
                false => (Wait::Watch(id), false),
            },
        };
        self.conns[i].wait = next;
        done
    }

    /// Copies retained output to a reading connection, up to its high-water mark.
    fn pump(
        &mut self,
        i: usize,
        id: String,
        mut out_pos: u64,
        mut err_pos: u64,
        follow: bool,
    ) -> (Wait, bool) {
        let Some(pi) = self.find(&id) else {
            self.conns[i].error(ErrorCode::NotFound, format!("process {id} is gone"));
            return (Wait::None, true);
        };
        let p = &self.procs[pi];
        let c = &mut self.conns[i];
        while c.out.len() < CONN_HIGH_WATER {
            let mut progressed = false;
            for (stream, ring, pos) in [
                (1u8, &p.stdout, &mut out_pos),
                (2u8, &p.stderr, &mut err_pos),
            ] {
                if *pos < ring.start() {
                    c.reply(&Reply::Truncated {
                        stream,
                        requested: *pos,
                        retained_from: ring.start(),
                    });
                    *pos = ring.start();
                }
                let data = ring.read(*pos, MAX_CHUNK_LEN);
                if !data.is_empty() {
                    c.reply(&Reply::Chunk {
                        stream,
                        offset: *pos,
                        data: data.to_vec(),
                    });
                    *pos += data.len() as u64;
                    progressed = true;
                }
            }
            if progressed {
                continue;
            }
            if !p.running() {
                let (exit_code, signal) = p.outcome();
                c.reply(&Reply::Exit {
                    exit_code,
                    signal,
                    finished_at_ms: p.finished_at_ms.unwrap_or(0),
                });
                return (Wait::None, true);
            }
            if !follow {
                c.reply(&Reply::Running {
                    stdout_offset: out_pos,
                    stderr_offset: err_pos,
                });
                return (Wait::None, true);
            }
            break;
        }
        (
            Wait::Output {
                id,
                out_pos,
                err_pos,
                follow,
            },
            false,
        )
    }

    /// Moves a watcher's queued events to a connection, up to its high-water mark; true when the
    /// answer ended (the watcher failed, and is removed, or there is none).
    fn hand_out(&mut self, i: usize, id: &str) -> bool {
        let Some(wi) = self.watchers.iter().position(|w| w.id == id) else {
            self.conns[i].error(ErrorCode::NotFound, format!("no watcher {id}"));
            return true;
        };
        let w = &mut self.watchers[wi];
        let c = &mut self.conns[i];
        while c.out.len() < CONN_HIGH_WATER {
            let Some((op, name)) = w.queue.pop_front() else {
                break;
            };
            c.reply(&Reply::FsEvent { op, name });
        }
        if w.queue.is_empty() {
            if let Some((code, message)) = w.failed.clone() {
                c.error(code, message);
                self.watchers.remove(wi);
                return true;
            }
        }
        false
    }

    fn watch(&mut self, i: usize, w: WatchStart) {
        if self.watchers.len() >= w.max_watchers as usize {
            self.conns[i].error(
                ErrorCode::TooMany,
                format!(
                    "{} directory watches exist in this sandbox, the most allowed",
                    self.watchers.len()
                ),
            );
            return;
        }
        let mut id = random_id_with("w_");
        while self.watchers.iter().any(|w| w.id == id) {
            id = random_id_with("w_");
        }
        match Watcher::start(id.clone(), &w) {
            Ok(watcher) => {
                self.watchers.push(watcher);
                self.conns[i].reply(&Reply::Watcher { id: id.clone() });
                if w.follow {
                    self.conns[i].wait = Wait::Watch(id);
                } else {
                    self.conns[i].reply(&Reply::Ok);
                }
            }
            Err((code, message)) => self.conns[i].error(code, message),
        }
    }

    fn handle(&mut self, i: usize, req: SupRequest) {
        let req = match req {
            SupRequest::Watch(w) => return self.watch(i, w),
            SupRequest::WatchEvents { id } => {
                match self.watchers.iter_mut().find(|w| w.id == id && !w.follow) {
                    Some(w) => w.last_asked = Instant::now(),
                    None => {
                        self.conns[i].error(ErrorCode::NotFound, format!("no watcher {id}"));
                        return;
                    }
                }
                if !self.hand_out(i, &id) {
                    self.conns[i].reply(&Reply::Ok);
                }
                return;
            }
            SupRequest::Unwatch { id } => {
                self.watchers.retain(|w| w.id != id || w.follow);
                self.conns[i].reply(&Reply::Ok);
                return;
            }
            other => other,
        };
        let id_of = |req: &SupRequest| match req {
            SupRequest::Get { id }
            | SupRequest::Output { id, .. }
            | SupRequest::Stdin { id, .. }
            | SupRequest::Signal { id, .. }
            | SupRequest::Resize { id, .. }
            | SupRequest::Delete { id } => Some(id.clone()),
            SupRequest::Start(_)
            | SupRequest::List
            | SupRequest::Watch(_)
            | SupRequest::WatchEvents { .. }
            | SupRequest::Unwatch { .. } => None,
        };
        let target = id_of(&req).map(|id| (self.find(&id), id));
        if let Some((None, id)) = &target {
            if !matches!(req, SupRequest::Delete { .. }) {
                self.conns[i].error(ErrorCode::NotFound, format!("no process {id}"));
                return;
            }
        }
        let pi = target.as_ref().and_then(|t| t.0);
        match req {
            SupRequest::Start(s) => self.start(i, s),
            SupRequest::List => {
                for p in &self.procs {
                    let info = p.info();
                    self.conns[i].reply(&Reply::Process(info));
                }
                self.conns[i].reply(&Reply::Ok);
            }
            SupRequest::Get { id } => {
                let Some(p) = self.find(&id) else { return };
                let info = self.procs[p].info();
                self.conns[i].reply(&Reply::Process(info));
                self.conns[i].reply(&Reply::Ok);
            }
            SupRequest::Output {
                id,
                stdout_from,
                stderr_from,
                follow,
            } => {
                self.conns[i].wait = Wait::Output {
                    id,
                    out_pos: stdout_from,
                    err_pos: stderr_from,
                    follow,
                };
            }
            SupRequest::Stdin { id, close, data } => {
                let Some(pi) = pi else { return };
                let p = &mut self.procs[pi];
                let c = &mut self.conns[i];
                if !p.running() {
                    c.error(ErrorCode::Conflict, format!("process {id} has exited"));
                } else if p.stdin.is_none() || p.close_stdin_after {
                    c.error(
                        ErrorCode::Conflict,
                        format!("process {id} has no open stdin"),
                    );
                } else {
                    p.stdin_queue.extend_from_slice(&data);
                    p.close_stdin_after = close;
                    if p.stdin_queue.len() <= STDIN_QUEUE {
                        let _ = p.write_stdin();
                    }
                    c.wait = Wait::Stdin(id);
                }
            }
            SupRequest::Signal { id, signal } => {
                let Some(pi) = pi else { return };
                let p = &self.procs[pi];
                let c = &mut self.conns[i];
                if !p.running() {
                    c.error(ErrorCode::Conflict, format!("process {id} has exited"));
                } else if !(1..=64).contains(&signal) {
                    c.error(
                        ErrorCode::Invalid,
                        format!("signal {signal} is out of range"),
                    );
                } else {
                    p.signal(signal as i32);
                    c.reply(&Reply::Ok);
                }
            }
            SupRequest::Resize { id, cols, rows } => {
                let Some(pi) = pi else { return };
                let p = &self.procs[pi];
                let c = &mut self.conns[i];
                if !p.tty {
                    c.error(ErrorCode::Conflict, format!("process {id} has no terminal"));
                } else if !p.running() {
                    c.error(ErrorCode::Conflict, format!("process {id} has exited"));
                } else {
                    p.resize(cols, rows);
                    c.reply(&Reply::Ok);
                }
            }
            SupRequest::Delete { id } => {
                if let Some(pi) = pi {
                    self.procs[pi].kill();
                }
                self.conns[i].wait = Wait::Delete(id);
            }
            SupRequest::Watch(_) | SupRequest::WatchEvents { .. } | SupRequest::Unwatch { .. } => {}
        }
    }

    fn start(&mut self, i: usize, s: ProcStart) {
        let running = self.procs.iter().filter(|p| p.running()).count();
        if running >= s.max_running as usize {
            self.conns[i].error(
                ErrorCode::TooMany,
                format!("{running} processes are running, the most allowed"),
            );
            return;
        }
        let mut id = random_id();
        while self.find(&id).is_some() {
            id = random_id();
        }
        match Process::start(id.clone(), &s) {
            Ok(p) => {
                self.procs.push(p);
                self.conns[i].wait = Wait::Started {
                    id,
                    follow: s.follow,
                };
            }
            Err(message) if message.starts_with("invalid request") => {
                self.conns[i].error(ErrorCode::Invalid, message)
            }
            Err(message) => self.conns[i].error(ErrorCode::Internal, message),
        }
    }

    fn forget_oldest(&mut self) {
        while self.ended.len() > KEEP_EXITED {
            let id = self.ended.remove(0);
            if let Some(p) = self.find(&id) {
                self.procs.remove(p);
            }
        }
    }
}
