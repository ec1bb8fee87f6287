//! The processes subresource of a sandbox, `…/sandboxes/{name}/processes[/{id}[/output|stdin|
//! signal|resize]]`: long-lived processes with stdin, terminals and output replayed from byte
//! offsets. Handlers parse (naming the field at fault), call [`crate::processes`] and map its
//! errors in one place ([`process_error`]); this file also holds the wire types, and each route
//! is registered with its OpenAPI description, so that everything about them is here.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;

use aide::axum::routing::{get_with, post_with};
use aide::axum::ApiRouter;
use aide::transform::TransformOperation;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use futures::StreamExt;
use schemars::JsonSchema;
use serde::Serialize;
use serde_json::{Map, Value};

use super::error::ApiError;
use super::openapi::Describe;
use super::resources::PREFIX;
use super::AppState;
use crate::processes::{
    OutputEvent, Process, ProcessError, StartSpec, State as PState, Stream, Target,
};
use crate::resource::{Kind, SandboxPhase};

/// Largest stdin body taken in one request.
pub const MAX_STDIN_BODY: usize = 8 * 1024 * 1024;
/// Largest argv/env/command of a start, together (the helper frame limit, with room).
const MAX_START_BODY: usize = 1024 * 1024;

fn base() -> String {
    format!("{PREFIX}/sandboxes/{{name}}/processes")
}

const NAME: &str = "The sandbox's name";
const ID: &str = "The process id (`p_` + 16 hex digits)";

/// Every process operation names its sandbox.
fn op<'t>(op: TransformOperation<'t>, id: &str, summary: &str) -> TransformOperation<'t> {
    op.id(id)
        .summary(summary)
        .tag("processes")
        .path_param("name", NAME)
}

/// ... and most name one process of it.
fn one<'t>(o: TransformOperation<'t>, id: &str, summary: &str) -> TransformOperation<'t> {
    op(o, id, summary).path_param("id", ID)
}

pub fn routes() -> ApiRouter<AppState> {
    let b = base();
    let boolean = serde_json::json!({"type": "boolean"});
    let offset = serde_json::json!({"type": "integer", "minimum": 0, "maximum": u64::MAX});
    ApiRouter::new()
        .api_route(
            &b,
            get_with(list, |o| {
                op(o, "listProcesses", "List a sandbox's processes")
                    .json::<ProcessList>(200, "Running, ended and lost processes")
                    .errors(&[404, 409, 502])
            })
            .post_with(start, |o| {
                op(o, "startProcess", "Start a long-lived process")
                    .description(
                        "Starts a command (`command`, run by `/bin/sh -c`, or `argv`) that \
                         belongs to the sandbox, not to the connection: it survives client \
                         disconnects and restarts of the server, and its output is retained for \
                         replay by byte offset (AGENT_SANDBOX_PROCESS_OUTPUT_BYTES per stream). \
                         At most AGENT_SANDBOX_MAX_PROCESSES run at once (429 beyond); the last \
                         64 ended ones are kept.",
                    )
                    .json_body_schema("ProcessStartRequest", start_request_schema())
                    .json::<ProcessObject>(201, "The process, started")
                    .errors(&[400, 404, 409, 413, 429, 502])
            }),
        )
        .api_route(
            &format!("{b}/{{id}}"),
            get_with(get_one, |o| {
                one(o, "getProcess", "One process")
                    .json::<ProcessObject>(200, "The process")
                    .errors(&[404, 409, 502])
            })
            .delete_with(delete, |o| {
                one(o, "deleteProcess", "Kill and forget a process")
                    .description(
                        "Kills its whole process tree (descendants that called setsid \
                         included), waits for it, and forgets it.",
                    )
                    .empty(204, "Killed and forgotten")
                    .errors(&[404, 409, 502])
            }),
        )
        .api_route(
            &format!("{b}/{{id}}/output"),
            get_with(output, |o| {
                one(o, "processOutput", "Read a process's output")
                    .description(
                        "NDJSON, one event a line, from the given offsets; reading does not \
                         consume. A `truncated` event first when an offset is older than what \
                         is retained. Ends with `exit` once the process has really ended, or \
                         with `running` when `follow=false` and it still runs.",
                    )
                    .query_with_schema(
                        "stdoutFrom",
                        false,
                        "Byte offset in stdout (default 0)",
                        offset.clone(),
                    )
                    .query_with_schema(
                        "stderrFrom",
                        false,
                        "Byte offset in stderr (default 0)",
                        offset.clone(),
                    )
                    .query_with_schema(
                        "follow",
                        false,
                        "Keep streaming until the process ends",
                        boolean.clone(),
                    )
                    .query_with_schema(
                        "encoding",
                        false,
                        "utf8 (default; invalid sequences replaced) or base64 (byte-exact)",
                        serde_json::json!({"type": "string", "enum": ["utf8", "base64"]}),
                    )
                    .ndjson::<ProcessOutputEvent>(200, "Output events")
                    .errors(&[400, 404, 409, 502])
            }),
        )
        .api_route(
            &format!("{b}/{{id}}/stdin"),
            post_with(stdin, |o| {
                one(o, "processStdin", "Write to a process's stdin")
                    .description(
                        "The raw body is written; 409 if it was started without stdin or has \
                         exited.",
                    )
                    .query_with_schema("close", false, "Close stdin afterwards", boolean.clone())
                    .binary_body()
                    .empty(204, "Written")
                    .errors(&[400, 404, 409, 413, 502])
            })
            .layer(axum::extract::DefaultBodyLimit::max(MAX_STDIN_BODY)),
        )
        .api_route(
            &format!("{b}/{{id}}/signal"),
            post_with(signal, |o| {
                one(o, "signalProcess", "Send a signal to a process's group")
                    .json_body_schema("SignalRequest", signal_request_schema())
                    .empty(202, "Sent")
                    .errors(&[400, 404, 409, 502])
            }),
        )
        .api_route(
            &format!("{b}/{{id}}/resize"),
            post_with(resize, |o| {
                one(o, "resizeProcess", "Resize a process's terminal")
                    .json_body_schema("ResizeRequest", resize_request_schema())
                    .empty(204, "Resized")
                    .errors(&[400, 404, 409, 502])
            }),
        )
}

// ------------------------------------------------------------------------------------------
// Wire types
// ------------------------------------------------------------------------------------------

#[derive(Serialize, JsonSchema, Clone, Copy)]
pub enum ProcessState {
    Running,
    Exited,
    Lost,
}

/// A long-lived process of a sandbox.
#[derive(Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessObject {
    /// `p_` + 16 hex digits.
    pub id: String,
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// The command string it was started with, or null when it was given an argv.
    pub command: Option<String>,
    pub argv: Vec<String>,
    pub tty: bool,
    pub state: ProcessState,
    pub started_at: DateTime<Utc>,
    /// Set when it exited normally.
    pub exit_code: Option<i32>,
    /// Set when a signal ended it: `KILL`, `TERM`, ...
    pub signal: Option<String>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Bytes it has written to stdout (to the terminal, for a tty).
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// Why it is `Lost`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[derive(Serialize, JsonSchema)]
pub struct ProcessList {
    pub items: Vec<ProcessObject>,
}

/// What `POST …/processes` takes, exactly as [`parse_start`] judges it: `command` or `argv`, not
/// both (`null` is the same as leaving a field out), and the limits that function checks.
fn start_request_schema() -> Value {
    let no_nul = "^[^\\u0000]*$";
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "command": {
                "type": ["string", "null"],
                "description": "Run as `/bin/sh -c`; not blank.",
                "pattern": "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$",
            },
            "argv": {
                "type": ["array", "null"],
                "minItems": 1,
                "prefixItems": [{"type": "string", "minLength": 1}],
                "items": {"type": "string", "pattern": no_nul},
            },
            "env": {
                "type": ["object", "null"],
                "propertyNames": {"type": "string", "minLength": 1, "pattern": "^[^=\\u0000]+$"},
                "additionalProperties": {"type": "string", "pattern": no_nul},
            },
            "workdir": {
                "type": ["string", "null"],
                "description": "An absolute path; default `/workspace`.",
                "pattern": "^/[^\\u0000]*$",
            },
            "tty": {"type": ["boolean", "null"], "description": "Run on a terminal (one stream, `stdout`). Default false."},
            "stdin": {"type": ["boolean", "null"], "description": "Keep stdin open for `…/stdin`. Default false."},
            "cols": {"type": ["integer", "null"], "minimum": 1, "maximum": 65535, "description": "Terminal width, default 80."},
            "rows": {"type": ["integer", "null"], "minimum": 1, "maximum": 65535, "description": "Terminal height, default 24."},
            "timeoutSeconds": {
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "maximum": 1e9,
                "description": "Kill the tree after this long; none means never.",
            },
        },
        "oneOf": [
            {"required": ["command"], "properties": {"command": {"type": "string"}}},
            {"required": ["argv"], "properties": {"argv": {"type": "array"}}},
        ],
        "examples": [{"command": "echo hello; sleep 1"}, {"argv": ["sleep", "5"], "stdin": true}],
    })
}

/// What `POST …/signal` takes (a leading `SIG` is also accepted).
fn signal_request_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["signal"],
        "properties": {"signal": {"enum": ["TERM", "INT", "HUP", "KILL", "QUIT", "USR1", "USR2"]}},
    })
}

/// What `POST …/resize` takes.
fn resize_request_schema() -> Value {
    let size = serde_json::json!({"type": "integer", "minimum": 1, "maximum": 65535});
    serde_json::json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["cols", "rows"],
        "properties": {"cols": size, "rows": size},
    })
}

#[derive(JsonSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum OutputStream {
    Stdout,
    Stderr,
}

/// One line of `…/output`.
#[derive(JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
#[allow(dead_code)]
enum ProcessOutputEvent {
    /// A chunk of output; `offset` is the byte offset of its first byte in its stream; `data` is
    /// text (`encoding=utf8`, invalid sequences replaced) or base64.
    Stdout {
        offset: u64,
        data: String,
    },
    Stderr {
        offset: u64,
        data: String,
    },
    /// The requested offset is older than what is retained; output resumes at `retainedFrom`.
    Truncated {
        stream: OutputStream,
        requested: u64,
        #[serde(rename = "retainedFrom")]
        retained_from: u64,
    },
    /// The process has really ended (last line).
    Exit {
        #[serde(rename = "exitCode")]
        exit_code: Option<i32>,
        signal: Option<String>,
        #[serde(rename = "finishedAt")]
        finished_at: DateTime<Utc>,
    },
    /// `follow=false` and it still runs: where to read on from (last line).
    Running {
        #[serde(rename = "stdoutOffset")]
        stdout_offset: u64,
        #[serde(rename = "stderrOffset")]
        stderr_offset: u64,
    },
}

fn wire(p: Process) -> ProcessObject {
    ProcessObject {
        id: p.id,
        pid: p.pid,
        command: p.command,
        argv: p.argv,
        tty: p.tty,
        state: match p.state {
            PState::Running => ProcessState::Running,
            PState::Exited => ProcessState::Exited,
            PState::Lost => ProcessState::Lost,
        },
        started_at: p.started_at,
        exit_code: p.exit_code,
        signal: p.signal,
        finished_at: p.finished_at,
        stdout_bytes: p.stdout_bytes,
        stderr_bytes: p.stderr_bytes,
        message: p.message,
    }
}

// ------------------------------------------------------------------------------------------
// Handlers
// ------------------------------------------------------------------------------------------

pub(super) fn process_error(e: ProcessError) -> ApiError {
    match e {
        ProcessError::NotFound(m) => ApiError::NotFound(m),
        ProcessError::Conflict(m) | ProcessError::Unavailable(m) => ApiError::Conflict(m),
        ProcessError::TooMany(m) => ApiError::LimitExceeded(m),
        ProcessError::Invalid(m) => ApiError::InvalidRequest(m),
        ProcessError::Backend(m) => ApiError::Backend(m),
    }
}

/// The sandbox's current container, or 404 / 409.
/// The sandbox a process call is about. The call counts as the sandbox's activity, and a paused
/// or stopped sandbox is resumed first (or the call refused with 409) as its `spec.autoResume`
/// says: a frozen supervisor could not answer.
pub(super) async fn target(state: &AppState, name: &str) -> Result<Target, ApiError> {
    let sandbox = state
        .store
        .get(Kind::Sandbox, name)
        .and_then(|e| e.resource.as_sandbox().cloned())
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .ok_or_else(|| ApiError::NotFound(format!("sandbox {name:?} not found")))?;
    let sandbox = crate::api::power::awake(state, sandbox).await?;
    let container_id = sandbox
        .status
        .as_ref()
        .and_then(|s| s.container_id.clone())
        .ok_or_else(|| ApiError::Conflict(format!("sandbox {name} is not running")))?;
    Ok(Target {
        name: name.to_string(),
        uid: sandbox.metadata.uid.clone().unwrap_or_default(),
        container_id,
        env: crate::api::v1::with_egress_env(state, name, sandbox.resolved_spec().env.clone()),
    })
}

pub(super) async fn json_body(body: Body, limit: usize) -> Result<Map<String, Value>, ApiError> {
    let bytes = axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ApiError::PayloadTooLarge(format!("the body is larger than {limit} bytes")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::InvalidRequest(
            "the body must be a JSON object".into(),
        )),
        Err(e) => Err(ApiError::InvalidRequest(format!(
            "the body is not valid JSON: {e}"
        ))),
    }
}

/// Reads typed fields out of a JSON object, naming the field at fault.
struct Fields(Map<String, Value>);

impl Fields {
    fn take(&mut self, name: &str) -> Option<Value> {
        self.0.remove(name).filter(|v| !v.is_null())
    }

    fn string(&mut self, name: &str) -> Result<Option<String>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(field(name, "must be a string")),
        }
    }

    fn bool(&mut self, name: &str) -> Result<Option<bool>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(b)),
            Some(_) => Err(field(name, "must be true or false")),
        }
    }

    fn u16(&mut self, name: &str, min: u16) -> Result<Option<u16>, ApiError> {
        match self.take(name) {
            None => Ok(None),
            // `80.0` is the integer 80, as JSON Schema counts integers.
            Some(v) => match v
                .as_u64()
                .or_else(|| {
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                        .map(|f| f as u64)
                })
                .and_then(|n| u16::try_from(n).ok())
            {
                Some(n) if n >= min => Ok(Some(n)),
                _ => Err(field(
                    name,
                    &format!("must be an integer from {min} to 65535"),
                )),
            },
        }
    }

    fn finish(self) -> Result<(), ApiError> {
        match self.0.keys().next() {
            None => Ok(()),
            Some(k) => Err(field(k, "is not a known field")),
        }
    }
}

fn field(name: &str, what: &str) -> ApiError {
    ApiError::InvalidRequest(format!("{name}: {what}"))
}

pub(super) fn parse_start(obj: Map<String, Value>) -> Result<StartSpec, ApiError> {
    let mut f = Fields(obj);
    let command = f.string("command")?;
    let argv = match f.take("argv") {
        None => None,
        Some(Value::Array(items)) => Some(
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s),
                    _ => Err(field(&format!("argv[{i}]"), "must be a string")),
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(_) => return Err(field("argv", "must be a list of strings")),
    };
    let env = match f.take("env") {
        None => BTreeMap::new(),
        Some(Value::Object(m)) => m
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k, s)),
                _ => Err(field(&format!("env.{k}"), "must be a string")),
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(field("env", "must be an object of strings")),
    };
    for (k, v) in &env {
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(field(&format!("env.{k}"), "is not a valid variable name"));
        }
        if v.contains('\0') {
            return Err(field(&format!("env.{k}"), "must not contain a NUL byte"));
        }
    }
    let workdir = f.string("workdir")?;
    if let Some(w) = &workdir {
        if !w.starts_with('/') || w.contains('\0') {
            return Err(field("workdir", "must be an absolute path"));
        }
    }
    let tty = f.bool("tty")?.unwrap_or(false);
    let stdin = f.bool("stdin")?.unwrap_or(false);
    let cols = f.u16("cols", 1)?.unwrap_or(80);
    let rows = f.u16("rows", 1)?.unwrap_or(24);
    let timeout_seconds = match f.take("timeoutSeconds") {
        None => None,
        Some(v) => match v.as_f64() {
            Some(t) if t.is_finite() && t > 0.0 && t <= 1e9 => Some(t),
            _ => return Err(field("timeoutSeconds", "must be a number above 0")),
        },
    };
    f.finish()?;
    let argv = match (&command, argv) {
        (Some(_), Some(_)) => return Err(field("argv", "give command or argv, not both")),
        (None, None) => return Err(field("command", "is required (or argv)")),
        (Some(c), None) if c.trim().is_empty() => {
            return Err(field("command", "must not be empty"))
        }
        (Some(c), None) => vec!["/bin/sh".into(), "-c".into(), c.clone()],
        (None, Some(a)) if a.first().is_none_or(String::is_empty) => {
            return Err(field("argv", "must start with a program name"))
        }
        (None, Some(a)) => a,
    };
    if let Some(i) = argv.iter().position(|a| a.contains('\0')) {
        return Err(field(&format!("argv[{i}]"), "must not contain a NUL byte"));
    }
    Ok(StartSpec {
        command,
        argv,
        env,
        workdir,
        tty,
        stdin,
        cols,
        rows,
        timeout_seconds,
    })
}

async fn start(
    State(state): State<AppState>,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let spec = parse_start(json_body(body, MAX_START_BODY).await?)?;
    let target = target(&state, &name).await?;
    let p = state
        .processes
        .start(&target, spec)
        .await
        .map_err(process_error)?;
    Ok((StatusCode::CREATED, Json(wire(p))).into_response())
}

/// A sandbox kept `Expired` (one declared in a watched folder) has no container to ask: its
/// processes ended with it, and those seen running are reported `Lost`.
fn expired(state: &AppState, name: &str) -> Option<Target> {
    let sandbox = state
        .store
        .get(Kind::Sandbox, name)?
        .resource
        .as_sandbox()
        .cloned()?;
    let phase = sandbox.status.as_ref().map(|s| s.phase);
    (sandbox.metadata.deletion_timestamp.is_none() && phase == Some(SandboxPhase::Expired)).then(
        || Target {
            name: name.to_string(),
            uid: sandbox.metadata.uid.clone().unwrap_or_default(),
            container_id: String::new(),
            env: BTreeMap::new(),
        },
    )
}

async fn list(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<ProcessList>, ApiError> {
    if let Some(target) = expired(&state, &name) {
        let items = state.processes.of_expired(&target);
        return Ok(Json(ProcessList {
            items: items.into_iter().map(wire).collect(),
        }));
    }
    let target = target(&state, &name).await?;
    let items = state.processes.list(&target).await.map_err(process_error)?;
    Ok(Json(ProcessList {
        items: items.into_iter().map(wire).collect(),
    }))
}

async fn get_one(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<Json<ProcessObject>, ApiError> {
    if let Some(target) = expired(&state, &name) {
        return match state
            .processes
            .of_expired(&target)
            .into_iter()
            .find(|p| p.id == id)
        {
            Some(p) => Ok(Json(wire(p))),
            None => Err(ApiError::NotFound(format!(
                "process {id} not found in sandbox {name}: it expired"
            ))),
        };
    }
    let target = target(&state, &name).await?;
    let p = state
        .processes
        .get(&target, &id)
        .await
        .map_err(process_error)?;
    Ok(Json(wire(p)))
}

async fn delete(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let target = target(&state, &name).await?;
    state
        .processes
        .delete(&target, &id)
        .await
        .map_err(process_error)?;
    Ok(StatusCode::NO_CONTENT)
}

fn query_bool(q: &HashMap<String, String>, name: &str) -> Result<Option<bool>, ApiError> {
    match q.get(name).map(|v| v.to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(None),
        Some("true") | Some("1") => Ok(Some(true)),
        Some("false") | Some("0") => Ok(Some(false)),
        Some(other) => Err(field(
            name,
            &format!("must be true or false, got {other:?}"),
        )),
    }
}

fn query_u64(q: &HashMap<String, String>, name: &str) -> Result<u64, ApiError> {
    match q.get(name).map(String::as_str) {
        None => Ok(0),
        Some(v) => v
            .parse()
            .map_err(|_| field(name, &format!("must be a byte offset, got {v:?}"))),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Encoding {
    Utf8,
    Base64,
}

async fn output(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let stdout_from = query_u64(&q, "stdoutFrom")?;
    let stderr_from = query_u64(&q, "stderrFrom")?;
    let follow = query_bool(&q, "follow")?.unwrap_or(false);
    let encoding = match q.get("encoding").map(String::as_str) {
        None | Some("") | Some("utf8") => Encoding::Utf8,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(field(
                "encoding",
                &format!("must be utf8 or base64, got {other:?}"),
            ))
        }
    };
    if let Some(k) = q
        .keys()
        .find(|k| !["stdoutFrom", "stderrFrom", "follow", "encoding"].contains(&k.as_str()))
    {
        return Err(field(k, "is not a known query parameter"));
    }
    let target = target(&state, &name).await?;
    let events = state
        .processes
        .output(&target, &id, stdout_from, stderr_from, follow)
        .await
        .map_err(process_error)?;
    let mut text = TextStreams::default();
    let lines = events.flat_map(move |ev| {
        let lines = render(&mut text, ev, encoding);
        futures::stream::iter(lines.into_iter().map(Ok::<_, Infallible>))
    });
    let mut response = (StatusCode::OK, Body::from_stream(lines)).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    Ok(response)
}

/// Per stream, the bytes of a character split across chunks (at most 3), held back so that text
/// is decoded whole; offsets still count raw bytes.
#[derive(Default)]
struct TextStreams {
    pending: [(u64, Vec<u8>); 2],
}

fn line(v: Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn stream_name(s: Stream) -> &'static str {
    match s {
        Stream::Stdout => "stdout",
        Stream::Stderr => "stderr",
    }
}

fn data_line(stream: Stream, offset: u64, data: String) -> Bytes {
    line(serde_json::json!({"type": stream_name(stream), "offset": offset, "data": data}))
}

/// A data line in base64, written straight into its buffer: base64 needs no JSON escaping, so
/// the text is encoded once and never scanned or copied again (a replay is mostly these).
fn base64_line(stream: Stream, offset: u64, data: &[u8]) -> Bytes {
    let head = format!(
        "{{\"type\":\"{}\",\"offset\":{offset},\"data\":\"",
        stream_name(stream)
    );
    let mut s = String::with_capacity(head.len() + data.len().div_ceil(3) * 4 + 3);
    s.push_str(&head);
    base64::engine::general_purpose::STANDARD.encode_string(data, &mut s);
    s.push_str("\"}\n");
    Bytes::from(s)
}

/// Where a complete UTF-8 prefix of `b` ends, keeping back only an incomplete last character.
fn complete_prefix(b: &[u8]) -> usize {
    let tail_start = b.len().saturating_sub(3);
    for start in (tail_start..b.len()).rev() {
        let lead = b[start];
        let need = match lead {
            0xc0..=0xdf => 2,
            0xe0..=0xef => 3,
            0xf0..=0xf7 => 4,
            _ => continue,
        };
        if b.len() - start < need && std::str::from_utf8(&b[start..]).is_err() {
            return start;
        }
        break;
    }
    b.len()
}

fn render(text: &mut TextStreams, ev: OutputEvent, encoding: Encoding) -> Vec<Bytes> {
    let flush = |text: &mut TextStreams| -> Vec<Bytes> {
        let mut out = Vec::new();
        for (i, s) in [Stream::Stdout, Stream::Stderr].into_iter().enumerate() {
            let (off, bytes) = std::mem::take(&mut text.pending[i]);
            if !bytes.is_empty() {
                out.push(data_line(
                    s,
                    off,
                    String::from_utf8_lossy(&bytes).into_owned(),
                ));
            }
        }
        out
    };
    match ev {
        OutputEvent::Data {
            stream,
            offset,
            data,
        } => match encoding {
            Encoding::Base64 => vec![base64_line(stream, offset, &data)],
            Encoding::Utf8 => {
                let slot = &mut text.pending[stream as usize];
                let (start, mut bytes) = std::mem::take(slot);
                let start = if bytes.is_empty() { offset } else { start };
                bytes.extend_from_slice(&data);
                let cut = complete_prefix(&bytes);
                let rest = bytes.split_off(cut);
                if !rest.is_empty() {
                    *slot = (start + cut as u64, rest);
                }
                if bytes.is_empty() {
                    return Vec::new();
                }
                vec![data_line(
                    stream,
                    start,
                    String::from_utf8_lossy(&bytes).into_owned(),
                )]
            }
        },
        OutputEvent::Truncated {
            stream,
            requested,
            retained_from,
        } => {
            let mut out = flush(text);
            out.push(line(serde_json::json!({
                "type": "truncated",
                "stream": stream_name(stream),
                "requested": requested,
                "retainedFrom": retained_from,
            })));
            out
        }
        OutputEvent::Exit {
            exit_code,
            signal,
            finished_at,
        } => {
            let mut out = flush(text);
            out.push(line(serde_json::json!({
                "type": "exit",
                "exitCode": exit_code,
                "signal": signal,
                "finishedAt": finished_at,
            })));
            out
        }
        OutputEvent::Running {
            stdout_offset,
            stderr_offset,
        } => {
            let mut out = flush(text);
            out.push(line(serde_json::json!({
                "type": "running",
                "stdoutOffset": stdout_offset,
                "stderrOffset": stderr_offset,
            })));
            out
        }
    }
}

async fn stdin(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
    Query(q): Query<HashMap<String, String>>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let close = query_bool(&q, "close")?.unwrap_or(false);
    let bytes = axum::body::to_bytes(body, MAX_STDIN_BODY)
        .await
        .map_err(|_| {
            ApiError::PayloadTooLarge(format!("the body is larger than {MAX_STDIN_BODY} bytes"))
        })?;
    let target = target(&state, &name).await?;
    state
        .processes
        .write_stdin(&target, &id, &bytes, close)
        .await
        .map_err(process_error)?;
    Ok(StatusCode::NO_CONTENT)
}

async fn signal(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let mut f = Fields(json_body(body, 4096).await?);
    let name_given = f
        .string("signal")?
        .ok_or_else(|| field("signal", "is required"))?;
    f.finish()?;
    let bare = name_given.trim_start_matches("SIG");
    let number = crate::processes::SIGNALS
        .iter()
        .find(|(n, _)| *n == bare)
        .map(|(_, s)| *s)
        .ok_or_else(|| {
            field(
                "signal",
                &format!(
                    "must be one of TERM, INT, HUP, KILL, QUIT, USR1, USR2, got {name_given:?}"
                ),
            )
        })?;
    let target = target(&state, &name).await?;
    state
        .processes
        .signal(&target, &id, number)
        .await
        .map_err(process_error)?;
    Ok(StatusCode::ACCEPTED)
}

async fn resize(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, String)>,
    body: Body,
) -> Result<StatusCode, ApiError> {
    let mut f = Fields(json_body(body, 4096).await?);
    let cols = f
        .u16("cols", 1)?
        .ok_or_else(|| field("cols", "is required"))?;
    let rows = f
        .u16("rows", 1)?
        .ok_or_else(|| field("rows", "is required"))?;
    f.finish()?;
    let target = target(&state, &name).await?;
    state
        .processes
        .resize(&target, &id, cols, rows)
        .await
        .map_err(process_error)?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_base64_line_is_the_json_of_its_event() {
        let line = super::base64_line(super::Stream::Stderr, 42, b"\x00\xffhi");
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"type": "stderr", "offset": 42, "data": "AP9oaQ=="})
        );
        assert!(line.ends_with(b"}\n"));
    }

    use super::*;

    #[test]
    fn split_characters_are_held_back_and_offsets_count_bytes() {
        let mut t = TextStreams::default();
        let snow = "☃".as_bytes();
        let a = render(
            &mut t,
            OutputEvent::Data {
                stream: Stream::Stdout,
                offset: 0,
                data: [b"ab".as_slice(), &snow[..1]].concat(),
            },
            Encoding::Utf8,
        );
        assert_eq!(a.len(), 1);
        assert!(std::str::from_utf8(&a[0])
            .unwrap()
            .contains("\"data\":\"ab\""));
        let b = render(
            &mut t,
            OutputEvent::Data {
                stream: Stream::Stdout,
                offset: 3,
                data: [&snow[1..], b"\xffz".as_slice()].concat(),
            },
            Encoding::Utf8,
        );
        let s = std::str::from_utf8(&b[0]).unwrap();
        assert!(
            s.contains("\"offset\":2") && s.contains("☃\u{fffd}z"),
            "{s}"
        );
    }

    #[test]
    fn start_bodies_name_the_field_at_fault() {
        let obj = |v: Value| v.as_object().cloned().unwrap();
        let e = parse_start(obj(serde_json::json!({"argv": ["ls", 3]}))).unwrap_err();
        assert!(e.to_string().contains("argv[1]"), "{e}");
        let e = parse_start(obj(serde_json::json!({"command": "x", "tty": "yes"}))).unwrap_err();
        assert!(e.to_string().contains("tty"), "{e}");
        let e = parse_start(obj(serde_json::json!({"command": "x", "bogus": 1}))).unwrap_err();
        assert!(e.to_string().contains("bogus"), "{e}");
        let s = parse_start(obj(serde_json::json!({"command": "echo hi"}))).unwrap();
        assert_eq!(s.argv, ["/bin/sh", "-c", "echo hi"]);
        assert_eq!((s.cols, s.rows), (80, 24));
    }
}
