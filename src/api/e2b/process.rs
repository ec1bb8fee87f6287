//! envd's `process.Process` service on the sandbox's process supervisor (`crate::processes`):
//! a started process is one of the sandbox's long-lived processes like any other (listed by the
//! processes subresource, kept while no client is connected), selected here by its pid.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use futures::stream::BoxStream;
use futures::StreamExt;

use super::envd::{self, process_error};
use crate::api::AppState;
use crate::e2b::connect::{self, Code, Encoding, RpcError};
use crate::e2b::messages::{
    ConnectRequest, DataEvent, Empty, EndEvent, EventResponse, ListResponse, ProcessConfig,
    ProcessEvent, ProcessInfo, ProcessSelector, SelectorRequest, SendInputRequest,
    SendSignalRequest, StartEvent, StartRequest, UpdateRequest,
};
use crate::e2b::paths;
use crate::e2b::protobuf::{self, Schema};
use crate::processes::{OutputEvent, Process, StartSpec, State as PState, Stream, Target};
use crate::resource::{Kind, SandboxState};

/// Keep-alive events when the client names no interval (envd's header `Keepalive-Ping-Interval`).
const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(50);

/// The sandbox and process target of a call, its token and user checked.
pub(super) async fn target(state: &AppState, headers: &HeaderMap) -> Result<Target, RpcError> {
    let sandbox = envd::sandbox(state, headers)?;
    envd::check_rpc_user(headers)?;
    crate::api::processes::target(state, &sandbox.metadata.key())
        .await
        .map_err(envd::api_error)
}

/// The process a selector names.
async fn select(
    state: &AppState,
    target: &Target,
    selector: Option<ProcessSelector>,
) -> Result<Process, RpcError> {
    let selector = selector.unwrap_or_default();
    let pid = match (selector.pid, selector.tag) {
        (Some(pid), _) => pid,
        (None, Some(_)) => {
            return Err(RpcError::new(
                Code::Unimplemented,
                "selecting a process by tag is not supported; select it by pid",
            ))
        }
        (None, None) => {
            return Err(RpcError::new(
                Code::InvalidArgument,
                "process: a pid is required",
            ))
        }
    };
    let processes = state.processes.list(target).await.map_err(process_error)?;
    // A pid may be reused once its process ended: a running one wins.
    processes
        .iter()
        .filter(|p| p.pid == pid && p.state != PState::Lost)
        .max_by_key(|p| (p.state == PState::Running, p.started_at))
        .cloned()
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("process with pid {pid} not found")))
}

pub(super) fn keepalive(headers: &HeaderMap) -> Duration {
    headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_KEEPALIVE, |s| Duration::from_secs(s.clamp(1, 300)))
}

pub async fn start(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let encoding = connect::stream_encoding(&headers);
    // The call's deadline counts from its arrival, before the process (whose own timeout counts
    // from its start) exists: the stream ends with `deadline_exceeded` before the kill's end
    // event can come, as the SDK expects of a command that ran out of time.
    let pace = Pace::of(&headers);
    match start_process(&state, &headers, &body, connect::timeout(&headers)).await {
        Ok((target, process, output)) => {
            stream_events(&state, target, process, output, pace, encoding)
        }
        Err(e) => connect::stream_error(e, encoding),
    }
}

/// Starts the process a `Start` asks for, its output followed from the start. A call deadline
/// (`Connect-Timeout-Ms`, the SDK's `timeout`) is the process's too: envd kills a command whose
/// call ran out, and so does the supervisor here.
async fn start_process(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    deadline: Option<Duration>,
) -> Result<(Target, Process, BoxStream<'static, OutputEvent>), RpcError> {
    let target = target(state, headers).await?;
    let request: StartRequest = connect::stream_request(headers, body, protobuf::START_REQUEST)?;
    let config = request.process.unwrap_or_default();
    if config.cmd.is_empty() {
        return Err(RpcError::new(
            Code::InvalidArgument,
            "process.cmd is required",
        ));
    }
    let size = request.pty.map(|p| p.size.unwrap_or_default());
    let dimension = |v: Option<u32>, default: u16| {
        v.filter(|v| *v > 0)
            .map_or(default, |v| u16::try_from(v).unwrap_or(u16::MAX))
    };
    let spec = StartSpec {
        command: None,
        argv: std::iter::once(config.cmd).chain(config.args).collect(),
        env: config.envs,
        workdir: config.cwd.as_deref().map(paths::resolve),
        tty: size.is_some(),
        // A terminal always takes input; envd's default for a plain process is stdin on.
        stdin: size.is_some() || request.stdin.unwrap_or(true),
        cols: dimension(size.and_then(|s| s.cols), 80),
        rows: dimension(size.and_then(|s| s.rows), 24),
        timeout_seconds: deadline.map(|d| d.as_secs_f64()),
    };
    let (process, output) = state
        .processes
        .start_following(&target, spec)
        .await
        .map_err(process_error)?;
    Ok((target, process, output))
}

pub async fn connect(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let encoding = connect::stream_encoding(&headers);
    let pace = Pace::of(&headers);
    let found = async {
        let target = target(&state, &headers).await?;
        let request: ConnectRequest =
            connect::stream_request(&headers, &body, protobuf::SELECTOR_REQUEST)?;
        let process = select(&state, &target, request.process).await?;
        // Like envd, a connection sees what the process prints from now on. Its deadline ends
        // only this stream: the process was started by another call.
        let (out, err) = (process.stdout_bytes, process.stderr_bytes);
        let output = state
            .processes
            .output(&target, &process.id, out, err, true)
            .await
            .map_err(process_error)?;
        Ok::<_, RpcError>((target, process, output))
    }
    .await;
    match found {
        Ok((target, p, output)) => stream_events(&state, target, p, output, pace, encoding),
        Err(e) => connect::stream_error(e, encoding),
    }
}

/// What an output event becomes on the wire; `None` for those envd has no word for.
fn wire_event(event: OutputEvent, tty: bool) -> Option<ProcessEvent> {
    match event {
        OutputEvent::Data { stream, data, .. } => {
            let text = Some(STANDARD.encode(&data));
            let mut out = DataEvent::default();
            match stream {
                _ if tty => out.pty = text,
                Stream::Stdout => out.stdout = text,
                Stream::Stderr => out.stderr = text,
            }
            Some(ProcessEvent::Data(out))
        }
        OutputEvent::Exit {
            exit_code, signal, ..
        } => Some(ProcessEvent::End(end_event(exit_code, signal.as_deref()))),
        OutputEvent::Truncated { .. } | OutputEvent::Running { .. } => None,
    }
}

/// envd's end event: an exit code, or for a process a signal ended, -1 and Go's wording.
fn end_event(exit_code: Option<i32>, signal: Option<&str>) -> EndEvent {
    match (exit_code, signal) {
        (Some(code), _) => EndEvent {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        },
        (None, Some(signal)) => EndEvent {
            exit_code: -1,
            exited: false,
            status: match signal {
                "KILL" => "signal: killed".to_string(),
                "TERM" => "signal: terminated".to_string(),
                other => format!("signal: SIG{other}"),
            },
            error: None,
        },
        (None, None) => EndEvent {
            exit_code: -1,
            exited: false,
            status: "ended without an exit status".into(),
            error: None,
        },
    }
}

/// How a stream of process events is paced: a keep-alive after `ping` of quiet, and the end of
/// the call at its deadline.
#[derive(Clone, Copy)]
struct Pace {
    ping: Duration,
    deadline: Option<tokio::time::Instant>,
}

impl Pace {
    /// The pace a call's headers ask for, its deadline counted from now (the call's arrival).
    fn of(headers: &HeaderMap) -> Pace {
        Pace {
            ping: keepalive(headers),
            deadline: connect::timeout(headers).map(|d| tokio::time::Instant::now() + d),
        }
    }
}

/// Why a stream's output ended before its process did, worded for the SDK: a sandbox that is
/// gone, being deleted, replaced, or no longer running "was not found" (its
/// `SandboxNotRunningException`, as E2B's proxy says it); otherwise contact was lost, and the
/// SDK asks `/health` what became of the sandbox.
fn lost_contact(state: &AppState, target: &Target) -> RpcError {
    let sandbox = state
        .store
        .get(Kind::Sandbox, &target.name)
        .and_then(|e| e.resource.as_sandbox().cloned());
    let why = match &sandbox {
        None => Some("it was deleted"),
        Some(s) if s.metadata.deletion_timestamp.is_some() => Some("it is being deleted"),
        Some(s) if s.metadata.uid.as_deref() != Some(target.uid.as_str()) => {
            Some("it was deleted and another took its name")
        }
        Some(s) if s.spec.state.unwrap_or_default() != SandboxState::Running => {
            Some("it was paused or stopped")
        }
        _ => None,
    };
    match why {
        Some(why) => RpcError::new(
            Code::Unavailable,
            format!("sandbox {} was not found: {why}", target.name),
        ),
        None => RpcError::new(
            Code::Unavailable,
            "lost contact with the process before it ended (the sandbox stopped?)",
        ),
    }
}

/// The server-streaming answer of a start or connect: the start event, `output` as it comes
/// (all of it for a process just started, from now on for a connect), keep-alives while it is
/// quiet, the end event, then the end of the stream; at the call's deadline, `deadline_exceeded`.
fn stream_events(
    state: &AppState,
    target: Target,
    process: Process,
    output: BoxStream<'static, OutputEvent>,
    pace: Pace,
    encoding: Encoding,
) -> Response {
    let schema = protobuf::EVENT_RESPONSE;
    let first = connect::envelope(
        &EventResponse {
            event: ProcessEvent::Start(StartEvent { pid: process.pid }),
        },
        encoding,
        schema,
    );
    let tty = process.tty;
    let state = state.clone();
    let rest = futures::stream::unfold(Some(output), move |output| {
        let (state, target) = (state.clone(), target.clone());
        async move {
            let mut output = output?;
            loop {
                let now = tokio::time::Instant::now();
                let wait = match pace.deadline {
                    Some(deadline) if deadline <= now => {
                        let late = RpcError::new(
                        Code::DeadlineExceeded,
                        "the call's deadline (Connect-Timeout-Ms) passed before the process ended",
                    );
                        return Some((connect::end_of_stream(Some(&late)), None));
                    }
                    Some(deadline) => pace.ping.min(deadline - now),
                    None => pace.ping,
                };
                match tokio::time::timeout(wait, output.next()).await {
                    Err(_)
                        if pace
                            .deadline
                            .is_some_and(|d| d <= tokio::time::Instant::now()) =>
                    {
                        continue
                    }
                    Err(_) => {
                        let alive = EventResponse {
                            event: ProcessEvent::Keepalive(Empty {}),
                        };
                        return Some((connect::envelope(&alive, encoding, schema), Some(output)));
                    }
                    Ok(None) => {
                        let lost = lost_contact(&state, &target);
                        return Some((connect::end_of_stream(Some(&lost)), None));
                    }
                    Ok(Some(event)) => {
                        let ended = matches!(event, OutputEvent::Exit { .. });
                        if let Some(event) = wire_event(event, tty) {
                            let mut bytes =
                                connect::envelope(&EventResponse { event }, encoding, schema)
                                    .to_vec();
                            if ended {
                                bytes.extend_from_slice(&connect::end_of_stream(None));
                                return Some((Bytes::from(bytes), None));
                            }
                            return Some((Bytes::from(bytes), Some(output)));
                        }
                    }
                }
            }
        }
    });
    let body = futures::stream::once(async move { first })
        .chain(rest)
        .map(Ok::<_, std::convert::Infallible>);
    (connect::stream_headers(encoding), Body::from_stream(body)).into_response()
}

/// Runs a unary process call on the sandbox its token names, as the SDK's user.
async fn unary<Req, Res, F, Fut>(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    schemas: (&'static Schema, &'static Schema),
    call: F,
) -> Response
where
    Req: serde::de::DeserializeOwned,
    Res: serde::Serialize,
    F: FnOnce(Target, Req) -> Fut,
    Fut: std::future::Future<Output = Result<Res, RpcError>>,
{
    envd::unary(headers, body, schemas, target(state, headers), call).await
}

pub async fn list(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::EMPTY, protobuf::LIST_RESPONSE),
        |target, _: Empty| async move {
            let processes = state.processes.list(&target).await.map_err(process_error)?;
            let processes = processes
                .into_iter()
                .filter(|p| p.state == PState::Running)
                .map(|p| {
                    let (cmd, args) = match (p.argv.split_first(), p.command) {
                        (Some((cmd, args)), _) => (cmd.clone(), args.to_vec()),
                        (None, Some(command)) => ("/bin/sh".into(), vec!["-c".into(), command]),
                        (None, None) => (String::new(), Vec::new()),
                    };
                    ProcessInfo {
                        config: ProcessConfig {
                            cmd,
                            args,
                            ..ProcessConfig::default()
                        },
                        pid: p.pid,
                        tag: None,
                    }
                })
                .collect();
            Ok(ListResponse { processes })
        },
    )
    .await
}

fn decode_input(text: &str) -> Result<Vec<u8>, RpcError> {
    STANDARD
        .decode(text)
        .map_err(|e| RpcError::new(Code::InvalidArgument, format!("input is not base64: {e}")))
}

pub async fn send_input(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::SEND_INPUT_REQUEST, protobuf::EMPTY),
        |target, req: SendInputRequest| async move {
            let process = select(state, &target, req.process).await?;
            let input = req.input.unwrap_or_default();
            let data = match (input.stdin, input.pty) {
                (Some(text), _) | (None, Some(text)) => decode_input(&text)?,
                (None, None) => Vec::new(),
            };
            state
                .processes
                .write_stdin(&target, &process.id, &data, false)
                .await
                .map_err(process_error)?;
            Ok(Empty {})
        },
    )
    .await
}

pub async fn close_stdin(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::SELECTOR_REQUEST, protobuf::EMPTY),
        |target, req: SelectorRequest| async move {
            let process = select(state, &target, req.process).await?;
            state
                .processes
                .write_stdin(&target, &process.id, &[], true)
                .await
                .map_err(process_error)?;
            Ok(Empty {})
        },
    )
    .await
}

/// envd's `Signal` enum, by name or number.
fn signal_of(value: Option<&serde_json::Value>) -> Result<i32, RpcError> {
    match value {
        Some(serde_json::Value::String(s)) if s == "SIGNAL_SIGKILL" => Ok(libc::SIGKILL),
        Some(serde_json::Value::String(s)) if s == "SIGNAL_SIGTERM" => Ok(libc::SIGTERM),
        Some(serde_json::Value::Number(n)) if n.as_i64() == Some(9) => Ok(libc::SIGKILL),
        Some(serde_json::Value::Number(n)) if n.as_i64() == Some(15) => Ok(libc::SIGTERM),
        other => Err(RpcError::new(
            Code::InvalidArgument,
            format!("signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL, not {other:?}"),
        )),
    }
}

pub async fn send_signal(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::SEND_SIGNAL_REQUEST, protobuf::EMPTY),
        |target, req: SendSignalRequest| async move {
            let signal = signal_of(req.signal.as_ref())?;
            let process = select(state, &target, req.process).await?;
            state
                .processes
                .signal(&target, &process.id, signal)
                .await
                .map_err(process_error)?;
            Ok(Empty {})
        },
    )
    .await
}

pub async fn update(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let state = &state;
    unary(
        state,
        &headers,
        &body,
        (protobuf::UPDATE_REQUEST, protobuf::EMPTY),
        |target, req: UpdateRequest| async move {
            let size = req.pty.and_then(|p| p.size).ok_or_else(|| {
                RpcError::new(
                    Code::InvalidArgument,
                    "pty.size is required (the only update envd has)",
                )
            })?;
            let (Some(cols), Some(rows)) = (size.cols, size.rows) else {
                return Err(RpcError::new(
                    Code::InvalidArgument,
                    "pty.size needs cols and rows",
                ));
            };
            let process = select(state, &target, req.process).await?;
            let clamp = |v: u32| u16::try_from(v).unwrap_or(u16::MAX);
            state
                .processes
                .resize(&target, &process.id, clamp(cols), clamp(rows))
                .await
                .map_err(process_error)?;
            Ok(Empty {})
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ends_say_exit_codes_and_signals_as_envd_does() {
        let e = end_event(Some(3), None);
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (3, true, "exit status 3")
        );
        let e = end_event(None, Some("KILL"));
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (-1, false, "signal: killed")
        );
        assert_eq!(
            signal_of(Some(&serde_json::json!("SIGNAL_SIGKILL"))).unwrap(),
            9
        );
        assert_eq!(signal_of(Some(&serde_json::json!(15))).unwrap(), 15);
        assert!(signal_of(Some(&serde_json::json!("SIGNAL_UNSPECIFIED"))).is_err());
    }

    #[test]
    fn terminal_output_is_pty_data() {
        let data = OutputEvent::Data {
            stream: Stream::Stdout,
            offset: 0,
            data: b"hi".to_vec(),
        };
        match wire_event(data, true) {
            Some(ProcessEvent::Data(d)) => assert_eq!(d.pty.as_deref(), Some("aGk=")),
            other => panic!("{other:?}"),
        }
    }
}
