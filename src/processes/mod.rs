//! Long-lived processes of a sandbox (background commands, stdin, terminals, output replayed from
//! byte offsets): the server's side of the in-sandbox process supervisor.
//!
//! Design: processes belong to the sandbox, not to a connection or to this server. The
//! container's main process (`agent-sandbox-helper idle`) is their supervisor: it holds their
//! shepherds and the retained tail of each output stream in bounded rings in the sandbox's own
//! memory, so they keep running and their output keeps being captured while no client is
//! connected and while this server is down or restarting, and offsets continue exactly where
//! they were. This module keeps no process state of its own except what it needs to report
//! `Lost`: the processes it last saw in each sandbox and the container they ran in (its id and
//! when it started). When the container is replaced (rollback, restore, a changed spec), goes
//! away, or stops and starts again (the sandbox killed its supervisor, say), the processes it saw
//! there are reported `Lost` with a message until they are deleted. Server memory stays bounded
//! whatever a process prints: output is streamed through one bridge connection per reader.
//!
//! Requests go over connections to the supervisor (`bridge.rs`, each one `docker exec` through
//! the engine); idle ones are pooled per container (a few each) so that a start or a get costs a
//! round trip, not an exec. An output reader, a deletion and an attach's stdin hold a connection
//! for as long as they need it (taken from the pool when there is one; an output reader gives it
//! back once its answer has ended). This module never knows the HTTP wire format
//! (`api/processes.rs` does), and only the engine talks to Docker.

mod bridge;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, TimeZone, Utc};
use futures::stream::BoxStream;

use crate::config::Settings;
use crate::docker::{Engine, EngineError};
use bridge::{Bridge, BridgeError};
use helper_protocol::supervisor::{ErrorCode, ProcInfo, ProcStart, Reply, SupRequest};
use helper_protocol::MAX_CHUNK_LEN;

/// `PATH` given to processes when neither the sandbox nor the request sets one.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// Where processes run unless the request says otherwise.
pub const DEFAULT_WORKDIR: &str = "/workspace";

/// The sandbox an operation targets, as the controller last observed it.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    /// The sandbox's `metadata.uid`: a new sandbox of the same name starts with nothing seen.
    pub uid: String,
    pub container_id: String,
    /// The sandbox's own environment; a request's env is applied on top.
    pub env: BTreeMap<String, String>,
}

impl Target {
    fn key(&self) -> String {
        format!("{}/{}", self.name, self.uid)
    }
}

/// Lost processes remembered per sandbox (the oldest are forgotten first).
const KEEP_LOST: usize = 64;

/// What to start.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartSpec {
    /// The command string (run as `/bin/sh -c`), or none when `argv` was given.
    pub command: Option<String>,
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub workdir: Option<String>,
    pub tty: bool,
    pub stdin: bool,
    pub cols: u16,
    pub rows: u16,
    pub timeout_seconds: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Running,
    Exited,
    Lost,
}

/// One process as reported.
#[derive(Clone, Debug, PartialEq)]
pub struct Process {
    pub id: String,
    pub pid: u32,
    pub command: Option<String>,
    pub argv: Vec<String>,
    pub tty: bool,
    pub state: State,
    pub started_at: DateTime<Utc>,
    pub exit_code: Option<i32>,
    /// The name of the signal that ended it (`KILL`, `TERM`, ...).
    pub signal: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Why it is `Lost`.
    pub message: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One event of an output read.
#[derive(Clone, Debug, PartialEq)]
pub enum OutputEvent {
    Data {
        stream: Stream,
        offset: u64,
        data: Vec<u8>,
    },
    Truncated {
        stream: Stream,
        requested: u64,
        retained_from: u64,
    },
    Exit {
        exit_code: Option<i32>,
        signal: Option<String>,
        finished_at: DateTime<Utc>,
    },
    Running {
        stdout_offset: u64,
        stderr_offset: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    TooMany(String),
    #[error("{0}")]
    Invalid(String),
    /// The sandbox has no running container, or it cannot take processes.
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Backend(String),
}

/// Signals a client may send, by name.
pub const SIGNALS: &[(&str, i32)] = &[
    ("TERM", libc::SIGTERM),
    ("INT", libc::SIGINT),
    ("HUP", libc::SIGHUP),
    ("KILL", libc::SIGKILL),
    ("QUIT", libc::SIGQUIT),
    ("USR1", libc::SIGUSR1),
    ("USR2", libc::SIGUSR2),
];

/// The name of a signal number, as reported in `signal`.
pub fn signal_name(n: u32) -> String {
    let known = [
        (libc::SIGHUP, "HUP"),
        (libc::SIGINT, "INT"),
        (libc::SIGQUIT, "QUIT"),
        (libc::SIGILL, "ILL"),
        (libc::SIGTRAP, "TRAP"),
        (libc::SIGABRT, "ABRT"),
        (libc::SIGBUS, "BUS"),
        (libc::SIGFPE, "FPE"),
        (libc::SIGKILL, "KILL"),
        (libc::SIGUSR1, "USR1"),
        (libc::SIGSEGV, "SEGV"),
        (libc::SIGUSR2, "USR2"),
        (libc::SIGPIPE, "PIPE"),
        (libc::SIGALRM, "ALRM"),
        (libc::SIGTERM, "TERM"),
        (libc::SIGXCPU, "XCPU"),
        (libc::SIGXFSZ, "XFSZ"),
        (libc::SIGSYS, "SYS"),
    ];
    known
        .iter()
        .find(|(k, _)| *k as u32 == n)
        .map_or_else(|| format!("SIG{n}"), |(_, name)| name.to_string())
}

fn time(ms: u64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms as i64)
        .single()
        .unwrap_or_default()
}

fn from_info(p: ProcInfo) -> Process {
    let state = if p.running {
        State::Running
    } else {
        State::Exited
    };
    Process {
        command: (!p.command.is_empty()).then_some(p.command),
        id: p.id,
        pid: p.pid,
        argv: p.argv,
        tty: p.tty,
        state,
        started_at: time(p.started_at_ms),
        exit_code: p.exit_code,
        signal: p.signal.map(signal_name),
        finished_at: p.finished_at_ms.map(time),
        stdout_bytes: p.stdout_bytes,
        stderr_bytes: p.stderr_bytes,
        message: None,
    }
}

/// What was last seen of one sandbox's processes.
#[derive(Default)]
struct Seen {
    container_id: String,
    /// When that container last started, as Docker says: a container stopped and started again
    /// keeps its id but has a new supervisor, with none of the processes seen before.
    started_at: Option<DateTime<Utc>>,
    processes: BTreeMap<String, Process>,
    /// Processes of an earlier container, reported `Lost`.
    lost: BTreeMap<String, Process>,
}

impl Seen {
    fn lose_all(&mut self, why: &str) {
        for (id, mut p) in std::mem::take(&mut self.processes) {
            if p.state == State::Running {
                p.state = State::Lost;
                p.message = Some(why.to_string());
                self.lost.insert(id, p);
            }
        }
        while self.lost.len() > KEEP_LOST {
            let oldest = self
                .lost
                .values()
                .min_by_key(|p| p.started_at)
                .map(|p| p.id.clone());
            match oldest {
                Some(id) => self.lost.remove(&id),
                None => break,
            };
        }
    }
}

pub struct Processes {
    engine: Arc<dyn Engine>,
    settings: Arc<Settings>,
    seen: Mutex<HashMap<String, Seen>>,
    pool: Pool,
    /// Where starts are timed, when the server keeps metrics.
    metrics: Option<crate::metrics::Metrics>,
}

/// Idle supervisor connections by container id.
type Pool = Arc<Mutex<HashMap<String, Vec<Bridge>>>>;

/// Keeps an idle connection for the next request into its container (a few per container).
fn give_back(pool: &Pool, container: &str, b: Bridge) {
    let mut pool = pool.lock().unwrap_or_else(|p| p.into_inner());
    // Containers that are gone (a pool member removed unclaimed, too) leave dead connections
    // behind; forget those.
    pool.retain(|_, idle| {
        idle.retain_mut(|b| b.is_alive());
        !idle.is_empty()
    });
    let idle = pool.entry(container.to_string()).or_default();
    if idle.len() < POOL_PER_CONTAINER {
        idle.push(b);
    }
}

/// How long a request waits for a supervisor that does not listen yet: the container's main
/// process binds its socket a moment after Docker reports the container running (longer under
/// gVisor), and a process started right after a sandbox was made must not meet that gap.
const SUPERVISOR_STARTING: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the helper's bridge found no supervisor listening (the socket not bound yet, or its
/// supervisor gone), as opposed to a container without one.
fn not_listening_yet(why: &str) -> bool {
    why.contains("not reachable") && why.contains("refused")
}

/// Idle connections kept per container.
const POOL_PER_CONTAINER: usize = 4;
/// How long a pooled connection has to answer a request the supervisor answers at once.
const POOLED_ANSWER: std::time::Duration = std::time::Duration::from_secs(3);

const REPLACED: &str = "the sandbox's container was replaced; its processes ended with it";
const GONE: &str = "the sandbox's container went away; its processes ended with it";
const RESTARTED: &str =
    "the sandbox's container stopped and started again; its processes ended with it";
const EXPIRED: &str = "the sandbox expired; its processes ended with it";

fn bridge_error(target: &Target, e: BridgeError) -> ProcessError {
    match e {
        BridgeError::Engine(EngineError::NotFound { .. })
        | BridgeError::Engine(EngineError::NotRunning { .. }) => {
            ProcessError::Unavailable(format!("sandbox {} is not running", target.name))
        }
        BridgeError::NoSupervisor(m) => ProcessError::Unavailable(format!(
            "sandbox {} cannot run long-lived processes: {m}",
            target.name
        )),
        other => ProcessError::Backend(other.to_string()),
    }
}

fn reply_error(code: ErrorCode, message: String) -> ProcessError {
    match code {
        ErrorCode::NotFound => ProcessError::NotFound(message),
        ErrorCode::Conflict => ProcessError::Conflict(message),
        ErrorCode::TooMany => ProcessError::TooMany(message),
        ErrorCode::Invalid => ProcessError::Invalid(message),
        ErrorCode::Internal => ProcessError::Backend(message),
        ErrorCode::Denied => ProcessError::Invalid(message),
    }
}

/// The `Ok` ending an answer, or its error.
fn expect_ok(replies: &[Reply]) -> Result<(), ProcessError> {
    match replies.last() {
        Some(Reply::Ok) => Ok(()),
        Some(Reply::Error { code, message }) => Err(reply_error(*code, message.clone())),
        other => Err(ProcessError::Backend(format!(
            "unexpected answer from the supervisor: {other:?}"
        ))),
    }
}

impl Processes {
    pub fn new(engine: Arc<dyn Engine>, settings: Arc<Settings>) -> Processes {
        Processes {
            engine,
            settings,
            seen: Mutex::new(HashMap::new()),
            pool: Pool::default(),
            metrics: None,
        }
    }

    /// Times every start into `metrics`.
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Processes {
        self.metrics = Some(metrics);
        self
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, HashMap<String, Seen>> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes the container a sandbox runs in now; processes of an earlier one become `Lost`.
    fn note_container(&self, target: &Target) {
        let mut seen = self.seen();
        let s = seen.entry(target.key()).or_default();
        if s.container_id != target.container_id {
            if !s.container_id.is_empty() {
                s.lose_all(REPLACED);
            }
            s.container_id = target.container_id.clone();
            s.started_at = None;
        }
    }

    /// Notes when the sandbox's container started (asked with each new connection: a restart
    /// ends every connection, so none can outlive its supervisor unnoticed); what ran before a
    /// new start is lost.
    fn note_started(&self, target: &Target, started_at: Option<DateTime<Utc>>) {
        let mut seen = self.seen();
        let s = seen.entry(target.key()).or_default();
        if s.container_id != target.container_id || started_at.is_none() {
            return;
        }
        if s.started_at
            .is_some_and(|before| Some(before) != started_at)
        {
            s.lose_all(RESTARTED);
        }
        s.started_at = started_at;
    }

    fn note(&self, target: &Target, p: &Process) {
        let mut seen = self.seen();
        let s = seen.entry(target.key()).or_default();
        if s.container_id == target.container_id {
            s.processes.insert(p.id.clone(), p.clone());
        }
    }

    /// The sandbox's container is gone or stopped: what ran there is lost.
    fn note_gone(&self, target: &Target) {
        let mut seen = self.seen();
        if let Some(s) = seen.get_mut(&target.key()) {
            s.lose_all(GONE);
        }
    }

    /// The processes of a sandbox that expired and is kept without a container: those seen
    /// running in its last container are `Lost`, with those lost before; none runs any more.
    /// (`target.container_id` is not used: there is none.)
    pub fn of_expired(&self, target: &Target) -> Vec<Process> {
        let mut seen = self.seen();
        let Some(s) = seen.get_mut(&target.key()) else {
            return Vec::new();
        };
        s.lose_all(EXPIRED);
        s.lost.values().cloned().collect()
    }

    fn lost(&self, target: &Target, id: &str) -> Option<Process> {
        self.seen()
            .get(&target.key())
            .and_then(|s| s.lost.get(id).cloned())
    }

    /// A new connection to the container's supervisor, waiting for one that does not listen yet.
    async fn open_bridge(&self, container_id: &str) -> Result<Bridge, BridgeError> {
        let deadline = std::time::Instant::now() + SUPERVISOR_STARTING;
        loop {
            let opened =
                Bridge::open(&self.engine, container_id, &self.settings.sandbox_user).await;
            match opened {
                Err(BridgeError::NoSupervisor(why))
                    if not_listening_yet(&why) && std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                opened => break opened,
            }
        }
    }

    /// Opens one connection to a new container's supervisor ahead of any request and keeps it
    /// idle. For a pool member waiting to be claimed: the claim keeps the container's ID, so the
    /// sandbox that claims it starts its first process without paying a `docker exec` (tens of
    /// milliseconds) first. A failure is only logged; the first request then connects as usual.
    pub async fn warm(&self, container_id: &str) {
        match self.open_bridge(container_id).await {
            Ok(bridge) => give_back(&self.pool, container_id, bridge),
            Err(error) => {
                tracing::debug!(container = %container_id, %error, "supervisor not warmed")
            }
        }
    }

    /// Whether an idle connection to the container's supervisor is kept.
    pub fn is_warm(&self, container_id: &str) -> bool {
        let pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.get(container_id).is_some_and(|idle| !idle.is_empty())
    }

    async fn connect(&self, target: &Target) -> Result<Bridge, ProcessError> {
        self.note_container(target);
        let opened = self.open_bridge(&target.container_id).await;
        match opened {
            Ok(b) => {
                if let Ok(Some(details)) = self.engine.inspect_container(&target.container_id).await
                {
                    self.note_started(target, details.started_at);
                }
                Ok(b)
            }
            Err(e) => {
                if matches!(
                    e,
                    BridgeError::Engine(EngineError::NotFound { .. })
                        | BridgeError::Engine(EngineError::NotRunning { .. })
                ) {
                    self.note_gone(target);
                }
                Err(bridge_error(target, e))
            }
        }
    }

    /// One request and its whole answer, on an idle pooled connection to the container's
    /// supervisor when there is a live one (a `docker exec` costs tens of milliseconds). A pooled
    /// connection is checked for life first; if it breaks anyway, only a request that is safe
    /// to repeat (not a start) is sent again on a fresh one.
    async fn call(&self, target: &Target, req: SupRequest) -> Result<Vec<Reply>, ProcessError> {
        let (b, replies) = self.checked_out(target, &req).await?;
        give_back(&self.pool, &target.container_id, b);
        Ok(replies)
    }

    /// Like [`Processes::call`], keeping the connection: the caller gives it back to the pool
    /// once nothing more will come on it, or drops it.
    async fn checked_out(
        &self,
        target: &Target,
        req: &SupRequest,
    ) -> Result<(Bridge, Vec<Reply>), ProcessError> {
        let pooled = self.take_pooled(&target.container_id);
        let repeatable = !matches!(req, SupRequest::Start(_) | SupRequest::Stdin { .. });
        let (mut b, was_pooled) = match pooled {
            Some(b) => (b, true),
            None => (self.connect(target).await?, false),
        };
        if was_pooled {
            self.note_container(target);
        }
        // A pooled connection into a container that was just removed may never answer (under
        // gVisor its exec outlives the container for a while): give it a bounded time.
        let answer = if was_pooled {
            tokio::time::timeout(POOLED_ANSWER, b.call(req))
                .await
                .unwrap_or_else(|_| Err(BridgeError::Broken("no answer".into())))
        } else {
            b.call(req).await
        };
        match answer {
            Ok(r) => Ok((b, r)),
            Err(_) if was_pooled && repeatable => {
                let mut b = self.connect(target).await?;
                let r = b.call(req).await.map_err(|e| bridge_error(target, e))?;
                Ok((b, r))
            }
            Err(e) => Err(bridge_error(target, e)),
        }
    }

    fn take_pooled(&self, container: &str) -> Option<Bridge> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        let idle = pool.get_mut(container)?;
        while let Some(mut b) = idle.pop() {
            if b.is_alive() {
                return Some(b);
            }
        }
        None
    }

    pub async fn start(&self, target: &Target, spec: StartSpec) -> Result<Process, ProcessError> {
        let req = self.start_request(target, spec, false)?;
        let began = std::time::Instant::now();
        let replies = self.call(target, req).await?;
        expect_ok(&replies)?;
        match replies.into_iter().next() {
            Some(Reply::Process(info)) => Ok(self.started(target, info, began)),
            other => Err(ProcessError::Backend(format!(
                "unexpected answer from the supervisor: {other:?}"
            ))),
        }
    }

    /// Starts a process and follows all its output until it ends, on one request to the
    /// supervisor (a start with `follow`): what [`Processes::start`] then
    /// [`Processes::output`] from offset 0 do, one round trip fewer, for a caller that starts a
    /// command to read it to its end (envd's `Start`). A supervisor older than `follow` (in a
    /// container an older server made) is asked the two things in turn. A start is not repeated
    /// on another connection: it may have run.
    pub async fn start_following(
        &self,
        target: &Target,
        spec: StartSpec,
    ) -> Result<(Process, BoxStream<'static, OutputEvent>), ProcessError> {
        let began = std::time::Instant::now();
        let (mut b, was_pooled) = match self.take_pooled(&target.container_id) {
            Some(b) => (b, true),
            None => (self.connect(target).await?, false),
        };
        if was_pooled {
            self.note_container(target);
        }
        let follows = b.starts_following();
        let req = match self.start_request(target, spec, follows) {
            Ok(req) => req,
            Err(e) => {
                give_back(&self.pool, &target.container_id, b);
                return Err(e);
            }
        };
        let first = async {
            b.send(&req).await?;
            b.next().await
        };
        // As in `checked_out`: a pooled connection into a removed container may never answer.
        let first = if was_pooled {
            tokio::time::timeout(POOLED_ANSWER, first)
                .await
                .unwrap_or_else(|_| Err(BridgeError::Broken("no answer".into())))
        } else {
            first.await
        };
        match first.map_err(|e| bridge_error(target, e))? {
            Reply::Process(info) => {
                let p = self.started(target, info, began);
                if follows {
                    return Ok((p, self.replies_as_output(target, b)));
                }
                match b.next().await.map_err(|e| bridge_error(target, e))? {
                    Reply::Ok => {}
                    other => {
                        return Err(ProcessError::Backend(format!(
                            "unexpected answer from the supervisor: {other:?}"
                        )))
                    }
                }
                let output = self.stream_output(target, b, &p.id, (0, 0), true).await?;
                Ok((p, output))
            }
            Reply::Error { code, message } => {
                give_back(&self.pool, &target.container_id, b);
                Err(reply_error(code, message))
            }
            other => Err(ProcessError::Backend(format!(
                "unexpected answer from the supervisor: {other:?}"
            ))),
        }
    }

    /// A process the supervisor says it started: counted, noted, and answered.
    fn started(&self, target: &Target, info: ProcInfo, began: std::time::Instant) -> Process {
        if let Some(metrics) = &self.metrics {
            metrics.process_started(began.elapsed());
        }
        let p = from_info(info);
        self.note(target, &p);
        p
    }

    /// The supervisor's request for a start `spec`, the target's environment under its own.
    fn start_request(
        &self,
        target: &Target,
        spec: StartSpec,
        follow: bool,
    ) -> Result<SupRequest, ProcessError> {
        let mut env = BTreeMap::from([("HOME".to_string(), DEFAULT_WORKDIR.to_string())]);
        env.extend(target.env.clone());
        env.extend(spec.env);
        env.entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.to_string());
        if spec.tty {
            env.entry("TERM".into())
                .or_insert_with(|| "xterm-256color".to_string());
        }
        let timeout_ms = spec
            .timeout_seconds
            .map_or(0, |t| ((t * 1000.0).ceil() as u64).max(1));
        let req = SupRequest::Start(ProcStart {
            command: spec.command.unwrap_or_default(),
            argv: spec.argv,
            env: env.into_iter().collect(),
            workdir: spec.workdir.unwrap_or_else(|| DEFAULT_WORKDIR.to_string()),
            tty: spec.tty,
            stdin: spec.stdin,
            cols: spec.cols,
            rows: spec.rows,
            timeout_ms,
            retain_bytes: self.settings.process_output_bytes,
            max_running: self.settings.max_processes,
            follow,
        });
        if req.to_frame().is_err() {
            return Err(ProcessError::Invalid(
                "the command, its arguments and environment are too large (over 1 MiB together)"
                    .into(),
            ));
        }
        Ok(req)
    }

    /// Every process of the sandbox: the supervisor's, then those lost with earlier containers.
    pub async fn list(&self, target: &Target) -> Result<Vec<Process>, ProcessError> {
        let current = match self.call(target, SupRequest::List).await {
            Ok(replies) => {
                expect_ok(&replies)?;
                let procs: Vec<Process> = replies
                    .into_iter()
                    .filter_map(|r| match r {
                        Reply::Process(i) => Some(from_info(i)),
                        _ => None,
                    })
                    .collect();
                let mut seen = self.seen();
                let s = seen.entry(target.key()).or_default();
                s.processes = procs.iter().map(|p| (p.id.clone(), p.clone())).collect();
                procs
            }
            Err(ProcessError::Unavailable(m)) => {
                let seen = self.seen();
                if seen.get(&target.key()).is_none_or(|s| s.lost.is_empty()) {
                    return Err(ProcessError::Unavailable(m));
                }
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let seen = self.seen();
        let lost = seen
            .get(&target.key())
            .map(|s| s.lost.values().cloned().collect::<Vec<_>>())
            .unwrap_or_default();
        Ok(current.into_iter().chain(lost).collect())
    }

    /// Whether a process runs in the sandbox now, and when the last one to end ended: what its
    /// idle policy counts as use. Lost processes count for neither.
    pub async fn in_use(
        &self,
        target: &Target,
    ) -> Result<(bool, Option<DateTime<Utc>>), ProcessError> {
        let processes = self.list(target).await?;
        let running = processes.iter().any(|p| p.state == State::Running);
        let last_end = processes
            .iter()
            .filter(|p| p.state == State::Exited)
            .filter_map(|p| p.finished_at)
            .max();
        Ok((running, last_end))
    }

    pub async fn get(&self, target: &Target, id: &str) -> Result<Process, ProcessError> {
        if let Some(p) = self.lost(target, id) {
            return Ok(p);
        }
        let result = self
            .call(target, SupRequest::Get { id: id.to_string() })
            .await;
        // The container may have just been found replaced or gone.
        if let Some(p) = self.lost(target, id) {
            return Ok(p);
        }
        let replies = result?;
        expect_ok(&replies)?;
        match replies.into_iter().next() {
            Some(Reply::Process(info)) => {
                let p = from_info(info);
                self.note(target, &p);
                Ok(p)
            }
            other => Err(ProcessError::Backend(format!(
                "unexpected answer from the supervisor: {other:?}"
            ))),
        }
    }

    /// Kills the whole tree, waits for it, forgets the process.
    pub async fn delete(&self, target: &Target, id: &str) -> Result<(), ProcessError> {
        {
            let mut seen = self.seen();
            if let Some(s) = seen.get_mut(&target.key()) {
                if s.lost.remove(id).is_some() {
                    return Ok(());
                }
            }
        }
        // Delete answers Ok for an unknown id; a get first gives the 404.
        let mut b = self.connect(target).await?;
        let r = b
            .call(&SupRequest::Get { id: id.to_string() })
            .await
            .map_err(|e| bridge_error(target, e))?;
        expect_ok(&r)?;
        let r = b
            .call(&SupRequest::Delete { id: id.to_string() })
            .await
            .map_err(|e| bridge_error(target, e))?;
        expect_ok(&r)?;
        if let Some(s) = self.seen().get_mut(&target.key()) {
            s.processes.remove(id);
        }
        Ok(())
    }

    /// Writes `data` to the process's stdin, then closes it if `close`.
    pub async fn write_stdin(
        &self,
        target: &Target,
        id: &str,
        data: &[u8],
        close: bool,
    ) -> Result<(), ProcessError> {
        if self.lost(target, id).is_some() {
            return Err(ProcessError::Conflict(format!("process {id} is lost")));
        }
        self.session(target)
            .await?
            .write_stdin(id, data, close)
            .await
    }

    pub async fn signal(&self, target: &Target, id: &str, signal: i32) -> Result<(), ProcessError> {
        if self.lost(target, id).is_some() {
            return Err(ProcessError::Conflict(format!("process {id} is lost")));
        }
        let r = self
            .call(
                target,
                SupRequest::Signal {
                    id: id.to_string(),
                    signal: signal as u32,
                },
            )
            .await?;
        expect_ok(&r)
    }

    pub async fn resize(
        &self,
        target: &Target,
        id: &str,
        cols: u16,
        rows: u16,
    ) -> Result<(), ProcessError> {
        if self.lost(target, id).is_some() {
            return Err(ProcessError::Conflict(format!("process {id} is lost")));
        }
        let r = self
            .call(
                target,
                SupRequest::Resize {
                    id: id.to_string(),
                    cols,
                    rows,
                },
            )
            .await?;
        expect_ok(&r)
    }

    /// Output from the given offsets. Errors known before the first event (no such process, no
    /// container) come back as `Err`; the stream then yields events until the answer ends. A
    /// stream that ends without `Exit` or `Running` means the connection broke (the container
    /// went away): it never invents an exit.
    pub async fn output(
        &self,
        target: &Target,
        id: &str,
        stdout_from: u64,
        stderr_from: u64,
        follow: bool,
    ) -> Result<BoxStream<'static, OutputEvent>, ProcessError> {
        if let Some(p) = self.lost(target, id) {
            return Err(ProcessError::Conflict(format!(
                "process {id} is lost: {}",
                p.message.unwrap_or_default()
            )));
        }
        // Refusals (no such process) before the stream starts; the first output of a quiet
        // process may be long in coming. A pooled connection serves, and goes back to the pool
        // once the answer has ended (a reader that leaves early takes its connection with it).
        let (b, r) = self
            .checked_out(target, &SupRequest::Get { id: id.to_string() })
            .await?;
        expect_ok(&r)?;
        self.stream_output(target, b, id, (stdout_from, stderr_from), follow)
            .await
    }

    /// Asks for a process's output on connection `b` and streams the answer; `b` goes back to
    /// the pool once the answer has ended.
    async fn stream_output(
        &self,
        target: &Target,
        mut b: Bridge,
        id: &str,
        (stdout_from, stderr_from): (u64, u64),
        follow: bool,
    ) -> Result<BoxStream<'static, OutputEvent>, ProcessError> {
        b.send(&SupRequest::Output {
            id: id.to_string(),
            stdout_from,
            stderr_from,
            follow,
        })
        .await
        .map_err(|e| bridge_error(target, e))?;
        Ok(self.replies_as_output(target, b))
    }

    /// The output replies coming on connection `b`, as events, until the last one; `b` then goes
    /// back to the pool.
    fn replies_as_output(&self, target: &Target, b: Bridge) -> BoxStream<'static, OutputEvent> {
        let back = (Arc::clone(&self.pool), target.container_id.clone());
        let started_at = self.seen().get(&target.key()).and_then(|s| s.started_at);
        let engine = Arc::clone(&self.engine);
        let stream = futures::stream::unfold(Some(b), move |bridge| {
            let (back, engine) = (back.clone(), Arc::clone(&engine));
            async move {
                let mut bridge = bridge?;
                let reply = loop {
                    match tokio::time::timeout(QUIET_CHECK, bridge.next()).await {
                        Ok(reply) => break reply.ok()?,
                        Err(_) if still_there(&engine, &back.1, started_at).await => {}
                        Err(_) => return None,
                    }
                };
                let (event, last) = to_event(reply)?;
                if last {
                    give_back(&back.0, &back.1, bridge);
                    return Some((event, None));
                }
                Some((event, Some(bridge)))
            }
        });
        Box::pin(stream)
    }
}

impl Processes {
    /// One request to the sandbox's supervisor and its whole answer (for the other users of the
    /// supervisor's protocol, such as directory watches).
    pub(crate) async fn supervisor_call(
        &self,
        target: &Target,
        req: SupRequest,
    ) -> Result<Vec<Reply>, ProcessError> {
        self.call(target, req).await
    }

    /// Sends a request whose answer streams: its first reply (which may be a final one, such as
    /// a [`Reply::Error`]; an `Err` when the connection failed), then the rest as they come. The stream ends
    /// after a final reply, when the connection breaks, or when the container stops running as
    /// it did; dropping it ends the connection (and what the supervisor tied to it).
    pub(crate) async fn supervisor_stream(
        &self,
        target: &Target,
        req: SupRequest,
    ) -> Result<(Reply, BoxStream<'static, Reply>), ProcessError> {
        let mut b = self.connect(target).await?;
        b.send(&req).await.map_err(|e| bridge_error(target, e))?;
        let first = b.next().await.map_err(|e| bridge_error(target, e))?;
        if first.is_final() {
            return Ok((first, Box::pin(futures::stream::empty())));
        }
        let container = target.container_id.clone();
        let started_at = self.seen().get(&target.key()).and_then(|s| s.started_at);
        let engine = Arc::clone(&self.engine);
        let stream = futures::stream::unfold(Some(b), move |bridge| {
            let (engine, container) = (Arc::clone(&engine), container.clone());
            async move {
                let mut bridge = bridge?;
                let reply = loop {
                    match tokio::time::timeout(QUIET_CHECK, bridge.next()).await {
                        Ok(reply) => break reply.ok()?,
                        Err(_) if still_there(&engine, &container, started_at).await => {}
                        Err(_) => return None,
                    }
                };
                let last = reply.is_final();
                Some((reply, (!last).then_some(bridge)))
            }
        });
        Ok((first, Box::pin(stream)))
    }
}

/// How long an output stream waits in silence before it checks that its container still runs
/// as it did when the stream began: under gVisor a connection into a container whose supervisor
/// died can stay open, and a follower must not wait on it for ever.
const QUIET_CHECK: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the container still runs, started when it was (`None`: not known then). Docker not
/// answering for a moment is no reason to end a stream.
async fn still_there(
    engine: &Arc<dyn Engine>,
    container: &str,
    started_at: Option<DateTime<Utc>>,
) -> bool {
    match engine.inspect_container(container).await {
        Ok(Some(d)) => d.running && (started_at.is_none() || d.started_at == started_at),
        Ok(None) => false,
        Err(_) => true,
    }
}

/// One kept connection for a client's stream of stdin writes and resizes (an attach), so that
/// each keystroke costs one round trip to the supervisor, not a new `docker exec`.
pub struct Session {
    target: Target,
    bridge: Bridge,
}

impl Processes {
    /// A connection of its own for a client's writes (an idle pooled one if there is one).
    pub async fn session(&self, target: &Target) -> Result<Session, ProcessError> {
        let bridge = match self.take_pooled(&target.container_id) {
            Some(b) => {
                self.note_container(target);
                b
            }
            None => self.connect(target).await?,
        };
        Ok(Session {
            target: target.clone(),
            bridge,
        })
    }
}

impl Session {
    pub async fn write_stdin(
        &mut self,
        id: &str,
        data: &[u8],
        close: bool,
    ) -> Result<(), ProcessError> {
        let mut chunks: Vec<&[u8]> = data.chunks(MAX_CHUNK_LEN).collect();
        if chunks.is_empty() {
            chunks.push(&[]);
        }
        let n = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            let r = self
                .bridge
                .call(&SupRequest::Stdin {
                    id: id.to_string(),
                    close: close && i + 1 == n,
                    data: chunk.to_vec(),
                })
                .await
                .map_err(|e| bridge_error(&self.target, e))?;
            expect_ok(&r)?;
        }
        Ok(())
    }

    pub async fn resize(&mut self, id: &str, cols: u16, rows: u16) -> Result<(), ProcessError> {
        let r = self
            .bridge
            .call(&SupRequest::Resize {
                id: id.to_string(),
                cols,
                rows,
            })
            .await
            .map_err(|e| bridge_error(&self.target, e))?;
        expect_ok(&r)
    }
}

fn stream_of(s: u8) -> Stream {
    if s == 2 {
        Stream::Stderr
    } else {
        Stream::Stdout
    }
}

/// One reply as an event, and whether it is the last.
fn to_event(reply: Reply) -> Option<(OutputEvent, bool)> {
    Some(match reply {
        Reply::Chunk {
            stream,
            offset,
            data,
        } => (
            OutputEvent::Data {
                stream: stream_of(stream),
                offset,
                data,
            },
            false,
        ),
        Reply::Truncated {
            stream,
            requested,
            retained_from,
        } => (
            OutputEvent::Truncated {
                stream: stream_of(stream),
                requested,
                retained_from,
            },
            false,
        ),
        Reply::Exit {
            exit_code,
            signal,
            finished_at_ms,
        } => (
            OutputEvent::Exit {
                exit_code,
                signal: signal.map(signal_name),
                finished_at: time(finished_at_ms),
            },
            true,
        ),
        Reply::Running {
            stdout_offset,
            stderr_offset,
        } => (
            OutputEvent::Running {
                stdout_offset,
                stderr_offset,
            },
            true,
        ),
        // Anything else ends the stream without inventing an event.
        _ => return None,
    })
}
