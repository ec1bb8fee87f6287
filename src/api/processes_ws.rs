//! WebSocket access to a sandbox's processes, like `kubectl attach` and `kubectl exec`:
//! `GET …/processes/{id}/attach` and `GET …/sandboxes/{name}/exec?command=…&tty=…&stdin=…`
//! (start and attach in one), in Kubernetes' channel framing (`v5.channel.k8s.io`, also answered
//! as `v4.channel.k8s.io`). Each binary message starts with a channel byte: 0 stdin, 1 stdout,
//! 2 stderr, 3 status (a Kubernetes `Status` object, with `exitCode`/`signal` added, sent once the
//! process has really ended), 4 resize (`{"Width": C, "Height": R}`), 255 close of a channel
//! (`[255, 0]` closes stdin).
//!
//! An attach streams output from what the process has printed by then (earlier output is read
//! with `…/output`); an exec streams from the start. The process belongs to the sandbox: closing
//! the socket leaves it running (`DELETE` ends it). Several clients may attach to one process.
//! Output goes through one follow connection per socket, stdin and resizes through one kept
//! session; nothing here buffers more than one message. The contract's parsing and errors live
//! in `processes.rs`; this file only frames.

use std::sync::Arc;

use aide::axum::routing::get_with;
use aide::axum::ApiRouter;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::Extension;

use crate::authz::Principal;
use axum::response::Response;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Map, Value};

use super::error::ApiError;
use super::openapi::Describe;
use super::processes::{parse_start, process_error, target};
use super::resources::PREFIX;
use super::AppState;
use crate::activity::Toucher;
use crate::processes::{OutputEvent, ProcessError, Processes, StartSpec, Stream, Target};

pub const CHANNEL_STDIN: u8 = 0;
pub const CHANNEL_STDOUT: u8 = 1;
pub const CHANNEL_STDERR: u8 = 2;
pub const CHANNEL_STATUS: u8 = 3;
pub const CHANNEL_RESIZE: u8 = 4;
pub const CHANNEL_CLOSE: u8 = 255;
const PROTOCOLS: [&str; 2] = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
/// The answer header of an exec naming the process it started.
pub const PROCESS_ID_HEADER: &str = "agent-sandbox-process-id";

pub fn routes() -> ApiRouter<AppState> {
    let b = format!("{PREFIX}/sandboxes/{{name}}");
    ApiRouter::new()
        .api_route(
            &format!("{b}/processes/{{id}}/attach"),
            get_with(attach, |op| {
                op.id("attachProcess")
                    .summary("Attach to a process (WebSocket)")
                    .tag("processes")
                    .path_param("name", "The sandbox's name")
                    .path_param("id", "The process id")
                    .description(
                        "A WebSocket in Kubernetes' channel framing (v5.channel.k8s.io): binary \
                         messages start with a channel byte, 0 stdin, 1 stdout, 2 stderr, 3 \
                         status (a Kubernetes Status with exitCode or signal, once the process \
                         ended), 4 resize ({\"Width\": C, \"Height\": R}), 255 close of a \
                         channel. Output starts at what the process has printed so far; closing \
                         the socket leaves the process running.",
                    )
                    .websocket("Switching to the WebSocket protocol")
                    .errors(&[400, 404, 409, 502])
            }),
        )
        .api_route(
            &format!("{b}/exec"),
            get_with(exec, |op| {
                op.id("execProcess")
                    .summary("Start a process and attach to it (WebSocket)")
                    .tag("processes")
                    .path_param("name", "The sandbox's name")
                    .query(
                        "command",
                        false,
                        "One value: a shell command line; repeated: the argv (like kubectl)",
                    )
                    .query(
                        "argv",
                        false,
                        "Repeated: the argv as given, however many (instead of command)",
                    )
                    .query_with_schema(
                        "tty",
                        false,
                        "Run on a terminal",
                        json!({"type": "boolean"}),
                    )
                    .query_with_schema(
                        "stdin",
                        false,
                        "Keep stdin open",
                        json!({"type": "boolean"}),
                    )
                    .query_with_schema(
                        "env",
                        false,
                        "An environment variable, KEY=VALUE (repeatable)",
                        json!({"type": "string", "pattern": "^[^=\\u0000]+=[^\\u0000]*$"}),
                    )
                    .query_with_schema(
                        "workdir",
                        false,
                        "Working directory, an absolute path (default /workspace)",
                        json!({"type": "string", "pattern": "^/[^\\u0000]*$"}),
                    )
                    .query_with_schema(
                        "cols",
                        false,
                        "Terminal width (default 80)",
                        json!({"type": "integer", "minimum": 1, "maximum": 65535}),
                    )
                    .query_with_schema(
                        "rows",
                        false,
                        "Terminal height (default 24)",
                        json!({"type": "integer", "minimum": 1, "maximum": 65535}),
                    )
                    .query_with_schema(
                        "timeoutSeconds",
                        false,
                        "Kill the tree after this long; none means never",
                        json!({"type": "number", "exclusiveMinimum": 0, "maximum": 1e9}),
                    )
                    .description(
                        "Like `kubectl exec`: starts a long-lived process and attaches to it from \
                         its first byte, in the framing of attachProcess. The fields of a start \
                         (env, workdir, cols, rows, timeoutSeconds) are query parameters here, \
                         judged as in startProcess. The answer's `Agent-Sandbox-Process-Id` \
                         header names the process.",
                    )
                    .websocket("Switching to the WebSocket protocol")
                    .errors(&[400, 404, 409, 429, 502])
            }),
        )
}

async fn attach(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path((name, id)): Path<(String, String)>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let target = target(&state, &name).await?;
    let p = state
        .processes
        .get(&target, &id)
        .await
        .map_err(process_error)?;
    let from = (p.stdout_bytes, p.stderr_bytes);
    let processes = Arc::clone(&state.processes);
    let activity = state.activity.toucher(&name);
    Ok(limited(ws).on_upgrade(move |socket| async move {
        principal
            .while_valid(run(socket, processes, target, id, from, activity))
            .await;
    }))
}

/// The largest message a client may send (a keystroke, a paste, a resize): a socket holds at
/// most one, so many sockets cannot make the server hold much. Larger ones close the socket with
/// "message too big"; the process is left as it was.
pub const MAX_CLIENT_MESSAGE: usize = 1 << 20;

fn limited(ws: WebSocketUpgrade) -> WebSocketUpgrade {
    ws.protocols(PROTOCOLS)
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
}

fn flag(v: Option<&String>, name: &str) -> Result<bool, ApiError> {
    match v.map(|s| s.to_ascii_lowercase()).as_deref() {
        None | Some("") | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") => Ok(true),
        Some(other) => Err(ApiError::InvalidRequest(format!(
            "{name}: must be true or false, got {other:?}"
        ))),
    }
}

/// The start an exec's query asks for, judged by the same parser as `POST …/processes` (so a
/// field at fault is named the same way): `command` once is a shell command line, several times
/// an argv (kubectl's way); `argv` (repeatable) is an argv however many there are, so that one
/// program with no arguments runs as given; `env=KEY=VALUE` repeatable; `workdir`, `tty`, `stdin`, `cols`,
/// `rows`, `timeoutSeconds` as in the body of a start. kubectl's `stdout`, `stderr` and
/// `container` are accepted and ignored (both streams are always sent; a sandbox has one
/// container).
fn exec_spec(query: Vec<(String, String)>) -> Result<StartSpec, ApiError> {
    let mut command = Vec::new();
    let mut argv = Vec::new();
    let mut env = Map::new();
    let mut body = Map::new();
    for (k, v) in query {
        match k.as_str() {
            "command" => command.push(v),
            "argv" => argv.push(v),
            "env" => {
                let Some((key, value)) = v.split_once('=') else {
                    return Err(ApiError::InvalidRequest(format!(
                        "env: expected KEY=VALUE, got {v:?}"
                    )));
                };
                env.insert(key.to_string(), Value::String(value.to_string()));
            }
            "tty" | "stdin" => {
                body.insert(k.clone(), Value::Bool(flag(Some(&v), &k)?));
            }
            "cols" | "rows" => {
                let n: u64 = v.parse().map_err(|_| {
                    ApiError::InvalidRequest(format!(
                        "{k}: must be an integer from 1 to 65535, got {v:?}"
                    ))
                })?;
                body.insert(k, Value::from(n));
            }
            "timeoutSeconds" => {
                let t = v
                    .parse::<f64>()
                    .ok()
                    .and_then(serde_json::Number::from_f64)
                    .ok_or_else(|| {
                        ApiError::InvalidRequest(format!(
                            "timeoutSeconds: must be a number above 0, got {v:?}"
                        ))
                    })?;
                body.insert(k, Value::Number(t));
            }
            "workdir" => {
                body.insert(k, Value::String(v));
            }
            "stdout" | "stderr" | "container" => {}
            other => {
                return Err(ApiError::InvalidRequest(format!(
                    "{other}: is not a known query parameter"
                )))
            }
        }
    }
    match (command.len(), argv.is_empty()) {
        (0, true) => return Err(ApiError::InvalidRequest("command: is required".into())),
        (0, false) => {}
        (_, false) => {
            return Err(ApiError::InvalidRequest(
                "argv: give command or argv, not both".into(),
            ))
        }
        (1, true) => {
            body.insert("command".into(), Value::String(command.remove(0)));
        }
        (_, true) => argv = command,
    }
    if !argv.is_empty() {
        body.insert(
            "argv".into(),
            Value::Array(argv.into_iter().map(Value::String).collect()),
        );
    }
    if !env.is_empty() {
        body.insert("env".into(), Value::Object(env));
    }
    parse_start(body)
}

async fn exec(
    State(state): State<AppState>,
    Extension(principal): Extension<Principal>,
    Path(name): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
    ws: WebSocketUpgrade,
) -> Result<Response, ApiError> {
    let spec = exec_spec(query)?;
    let target = target(&state, &name).await?;
    let p = state
        .processes
        .start(&target, spec)
        .await
        .map_err(process_error)?;
    let processes = Arc::clone(&state.processes);
    let activity = state.activity.toucher(&name);
    // Which process this is, for a client that wants to find it again (`…/processes/{id}`).
    let id_header = axum::http::HeaderValue::from_str(&p.id).ok();
    let mut response = limited(ws).on_upgrade(move |socket| async move {
        principal
            .while_valid(run(socket, processes, target, p.id, (0, 0), activity))
            .await;
    });
    if let Some(v) = id_header {
        response.headers_mut().insert(PROCESS_ID_HEADER, v);
    }
    Ok(response)
}

/// A Kubernetes `Status` for the end of a process.
fn status(exit_code: Option<i32>, signal: Option<&str>) -> Value {
    match (exit_code, signal) {
        (Some(0), _) => json!({"metadata": {}, "status": "Success", "exitCode": 0}),
        (Some(code), _) => json!({
            "metadata": {}, "status": "Failure", "exitCode": code,
            "message": format!("command terminated with non-zero exit code: {code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
        }),
        (None, sig) => json!({
            "metadata": {}, "status": "Failure", "signal": sig,
            "message": format!("command terminated by signal {}", sig.unwrap_or("?")),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "Signal", "message": sig}]},
        }),
    }
}

/// The status of a process that ended with its sandbox's container, without an exit of its own.
fn lost(message: &str) -> Value {
    json!({"metadata": {}, "status": "Failure", "reason": "Lost", "message": message})
}

fn framed(channel: u8, data: &[u8]) -> Message {
    let mut m = Vec::with_capacity(data.len() + 1);
    m.push(channel);
    m.extend_from_slice(data);
    Message::Binary(m.into())
}

async fn run(
    socket: WebSocket,
    processes: Arc<Processes>,
    target: Target,
    id: String,
    (stdout_from, stderr_from): (u64, u64),
    activity: Toucher,
) {
    let output_activity = activity.clone();
    let (mut tx, mut rx) = socket.split();
    let events = match processes
        .output(&target, &id, stdout_from, stderr_from, true)
        .await
    {
        Ok(e) => e,
        Err(e) => {
            // The process was there when the attach was accepted: a sandbox that stopped
            // running since (deleted, expired, replaced) took it along, as in the middle of a
            // stream below.
            let body = match e {
                ProcessError::Unavailable(why) => lost(&why),
                other => json!({"metadata": {}, "status": "Failure", "message": other.to_string()}),
            };
            let _ = tx
                .send(framed(CHANNEL_STATUS, body.to_string().as_bytes()))
                .await;
            let _ = tx.send(Message::Close(None)).await;
            return;
        }
    };
    let output = async move {
        let mut events = events;
        while let Some(ev) = events.next().await {
            let msg = match ev {
                OutputEvent::Data { stream, data, .. } => {
                    let ch = match stream {
                        Stream::Stdout => CHANNEL_STDOUT,
                        Stream::Stderr => CHANNEL_STDERR,
                    };
                    // Output and input count as the sandbox's activity (idle policies).
                    output_activity.touch();
                    framed(ch, &data)
                }
                OutputEvent::Exit {
                    exit_code, signal, ..
                } => {
                    let body = status(exit_code, signal.as_deref()).to_string();
                    let _ = tx.send(framed(CHANNEL_STATUS, body.as_bytes())).await;
                    let _ = tx.send(Message::Close(None)).await;
                    return;
                }
                OutputEvent::Truncated { .. } | OutputEvent::Running { .. } => continue,
            };
            if tx.send(msg).await.is_err() {
                return;
            }
        }
        // The follow broke off without an exit: the container went away.
        let body = lost("the sandbox's container went away");
        let _ = tx
            .send(framed(CHANNEL_STATUS, body.to_string().as_bytes()))
            .await;
        let _ = tx.send(Message::Close(None)).await;
    };
    let input = async move {
        let mut session = None;
        while let Some(msg) = rx.next().await {
            let msg = match msg {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!(error = %e, "websocket read failed");
                    return;
                }
            };
            let data = match msg {
                Message::Binary(b) => b,
                Message::Close(_) => return,
                _ => continue,
            };
            let Some((&channel, body)) = data.split_first() else {
                continue;
            };
            activity.touch();
            if session.is_none() {
                match processes.session(&target).await {
                    Ok(s) => session = Some(s),
                    Err(e) => {
                        tracing::debug!(error = %e, "attach: no stdin session");
                        return;
                    }
                }
            }
            let Some(s) = session.as_mut() else { return };
            let result = match channel {
                CHANNEL_STDIN => s.write_stdin(&id, body, false).await,
                CHANNEL_CLOSE if body.first() == Some(&CHANNEL_STDIN) => {
                    s.write_stdin(&id, &[], true).await
                }
                CHANNEL_RESIZE => {
                    let size: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
                    let dim = |k: &str| {
                        size[k]
                            .as_u64()
                            .and_then(|v| u16::try_from(v).ok())
                            .filter(|v| *v > 0)
                    };
                    match (dim("Width"), dim("Height")) {
                        (Some(c), Some(r)) => s.resize(&id, c, r).await,
                        _ => Ok(()),
                    }
                }
                _ => Ok(()),
            };
            // A refusal (stdin closed, not a tty) does not end the attach; a broken session does.
            if let Err(crate::processes::ProcessError::Backend(_)) = result {
                session = None;
            }
        }
    };
    tokio::select! {
        _ = output => {}
        _ = input => {}
    }
}
