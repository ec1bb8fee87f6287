//! Running one command: the request turned into argv, environment, working directory and
//! deadlines, started on a helper channel (or, without a helper, as a plain `docker exec`), and
//! its output collected (buffered exec, capped) or passed on as events (streamed exec, decoded
//! incrementally so that no character is ever split).
//!
//! Timeouts are enforced twice: the helper kills the command's tree at the deadline, and a host
//! deadline one second later kills it again and reports the timeout even if the helper does not.
//! A timeout reports exit code 137, as the reference does (the helper itself says 124).
//!
//! The plain `docker exec` fallback is a last resort, used only when a container has no working
//! helper: it kills on timeout from the host, by the process ID Docker reports, as the server's
//! own user. That needs the server in the host's PID namespace with permission to signal the
//! sandbox user's processes, does nothing under gVisor (Docker reports no PID there), and misses
//! descendants that called `setsid`: only the helper kills whole trees reliably.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;

use super::channel::{Channel, ChannelError, Running};
use super::channels::Recycle;
use super::utf8::Utf8Stream;
use super::{paths, Command, DataPlaneError, DataPlaneResult, ExecEvent, ExecRequest};
use crate::docker::{Engine, EngineError, EngineResult, ExecOutput, ExecPlan};
use helper_protocol::{Event, StartRequest, DOCKER_LINGER_MS};

/// Exit code reported on the wire for a command killed by its timeout (SIGKILL), like the reference.
pub const EXIT_CODE_TIMED_OUT: i64 = 137;
/// Exit code reported when it could not be learned.
pub const EXIT_CODE_UNKNOWN: i64 = -1;
/// `PATH` given to commands when neither the sandbox nor the request sets one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// How much later than the helper the host gives up on a command.
const HOST_GRACE: Duration = Duration::from_secs(1);

/// A request resolved into what actually runs.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: String,
    pub timeout: Duration,
}

impl Prepared {
    pub fn new(
        sandbox_env: &BTreeMap<String, String>,
        request: ExecRequest,
        default_timeout: f64,
    ) -> DataPlaneResult<Prepared> {
        let argv = match request.command {
            Command::Shell(s) => vec!["/bin/sh".into(), "-c".into(), s],
            Command::Argv(v) if v.is_empty() => {
                return Err(DataPlaneError::InvalidRequest(
                    "command must be a non-empty string or list of strings".into(),
                ))
            }
            Command::Argv(v) => v,
        };
        // HOME first so that the sandbox may override it; the request's env wins over both.
        let mut env = BTreeMap::from([("HOME".to_string(), paths::WORKSPACE.to_string())]);
        env.extend(sandbox_env.iter().map(|(k, v)| (k.clone(), v.clone())));
        env.extend(request.env);
        env.entry("PATH".into())
            .or_insert_with(|| DEFAULT_PATH.to_string());
        let workdir = match request.workdir.as_deref() {
            None | Some("") => paths::WORKSPACE.to_string(),
            Some(w) => paths::normalize(w)?,
        };
        let seconds = request.timeout_seconds.unwrap_or(default_timeout);
        let timeout = Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| DataPlaneError::InvalidRequest("timeout_seconds must be > 0".into()))?;
        Ok(Prepared {
            argv,
            env: env.into_iter().collect(),
            workdir,
            timeout,
        })
    }

    pub fn start_request(&self) -> StartRequest {
        StartRequest {
            id: 0,
            argv: self.argv.clone(),
            env: self.env.clone(),
            workdir: self.workdir.clone(),
            timeout_ms: u64::try_from(self.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
            // Like `docker exec`: wait up to 2 s for background output, then leave background
            // processes running (agents start servers that way).
            linger_ms: DOCKER_LINGER_MS,
            keep_background: true,
        }
    }

    fn exec_plan(&self, user: &str) -> ExecPlan {
        ExecPlan {
            argv: self.argv.clone(),
            env: self.env.iter().map(|(k, v)| format!("{k}={v}")).collect(),
            workdir: Some(self.workdir.clone()),
            user: user.to_string(),
            stdin: false,
        }
    }
}

/// What a running command produced next.
pub enum Step {
    Out {
        stderr: bool,
        data: Bytes,
    },
    Exit {
        code: i64,
        timed_out: bool,
    },
    /// Contact was lost; `retryable` when nothing at all had been heard of the command yet.
    Lost {
        why: String,
        retryable: bool,
    },
}

/// A command running somewhere: in a helper, or as a plain `docker exec`.
pub enum Source {
    Helper { running: Running, heard: bool },
    Plain(Plain),
}

impl Source {
    pub fn helper(running: Running) -> Source {
        Source::Helper {
            running,
            heard: false,
        }
    }

    /// Waits until the helper has heard of the command (its first event); `Err` with the reason
    /// when the channel died first, so that nothing ran and the command may be started again.
    pub async fn acknowledged(&mut self) -> Result<(), String> {
        match self {
            Source::Helper { running, .. } => {
                if running.acknowledged().await {
                    Ok(())
                } else {
                    Err(running.lost_reason())
                }
            }
            Source::Plain(_) => Ok(()),
        }
    }

    /// How long after the command's own deadline the host steps in.
    pub fn grace(&self) -> Duration {
        match self {
            Source::Helper { .. } => HOST_GRACE,
            Source::Plain(_) => Duration::ZERO,
        }
    }

    async fn next(&mut self) -> Step {
        match self {
            Source::Helper { running, heard } => loop {
                let event = running.next().await;
                if event.is_some() {
                    *heard = true;
                }
                match event {
                    Some(Event::Stdout { data, .. }) => {
                        return Step::Out {
                            stderr: false,
                            data: data.into(),
                        }
                    }
                    Some(Event::Stderr { data, .. }) => {
                        return Step::Out {
                            stderr: true,
                            data: data.into(),
                        }
                    }
                    Some(Event::Exit {
                        exit_code,
                        timed_out,
                        ..
                    }) => {
                        let code = if timed_out {
                            EXIT_CODE_TIMED_OUT
                        } else {
                            i64::from(exit_code)
                        };
                        return Step::Exit { code, timed_out };
                    }
                    // `Failed` is followed by the same reason on stderr and an `Exit`.
                    Some(_) => {}
                    None => {
                        return Step::Lost {
                            why: running.lost_reason(),
                            retryable: !*heard,
                        }
                    }
                }
            },
            Source::Plain(plain) => plain.next().await,
        }
    }

    async fn kill(&mut self) {
        match self {
            Source::Helper { running, .. } => running.give_up().await,
            Source::Plain(plain) => plain.kill().await,
        }
    }
}

/// A command run with one `docker exec` and no helper.
pub struct Plain {
    engine: Arc<dyn Engine>,
    exec_id: String,
    output: BoxStream<'static, EngineResult<ExecOutput>>,
    ended: bool,
    finished: bool,
}

impl Plain {
    pub async fn start(
        engine: Arc<dyn Engine>,
        container: &str,
        prepared: &Prepared,
        user: &str,
    ) -> EngineResult<Plain> {
        let session = engine.exec(container, &prepared.exec_plan(user)).await?;
        Ok(Plain {
            engine,
            exec_id: session.exec_id,
            output: session.output,
            ended: false,
            finished: false,
        })
    }

    async fn next(&mut self) -> Step {
        if !self.ended {
            match self.output.next().await {
                Some(Ok(ExecOutput::Stdout(data))) => {
                    return Step::Out {
                        stderr: false,
                        data,
                    }
                }
                Some(Ok(ExecOutput::Stderr(data))) => return Step::Out { stderr: true, data },
                Some(Err(e)) => {
                    self.finished = true;
                    return Step::Lost {
                        why: e.to_string(),
                        retryable: false,
                    };
                }
                None => self.ended = true,
            }
        }
        // Docker records the exit code a moment after the stream ends.
        for _ in 0..50 {
            match self.engine.inspect_exec(&self.exec_id).await {
                Ok(state) if !state.running => {
                    self.finished = true;
                    return Step::Exit {
                        code: state.exit_code.unwrap_or(EXIT_CODE_UNKNOWN),
                        timed_out: false,
                    };
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => break,
            }
        }
        self.finished = true;
        Step::Exit {
            code: EXIT_CODE_UNKNOWN,
            timed_out: false,
        }
    }

    async fn kill(&mut self) {
        kill_from_host(self.engine.as_ref(), &self.exec_id).await;
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let engine = Arc::clone(&self.engine);
            let exec_id = self.exec_id.clone();
            handle.spawn(async move { kill_from_host(engine.as_ref(), &exec_id).await });
        }
    }
}

/// Kills a plain exec's process (and its group, when it leads one) by its host PID.
async fn kill_from_host(engine: &dyn Engine, exec_id: &str) {
    let Ok(state) = engine.inspect_exec(exec_id).await else {
        return;
    };
    let Ok(pid) = libc::pid_t::try_from(state.pid) else {
        return;
    };
    if !state.running || pid <= 1 {
        return;
    }
    // SAFETY: kill(2) has no memory-safety preconditions; a stale PID is the accepted risk of
    // this last-resort mode (Docker just reported the exec as running).
    unsafe {
        libc::kill(-pid, libc::SIGKILL);
        libc::kill(pid, libc::SIGKILL);
    }
}

/// Maps a Docker failure on the way to running a command.
pub fn engine_error(sandbox: &str, e: EngineError) -> DataPlaneError {
    match &e {
        EngineError::NotFound { .. } | EngineError::NotRunning { .. } => {
            DataPlaneError::NotRunning(sandbox.to_string())
        }
        _ => DataPlaneError::Backend(e.to_string()),
    }
}

pub fn channel_error(sandbox: &str, e: ChannelError) -> DataPlaneError {
    match e {
        ChannelError::Engine(e) => engine_error(sandbox, e),
        ChannelError::TooLarge(m) => DataPlaneError::InvalidRequest(m),
        other => DataPlaneError::Backend(other.to_string()),
    }
}

/// Drives a command to its end, keeping at most `cap` bytes of output across both streams.
pub struct Collected {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub truncated: bool,
    pub exit: Result<(i64, bool), (String, bool)>,
}

pub async fn collect(source: &mut Source, timeout: Duration, cap: usize) -> Collected {
    let deadline = tokio::time::Instant::now() + timeout + source.grace();
    collect_until(source, deadline, cap).await
}

/// [`collect`] with the host's deadline already set.
pub async fn collect_until(
    source: &mut Source,
    deadline: tokio::time::Instant,
    cap: usize,
) -> Collected {
    let mut c = Collected {
        stdout: Vec::new(),
        stderr: Vec::new(),
        truncated: false,
        exit: Ok((EXIT_CODE_UNKNOWN, false)),
    };
    loop {
        let step = tokio::select! {
            step = source.next() => step,
            _ = tokio::time::sleep_until(deadline) => {
                source.kill().await;
                Step::Exit { code: EXIT_CODE_TIMED_OUT, timed_out: true }
            }
        };
        match step {
            Step::Out { stderr, data } => {
                // The command keeps running past the cap; its further output is dropped.
                let room = cap.saturating_sub(c.stdout.len() + c.stderr.len());
                if data.len() > room {
                    c.truncated = true;
                }
                let keep = &data[..data.len().min(room)];
                if stderr {
                    c.stderr.extend_from_slice(keep);
                } else {
                    c.stdout.extend_from_slice(keep);
                }
            }
            Step::Exit { code, timed_out } => {
                c.exit = Ok((code, timed_out));
                return c;
            }
            Step::Lost { why, retryable } => {
                c.exit = Err((why, retryable));
                return c;
            }
        }
    }
}

/// State of a streamed exec, consumed by [`events`].
struct StreamState {
    source: Source,
    deadline: tokio::time::Instant,
    began: Instant,
    stdout: Utf8Stream,
    stderr: Utf8Stream,
    pending: VecDeque<ExecEvent>,
    done: bool,
}

impl StreamState {
    fn finish(&mut self, code: i64, timed_out: bool) {
        let out = self.stdout.finish();
        if !out.is_empty() {
            self.pending.push_back(ExecEvent::Stdout { data: out });
        }
        let err = self.stderr.finish();
        if !err.is_empty() {
            self.pending.push_back(ExecEvent::Stderr { data: err });
        }
        self.pending.push_back(ExecEvent::Exit {
            exit_code: code,
            timed_out,
            duration_ms: duration_ms(self.began),
        });
        self.done = true;
    }

    async fn next_event(&mut self) -> Option<ExecEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            let step = tokio::select! {
                step = self.source.next() => step,
                _ = tokio::time::sleep_until(self.deadline) => {
                    self.source.kill().await;
                    Step::Exit { code: EXIT_CODE_TIMED_OUT, timed_out: true }
                }
            };
            match step {
                Step::Out { stderr, data } => {
                    let (decoder, text) = if stderr {
                        (&mut self.stderr, true)
                    } else {
                        (&mut self.stdout, false)
                    };
                    let data = decoder.push(&data);
                    if !data.is_empty() {
                        return Some(if text {
                            ExecEvent::Stderr { data }
                        } else {
                            ExecEvent::Stdout { data }
                        });
                    }
                }
                Step::Exit { code, timed_out } => self.finish(code, timed_out),
                Step::Lost { why, .. } => {
                    tracing::warn!(%why, "lost a streamed command");
                    self.pending.push_back(ExecEvent::Stderr {
                        data: format!("agent-sandbox: lost contact with the command: {why}\n"),
                    });
                    self.finish(EXIT_CODE_UNKNOWN, false);
                }
            }
        }
    }
}

/// A stream's private channel and where it goes when the stream is over.
pub struct Private {
    pub channel: Arc<Channel>,
    pub recycle: Recycle,
}

/// The state of [`events`]: the command and, for a private channel, its way back to the spares.
struct Streaming {
    state: StreamState,
    private: Option<Private>,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        // A channel is reused only when its one command ended with an `Exit` from the helper: a
        // stream dropped early (its command being killed), a host-side timeout or a lost helper
        // leave it busy or dead, and it is simply closed.
        let finished =
            matches!(&self.state.source, Source::Helper { running, .. } if running.is_finished());
        if let Some(private) = self.private.take() {
            if self.state.done && finished && private.channel.is_idle() {
                (private.recycle)(private.channel);
            }
        }
    }
}

/// The events of a streamed command; dropping the stream kills the command (its source's guard).
pub fn events(
    source: Source,
    deadline: tokio::time::Instant,
    began: Instant,
    private: Option<Private>,
) -> BoxStream<'static, ExecEvent> {
    let state = StreamState {
        source,
        deadline,
        began,
        stdout: Utf8Stream::new(),
        stderr: Utf8Stream::new(),
        pending: VecDeque::new(),
        done: false,
    };
    // The private channel lives exactly as long as the stream.
    futures::stream::unfold(Streaming { state, private }, |mut streaming| async move {
        let event = streaming.state.next_event().await?;
        Some((event, streaming))
    })
    .boxed()
}

pub fn duration_ms(began: Instant) -> u64 {
    u64::try_from(began.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(command: Command, env: &[(&str, &str)]) -> ExecRequest {
        ExecRequest {
            command,
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            workdir: None,
            timeout_seconds: None,
        }
    }

    #[test]
    fn env_layers_and_defaults() {
        let sandbox = BTreeMap::from([
            ("A".to_string(), "sandbox".to_string()),
            ("B".to_string(), "sandbox".to_string()),
        ]);
        let p = Prepared::new(
            &sandbox,
            request(Command::Shell("echo".into()), &[("B", "request")]),
            60.0,
        )
        .unwrap();
        let env: BTreeMap<_, _> = p.env.iter().cloned().collect();
        assert_eq!(env["A"], "sandbox");
        assert_eq!(env["B"], "request");
        assert_eq!(env["HOME"], "/workspace");
        assert_eq!(env["PATH"], DEFAULT_PATH);
        assert_eq!(p.argv, ["/bin/sh", "-c", "echo"]);
        assert_eq!(p.workdir, "/workspace");
        assert_eq!(p.timeout, Duration::from_secs(60));

        let sandbox = BTreeMap::from([("HOME".to_string(), "/h".to_string())]);
        let p = Prepared::new(
            &sandbox,
            request(Command::Argv(vec!["ls".into()]), &[("PATH", "/x")]),
            1.5,
        )
        .unwrap();
        let env: BTreeMap<_, _> = p.env.iter().cloned().collect();
        assert_eq!(env["HOME"], "/h");
        assert_eq!(env["PATH"], "/x");
        assert_eq!(p.argv, ["ls"]);
        assert_eq!(p.start_request().timeout_ms, 1500);
    }

    #[test]
    fn bad_requests_are_refused() {
        let none = BTreeMap::new();
        assert!(Prepared::new(&none, request(Command::Argv(vec![]), &[]), 1.0).is_err());
        let mut r = request(Command::Shell("x".into()), &[]);
        r.timeout_seconds = Some(f64::NAN);
        assert!(Prepared::new(&none, r, 1.0).is_err());
        let mut r = request(Command::Shell("x".into()), &[]);
        r.workdir = Some("sub/../dir".into());
        assert_eq!(
            Prepared::new(&none, r, 1.0).unwrap().workdir,
            "/workspace/dir"
        );
    }
}
