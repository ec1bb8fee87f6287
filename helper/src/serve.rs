//! `agent-sandbox-helper serve`: a single-threaded `poll(2)` loop over the host's requests
//! (stdin), the events queued for it (stdout, with back-pressure) and every running command's
//! pipes; all timers (timeouts, linger, shutdown grace) live here. It speaks only the
//! `helper_protocol` frames and never blocks on one command.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use helper_protocol::{
    Event, FrameDecoder, Request, StartRequest, EXIT_CODE_CANNOT_EXECUTE, EXIT_CODE_LOST,
    EXIT_CODE_TIMEOUT, MAX_CHUNK_LEN, PROTOCOL_VERSION,
};

use crate::command::{
    drain_and_close, force_end, hurry, parse_status, prepare, read_output_once, spawn, Command,
};
use crate::{files, shepherd, sys};

/// Stop reading command output while this much is queued for stdout (back-pressure).
const OUTPUT_HIGH_WATER: usize = 1 << 20;
/// After a shutdown starts, give up waiting for commands after this long.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long a shepherd told to kill at its command's deadline has to go before the helper kills
/// the command's process group itself. Below the host's own grace (one second), so that a command
/// whose shepherd is merely slow is reported by the helper rather than given up by the host.
const SHEPHERD_GRACE: Duration = Duration::from_millis(500);
/// How much longer the shepherd then has before the helper kills it too (see
/// `command::hurry` for why not at once). The host has answered by then.
const SHEPHERD_LAST_GRACE: Duration = Duration::from_secs(5);

/// A file write received over the channel (`WriteFile`, `Data`…, `End`).
struct Write {
    /// The failure is kept until `End` so that it is reported in order.
    job: Result<files::WriteJob, files::Fail>,
    began: Instant,
}

struct Helper {
    commands: BTreeMap<u64, Command>,
    writes: BTreeMap<u64, Write>,
    out: Vec<u8>,
    out_pos: usize,
    /// stdout is broken: drop everything.
    out_broken: bool,
    stdin_open: bool,
    decoder: FrameDecoder,
    shutdown_since: Option<Instant>,
    protocol_error: bool,
    buf: Vec<u8>,
    use_subreaper: bool,
}

fn main_loop_timeout(now: Instant, deadline: Option<Instant>) -> i32 {
    match deadline {
        None => -1,
        Some(d) => {
            let ms = d.saturating_duration_since(now).as_micros().div_ceil(1000);
            ms.min(60_000) as i32
        }
    }
}

/// Tells the host on stderr why the helper is ending, best effort: `eprintln!` would panic on a
/// stderr that is gone too.
fn say(message: &str) {
    let _ = sys::write(2, format!("helper: {message}\n").as_bytes());
}

fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

pub fn serve() -> i32 {
    sys::ensure_std_fds();
    sys::reset_inherited_signals();
    unsafe {
        // Keep commands (same uid) from ptrace-attaching to the helper or its shepherds and forging
        // frames; a process made non-dumpable can still read its own /proc entries.
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
    let _ = sys::set_nonblocking(0);
    let _ = sys::set_nonblocking(1);
    let mut h = Helper {
        commands: BTreeMap::new(),
        writes: BTreeMap::new(),
        out: Vec::with_capacity(1 << 16),
        out_pos: 0,
        out_broken: false,
        stdin_open: true,
        decoder: FrameDecoder::new(),
        shutdown_since: None,
        protocol_error: false,
        buf: vec![0u8; MAX_CHUNK_LEN],
        // The variable exists so tests can exercise the fallback where the prctl works.
        use_subreaper: std::env::var_os("AGENT_SANDBOX_HELPER_NO_SUBREAPER").is_none()
            && shepherd::subreaper_available(),
    };
    h.emit(&Event::Hello {
        version: PROTOCOL_VERSION,
    });
    h.run();
    i32::from(h.protocol_error)
}

impl Helper {
    fn emit(&mut self, ev: &Event) {
        if self.out_broken {
            return;
        }
        if let Err(e) = ev.encode(&mut self.out) {
            // Only a huge message can fail to encode; say so in a smaller one.
            let msg = format!("cannot encode event: {e}");
            let _ = Event::Error { message: msg }.encode(&mut self.out);
        }
    }

    fn queued(&self) -> usize {
        self.out.len() - self.out_pos
    }

    /// Writes as much queued output as stdout takes without blocking.
    fn flush(&mut self) {
        while self.out_pos < self.out.len() && !self.out_broken {
            match sys::write(1, &self.out[self.out_pos..]) {
                Ok(0) => break,
                Ok(n) => self.out_pos += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    // The host went away: nobody to report to (stderr may still reach it);
                    // kill everything.
                    say(&format!("cannot write events: {e}"));
                    self.out_broken = true;
                    self.begin_shutdown();
                }
            }
        }
        if self.out_pos == self.out.len() || self.out_broken {
            self.out.clear();
            self.out_pos = 0;
        } else if self.out_pos > (1 << 20) {
            self.out.drain(..self.out_pos);
            self.out_pos = 0;
        }
    }

    fn begin_shutdown(&mut self) {
        if self.shutdown_since.is_none() {
            self.shutdown_since = Some(Instant::now());
        }
        self.stdin_open = false;
        // Unfinished writes are abandoned: dropping them removes their temporary files.
        self.writes.clear();
        for c in self.commands.values_mut() {
            c.kill();
        }
    }

    fn run(&mut self) {
        loop {
            let now = Instant::now();
            if let Some(since) = self.shutdown_since {
                let give_up = now.duration_since(since) >= SHUTDOWN_GRACE;
                if self.commands.is_empty() || give_up {
                    self.final_flush(since + SHUTDOWN_GRACE);
                    return; // Dropping control pipes makes any remaining shepherd kill its tree.
                }
            }

            // Timers.
            let mut next: Option<Instant> = self.shutdown_since.map(|s| s + SHUTDOWN_GRACE);
            for c in self.commands.values_mut() {
                // The deadline holds in every state until the command is reported: one whose
                // shepherd was already told to finish (main exited, output closed) but is still
                // there is told to kill as well; either way the shepherd then has a short grace.
                if let Some(d) = c.deadline {
                    if c.status.is_none() {
                        c.deadline = None;
                    } else if now >= d {
                        c.deadline = None;
                        if !c.ending {
                            c.timed_out = true;
                            c.kill();
                        } else {
                            c.tell(shepherd::CTL_KILL);
                        }
                        c.force_at = Some(now + SHEPHERD_GRACE);
                    } else {
                        next = earliest(next, Some(d));
                    }
                }
                if let Some(f) = c.force_at {
                    if c.status.is_none() {
                        c.force_at = None;
                    } else if now >= f && !c.last_chance {
                        hurry(c);
                        c.force_at = Some(now + SHEPHERD_LAST_GRACE);
                        next = earliest(next, c.force_at);
                    } else if now >= f {
                        c.force_at = None;
                        force_end(c, &mut self.out, &mut self.buf, self.out_broken);
                    } else {
                        next = earliest(next, Some(f));
                    }
                }
                if let Some(d) = c.linger_deadline {
                    if now >= d {
                        c.linger_deadline = None;
                        drain_and_close(c, &mut self.out, &mut self.buf, self.out_broken);
                    } else {
                        next = earliest(next, Some(d));
                    }
                }
            }
            self.progress();
            if self.shutdown_since.is_some() && self.commands.is_empty() {
                continue;
            }

            // Poll set: [stdin?][stdout?] then per command: status, stdout, stderr.
            let mut pfds: Vec<libc::pollfd> = Vec::with_capacity(2 + 3 * self.commands.len());
            let mut slots: Vec<(u64, u8)> = Vec::with_capacity(pfds.capacity());
            if self.stdin_open {
                pfds.push(libc::pollfd {
                    fd: 0,
                    events: libc::POLLIN,
                    revents: 0,
                });
                slots.push((0, b'i'));
            }
            if self.queued() > 0 && !self.out_broken {
                pfds.push(libc::pollfd {
                    fd: 1,
                    events: libc::POLLOUT,
                    revents: 0,
                });
                slots.push((0, b'o'));
            }
            let read_output = self.queued() < OUTPUT_HIGH_WATER || self.out_broken;
            for c in self.commands.values() {
                if let Some(fd) = &c.status {
                    pfds.push(sys::pollfd(fd, libc::POLLIN));
                    slots.push((c.id, b's'));
                }
                if c.started && read_output {
                    if let Some(fd) = &c.stdout {
                        pfds.push(sys::pollfd(fd, libc::POLLIN));
                        slots.push((c.id, b'1'));
                    }
                    if let Some(fd) = &c.stderr {
                        pfds.push(sys::pollfd(fd, libc::POLLIN));
                        slots.push((c.id, b'2'));
                    }
                }
            }
            let timeout = main_loop_timeout(Instant::now(), next);
            if sys::poll(&mut pfds, timeout).is_err() {
                // Should not happen; avoid spinning.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }

            for (pfd, &(id, what)) in pfds.iter().zip(&slots) {
                if pfd.revents == 0 {
                    continue;
                }
                match what {
                    b'i' => self.read_stdin(),
                    b'o' => self.flush(),
                    b's' => self.read_status(id),
                    b'1' | b'2' => {
                        if let Some(c) = self.commands.get_mut(&id) {
                            read_output_once(
                                c,
                                what == b'2',
                                &mut self.out,
                                &mut self.buf,
                                self.out_broken,
                            );
                        }
                    }
                    _ => unreachable!(),
                }
            }
            self.progress();
            self.flush();
        }
    }

    /// After shutdown: try to deliver what is queued, until `until`.
    fn final_flush(&mut self, until: Instant) {
        let _ = sys::set_nonblocking(1);
        while self.queued() > 0 && !self.out_broken {
            let now = Instant::now();
            if now >= until {
                break;
            }
            let mut p = [libc::pollfd {
                fd: 1,
                events: libc::POLLOUT,
                revents: 0,
            }];
            let _ = sys::poll(&mut p, main_loop_timeout(now, Some(until)));
            self.flush();
        }
    }

    fn read_stdin(&mut self) {
        let mut buf = [0u8; 64 * 1024];
        loop {
            match sys::read(0, &mut buf) {
                Ok(0) => {
                    self.stdin_open = false;
                    if !self.commands.is_empty() {
                        // Normally the host asks for a Shutdown first; say why commands die.
                        say(&format!(
                            "requests ended with {} command(s) running",
                            self.commands.len()
                        ));
                    }
                    if let Err(e) = self.decoder.finish() {
                        self.protocol_violation(e.to_string());
                    }
                    self.begin_shutdown();
                    return;
                }
                Ok(n) => {
                    self.decoder.feed(&buf[..n]);
                    loop {
                        match self.decoder.next_request() {
                            Ok(Some(req)) => self.handle(req),
                            Ok(None) => break,
                            Err(e) => {
                                self.protocol_violation(e.to_string());
                                self.begin_shutdown();
                                return;
                            }
                        }
                        if !self.stdin_open {
                            return;
                        }
                    }
                    if n < buf.len() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    say(&format!("cannot read requests: {e}"));
                    self.stdin_open = false;
                    self.begin_shutdown();
                    return;
                }
            }
        }
    }

    fn protocol_violation(&mut self, message: String) {
        self.protocol_error = true;
        self.emit(&Event::Error { message });
    }

    fn handle(&mut self, req: Request) {
        match req {
            Request::Start(s) => self.start(s),
            Request::Kill { id } => {
                if let Some(c) = self.commands.get_mut(&id) {
                    c.kill();
                }
                if let Some(w) = self.writes.remove(&id) {
                    self.emit(&Event::Exit {
                        id,
                        exit_code: EXIT_CODE_LOST,
                        timed_out: false,
                        duration_ms: ms_since(w.began),
                    });
                }
            }
            Request::Shutdown => self.begin_shutdown(),
            Request::WriteFile { id, path, mode } => {
                if self.busy(id) {
                    return self.protocol_violation(format!(
                        "WriteFile with id {id} while that command is running"
                    ));
                }
                let began = Instant::now();
                let job = files::WriteJob::begin(path.as_bytes(), mode);
                self.writes.insert(id, Write { job, began });
            }
            // Data for an id that is not being written belongs to a write that was killed.
            Request::Data { id, data } => {
                if let Some(w) = self.writes.get_mut(&id) {
                    if let Ok(job) = &mut w.job {
                        if let Err(f) = job.feed(&data) {
                            w.job = Err(f);
                        }
                    }
                }
            }
            Request::End { id } => {
                if let Some(w) = self.writes.remove(&id) {
                    let outcome = w.job.and_then(files::WriteJob::finish);
                    let (line, code, message) = files::outcome_line(&outcome);
                    let mut data = line.into_bytes();
                    data.truncate(MAX_CHUNK_LEN);
                    self.emit(&Event::Stdout { id, data });
                    if code != 0 {
                        let mut data = format!("{message}\n").into_bytes();
                        data.truncate(MAX_CHUNK_LEN);
                        self.emit(&Event::Stderr { id, data });
                    }
                    self.emit(&Event::Exit {
                        id,
                        exit_code: code,
                        timed_out: false,
                        duration_ms: ms_since(w.began),
                    });
                }
            }
        }
    }

    /// Whether `id` names a command or write in progress.
    fn busy(&self, id: u64) -> bool {
        self.commands.contains_key(&id) || self.writes.contains_key(&id)
    }

    /// Reports a command that never ran: `Failed`, the reason on stderr, then `Exit`.
    fn refuse(&mut self, id: u64, code: i32, message: String, began: Instant) {
        self.emit(&Event::Failed {
            id,
            message: message.clone(),
        });
        let mut line = format!("agent-sandbox-helper: {message}\n").into_bytes();
        line.truncate(MAX_CHUNK_LEN);
        self.emit(&Event::Stderr { id, data: line });
        self.emit(&Event::Exit {
            id,
            exit_code: code,
            timed_out: false,
            duration_ms: ms_since(began),
        });
    }

    fn start(&mut self, s: StartRequest) {
        let began = Instant::now();
        if self.busy(s.id) {
            self.protocol_violation(format!(
                "Start with id {} while that command is running",
                s.id
            ));
            return;
        }
        let spec = match prepare(&s) {
            Ok(spec) => spec,
            Err(message) => return self.refuse(s.id, EXIT_CODE_CANNOT_EXECUTE, message, began),
        };
        let mut spec = spec;
        spec.use_subreaper = self.use_subreaper;
        match spawn(&spec) {
            Ok((shepherd, pipes)) => {
                let deadline = match s.timeout_ms {
                    0 => None,
                    ms => Some(began + Duration::from_millis(ms)),
                };
                self.commands.insert(
                    s.id,
                    Command {
                        id: s.id,
                        shepherd,
                        status: Some(pipes.status),
                        status_buf: Vec::new(),
                        control: pipes.control,
                        stdout: Some(pipes.stdout),
                        stderr: Some(pipes.stderr),
                        started: false,
                        failure: None,
                        main_exit: None,
                        began,
                        deadline,
                        linger_ms: s.linger_ms,
                        linger_deadline: None,
                        timed_out: false,
                        ending: false,
                        main_pid: None,
                        force_at: None,
                        last_chance: false,
                    },
                );
                if self.shutdown_since.is_some() {
                    if let Some(c) = self.commands.get_mut(&s.id) {
                        c.kill();
                    }
                }
            }
            Err(e) => self.refuse(s.id, EXIT_CODE_CANNOT_EXECUTE, e, began),
        }
    }

    fn read_status(&mut self, id: u64) {
        let Some(c) = self.commands.get_mut(&id) else {
            return;
        };
        let Some(fd) = &c.status else { return };
        let mut buf = [0u8; 4096];
        let eof = match sys::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) => true,
            Ok(n) => {
                c.status_buf.extend_from_slice(&buf[..n]);
                false
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(_) => true,
        };
        let mut events = Vec::new();
        parse_status(c, &mut events);
        // `Started` must precede any output.
        for ev in events {
            self.emit(&ev);
        }
        if eof {
            let Some(c) = self.commands.get_mut(&id) else {
                return;
            };
            c.status = None;
            let _ = sys::wait_for(c.shepherd);
            // The shepherd's tree is dead (or released): whatever is still in the pipes is all
            // there will be, unless a process outside the tree holds them.
            drain_and_close(c, &mut self.out, &mut self.buf, self.out_broken);
        }
    }

    /// Sends finish instructions and `Exit` frames for commands that are done.
    fn progress(&mut self) {
        let mut done = Vec::new();
        let now = Instant::now();
        for c in self.commands.values_mut() {
            if c.main_exit.is_some() && !c.ending && c.status.is_some() {
                if !c.pipes_open() {
                    c.ending = true;
                    c.tell(shepherd::CTL_FINISH);
                } else if c.linger_ms > 0 && c.linger_deadline.is_none() {
                    c.linger_deadline = Some(now + Duration::from_millis(c.linger_ms));
                    // Prevent re-arming: linger_ms is one-shot.
                    c.linger_ms = 0;
                }
            }
            if c.status.is_none() && !c.pipes_open() {
                done.push(c.id);
            }
        }
        for id in done {
            let c = self.commands.remove(&id).expect("listed above");
            let exit_code = if let Some(code) = c.failure {
                code
            } else if c.timed_out {
                EXIT_CODE_TIMEOUT
            } else {
                c.main_exit.unwrap_or(EXIT_CODE_LOST)
            };
            self.emit(&Event::Exit {
                id,
                exit_code,
                timed_out: c.timed_out && c.failure.is_none(),
                duration_ms: ms_since(c.began),
            });
        }
    }
}

fn ms_since(t: Instant) -> u64 {
    t.elapsed().as_millis().min(u128::from(u64::MAX)) as u64
}
